package agent

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"

	"github.com/kubenet-dev/kubenet/agent/routes"
)

func mustPrefixes(s ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(s))
	for i, p := range s {
		out[i] = netip.MustParsePrefix(p)
	}
	return out
}

// TestOwnPodCIDRs: the node's own pod CIDRs get a conflist only when every one passes every
// rule; the error names each reason.
func TestOwnPodCIDRs(t *testing.T) {
	rules := CIDRRules{
		Cluster:  mustPrefixes("10.244.0.0/16", "fd00:10:244::/48"),
		Services: mustPrefixes("10.96.0.0/12"),
		Networks: []routes.Network{{Prefix: netip.MustParsePrefix("10.244.200.0/24"), Source: "route 10.244.200.0/24 dev eth1"}},
	}
	peer := node("peer", []string{"10.244.2.0/24"}, "192.168.1.2")
	tests := []struct {
		name    string
		self    *corev1.Node
		rules   CIDRRules
		want    []string
		wantErr []string // substrings
	}{
		{name: "dual-stack inside the cluster CIDRs", self: node("a", []string{"10.244.1.0/24", "fd00:10:244:1::/64"}), rules: rules, want: []string{"10.244.1.0/24", "fd00:10:244:1::/64"}},
		{name: "no pod CIDR yet: none, no error", self: node("a", nil), rules: rules},
		{name: "our own node not in the API", rules: rules},
		{name: "no rules known: anything that is not special", self: node("a", []string{"172.16.0.0/24"}), want: []string{"172.16.0.0/24"}},
		{name: "outside the cluster CIDR", self: node("a", []string{"10.245.1.0/24"}), rules: rules, wantErr: []string{"pod CIDR 10.245.1.0/24 of node a is outside the cluster CIDRs"}},
		{name: "IPv6 outside, IPv4 fine: refused whole", self: node("a", []string{"10.244.1.0/24", "fd00:99::/64"}), rules: rules, wantErr: []string{"fd00:99::/64 of node a is outside"}},
		{name: "wider than the cluster CIDR", self: node("a", []string{"10.0.0.0/8"}), rules: rules, wantErr: []string{"is outside the cluster CIDRs"}},
		{name: "over the service CIDR", self: node("a", []string{"10.100.0.0/24"}), rules: CIDRRules{Services: rules.Services}, wantErr: []string{"overlaps the service CIDR 10.96.0.0/12"}},
		{name: "over this node's connected route", self: node("a", []string{"10.244.200.0/24"}), rules: rules, wantErr: []string{"overlaps this node's network 10.244.200.0/24 (route 10.244.200.0/24 dev eth1)"}},
		{name: "claimed by another node too", self: node("a", []string{"10.244.2.0/24"}), rules: rules, wantErr: []string{"overlaps the pod CIDR of node peer"}},
		{name: "loopback", self: node("a", []string{"127.0.0.0/16"}), wantErr: []string{"127.0.0.0/8 (loopback)"}},
		{name: "two reasons, both named", self: node("a", []string{"169.254.0.0/24", "ff00::/16"}), wantErr: []string{"link-local", "multicast"}},
		{name: "host bits", self: node("a", []string{"10.244.1.1/24"}), rules: rules, wantErr: []string{`pod CIDR "10.244.1.1/24" has host bits set`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			nodes := []*corev1.Node{peer}
			if tt.self != nil {
				nodes = append(nodes, tt.self)
			}
			got, err := OwnPodCIDRs("a", nodes, tt.rules)
			if len(tt.wantErr) > 0 {
				if err == nil || got != nil {
					t.Fatalf("OwnPodCIDRs = %v, %v, want an error", got, err)
				}
				for _, w := range tt.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not mention %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var gotS []string
			for _, p := range got {
				gotS = append(gotS, p.String())
			}
			if !slices.Equal(gotS, tt.want) {
				t.Errorf("OwnPodCIDRs = %q, want %q", gotS, tt.want)
			}
		})
	}
}

// TestSharedClaimsMatchPairwise compares the sweep that finds overlapping claims with the
// obvious pairwise comparison, on random clusters of nested, equal and disjoint CIDRs of both
// families (seeded: a failure reproduces).
func TestSharedClaimsMatchPairwise(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 300 {
		var nodes []*corev1.Node
		n := 1 + rng.IntN(40)
		for i := range n {
			var cidrs []string
			for range 1 + rng.IntN(2) {
				bits := 20 + rng.IntN(9)
				if rng.IntN(2) == 0 {
					a := netip.AddrFrom4([4]byte{10, 244, byte(rng.IntN(64)), byte(rng.IntN(256))})
					cidrs = append(cidrs, netip.PrefixFrom(a, bits).Masked().String())
				} else {
					a := netip.AddrFrom16([16]byte{0xfd, 0, 0, 0x10, 2, 0x44, 0, byte(rng.IntN(64)), byte(rng.IntN(256))})
					cidrs = append(cidrs, netip.PrefixFrom(a, 44+bits).Masked().String())
				}
			}
			nodes = append(nodes, node(fmt.Sprintf("n%02d", i), cidrs))
		}
		c := newClaims(nodes, CIDRRules{})
		for _, a := range nodes {
			for _, p := range c.byNode[a.Name] {
				var want []string
				for _, b := range nodes {
					if b.Name != a.Name && slices.ContainsFunc(c.byNode[b.Name], p.Overlaps) {
						want = append(want, b.Name)
					}
				}
				got := slices.Compact(slices.Sorted(slices.Values(c.shared[claim{a.Name, p}])))
				if !slices.Equal(got, want) {
					t.Fatalf("round %d: %s %s overlaps %q, the sweep found %q", round, a.Name, p, want, got)
				}
			}
		}
	}
}

// TestRefusalEvents: each new reason is recorded once on the agent's own Node, a reason that
// goes and comes back is recorded again, and nothing is recorded without the Node.
func TestRefusalEvents(t *testing.T) {
	rec := record.NewFakeRecorder(100)
	a := &Agent{reports: reports{events: rec}}
	self := node("a", nil)
	drain := func() []string {
		var out []string
		for {
			select {
			case e := <-rec.Events:
				out = append(out, e)
			default:
				return out
			}
		}
	}
	refused := errors.New("pod CIDR 10.245.1.0/24 of node a is outside the cluster CIDRs 10.244.0.0/16")
	a.reportRefusedPodCIDRs(self, refused)
	a.reportRefusedPodCIDRs(self, refused)
	if got := drain(); len(got) != 1 || got[0] != "Warning KubenetPodCIDRRefused no conflist written: "+refused.Error() {
		t.Fatalf("events %q, want one KubenetPodCIDRRefused", got)
	}
	a.reportRefusedPodCIDRs(self, nil)
	a.reportRefusedPodCIDRs(self, refused)
	if got := drain(); len(got) != 1 {
		t.Fatalf("a reason that came back: events %q, want one", got)
	}

	far := routes.Failure{Route: routes.Route{Node: "far", Dst: netip.MustParsePrefix("10.244.9.0/24")}, Err: errors.New("is outside the cluster CIDRs")}
	dup := routes.Failure{Route: routes.Route{Node: "dup", Dst: netip.MustParsePrefix("10.244.2.0/24")}, Err: errors.New("overlaps the pod CIDR of node b")}
	a.reportRefusedRoutes(self, []routes.Failure{far})
	a.reportRefusedRoutes(self, []routes.Failure{far, dup})
	got := drain()
	want := []string{"Warning KubenetRouteRefused no " + far.Error(), "Warning KubenetRouteRefused no " + dup.Error()}
	if !slices.Equal(got, want) {
		t.Fatalf("events %q, want %q", got, want)
	}
	a.reportRefusedRoutes(nil, []routes.Failure{far, dup})
	if got := drain(); len(got) != 0 {
		t.Fatalf("events without the Node: %q", got)
	}
}

// TestPathEvents: each peer CIDR's path is announced when it is first seen and when it changes
// between direct and vxlan; a big cluster's first sync gets one summary.
func TestPathEvents(t *testing.T) {
	rec := record.NewFakeRecorder(100)
	a := &Agent{reports: reports{events: rec}}
	self := node("a", nil)
	drain := func() []string {
		var out []string
		for {
			select {
			case e := <-rec.Events:
				out = append(out, e)
			default:
				return out
			}
		}
	}
	b4, c4 := netip.MustParsePrefix("10.244.2.0/24"), netip.MustParsePrefix("10.244.3.0/24")
	direct := Path{Node: "b", PodCIDR: b4, Via: ViaDirect, NextHop: netip.MustParseAddr("192.168.1.2"), Reason: "on-link"}
	overlaid := Path{Node: "c", PodCIDR: c4, Via: ViaVXLAN, NextHop: c4.Addr(), Underlay: netip.MustParseAddr("192.168.7.3"), Reason: "far"}
	a.reportPaths(self, map[netip.Prefix]Path{b4: direct, c4: overlaid})
	want := []string{
		"Normal KubenetPeerPath node b's pod CIDR 10.244.2.0/24: direct via 192.168.1.2 (on-link)",
		"Normal KubenetPeerPath node c's pod CIDR 10.244.3.0/24: through the VXLAN overlay to 192.168.7.3 (far)",
	}
	if got := drain(); !slices.Equal(got, want) {
		t.Fatalf("events %q, want %q", got, want)
	}
	a.reportPaths(self, map[netip.Prefix]Path{b4: direct, c4: overlaid})
	if got := drain(); len(got) != 0 {
		t.Fatalf("unchanged paths: events %q", got)
	}
	moved := direct
	moved.Via, moved.NextHop, moved.Underlay, moved.Reason = ViaVXLAN, b4.Addr(), direct.NextHop, "--routing=vxlan"
	a.reportPaths(self, map[netip.Prefix]Path{b4: moved, c4: overlaid})
	if got := drain(); !slices.Equal(got, []string{"Normal KubenetPeerPath node b's pod CIDR 10.244.2.0/24: through the VXLAN overlay to 192.168.1.2 (--routing=vxlan)"}) {
		t.Fatalf("a changed path: events %q", got)
	}
	big := map[netip.Prefix]Path{}
	for i := range maxPathEvents + 1 {
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 245, byte(i), 0}), 24)
		big[p] = Path{Node: fmt.Sprint(i), PodCIDR: p, Via: ViaVXLAN, NextHop: p.Addr()}
	}
	fresh := &Agent{reports: reports{events: rec}}
	fresh.reportPaths(self, big)
	if got := drain(); len(got) != 1 || !strings.Contains(got[0], "paths to 17 pod CIDRs of other nodes: 0 direct, 17 through the VXLAN overlay") {
		t.Fatalf("a big first sync: events %q, want one summary", got)
	}
}
