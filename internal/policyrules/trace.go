package policyrules

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
)

// Packet is the first packet of a connection, as trace judges it.
type Packet struct {
	Src, Dst netip.Addr
	Protocol uint8
	// Port is the destination port (TCP, UDP, SCTP); the policies look at no other protocol's.
	Port uint16
	// FromNode says the node itself sends it (Src is one of its own addresses): the node's own
	// packets reach every pod that is not held, whatever its ingress policies.
	FromNode bool
}

// Verdict is what the installed rules do with a packet, and why.
type Verdict struct {
	Allowed bool
	Steps   []Step // the sender's egress, then the receiver's ingress: those of local pods
}

// Step is one direction's judgement.
type Step struct {
	Ingress bool
	Port    int // the pod's port
	Allowed bool
	// Chain is where the port's map element goes: a group, an allow chain, or "" (held).
	Chain string
	// Match is the group's element that grants the packet (nil when none does).
	Match *Entry
	// Reason says, in words, which rule or missing rule decides.
	Reason string
	// Damage is what is wrong with the group (InstalledGroup.Damage): the kernel runs its
	// rules, which may then judge otherwise than its elements say.
	Damage []string
}

// Trace judges p as the installed rules do for a new connection: the egress of the sending pod
// when srcPort is a port of the node (else 0: a peer elsewhere), then the ingress of the
// receiving pod when dstPort is one. It evaluates the same lookups the kernel makes — the
// dispatch maps, the sources sets, the group's interval sets, field by field — on the elements
// read back. Pure.
func (in Installed) Trace(p Packet, srcPort, dstPort int) (Verdict, error) {
	p.Src, p.Dst = p.Src.Unmap(), p.Dst.Unmap()
	switch {
	case !p.Src.IsValid() || !p.Dst.IsValid():
		return Verdict{}, errors.New("trace: a source and a destination address are needed")
	case p.Src.Is4() != p.Dst.Is4():
		return Verdict{}, fmt.Errorf("trace: %s and %s are of different families", p.Src, p.Dst)
	case srcPort <= 0 && dstPort <= 0:
		return Verdict{}, errors.New("trace: neither end is a pod of this node: its policies judge neither")
	}
	v := Verdict{Allowed: true}
	if srcPort > 0 {
		v.Steps = append(v.Steps, in.judge(p, srcPort, false, false))
	}
	if dstPort > 0 {
		v.Steps = append(v.Steps, in.judge(p, dstPort, true, srcPort <= 0))
	}
	for _, s := range v.Steps {
		v.Allowed = v.Allowed && s.Allowed
	}
	return v, nil
}

// judge is one direction of the pod on port; routedIn says the packet comes from elsewhere than
// a port of the bridge (the output chain judges it).
func (in Installed) judge(p Packet, port int, ingress, routedIn bool) Step {
	s := Step{Ingress: ingress, Port: port}
	dir, m, guard, open, peer := "egress", MapEgress, "the bridge's guard (or the forward chain)", AllowEgress, p.Dst
	if ingress {
		dir, m, guard, open, peer = "ingress", MapIngress, "the port's guard", AllowIngress, p.Src
	}
	if !in.Tables {
		s.Reason = "there are no policy tables: every guarded pod is held, " + guard + " drops it"
		return s
	}
	ip := in.Ports[port]
	if !ingress && !slices.Contains(ip.Sources, p.Src) {
		s.Reason = fmt.Sprintf("%s is not an address port %d may send from (%s): no mark, %s drops it", p.Src, port, sourcesSetName(p.Src.Is6()), guard)
		return s
	}
	s.Chain = ip.Egress
	if ingress {
		s.Chain = ip.Ingress
	}
	switch {
	case s.Chain == "":
		s.Reason = fmt.Sprintf("port %d has no element in %s: held (its policies are not installed), %s drops it", port, m, guard)
		return s
	case ingress && routedIn && p.FromNode:
		s.Allowed, s.Reason = true, "the node's own packets reach every pod that is not held (the inet table's "+ChainNode+" chain marks them)"
		return s
	case routedIn && in.isLocalPodAddr(p.Src):
		s.Reason = fmt.Sprintf("%s is an address only the node's pods have (%s), routed in without coming through its pod's port: no mark, %s drops it",
			p.Src, localPodsSetName(p.Src.Is6()), guard)
		return s
	case s.Chain == open:
		s.Allowed, s.Reason = true, "not isolated for "+dir+" ("+open+")"
		return s
	}
	g, ok := in.Groups[s.Chain]
	if !ok {
		s.Reason = fmt.Sprintf("group %s, which %s names, is not in the kernel", s.Chain, m)
		return s
	}
	s.Damage = g.Damage
	if e, ok := g.lookup(peer, p.Protocol, p.Port); ok {
		s.Allowed, s.Match = true, &e
		s.Reason = fmt.Sprintf("group %s allows it: element %s", s.Chain, entryString(e))
		return s
	}
	if g.Audit {
		s.Allowed = true
		s.Reason = fmt.Sprintf("no element of audit group %s matches %s %s: its staged policies would drop it; passed by its last rule", s.Chain, peer, protoPort(p.Protocol, p.Port))
		return s
	}
	s.Reason = fmt.Sprintf("no element of group %s matches %s %s: dropped by its last rule", s.Chain, peer, protoPort(p.Protocol, p.Port))
	return s
}

// lookup finds the element that holds peer . protocol (any set) or peer . protocol . port
// (ports set): each field within the element's range, as the kernel's concatenated interval
// sets match.
func (g InstalledGroup) lookup(peer netip.Addr, proto uint8, port uint16) (Entry, bool) {
	for _, e := range g.Entries {
		if e.Ports == nil && e.Peer.Contains(peer) {
			return e, true
		}
	}
	if !hasPorts(proto) {
		return Entry{}, false
	}
	for _, e := range g.Entries {
		if e.Ports != nil && e.Peer.Contains(peer) && e.Ports.Protocol == proto && e.Ports.First <= port && port <= e.Ports.Last {
			return e, true
		}
	}
	return Entry{}, false
}

// isLocalPodAddr tells whether a is in the node's pod CIDRs and not the node's own (LocalPods).
func (in Installed) isLocalPodAddr(a netip.Addr) bool {
	return slices.ContainsFunc(in.LocalPods, func(r Range) bool { return r.Contains(a) })
}

// hasPorts tells whether the policies judge the protocol's ports (the only ones a port rule
// names: a ports element of another protocol is never written).
func hasPorts(proto uint8) bool {
	return proto == TCP || proto == UDP || proto == SCTP
}

func entryString(e Entry) string {
	if e.Ports == nil {
		return e.Peer.String() + " (every protocol and port)"
	}
	return e.Peer.String() + " " + e.Ports.String()
}

func protoPort(proto uint8, port uint16) string {
	if !hasPorts(proto) {
		return ProtocolName(proto)
	}
	return Ports{Protocol: proto, First: port, Last: port}.String()
}

func sourcesSetName(is6 bool) string {
	if is6 {
		return SetSourcesIPv6
	}
	return SetSourcesIPv4
}

func localPodsSetName(is6 bool) string {
	if is6 {
		return SetLocalPodsIPv6
	}
	return SetLocalPodsIPv4
}
