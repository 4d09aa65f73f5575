package agent

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/kubenet-dev/kubenet/agent/routes"
)

// TestOverlayPeerIsWhereThePeerListens: every node's VTEP is its first InternalIP (underlayOf):
// that is the local address of its device, the MAC every node derives for it, the only family
// its device's socket listens on. A peer must be sent to there. A dual-stack peer whose first
// InternalIP is of the other family than ours (kubelet --node-ip=<v6>,<v4> on some nodes, or a
// Node author reordering its addresses) gets a path to its InternalIP of our family instead, at
// the MAC of that address: its device has neither, every frame is dropped at the peer ("port
// unreachable"), and /peers, the metrics and the node condition all say the path is in place.
func TestOverlayPeerIsWhereThePeerListens(t *testing.T) {
	self := node("a", []string{"10.244.1.0/24", "fd00:10:244:1::/64"}, "192.0.2.1", "2001:db8::1")
	peer := node("b", []string{"10.244.2.0/24", "fd00:10:244:2::/64"}, "2001:db8::2", "192.0.2.2")
	nodes := []*corev1.Node{self, peer}
	rules := CIDRRules{Networks: []routes.Network{{Prefix: netip.MustParsePrefix("192.0.2.0/24"), Addr: netip.MustParseAddr("192.0.2.1")}}}
	for _, mode := range []Routing{RoutingVXLAN, RoutingAuto} {
		t.Run(string(mode), func(t *testing.T) {
			rules := rules
			if mode == RoutingAuto {
				rules.Networks = nil // b is on none of a's networks
			}
			w := newClaims(nodes, rules).routes("a", nodes, pathRules{mode: mode, underlay: underlayOf(self)})
			for _, p := range w.Overlay {
				if p.Node == "b" && p.Underlay != underlayOf(peer) {
					t.Errorf("node b is sent to at %s through the overlay, but its VTEP (its device's local address and MAC) is %s: "+
						"the path should be refused with a reason, not programmed", p.Underlay, underlayOf(peer))
				}
			}
		})
	}
}

// TestOverlayHostileNodesHeld (holds on de614e1): Node objects whose InternalIPs try to get an
// overlay path where none belongs get none, with a reason; the others get the path they should.
func TestOverlayHostileNodesHeld(t *testing.T) {
	self := node("a", []string{"10.244.1.0/24", "fd00:10:244:1::/64"}, "192.0.2.1", "2001:db8::1")
	good := node("c", []string{"10.244.3.0/24", "fd00:10:244:3::/64"}, "198.51.100.3", "2001:db8:1::3")
	rules := CIDRRules{
		Cluster:  []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:10:244::/48")},
		Services: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")},
		Networks: []routes.Network{{Prefix: netip.MustParsePrefix("192.0.2.0/24"), Addr: netip.MustParseAddr("192.0.2.1")}},
	}
	cases := []struct {
		name    string
		addrs   []string
		refused bool
		under   string // the underlay the path must use when not refused
	}{
		{"another node's overlay next hop", []string{"10.244.3.0"}, true, ""},
		{"inside its own pod CIDR", []string{"10.244.9.1"}, true, ""},
		{"a service address", []string{"10.96.0.10"}, true, ""},
		{"this node's own address", []string{"192.0.2.1"}, true, ""},
		{"loopback", []string{"127.0.0.1"}, true, ""},
		{"link-local", []string{"169.254.1.1"}, true, ""},
		{"multicast", []string{"224.0.0.1"}, true, ""},
		{"unspecified", []string{"0.0.0.0"}, true, ""},
		{"broadcast", []string{"255.255.255.255"}, true, ""},
		{"IPv6 only, this node's underlay IPv4", []string{"2001:db8:1::9"}, true, ""},
		{"zone only", []string{"fe80::1%eth0"}, true, ""},
		{"leading zeros", []string{"198.051.100.009"}, true, ""},
		{"IPv4-mapped IPv6", []string{"::ffff:198.51.100.9"}, false, "198.51.100.9"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			hostile := node("z", []string{"10.244.9.0/24"}, c.addrs...)
			nodes := []*corev1.Node{self, good, hostile}
			w := newClaims(nodes, rules).routes("a", nodes, pathRules{mode: RoutingAuto, underlay: underlayOf(self)})
			var got *string
			for _, p := range w.Overlay {
				if p.Node == "z" {
					s := p.Underlay.String()
					got = &s
				}
				if p.Node == "c" && p.Underlay != netip.MustParseAddr("198.51.100.3") {
					t.Errorf("node c's path changed: %v", p)
				}
			}
			for _, r := range w.Routes {
				if r.Node == "z" && !r.Dst.Addr().Is4() {
					continue
				}
				if r.Node == "z" && c.refused {
					t.Errorf("node z got a route %v", r)
				}
			}
			switch {
			case c.refused && got != nil:
				t.Errorf("node z got an overlay path via %s", *got)
			case !c.refused && (got == nil || *got != c.under):
				t.Errorf("node z's overlay path: %v, want via %s", got, c.under)
			}
		})
	}
}

// TestOverlayRandomNodesHeld (holds on de614e1): random Node sets (addresses of every kind and
// family, overlapping and odd CIDRs) in every mode: no panic, and what is planned is consistent:
// one route per destination, overlay routes via their CIDR's first address to a peer listed in
// Overlay with a usable underlay address of this node's family.
func TestOverlayRandomNodesHeld(t *testing.T) {
	r := rand.New(rand.NewPCG(25, 25))
	addrPool := []string{"192.0.2.1", "192.0.2.2", "198.51.100.3", "198.51.100.3", "10.244.3.0", "10.244.3.7", "10.96.0.1", "127.0.0.1",
		"0.0.0.0", "224.0.0.5", "255.255.255.255", "169.254.0.9", "::ffff:198.51.100.4", "2001:db8::1", "2001:db8::2", "fe80::1", "fe80::1%eth0",
		"::", "::1", "ff02::1", "fd00:10:244:3::5", "not-an-ip", "010.000.002.002", ""}
	cidrPool := []string{"10.244.1.0/24", "10.244.2.0/24", "10.244.3.0/24", "10.244.0.0/16", "10.244.3.128/25", "10.244.4.4/32", "fd00:10:244:1::/64",
		"fd00:10:244:3::/64", "fd00:10:244:3::/80", "192.0.2.0/24", "0.0.0.0/0", "::/0", "10.244.5.1/24", "bogus", "fd00:10:244:6::/128"}
	pick := func(pool []string, max int) []string {
		var out []string
		for range r.IntN(max + 1) {
			out = append(out, pool[r.IntN(len(pool))])
		}
		return out
	}
	modes := []Routing{RoutingAuto, RoutingDirect, RoutingVXLAN}
	for i := range 3000 {
		var nodes []*corev1.Node
		for j := range 1 + r.IntN(6) {
			nodes = append(nodes, node(fmt.Sprintf("n%d", j), pick(cidrPool, 3), pick(addrPool, 3)...))
		}
		rules := CIDRRules{Networks: []routes.Network{{Prefix: netip.MustParsePrefix("192.0.2.0/24"), Addr: netip.MustParseAddr("192.0.2.1")}}}
		if r.IntN(2) == 0 {
			rules.Cluster = []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:10:244::/48")}
		}
		mode := modes[r.IntN(3)]
		self := nodes[0]
		w := newClaims(nodes, rules).routes(self.Name, nodes, pathRules{mode: mode, underlay: underlayOf(self)})
		seen := map[netip.Prefix]bool{}
		peers := map[string]netip.Addr{}
		for _, p := range w.Overlay {
			peers[p.Node] = p.Underlay
			if !p.Underlay.IsValid() || p.Underlay.Is4() != underlayOf(self).Is4() || rules.gatewayError(p.Underlay) != nil {
				t.Fatalf("case %d (%s): overlay peer %s with underlay %s", i, mode, p.Node, p.Underlay)
			}
		}
		for _, rt := range w.Routes {
			if seen[rt.Dst] {
				t.Fatalf("case %d: two routes to %s", i, rt.Dst)
			}
			seen[rt.Dst] = true
			path := w.Paths[rt.Dst]
			if path.Via == ViaVXLAN {
				if rt.Gw != rt.Dst.Masked().Addr() {
					t.Fatalf("case %d: overlay route %v not via its first address", i, rt)
				}
				if _, ok := peers[rt.Node]; !ok {
					t.Fatalf("case %d: overlay route %v to a node not in Overlay", i, rt)
				}
			}
		}
	}
}
