package netpoldiff

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"regexp"
	"slices"
	"sort"
)

// Probe is one packet the tester sends (the first of a TCP connection, an SCTP INIT, a UDP
// datagram, an ICMP echo request) and the endpoints that would receive it: one for unicast,
// every pod and the node on the link for broadcast and multicast.
type Probe struct {
	// Class is the probe's path and protocol, e.g. "pod-pod-ll/udp-frag"; a pair whose sender or
	// receiver is held is reported as "held/" + Class.
	Class string
	From  Endpoint
	Src   netip.Addr // the source address the packet carries
	Dst   netip.Addr
	Proto Proto
	Port  uint16 // destination port; unused for ICMP
	Frag  bool   // a UDP datagram bigger than the MTU, sent in fragments
	Group bool   // Dst is a broadcast or multicast address
	To    []Endpoint
}

func (p *Probe) String() string {
	proto := string(p.Proto)
	if p.Frag {
		proto += " (fragmented)"
	}
	port := ""
	if p.Proto != ICMP {
		port = fmt.Sprintf(":%d", p.Port)
	}
	return fmt.Sprintf("%s %s (%s) -> %s%s", proto, p.Src, p.From, p.Dst, port)
}

// Flow is the model's view of p as it arrives at to.
func (p *Probe) Flow(to Endpoint) Flow {
	return Flow{From: p.From, To: to, Src: p.Src, Dst: p.Dst, Proto: p.Proto, Port: p.Port}
}

// PairClass is the class a (probe, receiver) pair is reported under.
func PairClass(m *Model, p *Probe, to Endpoint) string {
	for _, e := range []Endpoint{p.From, to} {
		if e.Role == RoleLocal && m.Held(e.Sandbox) {
			return "held/" + p.Class
		}
	}
	return p.Class
}

// Candidates lists every probe the lab can send: from each sandbox to the other sandboxes
// (primary and link-local addresses), to the node (its addresses and the bridge's link-local
// one), to the other node's pods and to the hosts, and to the broadcast and multicast
// addresses; from the node to the sandboxes and to the groups; from the other node's pods and
// the hosts to the sandboxes. Each in TCP, UDP, fragmented UDP, ICMP echo and (withSCTP) SCTP,
// on every port with a receiver.
func Candidates(t *Topology, withSCTP bool) []*Probe {
	var out []*Probe
	add := func(path string, from Endpoint, src, dst netip.Addr, to ...Endpoint) {
		base := Probe{From: from, Src: src, Dst: dst, To: to, Group: dst.IsMulticast() || slices.Contains(t.Broadcast4, dst)}
		if base.Group {
			for _, frag := range []bool{false, true} {
				p := base
				p.Proto, p.Port, p.Frag, p.Class = UDP, t.GroupPort, frag, path+"/udp"
				if frag {
					p.Class += "-frag"
				}
				out = append(out, &p)
			}
			return
		}
		for _, port := range t.TCPPorts {
			p := base
			p.Proto, p.Port, p.Class = TCP, port, path+"/tcp"
			out = append(out, &p)
		}
		for _, port := range t.UDPPorts {
			for _, frag := range []bool{false, true} {
				p := base
				p.Proto, p.Port, p.Frag, p.Class = UDP, port, frag, path+"/udp"
				if frag {
					p.Class += "-frag"
				}
				out = append(out, &p)
			}
		}
		p := base
		p.Proto, p.Class = ICMP, path+"/icmp"
		out = append(out, &p)
		if withSCTP {
			for _, port := range t.SCTPPorts {
				p := base
				p.Proto, p.Port, p.Class = SCTP, port, path+"/sctp"
				out = append(out, &p)
			}
		}
	}
	node := Endpoint{Role: RoleNode}
	local := func(s Sandbox) Endpoint { return Endpoint{Role: RoleLocal, Sandbox: s.Key()} }
	for _, s := range t.Sandboxes {
		from := local(s)
		for _, d := range t.Sandboxes {
			if d.Key() == s.Key() {
				continue
			}
			add("pod-pod", from, s.Addrs[0], d.Addrs[0], local(d))
			add("pod-pod", from, s.Addrs[1], d.Addrs[1], local(d))
			add("pod-pod-ll", from, s.LinkLocal, d.LinkLocal, local(d))
		}
		for _, a := range []netip.Addr{t.Gateway4, t.NodePeer4, t.NodeUplink4} {
			add("pod-node", from, s.Addrs[0], a, node)
		}
		for _, a := range []netip.Addr{t.Gateway6, t.NodePeer6, t.NodeUplink6} {
			add("pod-node", from, s.Addrs[1], a, node)
		}
		add("pod-node-ll", from, s.LinkLocal, t.BridgeLL, node)
		for _, r := range t.Remote {
			add("pod-remote", from, s.Addrs[0], r[0], Endpoint{Role: RoleRemote})
			add("pod-remote", from, s.Addrs[1], r[1], Endpoint{Role: RoleRemote})
		}
		add("pod-host", from, s.Addrs[0], t.Peer4, Endpoint{Role: RolePeerHost})
		add("pod-host", from, s.Addrs[1], t.Peer6, Endpoint{Role: RolePeerHost})
		add("pod-host", from, s.Addrs[0], t.External4, Endpoint{Role: RoleExternal})
		add("pod-host", from, s.Addrs[1], t.External6, Endpoint{Role: RoleExternal})
		others := []Endpoint{node}
		for _, d := range t.Sandboxes {
			if d.Key() != s.Key() {
				others = append(others, local(d))
			}
		}
		for _, g := range t.Broadcast4 {
			add("broadcast", from, s.Addrs[0], g, others...)
		}
		for _, g := range t.Multicast4 {
			add("multicast", from, s.Addrs[0], g, others...)
		}
		for _, g := range t.Multicast6 {
			src := s.Addrs[1]
			if g.IsLinkLocalMulticast() { // the source of the group's scope
				src = s.LinkLocal
			}
			add("multicast", from, src, g, others...)
		}
	}
	var pods []Endpoint
	for _, d := range t.Sandboxes {
		to := local(d)
		pods = append(pods, to)
		add("node-pod", node, t.Gateway4, d.Addrs[0], to)
		add("node-pod", node, t.Gateway6, d.Addrs[1], to)
		add("node-pod-ll", node, t.BridgeLL, d.LinkLocal, to)
		for _, r := range t.Remote {
			add("remote-pod", Endpoint{Role: RoleRemote}, r[0], d.Addrs[0], to)
			add("remote-pod", Endpoint{Role: RoleRemote}, r[1], d.Addrs[1], to)
		}
		add("host-pod", Endpoint{Role: RolePeerHost}, t.Peer4, d.Addrs[0], to)
		add("host-pod", Endpoint{Role: RolePeerHost}, t.Peer6, d.Addrs[1], to)
		add("host-pod", Endpoint{Role: RoleExternal}, t.External4, d.Addrs[0], to)
		add("host-pod", Endpoint{Role: RoleExternal}, t.External6, d.Addrs[1], to)
	}
	for _, g := range t.Broadcast4 {
		add("broadcast", node, t.Gateway4, g, pods...)
	}
	for _, g := range append(slices.Clone(t.Multicast4), t.Multicast6...) {
		src := t.Gateway4
		switch {
		case g.Is6() && g.IsLinkLocalMulticast():
			src = t.BridgeLL
		case g.Is6():
			src = t.Gateway6
		}
		add("multicast", node, src, g, pods...)
	}
	return out
}

// Sample picks n probes of cands for a case, never the same twice, among those with a pair of a
// class keep accepts. Half are spread over the classes: a class at random among those pairs'
// classes (held or not in this case), then a probe of it at random, so every kind of probe gets
// its share whatever its number of candidates. The other half are focused (Model.Focused): a
// rule's port matches them, so they test that rule's peers and families.
func Sample(r *rand.Rand, m *Model, cands []*Probe, n int, keep *regexp.Regexp) []*Probe {
	byClass := map[string][]*Probe{}
	var focused []*Probe
	for _, p := range cands {
		kept, focus := "", false
		for _, to := range p.To {
			if c := PairClass(m, p, to); keep.MatchString(c) {
				if kept == "" {
					kept = c
				}
				focus = focus || m.Focused(p.Flow(to))
			}
		}
		if kept == "" {
			continue
		}
		byClass[kept] = append(byClass[kept], p)
		if focus {
			focused = append(focused, p)
		}
	}
	chosen := map[*Probe]bool{}
	var out []*Probe
	for len(out) < n/2 && len(focused) > 0 {
		i := r.IntN(len(focused))
		chosen[focused[i]] = true
		out = append(out, focused[i])
		focused = slices.Delete(focused, i, i+1)
	}
	classes := make([]string, 0, len(byClass))
	for c := range byClass {
		classes = append(classes, c)
	}
	sort.Strings(classes)
	for len(out) < n && len(classes) > 0 {
		i := r.IntN(len(classes))
		ps := byClass[classes[i]]
		j := r.IntN(len(ps))
		if p := ps[j]; !chosen[p] {
			chosen[p] = true
			out = append(out, p)
		}
		ps[j] = ps[len(ps)-1]
		byClass[classes[i]] = ps[:len(ps)-1]
		if len(ps) == 1 {
			classes = slices.Delete(classes, i, i+1)
		}
	}
	return out
}

// OnePerKind picks, for every class and sender, one probe of cands: the control batch, which
// shows that every kind of probe can pass.
func OnePerKind(r *rand.Rand, cands []*Probe) []*Probe {
	kinds := map[string][]*Probe{}
	for _, p := range cands {
		k := p.Class + " from " + p.From.String()
		if p.From.Role == RoleRemote || p.From.Role == RolePeerHost || p.From.Role == RoleExternal {
			k += " " + p.Src.String()
		}
		kinds[k] = append(kinds[k], p)
	}
	keys := make([]string, 0, len(kinds))
	for k := range kinds {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]*Probe, 0, len(keys))
	for _, k := range keys {
		out = append(out, pickFrom(r, kinds[k]))
	}
	return out
}

// Classes lists the distinct classes of probes, sorted.
func Classes(ps []*Probe) []string {
	var out []string
	for _, p := range ps {
		if !slices.Contains(out, p.Class) {
			out = append(out, p.Class)
		}
	}
	sort.Strings(out)
	return out
}

// ControlClass is the class of the probes every case adds to check its prober.
const ControlClass = "control/node-pod/tcp"

// Controls are the probes every case adds to check its prober: a TCP connection from the node
// to every pod that is not held, which no policy may stop. When one fails, the case's
// "not delivered" outcomes mean nothing.
func Controls(t *Topology, m *Model) []*Probe {
	var out []*Probe
	for _, s := range t.Sandboxes {
		if m.Held(s.Key()) {
			continue
		}
		out = append(out, &Probe{Class: ControlClass, From: Endpoint{Role: RoleNode}, Src: t.Gateway4, Dst: s.Addrs[0],
			Proto: TCP, Port: t.TCPPorts[0], To: []Endpoint{{Role: RoleLocal, Sandbox: s.Key()}}})
	}
	return out
}
