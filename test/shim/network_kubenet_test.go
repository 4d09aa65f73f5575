package shim

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kubenet-dev/kubenet/test/testkit"

	"github.com/kubenet-dev/kubenet/core"
	"github.com/kubenet-dev/kubenet/hairpin"
	"github.com/kubenet-dev/kubenet/network"
	knet "github.com/kubenet-dev/kubenet/network/kubenet"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

// TestKubenetPluginPodCIDR: Status fails with a clear message until a valid pod CIDR arrives;
// an invalid one is ignored; the first one sets up the node before any pod (bridge with the
// gateways, SNAT chain); a later, different CIDR moves the bridge to exactly the new gateways
// (no stale address) and new pods get addresses from it, while a pod of the old CIDR can still be
// torn down completely.
func TestKubenetPluginPodCIDR(t *testing.T) {
	t.Parallel()
	node := nettest.NewNode(t, binDir)
	host := newShimHost()
	_, _, plugins := allPlugins(t, node, t.TempDir())
	pm := managerFor(t, plugins, "kubenet", host)

	if err := pm.Status(); err == nil || !strings.Contains(err.Error(), "no pod CIDR yet") {
		t.Fatalf("Status before the event: %v, want the missing pod CIDR named", err)
	}
	pod := newShimPod(t, host, "early")
	if err := pm.SetUpPod(pod.namespace, pod.name, pod.id, nil, nil); err == nil || !strings.Contains(err.Error(), "cannot SetUpPod") {
		t.Fatalf("SetUpPod before the event: %v, want a refusal", err)
	}
	pm.Event(network.PodCIDRChangeEvent, podCIDREvent("10.244.1.5/24"))
	if err := pm.Status(); err == nil {
		t.Fatal("Status is ready after an invalid pod CIDR (host bits set)")
	}
	if testkit.LinkExists(t, node.NS, "cbr0") {
		t.Fatal("an invalid pod CIDR created the bridge")
	}

	pm.Event(network.PodCIDRChangeEvent, podCIDREvent(dualStackCIDRs))
	if err := pm.Status(); err != nil {
		t.Fatalf("Status after the event: %v", err)
	}
	wantGW := []netip.Prefix{netip.MustParsePrefix("10.244.1.1/24"), netip.MustParsePrefix("fd00:10:244:1::1/64")}
	if got := testkit.Addrs(t, node.NS, "cbr0"); !testkit.SamePrefixes(got, wantGW) {
		t.Errorf("cbr0 after the event, before any pod: %v, want %v", got, wantGW)
	}
	testkit.CheckMasqRules(t, node.NS, []netip.Prefix{nettest.PodCIDR4, nettest.PodCIDR6})

	old := newShimPod(t, host, "old")
	oldIPs := setUp(t, pm, old, nil)

	const newCIDRs = "10.244.7.0/24,fd00:10:244:7::/64"
	pm.Event(network.PodCIDRChangeEvent, podCIDREvent(newCIDRs))
	if err := pm.Status(); err != nil {
		t.Fatalf("Status after the CIDR change: %v", err)
	}
	wantGW = []netip.Prefix{netip.MustParsePrefix("10.244.7.1/24"), netip.MustParsePrefix("fd00:10:244:7::1/64")}
	if got := testkit.Addrs(t, node.NS, "cbr0"); !testkit.SamePrefixes(got, wantGW) {
		t.Errorf("cbr0 after the CIDR change: %v, want exactly %v (no stale gateway)", got, wantGW)
	}
	fresh := newShimPod(t, host, "fresh")
	freshIPs := setUp(t, pm, fresh, nil)
	checkStatusMatchesPod(t, fresh, freshIPs, []netip.Prefix{netip.MustParsePrefix("10.244.7.0/24"), netip.MustParsePrefix("fd00:10:244:7::/64")})
	testkit.ExpectReachable(t, fresh.NS, nettest.StartTCPEcho(t, node.External, netip.AddrPortFrom(nettest.External4.Addr(), 9000)), nettest.NodeUplink4.Addr())

	for _, p := range []struct {
		pod *shimPod
		ips []netip.Addr
	}{{old, oldIPs}, {fresh, freshIPs}} {
		if err := pm.TearDownPod(p.pod.namespace, p.pod.name, p.pod.id); err != nil {
			t.Fatal(err)
		}
		testkit.AssertNoResidue(t, node, "kubenet", p.pod.att(), p.ips)
	}
}

// TestKubenetPluginRestart: while the pod lives the plugin holds its hostPort (a host process
// gets EADDRINUSE, IPv4 and IPv6); a new plugin object (the shim restarted) re-acquires it from
// the records; after the pod's netns is gone, the new object tears the pod down before any pod
// CIDR event, leaving nothing: no link, reservation, record, hostPort element or index file,
// shaping device, and the port is free again.
func TestKubenetPluginRestart(t *testing.T) {
	t.Parallel()
	node := nettest.NewNode(t, binDir)
	host := newShimHost()
	first, _, plugins := allPlugins(t, node, t.TempDir())
	pm := managerFor(t, plugins, "kubenet", host)
	pm.Event(network.PodCIDRChangeEvent, podCIDREvent(dualStackCIDRs))

	const hostPort = 30090
	pod := newShimPod(t, host, "web",
		&network.PortMapping{HostPort: hostPort, ContainerPort: 80, Protocol: "TCP"},
		&network.PortMapping{HostPort: hostPort, ContainerPort: 53, Protocol: "udp"})
	annotations := map[string]string{"kubernetes.io/ingress-bandwidth": "10M", "kubernetes.io/egress-bandwidth": "20M"}
	ips := setUp(t, pm, pod, annotations)
	if rec, err := core.NewRecords(filepath.Join(node.DataDir(), "kubenet")).Load(pod.att()); err != nil || rec == nil || rec.Pod != "default/web" {
		t.Errorf("attachment record %+v, %v; want it to name pod default/web", rec, err)
	}
	names := core.NamesFor("kubenet", pod.att())
	if !testkit.LinkExists(t, node.NS, names.IFB) {
		t.Fatalf("the bandwidth annotations did not reach the core: no ifb %s", names.IFB)
	}
	held := []struct{ proto, addr string }{{"tcp", "0.0.0.0:30090"}, {"tcp", "[::]:30090"}, {"udp", "0.0.0.0:30090"}, {"udp", "[::]:30090"}}
	for _, h := range held {
		expectPortHeld(t, node.NS, h.proto, h.addr)
	}
	if got, want := first.HeldPorts(pod.id), []string{"tcp/0.0.0.0:30090", "tcp/[::]:30090", "udp/0.0.0.0:30090", "udp/[::]:30090"}; !slices.Equal(got, want) {
		t.Errorf("held ports %v, want %v", got, want)
	}

	// The shim dies: its sockets close. A new plugin object takes over from the state on disk.
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	expectPortFree(t, node.NS, "tcp", "0.0.0.0:30090")
	second, _, plugins := allPlugins(t, node, t.TempDir())
	pm = managerFor(t, plugins, "kubenet", host)
	for _, h := range held {
		expectPortHeld(t, node.NS, h.proto, h.addr)
	}
	nettest.DeleteNS(t, pod.NS)
	if err := nettest.Eventually(testkit.TrafficTimeout, func() error {
		if testkit.LinkExists(t, node.NS, names.HostVeth) {
			return os.ErrExist
		}
		return nil
	}); err != nil {
		t.Fatalf("the pod's veth outlived its netns: %v", err)
	}
	// The netns is gone: the addresses come from the attachment record.
	if st, err := pm.GetPodNetworkStatus(pod.namespace, pod.name, pod.id); err != nil || !slices.Equal(statusAddrs(t, st), ips) {
		t.Errorf("status after restart with the netns gone: %v, %v; want %v from the record", st, err, ips)
	}
	if err := pm.Status(); err == nil {
		t.Fatal("the new plugin object is ready before any pod CIDR event")
	}
	if err := pm.TearDownPod(pod.namespace, pod.name, pod.id); err != nil {
		t.Fatalf("TearDownPod after restart with the netns gone, before the CIDR event: %v", err)
	}
	testkit.AssertNoResidue(t, node, "kubenet", pod.att(), ips)
	testkit.AssertNoHostPortResidue(t, node, ips, hostPort)
	for _, h := range held {
		expectPortFree(t, node.NS, h.proto, h.addr)
	}
	if got := second.HeldPorts(pod.id); len(got) != 0 {
		t.Errorf("still holding %v after teardown", got)
	}
}

// TestKubenetPluginHostPortTaken: a hostPort a host process already holds fails SetUpPod with a
// message naming the port, and the failed set-up leaves nothing behind.
func TestKubenetPluginHostPortTaken(t *testing.T) {
	t.Parallel()
	node := nettest.NewNode(t, binDir)
	host := newShimHost()
	_, _, plugins := allPlugins(t, node, t.TempDir())
	pm := managerFor(t, plugins, "kubenet", host)
	pm.Event(network.PodCIDRChangeEvent, podCIDREvent(nettest.PodCIDR4.String()))

	nettest.StartTCPEcho(t, node.NS, netip.MustParseAddrPort("0.0.0.0:30070")) // the host process
	pod := newShimPod(t, host, "late", &network.PortMapping{HostPort: 30070, ContainerPort: 80})
	err := pm.SetUpPod(pod.namespace, pod.name, pod.id, nil, nil)
	if err == nil || !strings.Contains(err.Error(), "cannot open hostport tcp/0.0.0.0:30070") {
		t.Fatalf("SetUpPod with a taken hostPort: %v, want it refused naming the port", err)
	}
	testkit.AssertNoResidue(t, node, "kubenet", pod.att(), nil)
	testkit.AssertNoHostPortResidue(t, node, nil, 30070)
	if testkit.LinkExists(t, pod.NS, "eth0") {
		t.Error("the pod got an interface although its set-up failed")
	}
	if entries, _ := os.ReadDir(filepath.Join(node.DataDir(), "kubenet", core.RecordDirName)); len(entries) > 0 {
		t.Errorf("attachment records remain after the failed set-up: %v", entries)
	}
}

// TestKubenetPluginInitValidates: bad settings fail Init (at start, not at the first pod).
func TestKubenetPluginInitValidates(t *testing.T) {
	for _, c := range []struct {
		name    string
		hairpin network.HairpinMode
		nonMasq string
		mtu     int
		want    string
	}{
		{"hairpin mode", "sometimes", "", 0, `invalid hairpin mode "sometimes"`},
		{"non-masquerade CIDR", "", "10.0.0.1/8", 0, "nonMasqueradeCIDRs"},
		{"MTU", "", "", 100, "mtu"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := knet.New(knet.Options{DataDir: t.TempDir()})
			err := p.Init(newShimHost(), c.hairpin, c.nonMasq, c.mtu)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("Init: %v, want an error mentioning %q", err, c.want)
			}
		})
	}
}

// TestKubenetPluginHostPortFamilies: the plugin holds a socket exactly where the pod's DNAT entry
// steers traffic. An explicit 0.0.0.0 on a dual-stack pod is IPv4 only (a host process may take
// the port on IPv6, where no DNAT entry exists, and the IPv4 mapping works); a hostIP of a family
// the pod lacks claims nothing (no socket, no entry, the pod still starts).
func TestKubenetPluginHostPortFamilies(t *testing.T) {
	t.Parallel()
	node := nettest.NewNode(t, binDir)
	host := newShimHost()
	kn, _, plugins := allPlugins(t, node, t.TempDir())
	pm := managerFor(t, plugins, "kubenet", host)
	pm.Event(network.PodCIDRChangeEvent, podCIDREvent(dualStackCIDRs))

	const anyV4Port, otherFamilyPort = 30072, 30073
	pod := newShimPod(t, host, "families",
		&network.PortMapping{HostPort: anyV4Port, ContainerPort: 8080, HostIP: "0.0.0.0"})
	ips := setUp(t, pm, pod, nil)
	t.Cleanup(func() { _ = pm.TearDownPod(pod.namespace, pod.name, pod.id) })
	if got, want := kn.HeldPorts(pod.id), []string{"tcp/0.0.0.0:30072"}; !slices.Equal(got, want) {
		t.Errorf("held ports %v, want %v (no IPv6 socket for an IPv4 hostIP)", got, want)
	}
	expectPortHeld(t, node.NS, "tcp4", "0.0.0.0:30072")
	expectPortFree(t, node.NS, "tcp6", "[::]:30072")
	srv := nettest.StartTCPEcho(t, pod.NS, netip.AddrPortFrom(ips[0], 8080))
	r, err := nettest.TCPRequest(node.External, netip.AddrPortFrom(nettest.NodeUplink4.Addr(), anyV4Port), "hp", testkit.TrafficTimeout)
	if err := nettest.ExpectFrom(r, err, nettest.External4.Addr()); err != nil {
		t.Errorf("hostPort %d over IPv4 to %s: %v", anyV4Port, srv.Addr, err)
	}
	if err := pm.TearDownPod(pod.namespace, pod.name, pod.id); err != nil {
		t.Fatal(err)
	}
	testkit.AssertNoHostPortResidue(t, node, ips, anyV4Port)

	// An IPv4-only node, a mapping on the node's IPv6 uplink address.
	node4 := nettest.NewNode(t, binDir)
	kn4, _, plugins4 := allPlugins(t, node4, t.TempDir())
	pm4 := managerFor(t, plugins4, "kubenet", host)
	pm4.Event(network.PodCIDRChangeEvent, podCIDREvent(nettest.PodCIDR4.String()))
	v6Only := newShimPod(t, host, "other-family",
		&network.PortMapping{HostPort: otherFamilyPort, ContainerPort: 8080, HostIP: nettest.NodeUplink6.Addr().String()})
	ips4 := setUp(t, pm4, v6Only, nil)
	t.Cleanup(func() { _ = pm4.TearDownPod(v6Only.namespace, v6Only.name, v6Only.id) })
	if got := kn4.HeldPorts(v6Only.id); len(got) != 0 {
		t.Errorf("held ports %v for an IPv6 hostIP on an IPv4-only pod, want none", got)
	}
	expectPortFree(t, node4.NS, "tcp6", netip.AddrPortFrom(nettest.NodeUplink6.Addr(), otherFamilyPort).String())
	if els := testkit.HostPortElements(t, node4); len(els) > 0 {
		t.Errorf("DNAT entries %v for an IPv6 hostIP on an IPv4-only pod %v, want none", els, ips4)
	}
}

// TestKubenetPluginPromiscuousMTU: kubelet's --hairpin-mode=promiscuous-bridge and a non-default
// --network-plugin-mtu given to Init reach the node and the pods: the bridge is promiscuous with
// the duplicate-frame rules, bridge, host veth and pod eth0 have the MTU, a pod reaches itself
// through its own hostPort on the node's address (hairpin) in both families, and teardown leaves
// nothing.
func TestKubenetPluginPromiscuousMTU(t *testing.T) {
	t.Parallel()
	node := nettest.NewNode(t, binDir)
	host := newShimHost()
	_, _, plugins := allPlugins(t, node, t.TempDir())
	const mtu = 1400
	p, err := network.InitNetworkPlugin(plugins, "kubenet", host, network.PromiscuousBridge, "10.0.0.0/8,fd00::/8", mtu)
	if err != nil {
		t.Fatal(err)
	}
	pm, err := network.NewPluginManager(p, nil)
	if err != nil {
		t.Fatal(err)
	}
	pm.Event(network.PodCIDRChangeEvent, podCIDREvent(dualStackCIDRs))

	const hostPort = 30074
	pod := newShimPod(t, host, "self", &network.PortMapping{HostPort: hostPort, ContainerPort: 8080})
	ips := setUp(t, pm, pod, nil)
	t.Cleanup(func() { _ = pm.TearDownPod(pod.namespace, pod.name, pod.id) })

	br := testkit.Link(t, node.NS, "cbr0")
	if br.Attrs().Promisc == 0 {
		t.Error("cbr0 is not promiscuous in promiscuous-bridge mode")
	}
	names := core.NamesFor("kubenet", pod.att())
	for _, l := range []struct {
		what string
		mtu  int
	}{
		{"cbr0", br.Attrs().MTU},
		{"host veth " + names.HostVeth, testkit.Link(t, node.NS, names.HostVeth).Attrs().MTU},
		{"pod eth0", testkit.Link(t, pod.NS, "eth0").Attrs().MTU},
	} {
		if l.mtu != mtu {
			t.Errorf("%s has MTU %d, want %d from Init", l.what, l.mtu, mtu)
		}
	}
	// The dedup chain itself, by its rules' comments: the bridge table holds the isolation
	// chains' drop rules in every mode, so a bare "drop" proves nothing.
	if rules, err := nettest.Output(node.NS, "nft", "list", "chain", "bridge", "kubenet-kubenet", hairpin.DedupChain); err != nil ||
		!testkit.ContainsAll(rules, "duplicate frames from pods in 10.244.1.0/24", "duplicate frames from pods in fd00:10:244:1::/64") {
		t.Errorf("no duplicate-frame rules in promiscuous-bridge mode (%v):\n%s", err, rules)
	}

	for i, uplink := range []netip.Addr{nettest.NodeUplink4.Addr(), nettest.NodeUplink6.Addr()} {
		srv := nettest.StartTCPEcho(t, pod.NS, netip.AddrPortFrom(ips[i], 8080))
		r, err := nettest.TCPRequest(pod.NS, netip.AddrPortFrom(uplink, hostPort), "self", testkit.TrafficTimeout)
		if err != nil {
			t.Errorf("pod to its own hostPort %s:%d (server %s): %v", uplink, hostPort, srv.Addr, err)
		} else if r.From == ips[i] {
			t.Errorf("hairpin via %s reached the pod with its own source %s: not masqueraded", uplink, r.From)
		}
	}
	if err := pm.TearDownPod(pod.namespace, pod.name, pod.id); err != nil {
		t.Fatal(err)
	}
	testkit.AssertNoResidue(t, node, "kubenet", pod.att(), ips)
	testkit.AssertNoHostPortResidue(t, node, ips, hostPort)
}
