package netpol

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/kubenet-dev/kubenet/internal/nettest"
)

// routedNode is a node namespace with pods a and b on links of their own (routed, no bridge:
// the mechanism only cares about the forward and input hooks), both families.
type routedNode struct {
	node, a, b     ns.NetNS
	nodeA4, nodeA6 netip.Addr // the node's addresses on a's link
	a4, a6, b4, b6 netip.Addr
	network        string
}

func newRoutedNode(t *testing.T) *routedNode {
	t.Helper()
	r := &routedNode{node: nettest.NewNS(t), a: nettest.NewNS(t), b: nettest.NewNS(t), network: fmt.Sprintf("np%d", time.Now().UnixNano()%1e6)}
	r.nodeA4, r.nodeA6 = netip.MustParseAddr("10.1.0.1"), netip.MustParseAddr("fd00:1::1")
	r.a4, r.a6 = netip.MustParseAddr("10.1.0.2"), netip.MustParseAddr("fd00:1::2")
	r.b4, r.b6 = netip.MustParseAddr("10.2.0.2"), netip.MustParseAddr("fd00:2::2")
	nettest.Link(t, nettest.Endpoint{NS: r.node, IfName: "pa", Addrs: []netip.Prefix{netip.MustParsePrefix("10.1.0.1/24"), netip.MustParsePrefix("fd00:1::1/64")}},
		nettest.Endpoint{NS: r.a, IfName: "eth0", Addrs: []netip.Prefix{netip.MustParsePrefix("10.1.0.2/24"), netip.MustParsePrefix("fd00:1::2/64")}})
	nettest.Link(t, nettest.Endpoint{NS: r.node, IfName: "pb", Addrs: []netip.Prefix{netip.MustParsePrefix("10.2.0.1/24"), netip.MustParsePrefix("fd00:2::1/64")}},
		nettest.Endpoint{NS: r.b, IfName: "eth0", Addrs: []netip.Prefix{netip.MustParsePrefix("10.2.0.2/24"), netip.MustParsePrefix("fd00:2::2/64")}})
	nettest.AddRoute(t, r.a, netip.MustParsePrefix("0.0.0.0/0"), netip.MustParseAddr("10.1.0.1"))
	nettest.AddRoute(t, r.a, netip.MustParsePrefix("::/0"), netip.MustParseAddr("fd00:1::1"))
	nettest.AddRoute(t, r.b, netip.MustParsePrefix("0.0.0.0/0"), netip.MustParseAddr("10.2.0.1"))
	nettest.AddRoute(t, r.b, netip.MustParsePrefix("::/0"), netip.MustParseAddr("fd00:2::1"))
	nettest.WriteSysctl(t, r.node, "net/ipv4/ip_forward", "1")
	nettest.WriteSysctl(t, r.node, "net/ipv6/conf/all/forwarding", "1")
	return r
}

// apply runs Apply inside the node.
func (r *routedNode) apply(t *testing.T, rs Ruleset) Applied {
	t.Helper()
	var res Applied
	nettest.Do(t, r.node, func() (err error) { res, err = Apply(r.network, rs); return err })
	return res
}

// reach connects once; a reachable peer answers within milliseconds, but the first SYN on a
// fresh link may wait for neighbour resolution, so an expected success gets a retransmission's
// time.
func reach(n ns.NetNS, dst netip.AddrPort, timeout time.Duration) error {
	_, err := nettest.TCPRequest(n, dst, "ping", timeout)
	return err
}

func expectReach(t *testing.T, what string, n ns.NetNS, dst netip.AddrPort, want bool) {
	t.Helper()
	timeout := 700 * time.Millisecond
	if want {
		timeout = 3 * time.Second
	}
	err := reach(n, dst, timeout)
	if want && err != nil {
		t.Errorf("%s: %s not reachable: %v", what, dst, err)
	}
	if !want && err == nil {
		t.Errorf("%s: %s reachable, want denied", what, dst)
	}
}

func TestApplyFiltersTraffic(t *testing.T) {
	r := newRoutedNode(t)
	for _, fam := range []struct {
		name         string
		a, b, nodeIP netip.Addr
	}{{"ipv4", r.a4, r.b4, r.nodeA4}, {"ipv6", r.a6, r.b6, r.nodeA6}} {
		t.Run(fam.name, func(t *testing.T) {
			b80 := nettest.StartTCPEcho(t, r.b, netip.AddrPortFrom(fam.b, 0))
			b81 := nettest.StartTCPEcho(t, r.b, netip.AddrPortFrom(fam.b, 0))
			aSrv := nettest.StartTCPEcho(t, r.a, netip.AddrPortFrom(fam.a, 0))
			nodeSrv := nettest.StartTCPEcho(t, r.node, netip.AddrPortFrom(fam.nodeIP, 0))
			owner := "b-" + fam.name
			podB := func(ingress, egress Direction) Ruleset {
				return Ruleset{Pods: []Pod{{Owner: owner, IPs: []netip.Addr{r.b4, r.b6}, Ingress: ingress, Egress: egress}}}
			}

			// No rules at all: everything flows.
			r.apply(t, Ruleset{})
			expectReach(t, "no policy", r.a, b80.Addr, true)

			// Ingress of b: only a, only b80's port.
			port := Ports{Protocol: TCP, First: b80.Addr.Port(), Last: b80.Addr.Port()}
			r.apply(t, podB(Direction{Isolated: true, Allow: []Entry{{Peer: Single(fam.a), Ports: &port}}}, Direction{}))
			expectReach(t, "ingress allowed port", r.a, b80.Addr, true)
			expectReach(t, "ingress other port", r.a, b81.Addr, false)
			expectReach(t, "b not egress-isolated", r.b, aSrv.Addr, true)

			// Ingress deny-all: nothing reaches b, b still reaches out and gets replies.
			r.apply(t, podB(Direction{Isolated: true}, Direction{}))
			expectReach(t, "ingress deny all", r.a, b80.Addr, false)
			expectReach(t, "replies of b's own connections", r.b, aSrv.Addr, true)

			// Egress of b: a on every port, nothing else; the node is not a but its address.
			r.apply(t, podB(Direction{}, Direction{Isolated: true, Allow: []Entry{{Peer: Single(fam.a)}}}))
			expectReach(t, "egress allowed peer", r.b, aSrv.Addr, true)
			expectReach(t, "egress to the node (input hook)", r.b, nodeSrv.Addr, false)
			expectReach(t, "ingress not isolated", r.a, b81.Addr, true)

			// An address range with a hole (ipBlock with except): the node's link is allowed
			// except the node's own address.
			lo, hi := fam.nodeIP.Prev(), fam.nodeIP.Next()
			r.apply(t, podB(Direction{}, Direction{Isolated: true, Allow: []Entry{
				{Peer: Range{PrefixRange(netip.PrefixFrom(fam.a, 24)).First, lo}},
				{Peer: Range{hi, PrefixRange(netip.PrefixFrom(fam.a, 24)).Last}},
			}}))
			expectReach(t, "egress inside the block", r.b, aSrv.Addr, true)
			expectReach(t, "egress to the excepted address", r.b, nodeSrv.Addr, false)

			// Pending: held addresses see nothing until Apply names their owner.
			r.apply(t, Ruleset{})
			nettest.Do(t, r.node, func() error { return Hold(r.network, owner, []netip.Addr{r.b4, r.b6}) })
			expectReach(t, "pending destination", r.a, b80.Addr, false)
			expectReach(t, "pending source", r.b, aSrv.Addr, false)
			res := r.apply(t, Ruleset{Pods: []Pod{{Owner: "someone-else", IPs: []netip.Addr{r.b4, r.b6}}}})
			if res.Released != 0 {
				t.Errorf("Apply released %d pending addresses for the wrong owner", res.Released)
			}
			expectReach(t, "pending for another owner", r.a, b80.Addr, false)
			res = r.apply(t, podB(Direction{}, Direction{}))
			if res.Released != 2 {
				t.Errorf("Apply released %d pending addresses, want 2", res.Released)
			}
			expectReach(t, "released", r.a, b80.Addr, true)

			// Forget removes map elements (and pending ones) of the addresses.
			r.apply(t, podB(Direction{Isolated: true}, Direction{}))
			expectReach(t, "before forget", r.a, b80.Addr, false)
			nettest.Do(t, r.node, func() error { return Forget(r.network, []netip.Addr{r.b4, r.b6}) })
			expectReach(t, "after forget", r.a, b80.Addr, true)
			r.apply(t, Ruleset{})
		})
	}
	// Everything the groups made is gone once nobody uses it: only the fixed objects remain.
	out := nettest.Run(t, r.node, "nft", "list", "table", "inet", TableName(r.network))
	for _, l := range strings.Split(out, "\n") {
		l = strings.TrimSpace(l)
		if (strings.HasPrefix(l, "chain ") && l != "chain forward {" && l != "chain input {") || strings.Contains(l, "-any-") || strings.Contains(l, "-ports-") {
			t.Errorf("left over after the last group went: %q", l)
		}
	}
}

// TestApplyKeepsTableWhenNothingChanges shows that a repeated Apply of the same ruleset writes
// nothing.
func TestApplyKeepsTableWhenNothingChanges(t *testing.T) {
	r := newRoutedNode(t)
	rs := Ruleset{Pods: []Pod{{Owner: "b", IPs: []netip.Addr{r.b4}, Ingress: Direction{Isolated: true, Allow: []Entry{{Peer: Single(r.a4)}}}}}}
	first := r.apply(t, rs)
	if first.NewGroups != 1 || !first.BaseWritten || first.MapChanges != 1 {
		t.Errorf("first Apply = %+v, want one group, the base written and one map element", first)
	}
	again := r.apply(t, rs)
	if again.NewGroups != 0 || again.BaseWritten || again.MapChanges != 0 || again.RemovedGroups != 0 {
		t.Errorf("second Apply of the same ruleset = %+v, want no change", again)
	}
}

// TestApplyRewritesBaseRuleChangedInPlace edits a base rule the way a person with the nft tool
// would, keeping its comment: the ingress dispatch becomes an accept, which lets everything to
// local pods through. The next Apply must see the change by the rule's expressions and put the
// planned rule back, so the isolated pod is denied again.
func TestApplyRewritesBaseRuleChangedInPlace(t *testing.T) {
	r := newRoutedNode(t)
	b80 := nettest.StartTCPEcho(t, r.b, netip.AddrPortFrom(r.b4, 0)).Addr
	deny := Ruleset{Pods: []Pod{{Owner: "b", IPs: []netip.Addr{r.b4}, Ingress: Direction{Isolated: true}}}}
	r.apply(t, deny)
	expectReach(t, "isolated", r.a, b80, false)

	table := TableName(r.network)
	comment := "ingress of local pods, by destination (" + MapIngress4 + ")"
	listing := nettest.Run(t, r.node, "nft", "-a", "list", "chain", "inet", table, ChainForward)
	var handle string
	for _, l := range strings.Split(listing, "\n") {
		if strings.Contains(l, `comment "`+comment+`"`) {
			if i := strings.LastIndex(l, "# handle "); i >= 0 {
				handle = strings.TrimSpace(l[i+len("# handle "):])
			}
		}
	}
	if handle == "" {
		t.Fatalf("no rule with comment %q in:\n%s", comment, listing)
	}
	nettest.Run(t, r.node, "nft", "replace", "rule", "inet", table, ChainForward, "handle", handle,
		"meta", "nfproto", "ipv4", "accept", "comment", `"`+comment+`"`)
	expectReach(t, "after the edit (the edit works)", r.a, b80, true)

	again := r.apply(t, deny)
	if !again.BaseWritten {
		t.Errorf("Apply after an in-place edit = %+v, want the base chains rewritten", again)
	}
	expectReach(t, "after Apply", r.a, b80, false)
}
