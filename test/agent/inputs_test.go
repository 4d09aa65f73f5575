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
	"github.com/kubenet-dev/kubenet/internal/nettest"
)

// TestAgentHostileNodes treats Node objects as input: Nodes whose pod CIDRs break a rule get no
// route on any node, a node whose own pod CIDR breaks one writes no conflist, and Events on the
// agents' own Nodes and their readiness say why. The honest nodes keep talking throughout,
// except where two Nodes claim the same addresses: then nobody routes them until the
// impostor is gone.
func TestAgentHostileNodes(t *testing.T) {
	u, cp, agentTok := startCluster(t)
	api := cp.admin
	n1, n2 := newSimNode(t, u, cp, "node-1", 1, agentTok), newSimNode(t, u, cp, "node-2", 2, agentTok)
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
	m, err := n1.metrics()
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hostile {
		if m[fmt.Sprintf("kubenet_agent_route_failures{node=%q}", h.node)] == 0 {
			t.Errorf("node-1 exports no route failure for node %s", h.node)
		}
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
	n3 := newSimNode(t, u, cp, "node-3", 3, agentTok)
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
