//go:build kubenet_e2e_agent

package agent

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kubenet-dev/kubenet/agent"
	"github.com/kubenet-dev/kubenet/internal/ipnet"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

// TestAgentHostileNodes treats Node objects as input: Nodes whose pod CIDRs break a rule get no
// route on any node, a node whose own pod CIDR breaks one writes no conflist, and Events on the
// agents' own Nodes and their readiness say why. The honest nodes keep talking throughout,
// except where two Nodes claim the same addresses: then nobody routes them until the
// impostor is gone.
func TestAgentHostileNodes(t *testing.T) {
	u, cp, agentUser := startCluster(t)
	api := cp.Admin
	n1, n2 := newSimNode(t, u, cp, "node-1", 1, agentUser), newSimNode(t, u, cp, "node-2", 2, agentUser)
	honest := []*simNode{n1, n2}
	cidrs := map[string][]netip.Prefix{n1.name: podCIDRs(1), n2.name: podCIDRs(2)}
	for _, n := range honest {
		createNode(t, api, nodeObject(n.name, n.addrs, cidrs[n.name]))
	}
	// node-1 has a network of its own inside the cluster CIDR (a second interface).
	localNet := netip.MustParsePrefix("10.244.200.1/24")
	nettest.Do(t, n1.ns, func() error {
		d := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "lan1"}}
		if err := netlink.LinkAdd(d); err != nil {
			return err
		}
		if err := netlink.AddrAdd(d, &netlink.Addr{IPNet: ipnet.FromPrefix(localNet)}); err != nil {
			return err
		}
		return netlink.LinkSetUp(d)
	})
	for _, n := range honest {
		n.startAgent(t)
	}
	honestRoutes := func(n *simNode) []string { return wantRoutes(n, honest, cidrs) }
	for _, n := range honest {
		expectRoutes(t, n, honestRoutes(n))
	}
	pod1, pod2 := addPod(t, n1, "pod-1"), addPod(t, n2, "pod-2")
	expectTraffic(t, pod1, pod2)

	// Every hostile node has an address on the segment: a route to it would work, so only the
	// rules can keep it out.
	gw := func(i int) []netip.Prefix {
		return []netip.Prefix{netip.MustParsePrefix(fmt.Sprintf("192.168.77.%d/24", i))}
	}
	hostile := []struct {
		node   string
		cidrs  []string
		reason string // what node-1's event says
	}{
		{"outside", []string{"10.245.7.0/24"}, "is outside the cluster CIDRs 10.244.0.0/16, fd00:10:244::/48"},
		{"loopback", []string{"127.0.0.0/24"}, "overlaps 127.0.0.0/8 (loopback)"},
		{"multicast", []string{"ff02::/64"}, "overlaps ff00::/8 (multicast)"},
		{"hostbits", []string{"10.244.8.5/24"}, `pod CIDR "10.244.8.5/24" has host bits set`},
		{"lan", []string{"10.244.200.0/24"}, "overlaps this node's network 10.244.200.0/24 (address 10.244.200.1/24 on lan1)"},
	}
	for i, h := range hostile {
		n := nodeObject(h.node, gw(40+i), nil) // "lan" is the last: 192.168.77.44
		n.Spec.PodCIDRs, n.Spec.PodCIDR = h.cidrs, h.cidrs[0]
		createNode(t, api, n)
	}
	// Only "lan" is routable, from node-2: the network it overlaps is node-1's alone.
	expectRoutes(t, n1, honestRoutes(n1))
	expectRoutes(t, n2, append(honestRoutes(n2), "10.244.200.0/24 via 192.168.77.44"))
	for _, h := range hostile {
		expectEvent(t, api, n1.name, agent.EventRouteRefused, "node "+h.node, h.reason)
	}
	if _, err := events(api, n2.name, agent.EventRouteRefused, "node lan"); err == nil {
		t.Error("node-2 reported a refusal of node lan's CIDR, which overlaps only node-1's network")
	}
	for _, h := range hostile {
		expectRouteFailureMetric(t, n1, h.node)
	}
	expectTraffic(t, pod1, pod2)

	// An impostor claims node-2's pod CIDRs: nobody routes them, node-2 writes no conflist for
	// them (its file stays: its pods must stay removable) and says so.
	confBefore := statFile(t, n2.confFile())
	createNode(t, api, nodeObject("impostor", gw(60), cidrs[n2.name]))
	expectRoutes(t, n1, nil)
	expectNotReady(t, n2, "overlaps the pod CIDR of node impostor")
	expectEvent(t, api, n2.name, agent.EventPodCIDRRefused, "pod CIDR 10.244.2.0/24 of node node-2 overlaps the pod CIDR of node impostor")
	expectEvent(t, api, n1.name, agent.EventRouteRefused, "node node-2", "overlaps the pod CIDR of node impostor")
	if after := statFile(t, n2.confFile()); after != confBefore {
		t.Error("node-2's conflist was replaced while its pod CIDRs were refused")
	}
	deleteNode(t, api, "impostor")
	expectRoutes(t, n1, honestRoutes(n1))
	expectReady(t, n2)
	expectTraffic(t, pod1, pod2)
	expectTraffic(t, pod2, pod1)

	// A new node whose pod CIDR is outside the cluster CIDR: no conflist at all.
	n3 := newSimNode(t, u, cp, "node-3", 3, agentUser)
	createNode(t, api, nodeObject(n3.name, n3.addrs, []netip.Prefix{netip.MustParsePrefix("10.250.3.0/24")}))
	n3.startAgent(t)
	expectNotReady(t, n3, "pod CIDR 10.250.3.0/24 of node node-3 is outside the cluster CIDRs")
	expectEvent(t, api, n3.name, agent.EventPodCIDRRefused, "10.250.3.0/24", "outside the cluster CIDRs")
	if _, err := os.Stat(n3.confFile()); !os.IsNotExist(err) {
		t.Fatalf("node-3 wrote a conflist for a refused pod CIDR (stat: %v)", err)
	}
	expectRoutes(t, n1, honestRoutes(n1))
	// Registered again with a CIDR of the cluster, it gets its conflist and its routes.
	deleteNode(t, api, n3.name)
	cidrs[n3.name] = podCIDRs(3)
	createNode(t, api, nodeObject(n3.name, n3.addrs, cidrs[n3.name]))
	expectReady(t, n3)
	checkConflist(t, n3, cidrs[n3.name])
	honest = append(honest, n3)
	for _, n := range honest {
		expectRoutes(t, n, slices.Concat(honestRoutes(n), lanRoute(n, n1)))
	}
	expectTraffic(t, addPod(t, n3, "pod-3"), pod1)
}

// lanRoute is the route every node but n1 makes to node lan's pod CIDR.
func lanRoute(n, n1 *simNode) []string {
	if n == n1 {
		return nil
	}
	return []string{"10.244.200.0/24 via 192.168.77.44"}
}

// expectRouteFailureMetric checks that n's agent exports a route failure for node.
func expectRouteFailureMetric(t *testing.T, n *simNode, node string) {
	t.Helper()
	m, err := n.metrics()
	if err != nil {
		t.Fatal(err)
	}
	if m[fmt.Sprintf("kubenet_agent_route_failures{node=%q}", node)] == 0 {
		t.Errorf("%s exports no route failure for node %s", n.name, node)
	}
}

// events returns the Events about node with reason whose message holds every part.
func events(api kubernetes.Interface, node, reason string, parts ...string) ([]corev1.Event, error) {
	list, err := api.CoreV1().Events(metav1.NamespaceDefault).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	var out []corev1.Event
	for _, e := range list.Items {
		if e.InvolvedObject.Kind != "Node" || e.InvolvedObject.Name != node || e.Reason != reason || e.Source.Component != "kubenet-agent" {
			continue
		}
		if !slices.ContainsFunc(parts, func(p string) bool { return !strings.Contains(e.Message, p) }) {
			out = append(out, e)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no %s event on node %s mentioning %q (of %d events)", reason, node, parts, len(list.Items))
	}
	return out, nil
}

func expectEvent(t *testing.T, api kubernetes.Interface, node, reason string, parts ...string) {
	t.Helper()
	err := nettest.Eventually(converge, func() error {
		_, err := events(api, node, reason, parts...)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestAgentNodeInsidePodCIDR: a Node whose InternalIP lies inside a pod CIDR (another node's, the
// local node's, its own; in any form the API lets it write) or a service CIDR gets no route on
// any node, and an Event on each agent's Node names the address and the CIDR, while a valid
// Node next to it keeps its route. An address that only later falls inside a pod CIDR (a new Node claims a CIDR
// around it, or the Node reports a new InternalIP) takes the route the Node had away, and gives
// it back when the conflict is gone.
func TestAgentNodeInsidePodCIDR(t *testing.T) {
	u, cp, agentUser := startCluster(t)
	api := cp.Admin
	n1, n2 := newSimNode(t, u, cp, "node-1", 1, agentUser), newSimNode(t, u, cp, "node-2", 2, agentUser)
	honest := []*simNode{n1, n2}
	cidrs := map[string][]netip.Prefix{n1.name: podCIDRs(1), n2.name: podCIDRs(2)}
	// A second subnet on the segment, inside the cluster CIDR: a gateway there is on-link, so
	// the kernel would take a route via it and only the agent's rules can keep one out.
	segment := netip.MustParsePrefix("10.244.99.0/24")
	for i, n := range honest {
		nettest.Do(t, n.ns, func() error {
			eth0, err := netlink.LinkByName("eth0")
			if err != nil {
				return err
			}
			return netlink.AddrAdd(eth0, &netlink.Addr{IPNet: ipnet.FromPrefix(netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, 99, byte(11 + i)}), segment.Bits()))})
		})
	}
	for _, n := range honest {
		createNode(t, api, nodeObject(n.name, n.addrs, cidrs[n.name]))
		n.startAgent(t)
	}
	for _, n := range honest {
		expectRoutes(t, n, wantRoutes(n, honest, cidrs))
	}
	pod1, pod2 := addPod(t, n1, "pod-1"), addPod(t, n2, "pod-2")
	expectTraffic(t, pod1, pod2)

	// Every hostile Node has a gateway that is on-link somewhere: the pod gateways are on the
	// nodes' bridges, the segment addresses on eth0.
	hostile := []struct {
		node  string
		addrs []string
		cidrs []netip.Prefix
		parts []string // what the agents' Events say
	}{
		{"gw-of-node-2", []string{"10.244.2.1", "fd00:10:244:2::1"}, podCIDRs(6), []string{"its InternalIP 10.244.2.1 lies inside the pod CIDR 10.244.2.0/24 of node node-2"}},
		{"mapped", []string{"::ffff:10.244.1.1"}, podCIDRs(7)[:1], []string{`its InternalIP "::ffff:10.244.1.1" (10.244.1.1) lies inside the pod CIDR 10.244.1.0/24 of node node-1`}},
		{"in-own", []string{"10.244.99.30", "10.244.8.1"}, podCIDRs(8)[:1], []string{"its InternalIP 10.244.8.1 lies inside the pod CIDR 10.244.8.0/24 of node in-own"}},
		{"in-services", []string{"10.244.99.31", "10.96.0.10"}, podCIDRs(9)[:1], []string{"its InternalIP 10.96.0.10 lies inside the service CIDR 10.96.0.0/16"}},
	}
	for _, h := range hostile {
		n := nodeObject(h.node, nil, h.cidrs)
		for _, a := range h.addrs {
			n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: a})
		}
		createNode(t, api, n)
	}
	// The valid Node, made after the hostile ones: once its routes are in place, the agents
	// have synced with the hostile Nodes in their caches too (a watch delivers in order), so
	// the routes the hostile ones would have had are known to be absent, not just not yet there.
	valid := nodeObject("valid", []netip.Prefix{netip.MustParsePrefix("10.244.99.20/24"), netip.MustParsePrefix("fd00:77::20/64")}, podCIDRs(5))
	createNode(t, api, valid)
	validRoutes := []string{"10.244.5.0/24 via 10.244.99.20", "fd00:10:244:5::/64 via fd00:77::20"}
	for _, n := range honest {
		expectRoutes(t, n, append(wantRoutes(n, honest, cidrs), validRoutes...))
		for _, h := range hostile {
			expectEvent(t, api, n.name, agent.EventRouteRefused, append([]string{"node " + h.node}, h.parts...)...)
		}
	}
	for _, h := range hostile {
		expectRouteFailureMetric(t, n1, h.node)
	}
	expectTraffic(t, pod1, pod2)
	expectTraffic(t, pod2, pod1)

	// A new Node claims a CIDR around the valid Node's address: the valid Node's routes go
	// everywhere (which claim is right is unknown), and come back when the claim goes.
	createNode(t, api, nodeObject("around-valid", []netip.Prefix{netip.MustParsePrefix("192.168.77.60/24")}, []netip.Prefix{netip.MustParsePrefix("10.244.99.16/28")}))
	for _, n := range honest {
		expectRoutes(t, n, wantRoutes(n, honest, cidrs))
		expectEvent(t, api, n.name, agent.EventRouteRefused, "node valid", "its InternalIP 10.244.99.20 lies inside the pod CIDR 10.244.99.16/28 of node around-valid")
	}
	deleteNode(t, api, "around-valid")
	for _, n := range honest {
		expectRoutes(t, n, append(wantRoutes(n, honest, cidrs), validRoutes...))
	}

	// The valid Node reports one more InternalIP, a pod's address on node-2: its routes go.
	setInternalIPs(t, api, "valid", "10.244.99.20", "fd00:77::20", "10.244.2.77")
	for _, n := range honest {
		expectRoutes(t, n, wantRoutes(n, honest, cidrs))
		expectEvent(t, api, n.name, agent.EventRouteRefused, "node valid", "its InternalIP 10.244.2.77 lies inside the pod CIDR 10.244.2.0/24 of node node-2")
	}
	setInternalIPs(t, api, "valid", "10.244.99.20", "fd00:77::20")
	for _, n := range honest {
		expectRoutes(t, n, append(wantRoutes(n, honest, cidrs), validRoutes...))
	}
	expectTraffic(t, pod1, pod2)
}

// setInternalIPs replaces the Node's InternalIPs through the status subresource, as its kubelet
// would.
func setInternalIPs(t *testing.T, api kubernetes.Interface, name string, addrs ...string) {
	t.Helper()
	ctx := context.Background()
	n, err := api.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Status.Addresses = slices.DeleteFunc(n.Status.Addresses, func(a corev1.NodeAddress) bool { return a.Type == corev1.NodeInternalIP })
	for _, a := range addrs {
		n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: a})
	}
	if _, err := api.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("node %s status: %v", name, err)
	}
}
