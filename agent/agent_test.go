package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kubenet-dev/kubenet/agent/cnidir"
	"github.com/kubenet-dev/kubenet/agent/routes"
)

func node(name string, cidrs []string, addrs ...string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{PodCIDRs: cidrs}}
	if len(cidrs) > 0 {
		n.Spec.PodCIDR = cidrs[0]
	}
	for _, a := range addrs {
		typ := corev1.NodeInternalIP
		if after, ok := strings.CutPrefix(a, "ext:"); ok {
			typ, a = corev1.NodeExternalIP, after
		}
		n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: typ, Address: a})
	}
	return n
}

// expectUnusable checks the refused routes, "node dst: error", against prefixes of them.
func expectUnusable(t *testing.T, got []routes.Failure, want []string) {
	t.Helper()
	var lines []string
	for _, f := range got {
		lines = append(lines, fmt.Sprintf("%s %s: %v", f.Route.Node, f.Route.Dst, f.Err))
	}
	if len(lines) != len(want) {
		t.Fatalf("unusable = %q, want %q", lines, want)
	}
	for i := range lines {
		if !strings.HasPrefix(lines[i], want[i]) {
			t.Errorf("unusable[%d] = %q, want %q", i, lines[i], want[i])
		}
	}
}

func TestDesiredRoutes(t *testing.T) {
	tests := []struct {
		name     string
		nodes    []*corev1.Node
		rules    CIDRRules
		routes   []string // "dst via gw (node)"
		unusable []string // "node dst: error", prefixes
		peers    []string
	}{
		{
			name: "dual-stack peers, self skipped",
			nodes: []*corev1.Node{
				node("a", []string{"10.244.1.0/24", "fd00:10:244:1::/64"}, "192.168.1.1", "fd00:1::1"),
				node("b", []string{"10.244.2.0/24", "fd00:10:244:2::/64"}, "192.168.1.2", "fd00:1::2"),
				node("c", []string{"fd00:10:244:3::/64", "10.244.3.0/24"}, "fd00:1::3", "192.168.1.3"),
			},
			routes: []string{"10.244.2.0/24 via 192.168.1.2 (b)", "fd00:10:244:2::/64 via fd00:1::2 (b)", "fd00:10:244:3::/64 via fd00:1::3 (c)", "10.244.3.0/24 via 192.168.1.3 (c)"},
			peers:  []string{"b", "c"},
		},
		{
			name: "a peer without a pod CIDR yet is no peer",
			nodes: []*corev1.Node{
				node("a", []string{"10.244.1.0/24"}, "192.168.1.1"),
				node("b", nil, "192.168.1.2"),
			},
		},
		{
			name: "only the single-stack field set (old clients)",
			nodes: []*corev1.Node{
				node("a", []string{"10.244.1.0/24"}, "192.168.1.1"),
				{ObjectMeta: metav1.ObjectMeta{Name: "b"}, Spec: corev1.NodeSpec{PodCIDR: "10.244.2.0/24"},
					Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.168.1.2"}}}},
			},
			routes: []string{"10.244.2.0/24 via 192.168.1.2 (b)"},
			peers:  []string{"b"},
		},
		{
			name: "no InternalIP of the family: reported, an ExternalIP is not used",
			nodes: []*corev1.Node{
				node("a", []string{"10.244.1.0/24"}, "192.168.1.1"),
				node("b", []string{"10.244.2.0/24", "fd00:10:244:2::/64"}, "192.168.1.2", "ext:2001:db8::2"),
			},
			routes:   []string{"10.244.2.0/24 via 192.168.1.2 (b)"},
			unusable: []string{"b fd00:10:244:2::/64: node has no IPv6 InternalIP"},
			peers:    []string{"b"},
		},
		{
			name: "a CIDR overlapping our own gets no route",
			nodes: []*corev1.Node{
				node("a", []string{"10.244.1.0/24"}, "192.168.1.1"),
				node("b", []string{"10.244.0.0/16"}, "192.168.1.2"),
			},
			unusable: []string{"b 10.244.0.0/16: overlaps this node's own pod CIDR 10.244.1.0/24"},
			peers:    []string{"b"},
		},
		{
			name: "two peers claiming one CIDR: neither gets a route (which one is right is unknown)",
			nodes: []*corev1.Node{
				node("z", []string{"10.244.2.0/24"}, "192.168.1.26"),
				node("a", []string{"10.244.1.0/24"}, "192.168.1.1"),
				node("b", []string{"10.244.2.0/24"}, "192.168.1.2"),
				node("c", []string{"10.244.3.0/24"}, "192.168.1.3"),
			},
			routes:   []string{"10.244.3.0/24 via 192.168.1.3 (c)"},
			unusable: []string{"b 10.244.2.0/24: overlaps the pod CIDR of node z", "z 10.244.2.0/24: overlaps the pod CIDR of node b"},
			peers:    []string{"b", "c", "z"},
		},
		{
			name: "a peer claiming a CIDR that covers others' takes their routes too",
			nodes: []*corev1.Node{
				node("a", []string{"10.244.1.0/24"}, "192.168.1.1"),
				node("b", []string{"10.244.2.0/24"}, "192.168.1.2"),
				node("c", []string{"10.244.3.0/24"}, "192.168.1.3"),
				node("wide", []string{"10.244.2.0/23"}, "192.168.1.4"),
			},
			unusable: []string{"b 10.244.2.0/24: overlaps the pod CIDR of node wide", "c 10.244.3.0/24: overlaps the pod CIDR of node wide", "wide 10.244.2.0/23: overlaps the pod CIDR of node b, c"},
			peers:    []string{"b", "c", "wide"},
		},
		{
			name: "CIDRs against the cluster's rules: outside the cluster CIDR, over the services, special ranges",
			nodes: []*corev1.Node{
				node("a", []string{"10.244.1.0/24"}, "192.168.1.1"),
				node("outside", []string{"10.245.0.0/24"}, "192.168.1.2"),
				node("services", []string{"10.244.96.0/24"}, "192.168.1.3"),
				node("v6-outside", []string{"fd00:99::/64"}, "fd00:1::4"),
				node("good", []string{"10.244.5.0/24", "fd00:10:244:5::/64"}, "192.168.1.5", "fd00:1::5"),
			},
			rules:  CIDRRules{Cluster: mustPrefixes("10.244.0.0/16", "fd00:10:244::/48"), Services: mustPrefixes("10.244.96.0/20")},
			routes: []string{"10.244.5.0/24 via 192.168.1.5 (good)", "fd00:10:244:5::/64 via fd00:1::5 (good)"},
			unusable: []string{
				"outside 10.245.0.0/24: is outside the cluster CIDRs 10.244.0.0/16, fd00:10:244::/48",
				"services 10.244.96.0/24: overlaps the service CIDR 10.244.96.0/20",
				"v6-outside fd00:99::/64: is outside the cluster CIDRs",
			},
			peers: []string{"good", "outside", "services", "v6-outside"},
		},
		{
			name: "special ranges, with no cluster CIDR to check against",
			nodes: []*corev1.Node{
				node("a", []string{"10.244.1.0/24"}, "192.168.1.1"),
				node("default", []string{"0.0.0.0/0"}, "192.168.1.2"),
				node("loopback", []string{"127.0.0.0/24"}, "192.168.1.3"),
				node("link-local", []string{"169.254.0.0/24", "fe80::/64"}, "192.168.1.4", "fd00:1::4"),
				node("multicast", []string{"224.0.0.0/24", "ff02::/64"}, "192.168.1.5", "fd00:1::5"),
				node("broadcast", []string{"255.255.255.255/32"}, "192.168.1.6"),
				node("v6-default", []string{"::/0"}, "fd00:1::7"),
				node("mapped", []string{"::ffff:10.9.0.0/120"}, "fd00:1::8"),
				node("compatible", []string{"::a09:0/120"}, "fd00:1::9"),
				node("translated", []string{"::ffff:0:a09:0/120"}, "fd00:1::a"),
				node("nat64", []string{"64:ff9b::a09:0/120"}, "fd00:1::b"),
				node("nat64-local", []string{"64:ff9b:1:9::/64"}, "fd00:1::c"),
				node("discard", []string{"100::/64"}, "fd00:1::d"),
			},
			unusable: []string{
				"broadcast 255.255.255.255/32: overlaps 255.255.255.255/32 (the limited broadcast address)",
				"compatible ::a09:0/120: overlaps ::/96 (the unspecified and loopback addresses and IPv4-compatible addresses)",
				"default 0.0.0.0/0: overlaps 0.0.0.0/8",
				"discard 100::/64: overlaps 100::/64 (discard-only addresses)",
				"link-local 169.254.0.0/24: overlaps 169.254.0.0/16 (link-local)",
				"link-local fe80::/64: overlaps fe80::/10 (link-local)",
				"loopback 127.0.0.0/24: overlaps 127.0.0.0/8 (loopback)",
				"mapped ::ffff:10.9.0.0/120: overlaps ::ffff:0.0.0.0/96 (IPv4-mapped addresses)",
				"multicast 224.0.0.0/24: overlaps 224.0.0.0/4 (multicast)",
				"multicast ff02::/64: overlaps ff00::/8 (multicast)",
				"nat64 64:ff9b::a09:0/120: overlaps 64:ff9b::/96 (the NAT64 prefix)",
				"nat64-local 64:ff9b:1:9::/64: overlaps 64:ff9b:1::/48 (the local-use NAT64 prefix)",
				"translated ::ffff:0:a09:0/120: overlaps ::ffff:0:0:0/96 (IPv4-translated addresses)",
				"v6-default ::/0: overlaps ::/96",
			},
			peers: []string{"broadcast", "compatible", "default", "discard", "link-local", "loopback", "mapped", "multicast", "nat64", "nat64-local", "translated", "v6-default"},
		},
		{
			name: "CIDRs over this node's own networks, and gateways that cannot be a peer's",
			nodes: []*corev1.Node{
				node("a", []string{"10.244.1.0/24"}, "192.168.1.1"),
				node("lan", []string{"192.168.1.128/25"}, "192.168.1.2"),
				node("connected", []string{"10.50.3.0/24"}, "192.168.1.3"),
				node("gw-self", []string{"10.244.4.0/24"}, "192.168.1.1"),
				node("gw-loopback", []string{"10.244.5.0/24"}, "127.0.0.1"),
				node("gw-mapped", []string{"fd00:10:244:6::/64"}, "::ffff:192.168.1.6"),
				node("gw-nat64", []string{"fd00:10:244:7::/64"}, "64:ff9b::c0a8:107"),
			},
			rules: CIDRRules{Networks: []routes.Network{
				{Prefix: netip.MustParsePrefix("192.168.1.0/24"), Addr: netip.MustParseAddr("192.168.1.1"), Source: "address 192.168.1.1/24 on eth0"},
				{Prefix: netip.MustParsePrefix("10.50.0.0/16"), Source: "route 10.50.0.0/16 dev eth1"},
			}},
			unusable: []string{
				"connected 10.50.3.0/24: overlaps this node's network 10.50.0.0/16 (route 10.50.0.0/16 dev eth1)",
				"gw-loopback 10.244.5.0/24: its InternalIP 127.0.0.1 is in 127.0.0.0/8 (loopback)",
				"gw-mapped fd00:10:244:6::/64: node has no IPv6 InternalIP",
				"gw-nat64 fd00:10:244:7::/64: its InternalIP 64:ff9b::c0a8:107 is in 64:ff9b::/96 (the NAT64 prefix)",
				"gw-self 10.244.4.0/24: its InternalIP 192.168.1.1 is this node's own address",
				"lan 192.168.1.128/25: overlaps this node's network 192.168.1.0/24 (address 192.168.1.1/24 on eth0)",
			},
			peers: []string{"connected", "gw-loopback", "gw-mapped", "gw-nat64", "gw-self", "lan"},
		},
		{
			name: "an InternalIP inside a pod CIDR, in every form the API lets a Node write: the whole Node refused",
			nodes: []*corev1.Node{
				node("a", []string{"10.244.1.0/24", "fd00:10:244:1::/64"}, "192.168.1.1", "fd00:1::1"),
				node("b", []string{"10.244.2.0/24", "fd00:10:244:2::/64"}, "192.168.1.2", "fd00:1::2"),
				// Another node's pod gateway, and the IPv6 address is fine: both routes go.
				node("gw-of-b", []string{"10.244.3.0/24", "fd00:10:244:3::/64"}, "10.244.2.1", "fd00:1::3"),
				node("in-own", []string{"10.244.4.0/24"}, "10.244.4.7"),
				node("in-local", []string{"10.244.5.0/24"}, "10.244.1.9"),
				node("mapped", []string{"10.244.6.0/24"}, "::ffff:10.244.2.9"),
				node("mapped-long", []string{"10.244.7.0/24"}, "0:0:0:0:0:ffff:0af4:0209"),
				node("leading-zeros", []string{"10.244.8.0/24"}, "010.244.002.009"),
				// The gateway of the family is fine; a second InternalIP is a pod's.
				node("second", []string{"10.244.9.0/24"}, "192.168.1.9", "10.244.2.10"),
				node("v6-in", []string{"10.244.10.0/24", "fd00:10:244:10::/64"}, "192.168.1.10", "fd00:10:244:2::10"),
				node("garbage", []string{"10.244.11.0/24"}, "192.168.1.11", "10.244.2.x"),
				// Not refused: an ExternalIP is not the Node's word about where it is, a zone is
				// no part of the address, and an address in no pod CIDR is fine.
				node("external", []string{"10.244.12.0/24"}, "192.168.1.12", "ext:10.244.2.12"),
				node("zoned", []string{"10.244.13.0/24", "fd00:10:244:13::/64"}, "192.168.1.13", "fe80::13%eth0", "fd00:1::13"),
				// Without a pod CIDR a Node is no peer: there is nothing to refuse.
				node("no-cidr", nil, "10.244.2.14"),
			},
			routes: []string{
				"10.244.2.0/24 via 192.168.1.2 (b)", "fd00:10:244:2::/64 via fd00:1::2 (b)",
				"10.244.12.0/24 via 192.168.1.12 (external)",
				"10.244.13.0/24 via 192.168.1.13 (zoned)", "fd00:10:244:13::/64 via fd00:1::13 (zoned)",
			},
			unusable: []string{
				`garbage 10.244.11.0/24: its InternalIP "10.244.2.x" is not an IP address`,
				"gw-of-b 10.244.3.0/24: its InternalIP 10.244.2.1 lies inside the pod CIDR 10.244.2.0/24 of node b",
				"gw-of-b fd00:10:244:3::/64: its InternalIP 10.244.2.1 lies inside the pod CIDR 10.244.2.0/24 of node b",
				"in-local 10.244.5.0/24: its InternalIP 10.244.1.9 lies inside the pod CIDR 10.244.1.0/24 of node a",
				"in-own 10.244.4.0/24: its InternalIP 10.244.4.7 lies inside the pod CIDR 10.244.4.0/24 of node in-own",
				`leading-zeros 10.244.8.0/24: its InternalIP "010.244.002.009" (10.244.2.9) lies inside the pod CIDR 10.244.2.0/24 of node b`,
				`mapped 10.244.6.0/24: its InternalIP "::ffff:10.244.2.9" (10.244.2.9) lies inside the pod CIDR 10.244.2.0/24 of node b`,
				`mapped-long 10.244.7.0/24: its InternalIP "0:0:0:0:0:ffff:0af4:0209" (10.244.2.9) lies inside the pod CIDR 10.244.2.0/24 of node b`,
				"second 10.244.9.0/24: its InternalIP 10.244.2.10 lies inside the pod CIDR 10.244.2.0/24 of node b",
				"v6-in 10.244.10.0/24: its InternalIP fd00:10:244:2::10 lies inside the pod CIDR fd00:10:244:2::/64 of node b",
				"v6-in fd00:10:244:10::/64: its InternalIP fd00:10:244:2::10 lies inside the pod CIDR fd00:10:244:2::/64 of node b",
			},
			peers: []string{"b", "external", "garbage", "gw-of-b", "in-local", "in-own", "leading-zeros", "mapped", "mapped-long", "second", "v6-in", "zoned"},
		},
		{
			name: "a new claim around existing nodes' addresses refuses them, as an address of the services does; refused and unparsable claims hold no pods and count for nothing",
			nodes: []*corev1.Node{
				node("a", []string{"10.244.1.0/24"}, "192.168.1.1"),
				node("b", []string{"10.244.2.0/24"}, "192.168.1.2"),
				node("c", []string{"10.244.3.0/24"}, "192.168.2.3"),
				node("d", []string{"10.244.4.0/24"}, "192.168.3.4"),
				node("around-b", []string{"192.168.1.0/28"}, "192.168.1.100"),
				node("twice-1", []string{"192.168.2.0/28"}, "192.168.1.101"),
				node("twice-2", []string{"192.168.2.0/28"}, "192.168.1.102"),
				node("refused", []string{"192.168.3.0/24", "fd00:99::/64"}, "192.168.1.103"),
				node("unparsable", []string{"192.168.3.0"}, "192.168.1.104"),
				node("service", []string{"10.244.5.0/24"}, "::ffff:10.96.0.1"),
			},
			rules:  CIDRRules{Cluster: mustPrefixes("10.244.0.0/16", "192.168.1.0/24", "192.168.2.0/24"), Services: mustPrefixes("10.96.0.0/12")},
			routes: []string{"192.168.1.0/28 via 192.168.1.100 (around-b)", "10.244.4.0/24 via 192.168.3.4 (d)"},
			unusable: []string{
				"b 10.244.2.0/24: its InternalIP 192.168.1.2 lies inside the pod CIDR 192.168.1.0/28 of node around-b",
				"c 10.244.3.0/24: its InternalIP 192.168.2.3 lies inside the pod CIDR 192.168.2.0/28 of node twice-1, twice-2",
				"refused 192.168.3.0/24: is outside the cluster CIDRs",
				"refused fd00:99::/64: is outside the cluster CIDRs",
				`service 10.244.5.0/24: its InternalIP "::ffff:10.96.0.1" (10.96.0.1) lies inside the service CIDR 10.96.0.0/12 (--service-cidr)`,
				"twice-1 192.168.2.0/28: overlaps the pod CIDR of node twice-2",
				"twice-2 192.168.2.0/28: overlaps the pod CIDR of node twice-1",
				"unparsable invalid Prefix",
			},
			peers: []string{"around-b", "b", "c", "d", "refused", "service", "twice-1", "twice-2", "unparsable"},
		},
		{
			name: "host bits set: not a network, refused whole",
			nodes: []*corev1.Node{
				node("a", []string{"10.244.1.0/24"}, "192.168.1.1"),
				node("b", []string{"10.244.2.7/24"}, "192.168.1.2"),
			},
			unusable: []string{`b invalid Prefix: node b: pod CIDR "10.244.2.7/24" has host bits set`},
			peers:    []string{"b"},
		},
		{
			name: "an unparsable pod CIDR is reported",
			nodes: []*corev1.Node{
				node("a", []string{"10.244.1.0/24"}, "192.168.1.1"),
				node("b", []string{"10.244.2.0"}, "192.168.1.2"),
			},
			unusable: []string{`b invalid Prefix: node b: pod CIDR "10.244.2.0"`},
			peers:    []string{"b"},
		},
		{
			name: "our own node missing from the API: every other node is a peer",
			nodes: []*corev1.Node{
				node("b", []string{"10.244.2.0/24"}, "192.168.1.2"),
			},
			routes: []string{"10.244.2.0/24 via 192.168.1.2 (b)"},
			peers:  []string{"b"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := DesiredRoutes("a", tt.nodes, tt.rules)
			var got []string
			for _, r := range w.Routes {
				got = append(got, fmt.Sprintf("%s via %s (%s)", r.Dst, r.Gw, r.Node))
			}
			if !slices.Equal(got, tt.routes) {
				t.Errorf("routes = %q, want %q", got, tt.routes)
			}
			expectUnusable(t, w.Unusable, tt.unusable)
			if !slices.Equal(w.Peers, tt.peers) {
				t.Errorf("peers = %q, want %q", w.Peers, tt.peers)
			}
		})
	}
}

func TestRouteCondition(t *testing.T) {
	fail := func(node, dst string) routes.Failure {
		return routes.Failure{Route: routes.Route{Node: node, Dst: netip.MustParsePrefix(dst)}, Err: routes.ErrNotOnLink}
	}
	tests := []struct {
		name     string
		peers    []string
		failures []routes.Failure
		status   corev1.ConditionStatus
		reason   string
		message  []string
	}{
		{name: "all in place", peers: []string{"b", "c"}, status: corev1.ConditionFalse, reason: ReasonRoutesCreated, message: []string{"every other node's pod CIDRs are in place"}},
		{name: "single-node cluster", status: corev1.ConditionFalse, reason: ReasonRoutesCreated, message: []string{"every other node's pod CIDRs are in place"}},
		{
			name:  "one peer off the segment: the rest of the cluster still works, so False",
			peers: []string{"b", "c", "far"}, failures: []routes.Failure{fail("far", "10.244.9.0/24"), fail("far", "fd00:10:244:9::/64")},
			status: corev1.ConditionFalse, reason: ReasonRoutesIncomplete,
			message: []string{"2 route(s) missing", "node far", "10.244.9.0/24", "L2 segment"},
		},
		{
			name:  "no peer reachable: True",
			peers: []string{"b", "c"}, failures: []routes.Failure{fail("b", "10.244.2.0/24"), fail("c", "10.244.3.0/24")},
			status: corev1.ConditionTrue, reason: ReasonNoRoutes, message: []string{"no route to any other node", "node b", "node c"},
		},
		{
			name:  "a stale route that cannot be deleted (no node): incomplete, but every peer reachable",
			peers: []string{"b"}, failures: []routes.Failure{{Route: routes.Route{Dst: netip.MustParsePrefix("10.244.7.0/24")}, Err: errors.New("delete: permission denied")}},
			status: corev1.ConditionFalse, reason: ReasonRoutesIncomplete, message: []string{"1 route(s) missing", "permission denied"},
		},
		{
			name:  "many failures: the message stays bounded",
			peers: []string{"b", "c"},
			failures: []routes.Failure{fail("c", "10.244.1.0/24"), fail("c", "10.244.2.0/24"), fail("c", "10.244.3.0/24"),
				fail("c", "10.244.4.0/24"), fail("c", "10.244.5.0/24"), fail("c", "10.244.6.0/24"), fail("c", "10.244.7.0/24")},
			status: corev1.ConditionFalse, reason: ReasonRoutesIncomplete, message: []string{"7 route(s) missing", "and 2 more"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := RouteCondition(tt.peers, tt.failures, nil)
			if c.Status != tt.status || c.Reason != tt.reason {
				t.Fatalf("condition %s %s (%s), want %s %s", c.Status, c.Reason, c.Message, tt.status, tt.reason)
			}
			for _, m := range tt.message {
				if !strings.Contains(c.Message, m) {
					t.Errorf("message %q does not mention %q", c.Message, m)
				}
			}
			if strings.Contains(c.Message, "10.244.6.0/24") {
				t.Errorf("message lists more than %d failures: %q", maxListed, c.Message)
			}
		})
	}
	// A node joining or leaving the cluster must not change any other node's condition (each
	// change would be a write of every Node).
	many := make([]string, 1000)
	for i := range many {
		many[i] = fmt.Sprintf("n%d", i)
	}
	far := []routes.Failure{fail("far", "10.244.9.0/24")}
	for _, failures := range [][]routes.Failure{nil, far} {
		if a, b := RouteCondition(many[:2], failures, nil), RouteCondition(append(many, "far"), failures, nil); a != b {
			t.Errorf("the condition depends on the number of peers: %+v and %+v", a, b)
		}
	}
}

func TestRelevantUpdates(t *testing.T) {
	a := &Agent{cfg: Config{NodeName: "self"}, syncState: syncState{patched: Condition{corev1.ConditionFalse, ReasonRoutesCreated, "set by us"}}}
	base := func(name string) *corev1.Node {
		n := node(name, []string{"10.244.1.0/24"}, "192.168.1.1")
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
		return n
	}
	tests := []struct {
		name   string
		node   string
		change func(n *corev1.Node)
		want   bool
	}{
		{"heartbeat of a peer", "peer", func(n *corev1.Node) { n.Status.Conditions[0].LastHeartbeatTime = metav1.Now() }, false},
		{"peer's pod CIDR assigned", "peer", func(n *corev1.Node) { n.Spec.PodCIDRs = append(n.Spec.PodCIDRs, "fd00::/64") }, true},
		{"peer's address changed", "peer", func(n *corev1.Node) { n.Status.Addresses[0].Address = "192.168.1.9" }, true},
		{"peer's NetworkUnavailable changed (its own agent)", "peer", func(n *corev1.Node) {
			n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: corev1.NodeNetworkUnavailable})
		}, false},
		{"own NetworkUnavailable overwritten by somebody else", "self", func(n *corev1.Node) {
			n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: corev1.NodeNetworkUnavailable, Status: corev1.ConditionTrue})
		}, true},
		{"own heartbeat", "self", func(n *corev1.Node) { n.Status.Conditions[0].LastHeartbeatTime = metav1.Now() }, false},
		{"own NetworkUnavailable as the agent itself last set it", "self", func(n *corev1.Node) {
			n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: corev1.NodeNetworkUnavailable, Status: corev1.ConditionFalse, Reason: ReasonRoutesCreated, Message: "set by us"})
		}, false},
		{"own NetworkUnavailable changed back by somebody else after that", "self", func(n *corev1.Node) {
			n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: corev1.NodeNetworkUnavailable, Status: corev1.ConditionFalse, Reason: ReasonRoutesCreated, Message: "set by somebody"})
		}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			old := base(tt.node)
			updated := old.DeepCopy()
			tt.change(updated)
			if got := a.relevant(old, updated); got != tt.want {
				t.Errorf("relevant = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestNewRefusesSettingsThePluginWouldRefuse(t *testing.T) {
	v6 := []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:10:244::/48")}
	tests := []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{name: "valid", cfg: Config{NodeName: "a"}},
		{name: "no node name", cfg: Config{}, wantErr: "no node name"},
		{name: "bad hairpin mode", cfg: Config{NodeName: "a", Conflist: cnidirOptions("bogus", 0, nil)}, wantErr: "hairpinMode"},
		{name: "MTU too small for IPv6 in a dual-stack cluster", cfg: Config{NodeName: "a", Conflist: cnidirOptions("", 1200, v6)}, wantErr: "IPv6 needs at least 1280"},
		{name: "the same MTU in an IPv4 cluster", cfg: Config{NodeName: "a", Conflist: cnidirOptions("", 1200, v6[:1])}},
		{name: "route protocol out of range", cfg: Config{NodeName: "a", RouteProtocol: 256}, wantErr: "route protocol"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(nil, tt.cfg)
			if (err == nil) != (tt.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("New = %v, want error %q", err, tt.wantErr)
			}
		})
	}
}

func cnidirOptions(hairpin string, mtu int, clusterCIDRs []netip.Prefix) cnidir.Options {
	return cnidir.Options{HairpinMode: hairpin, MTU: mtu, NonMasqueradeCIDRs: clusterCIDRs}
}

// TestStopWhileStartingIsNoFailure: an agent told to stop before its informers synced (a rollout
// replacing a pod that just started, an API server still down) ends without an error; its exit
// status would otherwise say it failed.
func TestStopWhileStartingIsNoFailure(t *testing.T) {
	// Nothing listens there: no list ever succeeds, so no informer syncs.
	cs, err := kubernetes.NewForConfig(&rest.Config{Host: "http://127.0.0.1:1", Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(cs.CoreV1(), Config{NodeName: "n", ConfDir: t.TempDir(), Conflist: cnidir.Options{DataDir: t.TempDir()},
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run stopped while starting: %v, want no error", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}
