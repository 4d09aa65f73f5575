package shim

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kubenet-dev/kubenet/test/testkit"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/kubenet-dev/kubenet/internal/ipnet"
	"github.com/kubenet-dev/kubenet/network"
	"github.com/kubenet-dev/kubenet/network/cni"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

// pluginVariant is one way a shim can run pods on the test node.
type pluginVariant struct {
	name       string
	plugin     string // --network-plugin
	loopback   bool   // the loopback CNI plugin is in the bin dirs
	notReady   string // Status before the pod CIDR event mentions this
	nonMasq    bool   // kubenet's non-masquerade CIDRs apply (the reference bridge masquerades all)
	kubenetish bool   // kubenet state on disk (names, records) to audit
}

// setUpVariant builds the node's plugins: for cni, the conf dir with the variant's conflist.
func setUpVariant(t testing.TB, v pluginVariant, node *nettest.Node) (*cni.Plugin, []network.NetworkPlugin) {
	t.Helper()
	confDir := t.TempDir()
	switch v.name {
	case "cni+kubenet":
		// No podCIDRs: the node's CIDRs arrive as ipRanges from the pod-cidr-change event.
		writeConf(t, confDir, "10-kubenet.conflist", map[string]any{
			"cniVersion": "1.1.0", "name": "kubenet",
			"plugins": []any{map[string]any{
				"type": "kubenet", "dataDir": node.DataDir(),
				"nonMasqueradeCIDRs": []string{"10.0.0.0/8", "fd00::/8"},
				"capabilities":       map[string]bool{"portMappings": true, "bandwidth": true, "ipRanges": true, "io.kubernetes.cri.pod-annotations": true},
			}},
		})
		_, cn, plugins := allPlugins(t, node, confDir, binDir)
		return cn, plugins
	case "cni+reference":
		ref, err := nettest.InstallRefPlugins()
		if err != nil {
			t.Fatal(err)
		}
		writeConf(t, confDir, "10-bridge.conflist", map[string]any{
			"cniVersion": "1.0.0", "name": "kubenet",
			"plugins": []any{
				map[string]any{
					"type": "bridge", "bridge": "cbr0", "isGateway": true, "ipMasq": true, "ipMasqBackend": "nftables", "hairpinMode": true,
					"ipam": map[string]any{
						"type": "host-local", "dataDir": node.DataDir(),
						"routes": []any{map[string]string{"dst": "0.0.0.0/0"}, map[string]string{"dst": "::/0"}},
					},
					"capabilities": map[string]bool{"ipRanges": true},
				},
				map[string]any{"type": "portmap", "backend": "nftables", "capabilities": map[string]bool{"portMappings": true}},
			},
		})
		_, cn, plugins := allPlugins(t, node, confDir, ref)
		return cn, plugins
	default:
		_, cn, plugins := allPlugins(t, node, confDir, binDir)
		return cn, plugins
	}
}

// TestNetworkPluginPods runs the core's pod scenarios through the PluginManager, as a shim
// would: with --network-plugin=kubenet (in-process), with =cni over the kubenet binary, and with
// =cni over the reference bridge + host-local + portmap plugins. Dual-stack pod CIDRs come from
// the pod-cidr-change event in every case. Asserted: Status before and after the event, the
// addresses GetPodNetworkStatus reports against the pod's eth0, lo up, traffic pod-to-pod,
// pod-to-gateway, pod-to-external (SNAT to the node), pod-to-non-masquerade (source kept), a
// hostPort from outside; after TearDownPod the leak audit.
func TestNetworkPluginPods(t *testing.T) {
	variants := []pluginVariant{
		{name: "kubenet", plugin: "kubenet", notReady: "no pod CIDR yet", nonMasq: true, kubenetish: true},
		{name: "cni+kubenet", plugin: "cni", notReady: "needs ipRanges but no PodCIDR set", nonMasq: true, kubenetish: true},
		{name: "cni+reference", plugin: "cni", loopback: true, notReady: "needs ipRanges but no PodCIDR set"},
	}
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			t.Parallel()
			testPluginPods(t, v)
		})
	}
}

func testPluginPods(t *testing.T, v pluginVariant) {
	node := nettest.NewNode(t, binDir)
	host := newShimHost()
	cn, plugins := setUpVariant(t, v, node)
	pm := managerFor(t, plugins, v.plugin, host)

	if err := pm.Status(); err == nil || !strings.Contains(err.Error(), v.notReady) {
		t.Fatalf("Status before the pod CIDR event: %v, want an error mentioning %q", err, v.notReady)
	}
	pm.Event(network.PodCIDRChangeEvent, podCIDREvent(dualStackCIDRs))
	if err := pm.Status(); err != nil {
		t.Fatalf("Status after the pod CIDR event: %v", err)
	}

	const hostPort, podPort = 30080, 8090
	a := newShimPod(t, host, "a")
	b := newShimPod(t, host, "b", &network.PortMapping{HostPort: hostPort, ContainerPort: podPort, Protocol: "TCP"})
	cidrs := []netip.Prefix{nettest.PodCIDR4, nettest.PodCIDR6}
	ips := map[*shimPod][]netip.Addr{}
	for _, p := range []*shimPod{a, b} {
		setLoDown(t, p.NS)
		ips[p] = setUp(t, pm, p, nil)
		t.Cleanup(func() { _ = pm.TearDownPod(p.namespace, p.name, p.id) })
		checkStatusMatchesPod(t, p, ips[p], cidrs)
		if !loIsUp(t, p.NS) {
			t.Errorf("pod %s: lo is down after SetUpPod", p.name)
		}
	}
	cacheFile := func(network, id, ifName string) string {
		return filepath.Join(node.Dir, "cache", "results", network+"-"+id+"-"+ifName)
	}
	if v.loopback {
		if _, err := os.Stat(cacheFile("cni-loopback", a.id.ID, "lo")); err != nil {
			t.Errorf("the loopback plugin did not run for the pod: %v", err)
		}
	}

	podIP := func(p *shimPod, like netip.Addr) netip.Addr {
		for _, ip := range ips[p] {
			if ip.Is4() == like.Is4() {
				return ip
			}
		}
		t.Fatalf("pod %s has no address of the family of %s", p.name, like)
		return netip.Addr{}
	}
	for _, cidr := range cidrs {
		gw := testkit.GatewayOf(cidr)
		aIP, bIP := podIP(a, gw), podIP(b, gw)
		external, nodeUplink, peer := nettest.External4, nettest.NodeUplink4, nettest.Peer4
		if gw.Is6() {
			external, nodeUplink, peer = nettest.External6, nettest.NodeUplink6, nettest.Peer6
		}
		t.Run("pod-to-pod "+cidr.String(), func(t *testing.T) {
			testkit.ExpectReachable(t, a.NS, nettest.StartTCPEcho(t, b.NS, netip.AddrPortFrom(bIP, 8080)), aIP)
		})
		t.Run("pod-to-gateway "+cidr.String(), func(t *testing.T) {
			waitAddrUsable(t, node.NS, "cbr0", gw)
			testkit.ExpectReachable(t, a.NS, nettest.StartTCPEcho(t, node.NS, netip.AddrPortFrom(gw, 8081)), aIP)
		})
		t.Run("pod-to-external is SNATed "+cidr.String(), func(t *testing.T) {
			testkit.ExpectReachable(t, a.NS, nettest.StartTCPEcho(t, node.External, netip.AddrPortFrom(external.Addr(), 9000)), nodeUplink.Addr())
		})
		if v.nonMasq {
			t.Run("pod-to-non-masquerade keeps source "+cidr.String(), func(t *testing.T) {
				testkit.ExpectReachable(t, a.NS, nettest.StartTCPEcho(t, node.Peer, netip.AddrPortFrom(peer.Addr(), 9001)), aIP)
			})
		}
		t.Run("hostPort from outside "+cidr.String(), func(t *testing.T) {
			srv := nettest.StartTCPEcho(t, b.NS, netip.AddrPortFrom(bIP, podPort))
			r, err := nettest.TCPRequest(node.External, netip.AddrPortFrom(nodeUplink.Addr(), hostPort), "hp", testkit.TrafficTimeout)
			if err := nettest.ExpectFrom(r, err, external.Addr()); err != nil {
				t.Errorf("hostPort %d of pod b via %s (server %s): %v", hostPort, nodeUplink.Addr(), srv.Addr, err)
			}
		})
	}

	if v.plugin == "cni" {
		// CHECK through libcni with ADD's runtimeConfig: passes, then fails once the pod's
		// IPv4 address is gone.
		if err := cn.CheckPod(a.namespace, a.name, a.id); err != nil {
			t.Errorf("CheckPod of a healthy pod: %v", err)
		}
		nettest.Do(t, a.NS, func() error {
			eth0, err := netlink.LinkByName("eth0")
			if err != nil {
				return err
			}
			return netlink.AddrDel(eth0, &netlink.Addr{IPNet: ipnet.FromPrefix(netip.PrefixFrom(podIP(a, testkit.GatewayOf(nettest.PodCIDR4)), 24))})
		})
		if err := cn.CheckPod(a.namespace, a.name, a.id); err == nil {
			t.Error("CheckPod passed for a pod whose IPv4 address was removed")
		}
	}

	var all []netip.Addr
	for _, p := range []*shimPod{a, b} {
		if err := pm.TearDownPod(p.namespace, p.name, p.id); err != nil {
			t.Fatal(err)
		}
		// The reference bridge leaves the pod's conntrack entries behind (kubenet flushes them),
		// so only kubenet is audited for those.
		auditIPs := ips[p]
		if !v.kubenetish {
			auditIPs = nil
		}
		testkit.AssertNoResidue(t, node, "kubenet", p.att(), auditIPs)
		if _, err := os.Stat(cacheFile("cni-loopback", p.id.ID, "lo")); err == nil {
			t.Errorf("leak: loopback cache entry of %s remains", p.name)
		}
		all = append(all, ips[p]...)
	}
	if v.kubenetish {
		testkit.AssertNoHostPortResidue(t, node, all, hostPort)
	}
	// A second teardown (the runtime retries) succeeds and changes nothing.
	if err := pm.TearDownPod(a.namespace, a.name, a.id); err != nil {
		t.Errorf("repeated TearDownPod: %v", err)
	}
}

// checkStatusMatchesPod compares the status addresses with the pod's eth0: one per family, IPv4
// first, inside the pod CIDRs.
func checkStatusMatchesPod(t *testing.T, p *shimPod, got []netip.Addr, cidrs []netip.Prefix) {
	t.Helper()
	var onEth0 []netip.Addr
	for _, a := range testkit.Addrs(t, p.NS, "eth0") {
		onEth0 = append(onEth0, a.Addr())
	}
	if !slices.Equal(testkit.SortedAddrs(got), testkit.SortedAddrs(onEth0)) {
		t.Errorf("pod %s: status IPs %v, eth0 has %v", p.name, got, onEth0)
	}
	if len(got) != len(cidrs) {
		t.Fatalf("pod %s: status IPs %v, want one per pod CIDR %v", p.name, got, cidrs)
	}
	for i, c := range cidrs {
		if !c.Contains(got[i]) {
			t.Errorf("pod %s: status IP %d is %s, want one in %s (IPv4 first)", p.name, i, got[i], c)
		}
	}
}

// waitAddrUsable waits until addr on dev inside n has finished duplicate address detection (the
// reference bridge plugin adds its IPv6 gateway with DAD; kubenet adds it without), so a server
// can bind it.
func waitAddrUsable(t *testing.T, n ns.NetNS, dev string, addr netip.Addr) {
	t.Helper()
	err := nettest.Eventually(5*time.Second, func() error {
		var tentative bool
		found := false
		err := n.Do(func(ns.NetNS) error {
			l, err := netlink.LinkByName(dev)
			if err != nil {
				return err
			}
			as, err := netlink.AddrList(l, netlink.FAMILY_ALL)
			for _, a := range as {
				if ip, _ := netip.AddrFromSlice(a.IP); ip.Unmap() == addr {
					found, tentative = true, a.Flags&unix.IFA_F_TENTATIVE != 0
				}
			}
			return err
		})
		switch {
		case err != nil:
			return err
		case !found:
			return fmt.Errorf("%s has no address %s", dev, addr)
		case tentative:
			return fmt.Errorf("%s on %s is still tentative", addr, dev)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
