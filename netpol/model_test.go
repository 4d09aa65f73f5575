package netpol

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/kubenet-dev/kubenet/internal/ipnet"
	"github.com/kubenet-dev/kubenet/internal/policyrules"
)

func r(s string) policyrules.Range {
	if p, err := netip.ParsePrefix(s); err == nil {
		return policyrules.PrefixRange(p)
	}
	return policyrules.Single(netip.MustParseAddr(s))
}

// canon is the group of allow, which must be within the limits.
func canon(t *testing.T, allow []policyrules.Entry) group {
	t.Helper()
	g, ok := canonical(allow, maxGroupCost)
	if !ok {
		t.Fatalf("canonical refused %d entries", len(allow))
	}
	return g
}

func tcp(first, last uint16) *policyrules.Ports {
	return &policyrules.Ports{Protocol: policyrules.TCP, First: first, Last: last}
}

func TestCanonical(t *testing.T) {
	cases := []struct {
		name  string
		allow []policyrules.Entry
		want  string
	}{
		{"nothing", nil, "nothing"},
		{"one pod any port", []policyrules.Entry{{Peer: r("10.0.0.5")}}, "10.0.0.5"},
		{"adjacent addresses stay hosts", []policyrules.Entry{{Peer: r("10.0.0.5")}, {Peer: r("10.0.0.6")}, {Peer: r("10.0.0.4")}}, "10.0.0.4, 10.0.0.5, 10.0.0.6"},
		{"adjacent ranges join", []policyrules.Entry{{Peer: r("10.0.0.4/31")}, {Peer: r("10.0.0.6/31")}}, "10.0.0.4-10.0.0.7"},
		{"host in a range dropped", []policyrules.Entry{{Peer: r("10.0.0.5")}, {Peer: r("10.0.0.0/24")}, {Peer: r("10.0.1.5")}}, "10.0.0.0-10.0.0.255, 10.0.1.5"},
		{"point of a host dropped", []policyrules.Entry{{Peer: r("10.0.0.5"), Ports: tcp(80, 80)}, {Peer: r("10.0.0.5")}}, "10.0.0.5"},
		{"point in a range of any port dropped", []policyrules.Entry{{Peer: r("10.0.0.5"), Ports: tcp(80, 80)}, {Peer: r("10.0.0.0/24")}}, "10.0.0.0-10.0.0.255"},
		{"point of another protocol kept", []policyrules.Entry{{Peer: r("10.0.0.5"), Ports: &policyrules.Ports{Protocol: policyrules.UDP, First: 80, Last: 80}}, {Peer: r("10.0.0.0/24"), Ports: tcp(1, 65535)}}, "10.0.0.0-10.0.0.255 tcp/1-65535, 10.0.0.5 udp/80"},
		{"overlapping prefixes join", []policyrules.Entry{{Peer: r("10.0.0.0/24")}, {Peer: r("10.0.0.128/25")}, {Peer: r("10.0.1.0/24")}}, "10.0.0.0-10.0.1.255"},
		{"families apart", []policyrules.Entry{{Peer: r("fd00::1")}, {Peer: r("10.0.0.1")}}, "10.0.0.1, fd00::1"},
		{"duplicate rule", []policyrules.Entry{{Peer: r("10.0.0.1"), Ports: tcp(80, 80)}, {Peer: r("10.0.0.1"), Ports: tcp(80, 80)}}, "10.0.0.1 tcp/80"},
		{"same port, peers stay points", []policyrules.Entry{{Peer: r("10.0.0.2"), Ports: tcp(80, 80)}, {Peer: r("10.0.0.1"), Ports: tcp(80, 80)}}, "10.0.0.1 tcp/80, 10.0.0.2 tcp/80"},
		{"same ports, peers join", []policyrules.Entry{{Peer: r("10.0.0.1"), Ports: tcp(80, 81)}, {Peer: r("10.0.0.2"), Ports: tcp(80, 81)}}, "10.0.0.1-10.0.0.2 tcp/80-81"},
		{"overlapping port ranges cut into disjoint boxes", []policyrules.Entry{
			{Peer: r("10.0.0.1"), Ports: tcp(80, 90)},
			{Peer: r("10.0.0.2"), Ports: tcp(85, 95)},
		}, "10.0.0.1 tcp/80-84, 10.0.0.1-10.0.0.2 tcp/85-90, 10.0.0.2 tcp/91-95"},
		{"contained range", []policyrules.Entry{
			{Peer: r("10.0.0.1"), Ports: tcp(1, 65535)},
			{Peer: r("10.0.0.1"), Ports: tcp(443, 443)},
		}, "10.0.0.1 tcp/1-65535"},
		{"protocols apart", []policyrules.Entry{
			{Peer: r("10.0.0.1"), Ports: &policyrules.Ports{Protocol: policyrules.UDP, First: 53, Last: 53}},
			{Peer: r("10.0.0.1"), Ports: tcp(53, 53)},
		}, "10.0.0.1 tcp/53, 10.0.0.1 udp/53"},
		{"invalid peer and inverted ports dropped", []policyrules.Entry{
			{Peer: policyrules.Range{First: netip.MustParseAddr("10.0.0.9"), Last: netip.MustParseAddr("10.0.0.1")}},
			{Peer: policyrules.Range{First: netip.MustParseAddr("10.0.0.1"), Last: netip.MustParseAddr("fd00::1")}},
			{Peer: r("10.0.0.1"), Ports: tcp(90, 80)},
		}, "nothing"},
		{"whole address space", []policyrules.Entry{{Peer: r("0.0.0.0/0")}, {Peer: r("::/0")}}, "0.0.0.0-255.255.255.255, ::-ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := canon(t, tc.allow).String(); got != tc.want {
				t.Errorf("canonical = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestGroupNames shows that equal allow lists share a group whatever their order, and that any
// difference is a new group.
func TestGroupNames(t *testing.T) {
	a := []policyrules.Entry{{Peer: r("10.0.0.1"), Ports: tcp(80, 80)}, {Peer: r("10.0.0.2")}}
	b := []policyrules.Entry{{Peer: r("10.0.0.2")}, {Peer: r("10.0.0.1"), Ports: tcp(80, 80)}, {Peer: r("10.0.0.2")}}
	if canon(t, a).name(ingressDir) != canon(t, b).name(ingressDir) {
		t.Error("equal allow lists got different groups")
	}
	if canon(t, a).name(ingressDir) == canon(t, a).name(egressDir) {
		t.Error("ingress and egress share a group name")
	}
	c := []policyrules.Entry{{Peer: r("10.0.0.1"), Ports: tcp(81, 81)}, {Peer: r("10.0.0.2")}}
	if canon(t, a).name(ingressDir) == canon(t, c).name(ingressDir) {
		t.Error("different allow lists share a group")
	}
	if canon(t, nil).name(ingressDir) == canon(t, []policyrules.Entry{{Peer: r("10.0.0.1")}}).name(ingressDir) {
		t.Error("deny-all shares a group with an allow")
	}
}

func TestPlan(t *testing.T) {
	deny := policyrules.Direction{Isolated: true}
	rs := policyrules.Ruleset{Pods: []policyrules.Pod{
		{Port: 11, IPs: []netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("fd00::1")}, Ingress: deny},
		{Port: 12, IPs: []netip.Addr{netip.MustParseAddr("10.0.0.2")}, Ingress: deny, Egress: deny},
		{Port: 13, IPs: []netip.Addr{netip.MustParseAddr("10.0.0.3")}},
		{Port: 0, Ingress: deny}, // no port: nothing to dispatch by
	}}
	d := plan(rs, newGroupMemo())
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
		in   []policyrules.Range
		cut  string
		want string
	}{
		{"the gateway out of a pod CIDR", []policyrules.Range{r("10.3.0.0/24")}, "10.3.0.1", "[10.3.0.0 10.3.0.2-10.3.0.255]"},
		{"the first address", []policyrules.Range{r("10.3.0.0/24")}, "10.3.0.0", "[10.3.0.1-10.3.0.255]"},
		{"the last address", []policyrules.Range{r("fd00:3::/127")}, "fd00:3::1", "[fd00:3::]"},
		{"the only address", []policyrules.Range{r("10.3.0.9")}, "10.3.0.9", "[]"},
		{"outside", []policyrules.Range{r("10.3.0.0/24")}, "10.4.0.1", "[10.3.0.0-10.3.0.255]"},
		{"the other family", []policyrules.Range{r("10.3.0.0/24")}, "fd00::1", "[10.3.0.0-10.3.0.255]"},
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
	var allow []policyrules.Entry
	for i := range 1000 {
		a := netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)})
		for j := range 200 {
			allow = append(allow, policyrules.Entry{Peer: policyrules.Single(a), Ports: tcp(uint16(1000+2*j), uint16(1000+2*j))})
		}
	}
	for b.Loop() {
		if g, _ := canonical(allow, maxGroupCost); len(g.ports4) != 200 {
			b.Fatalf("%d boxes, want 200 (one per port, the peers merged)", len(g.ports4))
		}
	}
}

// TestPlanEqualLists: allow lists equal by value (their ports apart in memory) share a group,
// lists that differ in one port do not, whichever the plan meets first.
func TestPlanEqualLists(t *testing.T) {
	list := func(port uint16) policyrules.Direction {
		d := policyrules.Direction{Isolated: true}
		for i := range 1000 {
			d.Allow = append(d.Allow, policyrules.Entry{Peer: policyrules.Single(netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)})), Ports: tcp(80, 80)})
		}
		d.Allow[999].Ports = tcp(port, port)
		return d
	}
	d := plan(policyrules.Ruleset{Pods: []policyrules.Pod{{Port: 1, Ingress: list(80)}, {Port: 2, Ingress: list(81)}, {Port: 3, Ingress: list(80)}, {Port: 4, Egress: list(81)}}}, newGroupMemo())
	in := d.maps[MapIngress]
	if in[1] != in[3] || in[1] == in[2] || len(d.groups) != 3 {
		t.Errorf("ingress chains %v and %d groups: want ports 1 and 3 in one group, 2 in another, 4's egress a third", in, len(d.groups))
	}
	for name, g := range d.groups {
		if want, _ := canonical(map[string][]policyrules.Entry{in[1]: list(80).Allow, in[2]: list(81).Allow, d.maps[MapEgress][4]: list(81).Allow}[name], maxGroupCost); g.group.String() != want.String() {
			t.Errorf("group %s is not the canonical form of its list", name)
		}
	}
}

// TestGroupMemoAcrossPasses: a memo kept from pass to pass computes a list's group once while
// passes keep it, gives the same plan as a fresh memo, keeps only the last pass's lists, and a
// caller that changes its list after a pass changes nothing the memo holds.
func TestGroupMemoAcrossPasses(t *testing.T) {
	list := func(ports ...uint16) policyrules.Direction {
		d := policyrules.Direction{Isolated: true}
		for _, p := range ports {
			d.Allow = append(d.Allow, policyrules.Entry{Peer: policyrules.Single(netip.AddrFrom4([4]byte{10, 1, 0, byte(p)})), Ports: tcp(p, p)})
		}
		return d
	}
	passes := [][]policyrules.Pod{
		{{Port: 1, Ingress: list(80, 81)}, {Port: 2, Ingress: list(82)}, {Port: 3, Egress: list(80, 81)}, {Port: 4, Ingress: list(81, 80)}},
		{{Port: 1, Ingress: list(80, 81)}, {Port: 2, Ingress: list(83)}},
		{{Port: 1, Ingress: list(84)}},
		{},
	}
	memo := newGroupMemo()
	var kept *memoGroup
	for i, pods := range passes {
		rs := policyrules.Ruleset{Pods: pods}
		got, want := plan(rs, memo), plan(rs, newGroupMemo())
		if i == 1 {
			// Port 1's list is the same as in pass 0: the memo's entry, computed once.
			if g, _ := memo.of(list(80, 81).Allow); g != kept {
				t.Errorf("pass 1: the list of pass 0 was computed again")
			}
		}
		memo.sweep()
		if !maps.Equal(got.maps[MapIngress], want.maps[MapIngress]) || !maps.Equal(got.maps[MapEgress], want.maps[MapEgress]) || !slices.Equal(slices.Sorted(maps.Keys(got.groups)), slices.Sorted(maps.Keys(want.groups))) {
			t.Errorf("pass %d: with the kept memo %v %v, with a fresh one %v %v", i, got.maps, slices.Collect(maps.Keys(got.groups)), want.maps, slices.Collect(maps.Keys(want.groups)))
		}
		distinct := map[string]bool{}
		for _, p := range pods {
			for _, d := range []policyrules.Direction{p.Ingress, p.Egress} {
				if d.Isolated {
					distinct[fmt.Sprint(d.Allow)] = true
				}
			}
		}
		if memo.size() != len(distinct) {
			t.Errorf("pass %d: the memo holds %d lists, want the pass's %d", i, memo.size(), len(distinct))
		}
		for name := range got.groups {
			if _, ok := memo.named(name); !ok {
				t.Errorf("pass %d: the memo does not know group %s of the pass", i, name)
			}
		}
		if i == 0 {
			kept, _ = memo.of(pods[0].Ingress.Allow)
			pods[0].Ingress.Allow[0].Ports.First = 1 // the caller reuses its list
		}
	}
}

// prefixesBrute splits r into prefixes the slow way: from its first address, the shortest prefix
// that starts there and ends within r, again and again.
func prefixesBrute(r policyrules.Range) int {
	n := 0
	for a := r.First; ; {
		var p netip.Prefix
		for bits := 0; bits <= a.BitLen(); bits++ {
			if p = netip.PrefixFrom(a, bits); p.Masked().Addr() == a && ipnet.Last(p).Compare(r.Last) <= 0 {
				break
			}
		}
		n++
		next := ipnet.Last(p).Next()
		if ipnet.Last(p) == r.Last || !next.IsValid() {
			return n
		}
		a = next
	}
}

func TestPrefixCount(t *testing.T) {
	cases := []struct {
		r    policyrules.Range
		want int
	}{
		{r("10.0.0.1"), 1},
		{r("10.0.0.0/8"), 1},
		{r("0.0.0.0/0"), 1},
		{r("::/0"), 1},
		{policyrules.Range{First: netip.MustParseAddr("10.0.0.1"), Last: netip.MustParseAddr("10.0.0.6")}, 4}, // .1, .2/31, .4/31, .6
		{policyrules.Range{First: netip.MustParseAddr("0.0.0.1"), Last: netip.MustParseAddr("255.255.255.254")}, 62},
		{policyrules.Range{First: netip.MustParseAddr("::1"), Last: netip.MustParseAddr("ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe")}, 254},
		{policyrules.Range{First: netip.MustParseAddr("::1"), Last: netip.MustParseAddr("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff")}, 128},
	}
	for _, tc := range cases {
		if got := prefixCount(tc.r); got != tc.want {
			t.Errorf("prefixCount(%s) = %d, want %d", tc.r, got, tc.want)
		}
		if got := prefixesBrute(tc.r); got != tc.want {
			t.Errorf("prefixesBrute(%s) = %d, want %d", tc.r, got, tc.want)
		}
	}
	rng := rand.New(rand.NewPCG(3, 5))
	for i := range 2000 {
		var a, b netip.Addr
		if i%2 == 0 {
			a, b = netip.AddrFrom4([4]byte{10, byte(rng.IntN(4)), byte(rng.IntN(256)), byte(rng.IntN(256))}), netip.AddrFrom4([4]byte{10, byte(rng.IntN(4)), byte(rng.IntN(256)), byte(rng.IntN(256))})
		} else {
			var x, y [16]byte
			for j := range x {
				x[j], y[j] = byte(rng.IntN(256)), byte(rng.IntN(256))
			}
			x[0], y[0] = 0x20, 0x20+byte(rng.IntN(2))
			a, b = netip.AddrFrom16(x), netip.AddrFrom16(y)
		}
		if b.Less(a) {
			a, b = b, a
		}
		if got, want := prefixCount(policyrules.Range{First: a, Last: b}), prefixesBrute(policyrules.Range{First: a, Last: b}); got != want {
			t.Fatalf("prefixCount(%s-%s) = %d, brute force %d", a, b, got, want)
		}
	}
}

// TestPlanLimits: plan refuses an allow list longer than MaxAllowEntries, a group whose sets
// would cost more than maxGroupCost or need more elements than that, and, cheapest first, the
// groups past maxNodeCost together; the refused pods keep what they have in that direction, and
// every other pod is planned as usual.
func TestPlanLimits(t *testing.T) {
	// A /48 without its first and last address splits into many prefixes.
	wide := func(i, j int) policyrules.Entry {
		first := netip.AddrFrom16([16]byte{0x20, 0x01, byte(i), byte(i >> 8), byte(j), byte(j >> 8), 15: 1})
		last := netip.AddrFrom16([16]byte{0x20, 0x01, byte(i), byte(i >> 8), byte(j), byte(j >> 8), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe})
		return policyrules.Entry{Peer: policyrules.Range{First: first, Last: last}, Ports: tcp(80, 80)}
	}
	perRange := rangeCost(wide(0, 0).Peer)
	isolated := func(allow []policyrules.Entry) policyrules.Direction {
		return policyrules.Direction{Isolated: true, Allow: allow}
	}
	long := make([]policyrules.Entry, policyrules.MaxAllowEntries+1)
	for i := range long {
		long[i] = policyrules.Entry{Peer: policyrules.Single(netip.MustParseAddr("10.0.0.1")), Ports: tcp(80, 80)}
	}
	var costly, grid []policyrules.Entry
	for j := range maxGroupCost/perRange + 1 {
		costly = append(costly, wide(1, j))
	}
	for i := range 600 { // address bars on every port, every address on 600 single ports
		grid = append(grid, policyrules.Entry{Peer: policyrules.Single(netip.AddrFrom4([4]byte{10, 1, byte(i >> 7), byte(2 * (i & 127))})), Ports: tcp(1, 60000)},
			policyrules.Entry{Peer: r("0.0.0.0/0"), Ports: tcp(uint16(2+2*i), uint16(2+2*i))})
	}
	rs := policyrules.Ruleset{Pods: []policyrules.Pod{
		{Port: 1, Name: "long", Ingress: isolated(long)},
		{Port: 2, Name: "costly", Ingress: isolated(costly)},
		{Port: 3, Name: "grid", Egress: isolated(grid)},
		{Port: 4, Name: "small", Ingress: isolated([]policyrules.Entry{{Peer: r("10.0.0.1"), Ports: tcp(80, 80)}})},
	}}
	// Five groups just under the limit each: four fit the node, the costliest does not.
	for g := range 5 {
		var allow []policyrules.Entry
		for j := range maxGroupCost*15/16/perRange + g {
			allow = append(allow, wide(10+g, j))
		}
		rs.Pods = append(rs.Pods, policyrules.Pod{Port: 10 + g, Name: fmt.Sprint("big", g), Ingress: isolated(allow)})
	}
	d := plan(rs, newGroupMemo())
	refused := map[string]policyrules.Refusal{}
	for _, r := range d.refused {
		if !errors.Is(r.Err, policyrules.ErrTooBig) || len(r.Pods) != 1 {
			t.Errorf("refusal %+v, want one pod's, too big", r)
		}
		refused[r.Pods[0]] = r
	}
	for _, want := range []struct {
		pod   string
		port  int
		m     string
		group bool // refused after its group was built (it has a name and a cost)
	}{
		{"long", 1, MapIngress, false}, {"costly", 2, MapIngress, true}, {"grid", 3, MapEgress, false}, {"big4", 14, MapIngress, true},
	} {
		r, ok := refused[want.pod]
		switch {
		case !ok:
			t.Errorf("%s not refused", want.pod)
		case (r.Group != "") != want.group || (r.Cost > 0) != want.group:
			t.Errorf("%s: refusal %+v, group named and counted: %v", want.pod, r, want.group)
		case !d.keep[want.m][want.port] || d.maps[want.m][want.port] != "":
			t.Errorf("%s: %s element %q, kept %v; want what it has kept", want.pod, want.m, d.maps[want.m][want.port], d.keep[want.m][want.port])
		}
	}
	if len(d.refused) != 4 {
		t.Errorf("%d refusals, want 4: %v", len(d.refused), d.refused)
	}
	if len(d.groups) != 5 || d.maps[MapIngress][4] == "" || d.maps[MapIngress][13] == "" || d.maps[MapEgress][3] != "" {
		t.Errorf("groups %d (want small's and big0-3's), maps %v", len(d.groups), d.maps)
	}
	if c := refused["costly"].Cost; c <= maxGroupCost {
		t.Errorf("costly's cost %d, want over %d", c, maxGroupCost)
	}
}

// TestCanonicalMeansTheList: for random allow lists over a few addresses of each family, a few
// protocols and the edge ports (0, 65535), the canonical group — hosts, points, ranges, after
// the singles a range covers are dropped — allows exactly what the list allows, and its sets'
// elements, decoded kind by kind as Inspect reads them, give its name back (no false damage).
func TestCanonicalMeansTheList(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	addrs := func(is6 bool) []netip.Addr {
		a := netip.MustParseAddr("10.0.0.0")
		if is6 {
			a = netip.MustParseAddr("fd00::")
		}
		out := []netip.Addr{a}
		for range 7 {
			a = a.Next()
			out = append(out, a)
		}
		return out
	}
	v4, v6 := addrs(false), addrs(true)
	protocols := []uint8{policyrules.TCP, policyrules.UDP}
	ports := []uint16{0, 1, 79, 80, 81, 65534, 65535}
	for i := range 3000 {
		var allow []policyrules.Entry
		for range 1 + rng.IntN(6) {
			pool := v4
			if rng.IntN(2) == 0 {
				pool = v6
			}
			first := rng.IntN(len(pool))
			last := first
			if rng.IntN(3) == 0 {
				last = first + rng.IntN(len(pool)-first)
			}
			e := policyrules.Entry{Peer: policyrules.Range{First: pool[first], Last: pool[last]}}
			if rng.IntN(3) > 0 {
				p := &policyrules.Ports{Protocol: protocols[rng.IntN(len(protocols))], First: ports[rng.IntN(len(ports))]}
				p.Last = p.First
				if rng.IntN(3) == 0 {
					p.Last = ports[rng.IntN(len(ports))]
				}
				e.Ports = p
			}
			allow = append(allow, e)
		}
		g := canon(t, allow)
		list := policyrules.Direction{Isolated: true, Allow: allow}
		installed := policyrules.Direction{Isolated: true, Allow: g.entries()}
		for _, a := range slices.Concat(v4, v6) {
			for _, proto := range protocols {
				for _, port := range ports {
					if list.Allows(a, proto, port) != installed.Allows(a, proto, port) {
						t.Fatalf("list %d %v: %s %d/%d allowed %v by the list, %v by its group %s", i, allow, a, proto, port,
							list.Allows(a, proto, port), installed.Allows(a, proto, port), g)
					}
				}
			}
		}
		var back group
		var ranges []policyrules.Entry
		for _, s := range groupSets(BridgeTable("t"), "g0", g, true) {
			kind := setKindOf(s.set.Name)
			for _, el := range s.elements {
				e, err := decodeElement(el, strings.HasSuffix(s.set.Name, "-ipv6"), kind)
				if err != nil {
					t.Fatalf("list %d %v: set %s: %v", i, allow, s.set.Name, err)
				}
				if kind == kindHosts || kind == kindPoints {
					back.add(kind, e)
				} else {
					ranges = append(ranges, e)
				}
			}
		}
		back.setRanges(ranges, maxGroupCost)
		back.sortSingles()
		if back.name(ingressDir) != g.name(ingressDir) {
			t.Fatalf("list %d %v: group %s read back as %s", i, allow, g, back)
		}
	}
}

// TestPlanClusterWidePeers: a policy that lets every pod of a big dual-stack cluster in (a
// namespaceSelector of {}: 60 000 pods, each a host of both families, the usual peers) fits
// the group limit, as it did when neighbouring pods merged into a few ranges: a hash set's
// element is one key, whatever its family, not the prefixes an interval set splits a range into.
func TestPlanClusterWidePeers(t *testing.T) {
	var allow []policyrules.Entry
	v4, v6 := netip.MustParseAddr("10.0.0.0"), netip.MustParseAddr("fd00::")
	for range 60000 {
		v4, v6 = v4.Next(), v6.Next()
		allow = append(allow, policyrules.Entry{Peer: policyrules.Single(v4)}, policyrules.Entry{Peer: policyrules.Single(v6)})
	}
	rs := policyrules.Ruleset{Pods: []policyrules.Pod{{Port: 1, Name: "server", Ingress: policyrules.Direction{Isolated: true, Allow: allow}}}}
	d := plan(rs, newGroupMemo())
	if len(d.refused) > 0 {
		t.Fatalf("refused: %+v", d.refused)
	}
	if len(d.groups) != 1 {
		t.Fatalf("%d groups, want 1", len(d.groups))
	}
}
