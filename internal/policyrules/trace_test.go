package policyrules

import (
	"net/netip"
	"strings"
	"testing"
)

func TestTrace(t *testing.T) {
	addr := netip.MustParseAddr
	a4, a6, b4, b6 := addr("10.3.0.2"), addr("fd00:3::2"), addr("10.3.0.3"), addr("fd00:3::3")
	http := &Ports{Protocol: TCP, First: 8000, Last: 8080}
	in := Installed{
		Tables: true,
		Ports: map[int]InstalledPort{
			10: {Egress: "out-a", Ingress: AllowIngress, Sources: []netip.Addr{a4, a6}},
			11: {Egress: AllowEgress, Ingress: "in-b", Sources: []netip.Addr{b4, b6}},
			12: {Sources: []netip.Addr{addr("10.3.0.4")}}, // held
		},
		Groups: map[string]InstalledGroup{
			"out-a": {Name: "out-a", Entries: []Entry{
				{Peer: Range{First: addr("192.0.2.0"), Last: addr("192.0.2.255")}},
				{Peer: Single(b4), Ports: http},
				{Peer: Single(b6), Ports: &Ports{Protocol: UDP, First: 53, Last: 53}},
			}},
			"in-b": {Name: "in-b", Ingress: true, Entries: []Entry{
				{Peer: Single(a4), Ports: http},
				{Peer: Range{First: addr("fd00:3::"), Last: addr("fd00:3::ff")}},
			}},
		},
		LocalPods: []Range{{First: addr("10.3.0.2"), Last: addr("10.3.0.255")}},
	}
	cases := []struct {
		name             string
		p                Packet
		srcPort, dstPort int
		allowed          bool
		reasons          []string // one per step, a substring each
	}{
		{"both groups match", Packet{a4, b4, TCP, 8080, false}, 10, 11, true,
			[]string{"group out-a allows it: element 10.3.0.3 tcp/8000-8080", "group in-b allows it: element 10.3.0.2 tcp/8000-8080"}},
		{"port past the range", Packet{a4, b4, TCP, 8081, false}, 10, 11, false,
			[]string{"no element of group out-a matches 10.3.0.3 tcp/8081: dropped by its last rule", "no element of group in-b matches 10.3.0.2 tcp/8081"}},
		{"other protocol on the port", Packet{a4, b4, UDP, 8080, false}, 10, 11, false,
			[]string{"no element of group out-a matches 10.3.0.3 udp/8080", "no element of group in-b"}},
		{"ICMP to an any-port range", Packet{a4, addr("192.0.2.77"), ICMP, 0, false}, 10, 0, true,
			[]string{"element 192.0.2.0-192.0.2.255 (every protocol and port)"}},
		{"ICMP where only ports are allowed", Packet{a4, b4, ICMP, 0, false}, 10, 11, false,
			[]string{"no element of group out-a matches 10.3.0.3 icmp", "no element of group in-b matches 10.3.0.2 icmp"}},
		{"IPv6: egress by ports, ingress by range", Packet{a6, b6, UDP, 53, false}, 10, 11, true,
			[]string{"element fd00:3::3 udp/53", "element fd00:3::-fd00:3::ff (every protocol and port)"}},
		{"IPv6 peer out of the range family-wise", Packet{a6, b6, TCP, 8080, false}, 10, 11, false,
			[]string{"no element of group out-a matches fd00:3::3 tcp/8080", "fd00:3::-fd00:3::ff"}},
		{"not isolated both ways", Packet{b4, a4, TCP, 1, false}, 11, 10, true,
			[]string{"not isolated for egress (allow-egress)", "not isolated for ingress (allow-ingress)"}},
		{"held sender", Packet{addr("10.3.0.4"), a4, TCP, 1, false}, 12, 10, false,
			[]string{"port 12 has no element in egress-ports: held", "not isolated for ingress"}},
		{"held receiver", Packet{a4, addr("10.3.0.4"), TCP, 8080, false}, 0, 12, false,
			[]string{"port 12 has no element in ingress-ports: held"}},
		{"a source the port may not use", Packet{b4, a4, TCP, 1, false}, 10, 0, false,
			[]string{"10.3.0.3 is not an address port 10 may send from (egress-sources-ipv4)"}},
		{"an outside peer allowed by range", Packet{addr("fd00:3::99"), b6, SCTP, 9, false}, 0, 11, true,
			[]string{"element fd00:3::-fd00:3::ff"}},
		{"the node to an isolated pod", Packet{Src: addr("10.3.0.1"), Dst: b4, Protocol: TCP, Port: 22, FromNode: true}, 0, 11, true,
			[]string{"the node's own packets reach every pod that is not held"}},
		{"the node to a held pod", Packet{Src: addr("10.3.0.1"), Dst: addr("10.3.0.4"), Protocol: TCP, Port: 22, FromNode: true}, 0, 12, false,
			[]string{"port 12 has no element in ingress-ports: held"}},
		{"a local pod's address routed in from outside", Packet{addr("10.3.0.9"), a4, TCP, 1, false}, 0, 10, false,
			[]string{"only the node's pods have (local-pods-ipv4)"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v, err := in.Trace(c.p, c.srcPort, c.dstPort)
			if err != nil {
				t.Fatal(err)
			}
			if v.Allowed != c.allowed {
				t.Errorf("allowed %v, want %v: %+v", v.Allowed, c.allowed, v.Steps)
			}
			if len(v.Steps) != len(c.reasons) {
				t.Fatalf("%d steps, want %d: %+v", len(v.Steps), len(c.reasons), v.Steps)
			}
			for i, s := range v.Steps {
				if !strings.Contains(s.Reason, c.reasons[i]) {
					t.Errorf("step %d: %q, want it to say %q", i, s.Reason, c.reasons[i])
				}
			}
		})
	}
	held := Installed{}
	v, err := held.Trace(Packet{a4, b4, TCP, 80, false}, 10, 11)
	if err != nil || v.Allowed || !strings.Contains(v.Steps[0].Reason, "no policy tables") {
		t.Errorf("without tables: %+v, %v; want denied, saying there are no tables", v, err)
	}
	for _, bad := range []struct {
		p                Packet
		srcPort, dstPort int
		want             string
	}{
		{Packet{a4, b6, TCP, 80, false}, 10, 11, "different families"},
		{Packet{a4, b4, TCP, 80, false}, 0, 0, "neither end"},
		{Packet{Dst: b4}, 10, 0, "source and a destination"},
	} {
		if _, err := in.Trace(bad.p, bad.srcPort, bad.dstPort); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("Trace(%+v): %v, want an error saying %q", bad.p, err, bad.want)
		}
	}
}
