package cni

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/kubenet-dev/kubenet/test/testkit"

	"github.com/vishvananda/netlink"

	"github.com/kubenet-dev/kubenet/bridge"
	"github.com/kubenet-dev/kubenet/core"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

var familyCases = []struct {
	name  string
	cidrs []netip.Prefix
}{
	{"ipv4", []netip.Prefix{nettest.PodCIDR4}},
	{"ipv6", []netip.Prefix{nettest.PodCIDR6}},
	{"dual", []netip.Prefix{nettest.PodCIDR4, nettest.PodCIDR6}},
}

// TestAddDelMatrix runs two pods on a node for every address family and CNI version through
// libcni, and checks the result, the kernel state and real traffic, then the leak audit after DEL.
func TestAddDelMatrix(t *testing.T) {
	for _, fam := range familyCases {
		for _, ver := range core.SupportedVersions() {
			t.Run(fam.name+"/"+ver, func(t *testing.T) {
				t.Parallel()
				testTwoPods(t, fam.cidrs, ver)
			})
		}
	}
}

func testTwoPods(t *testing.T, cidrs []netip.Prefix, version string) {
	node := nettest.NewNode(t, binDir)
	list := node.ConfList(t, nettest.NetConf{
		CNIVersion:         version,
		PodCIDRs:           cidrs,
		NonMasqueradeCIDRs: []netip.Prefix{nettest.NonMasquerade4, nettest.NonMasquerade6},
	})
	a, b := node.NewPod(t, "pod-a"), node.NewPod(t, "pod-b")
	node.MustAdd(t, list, a)
	node.MustAdd(t, list, b)

	checkResult(t, a, cidrs, version)
	checkNodeState(t, node, cidrs, []*nettest.Pod{a, b})
	checkPodState(t, a, cidrs)
	testkit.CheckMasqRules(t, node.NS, cidrs)

	for _, cidr := range cidrs {
		gw := testkit.GatewayOf(cidr)
		aIP, bIP := a.IP(gw), b.IP(gw)
		t.Run("pod-to-pod "+cidr.String(), func(t *testing.T) {
			testkit.ExpectReachable(t, a.NS, nettest.StartTCPEcho(t, b.NS, netip.AddrPortFrom(bIP, 8080)), aIP)
		})
		t.Run("pod-to-gateway "+cidr.String(), func(t *testing.T) {
			testkit.ExpectReachable(t, a.NS, nettest.StartTCPEcho(t, node.NS, netip.AddrPortFrom(gw, 8081)), aIP)
		})
		external, nodeUplink, peer := nettest.External4, nettest.NodeUplink4, nettest.Peer4
		if gw.Is6() {
			external, nodeUplink, peer = nettest.External6, nettest.NodeUplink6, nettest.Peer6
		}
		t.Run("pod-to-external is SNATed "+cidr.String(), func(t *testing.T) {
			testkit.ExpectReachable(t, a.NS, nettest.StartTCPEcho(t, node.External, netip.AddrPortFrom(external.Addr(), 9000)), nodeUplink.Addr())
		})
		t.Run("pod-to-non-masquerade keeps source "+cidr.String(), func(t *testing.T) {
			testkit.ExpectReachable(t, a.NS, nettest.StartTCPEcho(t, node.Peer, netip.AddrPortFrom(peer.Addr(), 9001)), aIP)
		})
	}

	for _, p := range []*nettest.Pod{a, b} {
		if err := node.Del(list, p); err != nil {
			t.Fatalf("DEL %s: %v", p.RT.ContainerID, err)
		}
		testkit.AssertNoResidue(t, node, "kubenet", testkit.AttachmentOf(p), p.IPs())
	}
}

func checkResult(t *testing.T, p *nettest.Pod, cidrs []netip.Prefix, version string) {
	t.Helper()
	r := p.Result
	if p.ResultVersion != version {
		t.Errorf("result cniVersion %s, want the config's %s", p.ResultVersion, version)
	}
	if len(r.Interfaces) != 3 {
		t.Fatalf("result has %d interfaces, want [bridge, host veth, pod]: %v", len(r.Interfaces), r.Interfaces)
	}
	names := core.NamesFor("kubenet", testkit.AttachmentOf(p))
	if r.Interfaces[0].Name != "cbr0" || r.Interfaces[1].Name != names.HostVeth || r.Interfaces[2].Name != "eth0" {
		t.Errorf("interfaces %s, %s, %s; want cbr0, %s, eth0", r.Interfaces[0].Name, r.Interfaces[1].Name, r.Interfaces[2].Name, names.HostVeth)
	}
	if r.Interfaces[2].Sandbox != p.NS.Path() || r.Interfaces[0].Sandbox != "" || r.Interfaces[1].Sandbox != "" {
		t.Errorf("sandboxes %q %q %q; want only the pod interface in %s", r.Interfaces[0].Sandbox, r.Interfaces[1].Sandbox, r.Interfaces[2].Sandbox, p.NS.Path())
	}
	if len(r.IPs) != len(cidrs) {
		t.Fatalf("result has %d IPs, want one per pod CIDR %v", len(r.IPs), cidrs)
	}
	for i, ip := range r.IPs {
		addr, _ := netip.AddrFromSlice(ip.Address.IP)
		addr = addr.Unmap()
		gw, _ := netip.AddrFromSlice(ip.Gateway)
		if !cidrs[i].Contains(addr) || addr == testkit.GatewayOf(cidrs[i]) || addr == cidrs[i].Addr() {
			t.Errorf("IP %s not a pod address of %s", addr, cidrs[i])
		}
		if gw.Unmap() != testkit.GatewayOf(cidrs[i]) {
			t.Errorf("IP %s gateway %s, want %s", addr, gw, testkit.GatewayOf(cidrs[i]))
		}
		if ip.Interface == nil || *ip.Interface != 2 {
			t.Errorf("IP %s interface index %v, want 2", addr, ip.Interface)
		}
	}
	if len(r.Routes) != len(cidrs) {
		t.Errorf("routes %v, want a default route per family", r.Routes)
	}
}

func checkNodeState(t *testing.T, node *nettest.Node, cidrs []netip.Prefix, pods []*nettest.Pod) {
	t.Helper()
	br := testkit.Link(t, node.NS, "cbr0")
	if br.Type() != "bridge" {
		t.Fatalf("cbr0 is a %s", br.Type())
	}
	var wantAddrs []netip.Prefix
	for _, c := range cidrs {
		wantAddrs = append(wantAddrs, netip.PrefixFrom(testkit.GatewayOf(c), c.Bits()))
	}
	if got := testkit.Addrs(t, node.NS, "cbr0"); !slices.Equal(testkit.SortedPrefixes(got), testkit.SortedPrefixes(wantAddrs)) {
		t.Errorf("cbr0 addresses %v, want exactly the gateways %v", got, wantAddrs)
	}
	if br.Attrs().MTU != 1500 {
		t.Errorf("cbr0 MTU %d, want the uplink's 1500", br.Attrs().MTU)
	}
	if mac := bridge.MAC(wantAddrs).String(); br.Attrs().HardwareAddr.String() != mac {
		t.Errorf("cbr0 MAC %s, want pinned %s", br.Attrs().HardwareAddr, mac)
	}
	if br.Attrs().Promisc != 0 {
		t.Error("cbr0 is promiscuous in hairpin-veth mode")
	}
	wantSysctl := map[string]string{"net/ipv6/conf/cbr0/accept_ra": "0"}
	for _, c := range cidrs {
		if c.Addr().Is4() {
			wantSysctl["net/ipv4/ip_forward"] = "1"
			wantSysctl["net/bridge/bridge-nf-call-iptables"] = "1"
		} else {
			wantSysctl["net/ipv6/conf/all/forwarding"] = "1"
			wantSysctl["net/bridge/bridge-nf-call-ip6tables"] = "1"
		}
	}
	for k, v := range wantSysctl {
		if got := testkit.Sysctl(t, node.NS, k); got != v {
			t.Errorf("node sysctl %s = %s, want %s", k, got, v)
		}
	}
	for _, p := range pods {
		host := testkit.Link(t, node.NS, core.NamesFor("kubenet", testkit.AttachmentOf(p)).HostVeth)
		if host.Attrs().MasterIndex != br.Attrs().Index {
			t.Errorf("host veth %s not on cbr0", host.Attrs().Name)
		}
		if host.Attrs().MTU != 1500 {
			t.Errorf("host veth %s MTU %d, want 1500", host.Attrs().Name, host.Attrs().MTU)
		}
		var info netlink.Protinfo
		nettest.Do(t, node.NS, func() error {
			var err error
			info, err = netlink.LinkGetProtinfo(host)
			return err
		})
		if !info.Hairpin {
			t.Errorf("host veth %s has no hairpin flag in hairpin-veth mode", host.Attrs().Name)
		}
	}
}

func checkPodState(t *testing.T, p *nettest.Pod, cidrs []netip.Prefix) {
	t.Helper()
	eth0 := testkit.Link(t, p.NS, "eth0")
	if eth0.Attrs().MTU != 1500 {
		t.Errorf("pod eth0 MTU %d, want 1500", eth0.Attrs().MTU)
	}
	if lo := testkit.Link(t, p.NS, "lo"); lo.Attrs().OperState != netlink.OperUp && lo.Attrs().Flags&1 == 0 {
		t.Error("pod lo is down")
	}
	var want []netip.Prefix
	for i, c := range cidrs {
		a, _ := netip.AddrFromSlice(p.Result.IPs[i].Address.IP)
		want = append(want, netip.PrefixFrom(a.Unmap(), c.Bits()))
	}
	if got := testkit.Addrs(t, p.NS, "eth0"); !slices.Equal(testkit.SortedPrefixes(got), testkit.SortedPrefixes(want)) {
		t.Errorf("pod eth0 addresses %v, want %v", got, want)
	}
	var wantGW []netip.Addr
	for _, c := range cidrs {
		wantGW = append(wantGW, testkit.GatewayOf(c))
	}
	if got := testkit.DefaultRoutes(t, p.NS); !slices.Equal(testkit.SortedAddrs(got), testkit.SortedAddrs(wantGW)) {
		t.Errorf("pod default routes via %v, want %v", got, wantGW)
	}
	if v := testkit.Sysctl(t, p.NS, "net/ipv4/conf/eth0/arp_notify"); v != "1" {
		t.Errorf("pod arp_notify = %s, want 1", v)
	}
	if cidrs[len(cidrs)-1].Addr().Is6() {
		if v := testkit.Sysctl(t, p.NS, "net/ipv6/conf/eth0/accept_dad"); v != "0" {
			t.Errorf("pod accept_dad = %s, want 0 (no DAD delay)", v)
		}
	}
}
