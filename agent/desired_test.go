package agent

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/kubenet-dev/kubenet/agent/routes"
)

// TestPaths: how each peer pod CIDR is reached under each --routing, and what is refused.
func TestPaths(t *testing.T) {
	// This node ("a") is on 192.168.1.0/24 and fd00:1::/64; 10.9.0.0/16 is reached through a
	// connected route without an address of the node's in it.
	networks := []routes.Network{
		{Prefix: netip.MustParsePrefix("192.168.1.0/24"), Addr: netip.MustParseAddr("192.168.1.1"), Source: "address 192.168.1.1/24 on eth0"},
		{Prefix: netip.MustParsePrefix("fd00:1::/64"), Addr: netip.MustParseAddr("fd00:1::1"), Source: "address fd00:1::1/64 on eth0"},
		{Prefix: netip.MustParsePrefix("10.9.0.0/16"), Source: "route 10.9.0.0/16 dev eth1"},
	}
	self := node("a", []string{"10.244.1.0/24", "fd00:10:244:1::/64"}, "192.168.1.1", "fd00:1::1")
	onLink := node("b", []string{"10.244.2.0/24", "fd00:10:244:2::/64"}, "192.168.1.2", "fd00:1::2")
	farAway := node("c", []string{"10.244.3.0/24", "fd00:10:244:3::/64"}, "192.168.7.3", "fd00:7::3")
	viaRoute := node("d", []string{"10.244.4.0/24"}, "10.9.4.4")
	v4Only := node("e", []string{"10.244.5.0/24", "fd00:10:244:5::/64"}, "192.168.1.5")
	v6Only := node("f", []string{"10.244.6.0/24"}, "fd00:7::6")
	noAddress := node("g", []string{"10.244.7.0/24"})
	insidePods := node("h", []string{"10.244.8.0/24"}, "10.244.1.9") // inside this node's pod CIDR
	loopback := node("i", []string{"10.244.9.0/24"}, "127.0.0.1")
	ownAddr := node("j", []string{"10.244.10.0/24"}, "192.168.1.1")
	tests := []struct {
		name     string
		mode     Routing
		self     *corev1.Node
		peers    []*corev1.Node
		paths    []string // "dst via gw (via, underlay)"
		unusable []string // "node dst: error" prefixes
	}{
		{
			name:  "auto: on-link peers direct, the others through the overlay",
			mode:  RoutingAuto,
			peers: []*corev1.Node{onLink, farAway, viaRoute},
			paths: []string{
				"10.244.2.0/24 via 192.168.1.2 (direct)", "fd00:10:244:2::/64 via fd00:1::2 (direct)",
				"10.244.3.0/24 via 10.244.3.0 (vxlan to 192.168.7.3)", "fd00:10:244:3::/64 via fd00:10:244:3:: (vxlan to 192.168.7.3)",
				"10.244.4.0/24 via 10.9.4.4 (direct)",
			},
		},
		{
			name:  "auto: a peer without an InternalIP of the CIDR's family rides the IPv4 underlay",
			mode:  RoutingAuto,
			peers: []*corev1.Node{v4Only},
			paths: []string{"10.244.5.0/24 via 192.168.1.5 (direct)", "fd00:10:244:5::/64 via fd00:10:244:5:: (vxlan to 192.168.1.5)"},
		},
		{
			name:     "direct: today's behaviour, a missing family is refused",
			mode:     RoutingDirect,
			peers:    []*corev1.Node{farAway, v4Only},
			paths:    []string{"10.244.3.0/24 via 192.168.7.3 (direct)", "fd00:10:244:3::/64 via fd00:7::3 (direct)", "10.244.5.0/24 via 192.168.1.5 (direct)"},
			unusable: []string{"e fd00:10:244:5::/64: node has no IPv6 InternalIP"},
		},
		{
			name:  "vxlan: everything through the overlay, also on-link peers",
			mode:  RoutingVXLAN,
			peers: []*corev1.Node{onLink},
			paths: []string{"10.244.2.0/24 via 10.244.2.0 (vxlan to 192.168.1.2)", "fd00:10:244:2::/64 via fd00:10:244:2:: (vxlan to 192.168.1.2)"},
		},
		{
			name:     "the overlay needs the peer's InternalIP of the underlay's family",
			mode:     RoutingAuto,
			peers:    []*corev1.Node{v6Only},
			unusable: []string{"f 10.244.6.0/24: no direct path: node has no IPv4 InternalIP in its status, and the node has no IPv4 InternalIP to reach it through the overlay"},
		},
		{
			name:  "an IPv6 underlay carries IPv4 pods",
			mode:  RoutingAuto,
			self:  node("a", []string{"10.244.1.0/24", "fd00:10:244:1::/64"}, "fd00:1::1", "192.168.1.1"),
			peers: []*corev1.Node{v6Only},
			paths: []string{"10.244.6.0/24 via 10.244.6.0 (vxlan to fd00:7::6)"},
		},
		{
			name:  "no underlay address of our own: nothing through the overlay",
			mode:  RoutingAuto,
			self:  node("a", []string{"10.244.1.0/24"}),
			peers: []*corev1.Node{farAway},
			unusable: []string{
				"c 10.244.3.0/24: its InternalIP 192.168.7.3 is on none of this node's networks, and this node has no InternalIP to carry the overlay",
				"c fd00:10:244:3::/64: its InternalIP fd00:7::3 is on none of this node's networks, and this node has no InternalIP to carry the overlay",
			},
		},
		{
			name:  "bad Node data gets no path in any mode",
			mode:  RoutingVXLAN,
			peers: []*corev1.Node{noAddress, insidePods, loopback, ownAddr},
			unusable: []string{
				"g 10.244.7.0/24: --routing=vxlan, and the node has no IPv4 InternalIP",
				"h 10.244.8.0/24: its InternalIP 10.244.1.9 lies inside the pod CIDR 10.244.1.0/24 of node a",
				"i 10.244.9.0/24: its InternalIP 127.0.0.1 is in 127.0.0.0/8",
				"j 10.244.10.0/24: its InternalIP 192.168.1.1 is this node's own address",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			me := self
			if tt.self != nil {
				me = tt.self
			}
			nodes := append([]*corev1.Node{me}, tt.peers...)
			rules := CIDRRules{Cluster: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:10:244::/48")}, Networks: networks}
			w := newClaims(nodes, rules).routes("a", nodes, pathRules{mode: tt.mode, underlay: underlayOf(me)})
			var got []string
			for _, r := range w.Routes {
				p := w.Paths[r.Dst]
				if p.NextHop != r.Gw || p.PodCIDR != r.Dst || p.Node != r.Node || p.Reason == "" {
					t.Errorf("path %+v does not describe route %s", p, r)
				}
				via := p.Via
				if p.Via == ViaVXLAN {
					via += " to " + p.Underlay.String()
				}
				got = append(got, fmt.Sprintf("%s via %s (%s)", r.Dst, r.Gw, via))
			}
			if !slices.Equal(got, tt.paths) {
				t.Errorf("paths:\n got %q\nwant %q", got, tt.paths)
			}
			expectUnusable(t, w.Unusable, tt.unusable)
			// Every overlay route's peer is handed to the overlay, with exactly its CIDRs.
			overlaid := map[string][]netip.Prefix{}
			for _, r := range w.Routes {
				if w.Paths[r.Dst].Via == ViaVXLAN {
					overlaid[r.Node] = append(overlaid[r.Node], r.Dst)
				}
			}
			if len(w.Overlay) != len(overlaid) {
				t.Fatalf("overlay peers %+v, want those of %v", w.Overlay, overlaid)
			}
			for _, p := range w.Overlay {
				if !slices.Equal(p.PodCIDRs, overlaid[p.Node]) || p.Underlay != w.Paths[p.PodCIDRs[0]].Underlay {
					t.Errorf("overlay peer %+v, want CIDRs %v", p, overlaid[p.Node])
				}
			}
		})
	}
}

func TestParseRouting(t *testing.T) {
	for _, s := range []string{"auto", "direct", "vxlan"} {
		if r, err := ParseRouting(s); err != nil || string(r) != s {
			t.Errorf("ParseRouting(%q) = %q, %v", s, r, err)
		}
	}
	for _, s := range []string{"", "VXLAN", "geneve", "auto "} {
		if _, err := ParseRouting(s); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%q", s)) {
			t.Errorf("ParseRouting(%q): %v, want an error naming the value", s, err)
		}
	}
}
