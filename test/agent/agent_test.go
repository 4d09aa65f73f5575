//go:build kubenet_e2e_agent

package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubenet-dev/kubenet/agent"
	"github.com/kubenet-dev/kubenet/agent/routes"
	"github.com/kubenet-dev/kubenet/hostport"
	"github.com/kubenet-dev/kubenet/internal/ipnet"
	"github.com/kubenet-dev/kubenet/test/nettest"
	"github.com/kubenet-dev/kubenet/test/testkit"
)

const converge = 30 * time.Second

// TestAgentCluster runs one agent per node of a three-node cluster against a real API server
// and follows the cluster through its life: a node without a pod CIDR, CIDR assignment, routes
// and pod traffic between nodes, the node condition, an agent restart, a node that is not on
// the segment, a node deletion and a pod CIDR change. The steps share the cluster and run in
// order; the first failing step ends the test.
func TestAgentCluster(t *testing.T) {
	u, cp, agentUser := startCluster(t)
	api := cp.Admin

	nodes := []*simNode{
		newSimNode(t, u, cp, "node-1", 1, agentUser),
		newSimNode(t, u, cp, "node-2", 2, agentUser),
		newSimNode(t, u, cp, "node-3", 3, agentUser),
	}
	n1, n2, n3 := nodes[0], nodes[1], nodes[2]
	// What the API says each node's pod CIDRs are; the routes everywhere must follow it.
	cidrs := map[string][]netip.Prefix{n2.name: podCIDRs(2), n3.name: podCIDRs(3)}
	for _, n := range nodes {
		createNode(t, api, nodeObject(n.name, n.addrs, cidrs[n.name]))
	}
	// A route somebody else made (an operator's static route) that must survive everything.
	foreign := netip.MustParsePrefix("10.99.0.0/24")
	nettest.Do(t, n1.ns, func() error {
		return netlink.RouteAdd(&netlink.Route{Dst: ipnet.FromPrefix(foreign), Gw: netip.MustParseAddr("192.168.77.250").AsSlice(), Protocol: unix.RTPROT_STATIC})
	})
	// --routing=direct: this test is about routes via node addresses (TestAgentOverlay covers
	// the overlay, which auto would pick for the node off the segment below).
	for _, n := range nodes {
		n.startAgent(t, "--routing=direct")
	}

	routesConverge := func(t *testing.T) {
		t.Helper()
		for _, n := range nodes {
			expectRoutes(t, n, wantRoutes(n, nodes, cidrs))
		}
	}
	conditionIs := func(t *testing.T, n *simNode, status corev1.ConditionStatus, reason string, msgParts ...string) {
		t.Helper()
		err := nettest.Eventually(converge, func() error {
			c, err := networkCondition(api, n.name)
			if err != nil {
				return err
			}
			if c == nil {
				return fmt.Errorf("node %s has no NetworkUnavailable condition", n.name)
			}
			if c.Status != status || c.Reason != reason {
				return fmt.Errorf("node %s: NetworkUnavailable=%s %s (%s), want %s %s", n.name, c.Status, c.Reason, c.Message, status, reason)
			}
			for _, p := range msgParts {
				if !strings.Contains(c.Message, p) {
					return fmt.Errorf("node %s: condition message %q does not mention %q", n.name, c.Message, p)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}

	steps := []struct {
		name string
		run  func(t *testing.T)
	}{
		{"no pod CIDR: nothing written, not ready", func(t *testing.T) {
			n1.waitSynced(t)
			if code, body, err := n1.get("/healthz"); err != nil || code != 200 {
				t.Fatalf("/healthz: %d %q %v", code, body, err)
			}
			code, body, err := n1.get("/readyz")
			if err != nil || code != 503 || !strings.Contains(body, "waiting for the node's pod CIDR") {
				t.Fatalf("/readyz of a node without a pod CIDR: %d %q %v, want 503 waiting for the pod CIDR", code, body, err)
			}
			if _, err := os.Stat(n1.confFile()); !os.IsNotExist(err) {
				t.Fatalf("conflist written before the node had a pod CIDR (stat: %v)", err)
			}
			if c, err := networkCondition(api, n1.name); err != nil || c != nil {
				t.Fatalf("condition set before the node had a pod CIDR: %+v %v", c, err)
			}
			// The binary is installed regardless, identical to the source.
			got, err := os.ReadFile(filepath.Join(n1.binDir(), "kubenet"))
			if err != nil {
				t.Fatal(err)
			}
			src, _ := os.ReadFile(filepath.Join(testBins.pluginDir, "kubenet"))
			if !bytes.Equal(got, src) {
				t.Fatal("installed kubenet binary differs from the source")
			}
		}},
		{"pod CIDR assigned: conflist written, ready", func(t *testing.T) {
			cidrs[n1.name] = podCIDRs(1)
			patch := fmt.Sprintf(`{"spec":{"podCIDR":%q,"podCIDRs":[%q,%q]}}`, cidrs[n1.name][0], cidrs[n1.name][0], cidrs[n1.name][1])
			if _, err := api.CoreV1().Nodes().Patch(context.Background(), n1.name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
				t.Fatal(err)
			}
			for _, n := range nodes {
				expectReady(t, n)
				checkConflist(t, n, cidrs[n.name])
			}
		}},
		{"routes converge on every node", routesConverge},
		{"condition NetworkUnavailable=False", func(t *testing.T) {
			for _, n := range nodes {
				conditionIs(t, n, corev1.ConditionFalse, agent.ReasonRoutesCreated, "every other node's pod CIDRs are in place")
			}
		}},
		{"pods on different nodes talk with their own addresses", func(t *testing.T) {
			pods := make([]*nettest.Pod, len(nodes))
			for i, n := range nodes {
				pods[i] = addPod(t, n, fmt.Sprintf("pod-%s", n.name))
			}
			for i := range nodes {
				for j := range nodes {
					if i != j {
						expectTraffic(t, pods[i], pods[j])
					}
				}
			}
		}},
		{"a flushed ruleset is restored by the agent", func(t *testing.T) {
			// A firewall reload on node-1 runs `nft flush ruleset`: the agent's nftables watch
			// puts kubenet's rules, the running pod's hostPort element and every running pod's
			// isolation elements (from their attachment records) back, without an ADD.
			list, err := libcni.ConfListFromFile(n1.confFile())
			if err != nil {
				t.Fatal(err)
			}
			// In the API first: with NetworkPolicy on, a pod the agent cannot find stays held.
			createPod(t, n1.admin, "default", "hostport-heal", n1.name, nil)
			pod := n1.cni.NewPod(t, "hostport-heal")
			pod.RT.CapabilityArgs = map[string]any{"portMappings": []map[string]any{{"hostPort": 30480, "containerPort": 7777, "protocol": "tcp"}}}
			n1.cni.MustAdd(t, list, pod)
			nettest.StartTCPEcho(t, pod.NS, netip.AddrPortFrom(netip.IPv6Unspecified(), 7777))
			hostPort := netip.AddrPortFrom(n1.addrs[0].Addr(), 30480)
			reachable := func() error {
				r, err := nettest.TCPRequest(n2.ns, hostPort, "heal", 2*time.Second)
				return nettest.ExpectFrom(r, err, n2.addrs[0].Addr())
			}
			if err := nettest.Eventually(converge, reachable); err != nil {
				t.Fatalf("host port %s before the flush: %v", hostPort, err)
			}
			before, err := n1.metrics()
			if err != nil {
				t.Fatal(err)
			}
			// Every pod running on node-1 (this one at least: its port, twice, its MAC, its
			// link-local address and its two addresses, and the last three joined with its MAC).
			isolated := testkit.SortedIsolationElements(t, n1.cni)
			if n := len(slices.DeleteFunc(slices.Clone(isolated), func(e string) bool { return !strings.HasSuffix(e, "[hostport-heal/eth0]") })); n != 9 {
				t.Fatalf("isolation elements on node-1 before the flush: %q, want 9 of the pod", isolated)
			}
			nettest.Run(t, n1.ns, "nft", "flush", "ruleset")
			flushed := time.Now()
			err = nettest.Eventually(converge, func() error {
				out, err := nettest.Output(n1.ns, "nft", "list", "chain", "inet", "kubenet-kubenet", hostport.ChainLocalnetInput)
				if err != nil || strings.Count(out, " drop ") != 2 {
					return fmt.Errorf("localnet guard not back: %v\n%s", err, out)
				}
				if got := testkit.SortedIsolationElements(t, n1.cni); !slices.Equal(got, isolated) {
					return fmt.Errorf("isolation elements %q, want the running pods' %q", got, isolated)
				}
				return reachable()
			})
			if err != nil {
				t.Fatalf("after nft flush ruleset: %v", err)
			}
			t.Logf("node-1 healed %v after the flush (polled)", time.Since(flushed))
			after, err := n1.metrics()
			if err != nil {
				t.Fatal(err)
			}
			if r := "kubenet_agent_heal_repairs_total"; after[r] <= before[r] {
				t.Errorf("%s = %v, was %v: the repair is not counted", r, after[r], before[r])
			}
			if r := "kubenet_agent_heal_restored_hostport_elements_total"; after[r] < before[r]+2 {
				t.Errorf("%s = %v, was %v: the restored element is not counted", r, after[r], before[r])
			}
			// The pod's mapping has no hostIP: one element per family.
			if _, err := logRecord(n1.logFile(), "node-wide state of the kubenet network restored", map[string]string{"restoredHostPortElements": "2"}); err != nil {
				t.Error(err)
			}
		}},
		{"operator's route untouched", func(t *testing.T) {
			expectForeignRoute(t, n1, foreign)
		}},
		{"restart converges without flapping", func(st *testing.T) {
			restartWithoutFlap(st, t, n1, n2, n3)
		}},
		{"node off the segment is reported", func(t *testing.T) {
			far := nodeObject("far", []netip.Prefix{netip.MustParsePrefix("192.168.99.4/24"), netip.MustParsePrefix("fd00:99::4/64")}, podCIDRs(9))
			createNode(t, api, far)
			for _, n := range nodes {
				conditionIs(t, n, corev1.ConditionFalse, agent.ReasonRoutesIncomplete, "node far", "L2 segment", "2 route(s) missing")
			}
			err := nettest.Eventually(converge, func() error {
				m, err := n1.metrics()
				if err != nil {
					return err
				}
				if got := m[`kubenet_agent_route_failures{node="far"}`]; got != 2 {
					return fmt.Errorf("route failures for node far: %v, want 2", got)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := logRecord(n1.logFile(), "route not programmed", map[string]string{"node": "far", "dst": "10.244.9.0/24"}); err != nil {
				t.Fatal(err)
			}
			routesConverge(t) // the others are unaffected
			deleteNode(t, api, "far")
			for _, n := range nodes {
				conditionIs(t, n, corev1.ConditionFalse, agent.ReasonRoutesCreated)
			}
			m, err := n1.metrics()
			if err != nil {
				t.Fatal(err)
			}
			for series := range m {
				if strings.HasPrefix(series, "kubenet_agent_route_failures") {
					t.Fatalf("failure series %s still exported after node far was deleted", series)
				}
			}
		}},
		{"deleted node loses its routes everywhere", func(t *testing.T) {
			deleteNode(t, api, n3.name)
			delete(cidrs, n3.name)
			routesConverge(t)
			expectNotReady(t, n3, "not found")
			// Its pods keep running until drained: the conflist stays.
			checkConflist(t, n3, podCIDRs(3))
		}},
		{"pod CIDR change: conflist rewritten, bridge moved, routes follow", func(t *testing.T) {
			// The API server refuses changes of spec.podCIDRs, so a CIDR change is a Node
			// deleted and registered again.
			cidrs[n3.name] = podCIDRs(33)
			createNode(t, api, nodeObject(n3.name, n3.addrs, cidrs[n3.name]))
			err := nettest.Eventually(converge, func() error { return conflistHas(n3, cidrs[n3.name]) })
			if err != nil {
				t.Fatal(err)
			}
			routesConverge(t)
			conditionIs(t, n3, corev1.ConditionFalse, agent.ReasonRoutesCreated)
			pod3 := addPod(t, n3, "pod-after-change")
			if ip := pod3.IP(netip.IPv4Unspecified()); !cidrs[n3.name][0].Contains(ip) {
				t.Fatalf("new pod on %s got %s, outside the new pod CIDR %s", n3.name, ip, cidrs[n3.name][0])
			}
			expectBridgeGateways(t, n3, cidrs[n3.name])
			pod1 := addPod(t, n1, "pod-1-again")
			expectTraffic(t, pod1, pod3)
			expectTraffic(t, pod3, pod1)
			expectForeignRoute(t, n1, foreign)
		}},
	}
	for _, s := range steps {
		if !t.Run(s.name, s.run) {
			return
		}
	}
}

// checkConflist verifies the conflist the agent wrote: the node's CIDRs and the flags' values,
// loadable by libcni.
func checkConflist(t *testing.T, n *simNode, cidrs []netip.Prefix) {
	t.Helper()
	if err := conflistHas(n, cidrs); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(n.confFile())
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		CNIVersion  string   `json:"cniVersion"`
		CNIVersions []string `json:"cniVersions"`
		Name        string   `json:"name"`
		Plugins     []struct {
			Type               string          `json:"type"`
			NonMasqueradeCIDRs []string        `json:"nonMasqueradeCIDRs"`
			MTU                int             `json:"mtu"`
			HairpinMode        string          `json:"hairpinMode"`
			DataDir            string          `json:"dataDir"`
			Capabilities       map[string]bool `json:"capabilities"`
		} `json:"plugins"`
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		t.Fatal(err)
	}
	p := c.Plugins[0]
	wantNonMasq := []string{clusterCIDRs[0].String(), clusterCIDRs[1].String()}
	if c.Name != "kubenet" || c.CNIVersion != "1.0.0" || !slices.Contains(c.CNIVersions, "1.1.0") || p.Type != "kubenet" ||
		!slices.Equal(p.NonMasqueradeCIDRs, wantNonMasq) || p.MTU != 1450 || p.HairpinMode != "hairpin-veth" ||
		p.DataDir != n.cni.DataDir() || !p.Capabilities["portMappings"] {
		t.Fatalf("conflist of %s does not carry the agent's flags:\n%s", n.name, raw)
	}
}

// conflistHas checks that the conflist loads through libcni and names exactly cidrs.
func conflistHas(n *simNode, cidrs []netip.Prefix) error {
	list, err := libcni.ConfListFromFile(n.confFile())
	if err != nil {
		return err
	}
	var p struct {
		PodCIDRs []string `json:"podCIDRs"`
	}
	if err := json.Unmarshal(list.Plugins[0].Bytes, &p); err != nil {
		return err
	}
	want := []string{cidrs[0].String(), cidrs[1].String()}
	if !slices.Equal(p.PodCIDRs, want) {
		return fmt.Errorf("conflist of %s has podCIDRs %q, want %q", n.name, p.PodCIDRs, want)
	}
	return nil
}

// addPod creates a pod object in the default namespace, bound to n, and attaches it on n through
// libcni with the agent's conflist and installed binary (the agent releases the pod's addresses
// once it knows the pod: NetworkPolicy is on), and starts a TCP echo server in it.
func addPod(t *testing.T, n *simNode, id string) *nettest.Pod {
	t.Helper()
	list, err := libcni.ConfListFromFile(n.confFile())
	if err != nil {
		t.Fatal(err)
	}
	createPod(t, n.admin, "default", id, n.name, nil)
	pod := n.cni.NewPod(t, id)
	n.cni.MustAdd(t, list, pod)
	nettest.StartTCPEcho(t, pod.NS, netip.AddrPortFrom(netip.IPv6Unspecified(), 7777))
	return pod
}

// expectTraffic connects from src to dst over both families and checks that dst saw src's own
// address: the route between the nodes carries it, and no SNAT happens inside the cluster CIDR.
func expectTraffic(t *testing.T, src, dst *nettest.Pod) {
	t.Helper()
	for _, dstIP := range dst.IPs() {
		err := nettest.Eventually(10*time.Second, func() error {
			r, err := nettest.TCPRequest(src.NS, netip.AddrPortFrom(dstIP, 7777), "hello", 2*time.Second)
			return nettest.ExpectFrom(r, err, src.IP(dstIP))
		})
		if err != nil {
			t.Fatalf("%s -> %s (%s): %v", src.RT.ContainerID, dst.RT.ContainerID, dstIP, err)
		}
	}
}

func expectForeignRoute(t *testing.T, n *simNode, dst netip.Prefix) {
	t.Helper()
	nettest.Do(t, n.ns, func() error {
		rs, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Dst: ipnet.FromPrefix(dst), Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_DST|netlink.RT_FILTER_TABLE)
		if err != nil {
			return err
		}
		if len(rs) != 1 || rs[0].Protocol != unix.RTPROT_STATIC {
			return fmt.Errorf("the operator's static route to %s changed: %v", dst, rs)
		}
		return nil
	})
}

// expectBridgeGateways checks that the node's bridge has exactly the gateways of cidrs as
// global addresses: nothing left of an earlier pod CIDR.
func expectBridgeGateways(t *testing.T, n *simNode, cidrs []netip.Prefix) {
	t.Helper()
	var want []string
	for _, c := range cidrs {
		want = append(want, netip.PrefixFrom(c.Addr().Next(), c.Bits()).String())
	}
	nettest.Do(t, n.ns, func() error {
		br, err := netlink.LinkByName("cbr0")
		if err != nil {
			return err
		}
		addrs, err := netlink.AddrList(br, netlink.FAMILY_ALL)
		if err != nil {
			return err
		}
		var got []string
		for _, a := range addrs {
			if a.Scope == unix.RT_SCOPE_UNIVERSE {
				got = append(got, a.IPNet.String())
			}
		}
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			return fmt.Errorf("bridge of %s has %q, want exactly %q", n.name, got, want)
		}
		return nil
	})
}

// restartWithoutFlap stops n's agent, moves one of its routes to a wrong gateway behind its
// back, starts it again and checks, from the kernel's route notifications, that the restarted
// agent changed that one route in place and touched no other.
// The new agent belongs to the whole test (top), not to the step.
func restartWithoutFlap(t, top *testing.T, n, peer, wrong *simNode) {
	if err := n.agent.Stop(); err != nil {
		t.Fatal(err)
	}
	before, err := agentRoutes(n.ns)
	if err != nil {
		t.Fatal(err)
	}
	if len(before) == 0 {
		t.Fatal("the stopped agent's routes are gone; they must stay across restarts")
	}
	confBefore, binBefore := statFile(t, n.confFile()), statFile(t, filepath.Join(n.binDir(), "kubenet"))

	peerCIDR := podCIDRs(2)[0]
	nettest.Do(t, n.ns, func() error {
		return netlink.RouteReplace(&netlink.Route{Dst: ipnet.FromPrefix(peerCIDR), Gw: wrong.addr(peerCIDR.Addr()).AsSlice(), Protocol: routes.DefaultProtocol})
	})
	events := subscribeRoutes(t, n.ns)
	n.startAgent(top, "--routing=direct")
	err = nettest.Eventually(converge, func() error {
		got, err := agentRoutes(n.ns)
		if err != nil {
			return err
		}
		if !slices.Equal(got, before) {
			return fmt.Errorf("routes after restart:\n got %q\nwant %q", got, before)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	m := n.waitSynced(t)
	if m["kubenet_agent_conflist_writes_total"] != 0 {
		t.Fatalf("the restarted agent rewrote an unchanged conflist (%v writes)", m["kubenet_agent_conflist_writes_total"])
	}
	if confAfter, binAfter := statFile(t, n.confFile()), statFile(t, filepath.Join(n.binDir(), "kubenet")); confAfter != confBefore || binAfter != binBefore {
		t.Fatalf("the restart replaced files that were already right: conflist %v -> %v, binary %v -> %v", confBefore, confAfter, binBefore, binAfter)
	}
	got := events.drain(t, n.ns)
	want := []string{fmt.Sprintf("new %s via %s", peerCIDR, peer.addr(peerCIDR.Addr()))}
	if !slices.Equal(got, want) {
		t.Fatalf("route changes of the agent's protocol during the restart: %q, want only %q (no delete, no re-add)", got, want)
	}
}

type fileID struct {
	ino   uint64
	mtime int64
}

func statFile(t *testing.T, path string) fileID {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return fileID{st.Ino, st.Mtim.Nano()}
}

// routeEvents collects the kernel's route notifications of one namespace.
type routeEvents struct {
	ch   chan netlink.RouteUpdate
	done chan struct{}
}

func subscribeRoutes(t testing.TB, n ns.NetNS) *routeEvents {
	t.Helper()
	h, err := netns.GetFromPath(n.Path())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	e := &routeEvents{ch: make(chan netlink.RouteUpdate, 1024), done: make(chan struct{})}
	t.Cleanup(func() { close(e.done) })
	if err := netlink.RouteSubscribeWithOptions(e.ch, e.done, netlink.RouteSubscribeOptions{Namespace: &h}); err != nil {
		t.Fatal(err)
	}
	return e
}

// drain returns the agent-protocol changes seen so far ("new|del dst via gw"). It adds a
// sentinel route of another protocol and reads until its notification arrives: the kernel
// delivers notifications in order, so everything before it has been read.
func (e *routeEvents) drain(t *testing.T, n ns.NetNS) []string {
	t.Helper()
	sentinel := netip.MustParsePrefix("10.98.0.0/24")
	nettest.Do(t, n, func() error {
		return netlink.RouteAdd(&netlink.Route{Dst: ipnet.FromPrefix(sentinel), Gw: netip.MustParseAddr("192.168.77.251").AsSlice(), Protocol: unix.RTPROT_STATIC})
	})
	var out []string
	timeout := time.After(10 * time.Second)
	for {
		select {
		case u := <-e.ch:
			if u.Dst != nil && u.Dst.String() == sentinel.String() {
				return out
			}
			if u.Protocol != routes.DefaultProtocol {
				continue
			}
			kind := "new"
			if u.Type == unix.RTM_DELROUTE {
				kind = "del"
			}
			out = append(out, fmt.Sprintf("%s %s via %s", kind, u.Dst, u.Gw))
		case <-timeout:
			t.Fatalf("no notification of the sentinel route; seen so far %q", out)
		}
	}
}
