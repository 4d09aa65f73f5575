package netpol

import (
	"fmt"
	"net/netip"
	"testing"
)

func r(s string) Range {
	if p, err := netip.ParsePrefix(s); err == nil {
		return PrefixRange(p)
	}
	return Single(netip.MustParseAddr(s))
}

func tcp(first, last uint16) *Ports { return &Ports{Protocol: TCP, First: first, Last: last} }

func TestCanonical(t *testing.T) {
	cases := []struct {
		name  string
		allow []Entry
		want  string
	}{
		{"nothing", nil, "nothing"},
		{"one pod any port", []Entry{{Peer: r("10.0.0.5")}}, "10.0.0.5"},
		{"adjacent addresses join", []Entry{{Peer: r("10.0.0.5")}, {Peer: r("10.0.0.6")}, {Peer: r("10.0.0.4")}}, "10.0.0.4-10.0.0.6"},
		{"overlapping prefixes join", []Entry{{Peer: r("10.0.0.0/24")}, {Peer: r("10.0.0.128/25")}, {Peer: r("10.0.1.0/24")}}, "10.0.0.0-10.0.1.255"},
		{"families apart", []Entry{{Peer: r("fd00::1")}, {Peer: r("10.0.0.1")}}, "10.0.0.1, fd00::1"},
		{"duplicate rule", []Entry{{Peer: r("10.0.0.1"), Ports: tcp(80, 80)}, {Peer: r("10.0.0.1"), Ports: tcp(80, 80)}}, "10.0.0.1 tcp/80"},
		{"same port, peers join", []Entry{{Peer: r("10.0.0.1"), Ports: tcp(80, 80)}, {Peer: r("10.0.0.2"), Ports: tcp(80, 80)}}, "10.0.0.1-10.0.0.2 tcp/80"},
		{"overlapping port ranges cut into disjoint boxes", []Entry{
			{Peer: r("10.0.0.1"), Ports: tcp(80, 90)},
			{Peer: r("10.0.0.2"), Ports: tcp(85, 95)},
		}, "10.0.0.1 tcp/80-84, 10.0.0.1-10.0.0.2 tcp/85-90, 10.0.0.2 tcp/91-95"},
		{"contained range", []Entry{
			{Peer: r("10.0.0.1"), Ports: tcp(1, 65535)},
			{Peer: r("10.0.0.1"), Ports: tcp(443, 443)},
		}, "10.0.0.1 tcp/1-65535"},
		{"protocols apart", []Entry{
			{Peer: r("10.0.0.1"), Ports: &Ports{Protocol: UDP, First: 53, Last: 53}},
			{Peer: r("10.0.0.1"), Ports: tcp(53, 53)},
		}, "10.0.0.1 tcp/53, 10.0.0.1 udp/53"},
		{"invalid peer and inverted ports dropped", []Entry{
			{Peer: Range{netip.MustParseAddr("10.0.0.9"), netip.MustParseAddr("10.0.0.1")}},
			{Peer: Range{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("fd00::1")}},
			{Peer: r("10.0.0.1"), Ports: tcp(90, 80)},
		}, "nothing"},
		{"whole address space", []Entry{{Peer: r("0.0.0.0/0")}, {Peer: r("::/0")}}, "0.0.0.0-255.255.255.255, ::-ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := canonical(tc.allow).String(); got != tc.want {
				t.Errorf("canonical = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestGroupNames shows that equal allow lists share a group whatever their order, and that any
// difference is a new group.
func TestGroupNames(t *testing.T) {
	a := []Entry{{Peer: r("10.0.0.1"), Ports: tcp(80, 80)}, {Peer: r("10.0.0.2")}}
	b := []Entry{{Peer: r("10.0.0.2")}, {Peer: r("10.0.0.1"), Ports: tcp(80, 80)}, {Peer: r("10.0.0.2")}}
	if canonical(a).name(ingressDir) != canonical(b).name(ingressDir) {
		t.Error("equal allow lists got different groups")
	}
	if canonical(a).name(ingressDir) == canonical(a).name(egressDir) {
		t.Error("ingress and egress share a group name")
	}
	c := []Entry{{Peer: r("10.0.0.1"), Ports: tcp(81, 81)}, {Peer: r("10.0.0.2")}}
	if canonical(a).name(ingressDir) == canonical(c).name(ingressDir) {
		t.Error("different allow lists share a group")
	}
	if canonical(nil).name(ingressDir) == canonical([]Entry{{Peer: r("10.0.0.1")}}).name(ingressDir) {
		t.Error("deny-all shares a group with an allow")
	}
}

func TestPlan(t *testing.T) {
	deny := Direction{Isolated: true}
	rs := Ruleset{Pods: []Pod{
		{Port: 11, IPs: []netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("fd00::1")}, Ingress: deny},
		{Port: 12, IPs: []netip.Addr{netip.MustParseAddr("10.0.0.2")}, Ingress: deny, Egress: deny},
		{Port: 13, IPs: []netip.Addr{netip.MustParseAddr("10.0.0.3")}},
		{Port: 0, Ingress: deny}, // no port: nothing to dispatch by
	}}
	d := plan(rs)
	if len(d.groups) != 2 {
		t.Errorf("groups = %d, want 2 (deny-all ingress shared by a and b, deny-all egress)", len(d.groups))
	}
	want := map[string]map[int]string{
		MapIngress: {11: "in-", 12: "in-", 13: ChainAllowIngress},
		MapEgress:  {11: ChainAllowEgress, 12: "out-", 13: ChainAllowEgress},
	}
	for m, ports := range want {
		if len(d.maps[m]) != len(ports) {
			t.Errorf("%s has %d elements, want %d: %v", m, len(d.maps[m]), len(ports), d.maps[m])
		}
		for port, prefix := range ports {
			if got := d.maps[m][port]; got == "" || got[:min(len(got), len(prefix))] != prefix {
				t.Errorf("%s[%d] = %q, want %q…", m, port, got, prefix)
			}
		}
	}
	if d.maps[MapIngress][11] != d.maps[MapIngress][12] {
		t.Error("a and b with equal ingress got different chains")
	}
}

func TestWithoutAddr(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []Range
		cut  string
		want string
	}{
		{"the gateway out of a pod CIDR", []Range{r("10.3.0.0/24")}, "10.3.0.1", "[10.3.0.0 10.3.0.2-10.3.0.255]"},
		{"the first address", []Range{r("10.3.0.0/24")}, "10.3.0.0", "[10.3.0.1-10.3.0.255]"},
		{"the last address", []Range{r("fd00:3::/127")}, "fd00:3::1", "[fd00:3::]"},
		{"the only address", []Range{r("10.3.0.9")}, "10.3.0.9", "[]"},
		{"outside", []Range{r("10.3.0.0/24")}, "10.4.0.1", "[10.3.0.0-10.3.0.255]"},
		{"the other family", []Range{r("10.3.0.0/24")}, "fd00::1", "[10.3.0.0-10.3.0.255]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := fmt.Sprint(withoutAddr(tc.in, netip.MustParseAddr(tc.cut))); got != tc.want {
				t.Errorf("withoutAddr(%v, %s) = %s, want %s", tc.in, tc.cut, got, tc.want)
			}
		})
	}
}

// BenchmarkCanonicalWide: one allow list of 1000 peers on 200 ports, each peer on every port (a
// podSelector of many pods with a long ports list): 200 000 entries.
func BenchmarkCanonicalWide(b *testing.B) {
	var allow []Entry
	for i := range 1000 {
		a := netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)})
		for j := range 200 {
			allow = append(allow, Entry{Peer: Single(a), Ports: tcp(uint16(1000+2*j), uint16(1000+2*j))})
		}
	}
	for b.Loop() {
		if g := canonical(allow); len(g.ports4) != 200 {
			b.Fatalf("%d boxes, want 200 (one per port, the peers merged)", len(g.ports4))
		}
	}
}
