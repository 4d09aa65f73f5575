package netpol

import (
	"net/netip"

	vnl "github.com/vishvananda/netlink"

	"github.com/kubenet-dev/kubenet/internal/conntrack"
	"github.com/kubenet-dev/kubenet/internal/policyrules"
)

// CutDenied cuts the connections that rs denies: it sets CtMarkCut in the marks of their conntrack
// entries, and the inet table drops their packets, whichever end sends them; it takes the bit
// off the entries rs allows again (a policy that flipped back). Without it a connection
// established while a policy allowed it keeps flowing until it ends (its packets are
// established in conntrack, which the groups grant first). The entries stay: removed, the
// next packet would be taken for a new connection, mid-stream, in the direction of whichever
// end sends first, and judged as that end's (a server that sends first, to a client whose
// ingress is open, would take the connection back up). Call it after Apply installed rs; it
// returns how many entries it marked.
//
// A connection is judged in the direction it was opened, as the kernel judged its first packet:
// by its originator's egress (when a pod of rs) towards the responder's address, protocol and
// port after DNAT (a Service's backend), and by the responder's ingress (when a pod of rs) from
// the originator. What the kernel cannot have judged is kept: connections the node opened
// (nodeAddrs: the node's packets are never filtered), directions whose allow list Apply refused
// (their pods keep the group they had), pods not in rs (held: their guards drop everything
// already), and addresses that more than one pod of rs lists (whose connection it is, conntrack
// does not say). Where it cannot tell exactly it keeps the connection: the responder's ingress
// denies only when it denies the originator's address both before and after any SNAT.
func CutDenied(rs policyrules.Ruleset, applied policyrules.Applied, nodeAddrs []netip.Addr) (uint, error) {
	j := newFlowJudge(rs, applied, nodeAddrs)
	return conntrack.SetMark(CtMarkCut, j.denies)
}

// ClearCuts takes CtMarkCut off every conntrack entry: the agent without strict mode lets the
// connections an earlier run cut flow again, as the API allows established connections to.
func ClearCuts() error {
	_, err := conntrack.SetMark(CtMarkCut, func(*vnl.ConntrackFlow) bool { return false })
	return err
}

// flowJudge holds what judging a conntrack entry needs, by address.
type flowJudge struct {
	pods map[netip.Addr]*policyrules.Pod
	node map[netip.Addr]bool
	// refused names the pods' directions whose allow list was not installed: "in/"+name,
	// "out/"+name.
	refused map[string]bool
}

func newFlowJudge(rs policyrules.Ruleset, applied policyrules.Applied, nodeAddrs []netip.Addr) flowJudge {
	j := flowJudge{pods: map[netip.Addr]*policyrules.Pod{}, node: map[netip.Addr]bool{}, refused: map[string]bool{}}
	// An address two pods list cannot tell whose an entry is (the kernel judges a pod by its
	// port, which conntrack does not record): it stands for no pod, so its entries are kept.
	owner, shared := map[netip.Addr]int{}, map[netip.Addr]bool{}
	for i, p := range rs.Pods {
		for _, a := range p.IPs {
			if o, ok := owner[a.Unmap()]; ok && o != i {
				shared[a.Unmap()] = true
			}
			owner[a.Unmap()] = i
		}
	}
	for i := range rs.Pods {
		p := &rs.Pods[i]
		if !p.Ingress.Isolated && !p.Egress.Isolated {
			continue
		}
		for _, a := range p.IPs {
			if !shared[a.Unmap()] {
				j.pods[a.Unmap()] = p
			}
		}
	}
	for _, a := range nodeAddrs {
		j.node[a.Unmap()] = true
	}
	for _, r := range applied.Refused {
		dir := egressDir
		if r.Ingress {
			dir = ingressDir
		}
		for _, name := range r.Pods {
			j.refused[dir+"/"+name] = true
		}
	}
	return j
}

func addrOf(ip []byte) netip.Addr {
	a, _ := netip.AddrFromSlice(ip)
	return a.Unmap()
}

// denies tells whether the connection of f is one the ruleset denies.
func (j flowJudge) denies(f *vnl.ConntrackFlow) bool {
	origin, originSeen := addrOf(f.Forward.SrcIP), addrOf(f.Reverse.DstIP)
	responder, port := addrOf(f.Reverse.SrcIP), f.Reverse.SrcPort
	protocol := f.Forward.Protocol
	allowed := func(d policyrules.Direction, peer netip.Addr) bool {
		switch protocol {
		case policyrules.TCP, policyrules.UDP, policyrules.SCTP:
			return d.Allows(peer, protocol, port)
		}
		return d.Allows(peer, protocol, 0)
	}
	if p := j.pods[origin]; p != nil && !j.refused[egressDir+"/"+p.Name] && !allowed(p.Egress, responder) {
		return true
	}
	if p := j.pods[responder]; p != nil && !j.refused[ingressDir+"/"+p.Name] && !j.node[origin] {
		return !allowed(p.Ingress, origin) && !allowed(p.Ingress, originSeen)
	}
	return false
}
