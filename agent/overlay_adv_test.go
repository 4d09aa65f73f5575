package agent

import (
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
