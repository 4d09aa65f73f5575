//go:build kubenet_e2e_agent

package agent

// Adversarial end-to-end tests of the overlay (issue #25 review): each subtest is one attack
// that succeeds on de614e1. Run:
//   hack/kubernetes/build.sh kube-apiserver etcd >/dev/null
//   go test -count=1 -tags kubenet_e2e_agent -run '^TestAgentOverlayAdv' -v ./test/agent/

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"

	"github.com/kubenet-dev/kubenet/test/nettest"
)

// sniffVXLAN counts the IPv4 UDP packets to port 8472 that reach n's eth0, as a pod with
// NET_RAW in its own namespace sees them (a packet socket: tcpdump).
func sniffVXLAN(t *testing.T, n ns.NetNS) *atomic.Int64 {
	t.Helper()
	var got atomic.Int64
	var fd int
	nettest.Do(t, n, func() error {
		var err error
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM, int(htons(unix.ETH_P_IP)))
		if err != nil {
			return err
		}
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		return unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_IP), Ifindex: l.Attrs().Index})
	})
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 200000})
	var stop atomic.Bool
	t.Cleanup(func() { stop.Store(true) })
	go func() {
		defer unix.Close(fd)
		buf := make([]byte, 65536)
		for !stop.Load() {
			n, _, err := unix.Recvfrom(fd, buf, 0)
			if err != nil || n < 24 {
				continue
			}
			ihl := int(buf[0]&0x0f) * 4
			if buf[9] == unix.IPPROTO_UDP && n >= ihl+4 && binary.BigEndian.Uint16(buf[ihl+2:]) == 8472 {
				got.Add(1)
			}
		}
	}()
	return &got
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// TestAgentOverlayAdv: attacks on the routed cluster of TestAgentOverlay (two nodes on one
// subnet, node-3 behind a router, all in --routing=auto). Every step runs even when one fails.
func TestAgentOverlayAdv(t *testing.T) {
	rc := startRoutedCluster(t, false)
	top := t
	api := rc.cp.Admin
	n1, n2, n3 := rc.nodes[0], rc.nodes[1], rc.nodes[2]
	for _, n := range rc.nodes {
		n.startAgent(t, "--mtu=0")
	}
	for _, n := range rc.nodes {
		expectReady(t, n)
	}
	p1, p3 := addPod(t, n1, "adv-1"), addPod(t, n3, "adv-3")
	_ = addPod(t, n2, "adv-2")
	expectRoutes(t, n1, wantPaths(n1, rc.nodes, n3))
	expectTraffic(t, p1, p3)

	t.Run("a pod with hostPort 8472/udp does not get the overlay's traffic", func(t *testing.T) {
		// hostPorts are DNATed in prerouting for every local destination address, before the
		// overlay's input filter and before the VXLAN socket: the node's own overlay port is
		// just another port to them.
		list, err := libcni.ConfListFromFile(n3.confFile())
		if err != nil {
			t.Fatal(err)
		}
		createPod(t, api, "default", "adv-hostport", n3.name, nil)
		hp := n3.cni.NewPod(t, "adv-hostport")
		hp.RT.CapabilityArgs = map[string]any{"portMappings": []map[string]any{{"hostPort": 8472, "containerPort": 8472, "protocol": "udp"}}}
		n3.cni.MustAdd(t, list, hp)
		defer func() {
			// The pod and the DNAT of the underlay flows it took go: the steps after this one
			// need node-3's overlay port back.
			if err := n3.cni.Del(list, hp); err != nil {
				t.Errorf("delete the hostPort pod: %v", err)
			}
			_, _ = nettest.Output(n3.ns, "conntrack", "-D", "-p", "udp", "--orig-port-dst", "8472")
			expectTraffic(t, p1, p3)
		}()
		stolen := sniffVXLAN(t, hp.NS)
		sink := nettest.StartUDPEcho(t, p3.NS, netip.AddrPortFrom(netip.IPv6Unspecified(), 7795))
		dst := p3.IP(netip.MustParseAddr("10.0.0.0"))
		// New flows (new sockets, new source ports): the underlay flows get new conntrack
		// entries, which the hostPort DNAT takes.
		const flows = 20
		for i := range flows {
			_, _ = nettest.UDPRequest(p1.NS, netip.AddrPortFrom(dst, 7795), fmt.Sprintf("flow-%d", i), 100*time.Millisecond)
		}
		if err := sink.Barrier(); err != nil {
			t.Fatal(err)
		}
		arrived := 0
		for i := range flows {
			if sink.Received(fmt.Sprintf("flow-%d", i)) > 0 {
				arrived++
			}
		}
		if n := stolen.Load(); n > 0 || arrived < flows {
			ct, _ := nettest.Output(n3.ns, "conntrack", "-L", "-p", "udp", "--dport", "8472")
			t.Logf("node-3's conntrack entries of the overlay port:\n%s", ct)
			t.Fatalf("a pod with hostPort 8472/udp on node-3 received %d VXLAN packets of node-1 (the other pods' traffic, inner frames and all); %d of %d flows from pod adv-1 to pod adv-3 arrived",
				n, arrived, flows)
		}
	})

	t.Run("no tool adds a sender to the firewall's node set", func(t *testing.T) {
		// The sets are constant: element changes raise no event the agent follows (pods' ADD
		// and DEL make them all the time), so the kernel itself refuses them; replacing the
		// table is an event, and the agent undoes it.
		out, err := nettest.Output(n3.ns, "nft", "add", "element", "inet", "kubenet-overlay", "nodes4", "{ "+intruder[0].Addr().String()+" }")
		if err == nil {
			t.Fatalf("node-3's firewall took a new sender:\n%s", out)
		}
	})

	t.Run("own Node deleted: overlay routes stay as the direct ones do", func(t *testing.T) {
		// The agent logs "own node not found; the conflist and routes stay as they are", and
		// the direct routes do stay; but without its own Node the agent has no underlay
		// address, refuses every overlay path and removes the device: node-1's pods lose
		// node-3's until the Node is registered again (a kubelet re-registering, an operator's
		// `kubectl delete node`, a cloud controller).
		deleteNode(t, api, n1.name)
		defer func() {
			createNode(t, api, nodeObject(n1.name, n1.addrs, podCIDRs(1)))
			expectRoutes(t, n1, wantPaths(n1, rc.nodes, n3))
		}()
		// The agent has seen the deletion once it says so.
		err := nettest.Eventually(converge, func() error {
			_, err := logRecord(n1.logFile(), "own node not found; the conflist and routes stay as they are", nil)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		got, err := agentRoutes(n1.ns)
		if err != nil {
			t.Fatal(err)
		}
		want := wantPaths(n1, rc.nodes, n3)
		if strings.Join(got, ",") != strings.Join(sortedCopy(want), ",") {
			t.Fatalf("node-1's routes 3 s after its own Node was deleted:\n got %q\nwant %q (as before)", got, sortedCopy(want))
		}
	})

	t.Run("one Node with 13000 InternalIPs does not take the overlay down", func(t *testing.T) {
		// The API server bounds neither the count nor the kind of a Node's addresses (only
		// duplicates are refused), and every address goes into every node's firewall set, in
		// one message per set and one transaction: on de614e1 the write fails ("message too
		// long") and every agent refuses every overlay path.
		fat := nodeObject("fat", nil, nil)
		a := netip.MustParseAddr("100.64.0.1")
		for range 13000 {
			fat.Status.Addresses = append(fat.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: a.String()})
			a = a.Next()
		}
		createNode(t, api, fat)
		defer deleteNode(t, api, "fat")
		// Synced once the last of its addresses is in node-1's firewall.
		err := nettest.Eventually(converge, func() error {
			out := nettest.Run(t, n1.ns, "nft", "list", "set", "inet", "kubenet-overlay", "nodes4")
			if !strings.Contains(out, a.Prev().String()) {
				return fmt.Errorf("node-1's firewall does not hold the fat Node's last address %s yet", a.Prev())
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		expectRoutes(t, n1, wantPaths(n1, rc.nodes, n3))
		expectTraffic(t, p1, p3)
	})

	t.Run("--manage-routes=false: no overlay is left to trust a deleted Node's address", func(t *testing.T) {
		// With --manage-routes=false (or the agent uninstalled: docs/agent.md's Uninstall
		// names neither the device nor the table) the overlay's device stays and keeps
		// decapsulating, but its firewall is never written again: the allowlist is frozen,
		// and an address that was a Node's stays trusted after the Node is gone.
		createNode(t, api, nodeObject("leaver", intruder, nil))
		err := nettest.Eventually(converge, func() error {
			out := nettest.Run(t, n3.ns, "nft", "list", "set", "inet", "kubenet-overlay", "nodes4")
			if !strings.Contains(out, intruder[0].Addr().String()) {
				return fmt.Errorf("not trusted yet")
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := n3.agent.Stop(); err != nil {
			t.Fatal(err)
		}
		n3.startAgent(top, "--mtu=0", "--manage-routes=false")
		n3.waitSynced(t)
		defer func() {
			_ = n3.agent.Stop()
			n3.startAgent(top, "--mtu=0")
			n3.waitSynced(t)
		}()
		deleteNode(t, api, "leaver")
		sink := nettest.StartUDPEcho(t, p3.NS, netip.AddrPortFrom(netip.IPv6Unspecified(), 7798))
		// Without routes to manage the agent keeps no overlay: nothing is left to decapsulate.
		err = nettest.Eventually(converge, func() error {
			if out, err := nettest.Output(n3.ns, "ip", "link", "show", overlayDevice); err == nil {
				return fmt.Errorf("the overlay device stays with --manage-routes=false:\n%s", out)
			}
			if out, err := nettest.Output(n3.ns, "nft", "list", "table", "inet", "kubenet-overlay"); err == nil {
				return fmt.Errorf("the overlay firewall stays with --manage-routes=false:\n%s", out)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		injectVXLAN(t, rc.intruder, intruder[0].Addr(), n3.addrs[0].Addr(), netip.MustParseAddr("10.244.1.99"), p3.IP(netip.MustParseAddr("10.0.0.0")), 7798, "after-leaving")
		// A datagram the node itself sends after the frame: once it is in, the frame had its chance.
		err = nettest.Eventually(converge, func() error {
			_, _ = nettest.UDPRequest(n3.ns, netip.AddrPortFrom(p3.IP(netip.MustParseAddr("10.0.0.0")), 7798), "barrier", 200*time.Millisecond)
			if sink.Received("barrier") == 0 {
				return fmt.Errorf("the barrier datagram did not arrive")
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if got := sink.Received("after-leaving"); got != 0 {
			out, _ := nettest.Output(n3.ns, "ip", "-d", "link", "show", overlayDevice)
			t.Fatalf("%d frames of %s, whose Node was deleted, were decapsulated by node-3 running --manage-routes=false:\n%s", got, intruder[0].Addr(), out)
		}
	})
}

// TestAgentOverlayAdvAsymmetric: node-2 also has a leg on node-3's subnet (a second NIC), its
// InternalIP stays on the first. --routing=auto decides per node, from its own links: node-2
// reaches everyone directly and so has no overlay at all; node-3 sees node-2's InternalIP on
// none of its networks and sends to it through the overlay. Nothing on node-2 decapsulates, and
// nothing on node-2 keeps its pods from sending VXLAN to the other nodes.
func TestAgentOverlayAdvAsymmetric(t *testing.T) {
	near, cp, agentUser := startCluster(t)
	far := nettest.NewUnderlay(t, 0)
	router := nettest.NewNS(t)
	near.Attach(t, router, "near", routerNear...)
	far.Attach(t, router, "far", routerFar...)
	nettest.WriteSysctl(t, router, "net/ipv4/ip_forward", "1")
	nettest.WriteSysctl(t, router, "net/ipv6/conf/all/forwarding", "1")
	defaultRoutes(t, cp.NS, routerNear[:1])
	nodes := []*simNode{
		newSimNode(t, near, cp, "node-1", 1, agentUser),
		newSimNode(t, near, cp, "node-2", 2, agentUser),
		newSimNodeWith(t, far, cp, "node-3", farAddrs(3), agentUser),
	}
	n1, n2, n3 := nodes[0], nodes[1], nodes[2]
	far.Attach(t, n2.ns, "eth1", farAddrs(2)...)
	defaultRoutes(t, n1.ns, routerNear)
	defaultRoutes(t, n2.ns, routerNear)
	defaultRoutes(t, n3.ns, routerFar)
	for i, n := range nodes {
		createNode(t, cp.Admin, nodeObject(n.name, n.addrs, podCIDRs(i+1)))
	}
	for _, n := range nodes {
		n.startAgent(t, "--mtu=0")
	}
	for _, n := range nodes {
		expectReady(t, n)
	}
	p1, p2, p3 := addPod(t, n1, "asym-1"), addPod(t, n2, "asym-2"), addPod(t, n3, "asym-3")
	expectRoutes(t, n3, wantPaths(n3, nodes, n1, n2))
	if out, err := nettest.Output(n2.ns, "ip", "link", "show", overlayDevice); err == nil {
		t.Logf("node-2 has an overlay device after all:\n%s", out)
	}

	t.Run("node-3's pods reach node-2's", func(t *testing.T) {
		expectTraffic(t, p3, p2)
	})
	t.Run("node-2's pods cannot get VXLAN decapsulated by node-1", func(t *testing.T) {
		expectTraffic(t, p2, p1) // the injector's path works
		sink := nettest.StartUDPEcho(t, p1.NS, netip.AddrPortFrom(netip.IPv6Unspecified(), 7797))
		dst := p1.IP(netip.MustParseAddr("10.0.0.0"))
		spoofed := netip.MustParseAddr("10.244.3.77") // a pod address of node-3
		for range 3 {
			injectVXLAN(t, p2.NS, p2.IP(dst), n1.addrs[0].Addr(), spoofed, dst, 7797, "from-node-2-pod")
		}
		if err := sink.Barrier(); err != nil {
			t.Fatal(err)
		}
		if got := sink.Received("from-node-2-pod"); got != 0 {
			t.Fatalf("%d frames pod asym-2 encapsulated itself (inner source %s spoofed) were decapsulated by node-1: node-2 has no overlay firewall, masquerades them to its InternalIP, and node-1 trusts that", got, spoofed)
		}
	})
}

func sortedCopy(s []string) []string {
	out := append([]string(nil), s...)
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if out[j] < out[i] {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
}
