package netpol

import (
	"net/netip"
	"testing"

	vnl "github.com/vishvananda/netlink"

	"github.com/kubenet-dev/kubenet/internal/policyrules"
)

func TestFlowJudge(t *testing.T) {
	addr := netip.MustParseAddr
	server := addr("10.3.0.2")  // isolated for ingress: TCP 8080 from client only
	client := addr("10.3.0.3")  // isolated for egress: TCP 8080 to server, UDP 53 anywhere
	open := addr("10.3.0.4")    // not isolated
	refused := addr("10.3.0.5") // isolated for ingress, nothing allowed, but its list was refused
	staged := addr("10.3.0.6")  // isolated both ways by staged (audit) policies only, nothing allowed
	node := addr("10.3.0.1")
	vip := addr("10.96.0.10")
	tcp8080 := &policyrules.Ports{Protocol: policyrules.TCP, First: 8080, Last: 8080}
	sctp := &policyrules.Ports{Protocol: policyrules.SCTP, First: 9000, Last: 9000}
	rs := policyrules.Ruleset{Pods: []policyrules.Pod{
		{Name: "a/server", Port: 2, IPs: []netip.Addr{server}, Ingress: policyrules.Direction{Isolated: true, Allow: []policyrules.Entry{
			{Peer: policyrules.Single(client), Ports: tcp8080}, {Peer: policyrules.Single(open), Ports: sctp}}}},
		{Name: "a/client", Port: 3, IPs: []netip.Addr{client}, Egress: policyrules.Direction{Isolated: true, Allow: []policyrules.Entry{
			{Peer: policyrules.Single(server), Ports: tcp8080},
			{Peer: policyrules.PrefixRange(netip.MustParsePrefix("0.0.0.0/0")), Ports: &policyrules.Ports{Protocol: policyrules.UDP, First: 53, Last: 53}}}}},
		{Name: "a/open", Port: 4, IPs: []netip.Addr{open}},
		{Name: "a/refused", Port: 5, IPs: []netip.Addr{refused}, Ingress: policyrules.Direction{Isolated: true}},
		{Name: "a/staged", Port: 6, IPs: []netip.Addr{staged}, Ingress: policyrules.Direction{Isolated: true, Audit: true},
			Egress: policyrules.Direction{Isolated: true, Audit: true}},
	}}
	applied := policyrules.Applied{Refused: []policyrules.Refusal{{Ingress: true, Pods: []string{"a/refused"}}}}
	j := newFlowJudge(rs, applied, []netip.Addr{node})
	// flow: origin → destination (what the originator sent to), answered by responder:port
	// (after DNAT), seen by the responder as coming from originSeen (after SNAT).
	flow := func(proto uint8, origin, dst netip.Addr, dport uint16, responder netip.Addr, rport uint16, originSeen netip.Addr) *vnl.ConntrackFlow {
		f := &vnl.ConntrackFlow{}
		f.Forward = vnl.IPTuple{Protocol: proto, SrcIP: origin.AsSlice(), DstIP: dst.AsSlice(), SrcPort: 40000, DstPort: dport}
		f.Reverse = vnl.IPTuple{Protocol: proto, SrcIP: responder.AsSlice(), DstIP: originSeen.AsSlice(), SrcPort: rport, DstPort: 40000}
		return f
	}
	direct := func(proto uint8, origin, responder netip.Addr, port uint16) *vnl.ConntrackFlow {
		return flow(proto, origin, responder, port, responder, port, origin)
	}
	tests := []struct {
		name string
		f    *vnl.ConntrackFlow
		want bool
	}{
		{"allowed both ways", direct(policyrules.TCP, client, server, 8080), false},
		{"ingress denies the port", direct(policyrules.TCP, open, server, 8080), true},
		{"egress denies the destination", direct(policyrules.TCP, client, open, 8080), true},
		{"egress allows UDP 53 anywhere", direct(policyrules.UDP, client, addr("192.0.2.1"), 53), false},
		{"egress denies ICMP", direct(1, client, addr("192.0.2.1"), 0), true},
		{"through a Service: judged after DNAT", flow(policyrules.TCP, client, vip, 80, server, 8080, client), false},
		{"through a Service to a denied port", flow(policyrules.TCP, open, vip, 80, server, 8080, open), true},
		{"masqueraded: allowed before SNAT keeps it", flow(policyrules.TCP, client, vip, 80, server, 8080, node), false},
		{"masqueraded: denied both before and after SNAT", flow(policyrules.TCP, open, vip, 80, server, 8080, node), true},
		{"the node's own connection", direct(policyrules.TCP, node, server, 22), false},
		{"an ingress-isolated pod opening to an open pod", direct(policyrules.TCP, server, open, 8080), false},
		{"refused list: kept", direct(policyrules.TCP, open, refused, 80), false},
		// Staged policies change no verdict: their pod's connections pass, and are not cut.
		{"audit ingress: kept", direct(policyrules.TCP, open, staged, 80), false},
		{"audit egress: kept", direct(policyrules.TCP, staged, open, 80), false},
		{"audit egress, enforced ingress of the peer: cut", direct(policyrules.TCP, staged, server, 80), true},
		{"SCTP: the allowed port", direct(policyrules.SCTP, open, server, 9000), false},
		{"SCTP: another port of the peer", direct(policyrules.SCTP, open, server, 9001), true},
		{"SCTP: no port allowed", direct(policyrules.SCTP, client, server, 9000), true},
		{"neither end a pod of the node", direct(policyrules.TCP, addr("192.0.2.1"), addr("192.0.2.2"), 80), false},
		{"not isolated pod to not isolated peer", direct(policyrules.TCP, open, addr("192.0.2.2"), 80), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := j.denies(tt.f); got != tt.want {
				t.Errorf("denies = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestFlowJudgeSharedAddress: an address two pods of the ruleset list cannot say whose
// connection an entry is (the kernel judges a pod by its port, which conntrack does not
// record): the entry is kept, whichever pod comes last, rather than judged by the other pod's
// policies.
func TestFlowJudgeSharedAddress(t *testing.T) {
	addr := netip.MustParseAddr
	shared, peer := addr("10.3.0.7"), addr("192.0.2.9")
	denyAll := policyrules.Pod{Name: "a/deny-all", Port: 7, IPs: []netip.Addr{shared}, Egress: policyrules.Direction{Isolated: true}, Ingress: policyrules.Direction{Isolated: true}}
	open := policyrules.Pod{Name: "a/open", Port: 8, IPs: []netip.Addr{shared}}
	for _, order := range [][]policyrules.Pod{{denyAll, open}, {open, denyAll}} {
		j := newFlowJudge(policyrules.Ruleset{Pods: order}, policyrules.Applied{}, nil)
		for _, f := range []*vnl.ConntrackFlow{tcpFlow(shared, peer, 443), tcpFlow(peer, shared, 80)} {
			if j.denies(f) {
				t.Errorf("pods %s, %s: %s → %s judged denied, want kept (either pod's)", order[0].Name, order[1].Name, addrOf(f.Forward.SrcIP), addrOf(f.Forward.DstIP))
			}
		}
	}
}

func tcpFlow(origin, responder netip.Addr, port uint16) *vnl.ConntrackFlow {
	f := &vnl.ConntrackFlow{}
	f.Forward = vnl.IPTuple{Protocol: policyrules.TCP, SrcIP: origin.AsSlice(), DstIP: responder.AsSlice(), SrcPort: 40000, DstPort: port}
	f.Reverse = vnl.IPTuple{Protocol: policyrules.TCP, SrcIP: responder.AsSlice(), DstIP: origin.AsSlice(), SrcPort: port, DstPort: 40000}
	return f
}
