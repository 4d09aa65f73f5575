package cni

import (
	"context"
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/vishvananda/netlink"

	"github.com/kubenet-dev/kubenet/core"
	"github.com/kubenet-dev/kubenet/hostport"
	"github.com/kubenet-dev/kubenet/internal/ipnet"
	"github.com/kubenet-dev/kubenet/masq"
	"github.com/kubenet-dev/kubenet/test/nettest"
	"github.com/kubenet-dev/kubenet/test/testkit"
)

// TestCheck: CHECK passes right after ADD, and catches each tampering with what the attachment
// owns, naming what differs.
func TestCheck(t *testing.T) {
	linkOp := func(where func(*nettest.Node, *nettest.Pod) *nettest.Pod, name func(*nettest.Pod) string, op func(netlink.Link) error) func(*testing.T, *nettest.Node, *nettest.Pod) {
		return func(t *testing.T, node *nettest.Node, pod *nettest.Pod) {
			target := where(node, pod)
			ns := node.NS
			if target != nil {
				ns = target.NS
			}
			nettest.Do(t, ns, func() error {
				l, err := netlink.LinkByName(name(pod))
				if err != nil {
					return err
				}
				return op(l)
			})
		}
	}
	onNode := func(*nettest.Node, *nettest.Pod) *nettest.Pod { return nil }
	inPod := func(_ *nettest.Node, p *nettest.Pod) *nettest.Pod { return p }
	hostVeth := func(p *nettest.Pod) string { return testkit.KubenetNames(p).HostVeth }
	named := func(n string) func(*nettest.Pod) string { return func(*nettest.Pod) string { return n } }

	cases := []struct {
		name    string
		tamper  func(*testing.T, *nettest.Node, *nettest.Pod)
		wantErr string // "" = CHECK passes
	}{
		{"untouched", func(*testing.T, *nettest.Node, *nettest.Pod) {}, ""},
		{"reservation removed", func(t *testing.T, node *nettest.Node, pod *nettest.Pod) {
			if err := os.Remove(filepath.Join(node.DataDir(), "kubenet", pod.IPs()[0].String())); err != nil {
				t.Fatal(err)
			}
		}, "not reserved"},
		{"pod address removed", linkOp(inPod, named("eth0"), func(l netlink.Link) error {
			addrs, err := netlink.AddrList(l, netlink.FAMILY_V6)
			for _, a := range addrs {
				if !a.IP.IsLinkLocalUnicast() {
					return netlink.AddrDel(l, &a)
				}
			}
			return err
		}), "lacks address"},
		{"pod default route removed", linkOp(inPod, named("eth0"), func(l netlink.Link) error {
			return netlink.RouteDel(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: ipnet.FromPrefix(netip.MustParsePrefix("0.0.0.0/0"))})
		}), "default route"},
		{"pod MTU changed", linkOp(inPod, named("eth0"), func(l netlink.Link) error { return netlink.LinkSetMTU(l, 1400) }), "MTU"},
		{"host veth off the bridge", linkOp(onNode, hostVeth, netlink.LinkSetNoMaster), "not on bridge"},
		{"hairpin flag cleared", linkOp(onNode, hostVeth, func(l netlink.Link) error { return netlink.LinkSetHairpin(l, false) }), "hairpin"},
		{"host veth deleted", linkOp(onNode, hostVeth, netlink.LinkDel), "host veth"},
		{"bridge made promiscuous", linkOp(onNode, named("cbr0"), netlink.SetPromiscOn), "promiscuous"},
		{"bridge gateway removed", linkOp(onNode, named("cbr0"), func(l netlink.Link) error {
			return netlink.AddrDel(l, &netlink.Addr{IPNet: ipnet.FromPrefix(netip.MustParsePrefix("10.244.1.1/24"))})
		}), "gateway address 10.244.1.1/24"},
		{"hostPort element deleted", func(t *testing.T, node *nettest.Node, _ *nettest.Pod) {
			nettest.Run(t, node.NS, "nft", "delete", "element", "inet", "kubenet-kubenet", hostport.MapIPv4, "{ tcp . 30080 }")
		}, "no element"},
		{"hostPort reservation removed", func(t *testing.T, node *nettest.Node, _ *nettest.Pod) {
			if err := os.RemoveAll(filepath.Join(node.DataDir(), "kubenet", hostport.IndexDirName)); err != nil {
				t.Fatal(err)
			}
		}, "not reserved"},
		{"ifb deleted", linkOp(onNode, func(p *nettest.Pod) string { return testkit.KubenetNames(p).IFB }, netlink.LinkDel), "ifb"},
		{"SNAT rule deleted", func(t *testing.T, node *nettest.Node, _ *nettest.Pod) {
			out := nettest.Run(t, node.NS, "nft", "-a", "list", "chain", "inet", "kubenet-kubenet", masq.ChainName)
			for _, line := range strings.Split(out, "\n") {
				if strings.Contains(line, "SNAT to the node") {
					fields := strings.Fields(line)
					handle := fields[len(fields)-1]
					nettest.Run(t, node.NS, "nft", "delete", "rule", "inet", "kubenet-kubenet", masq.ChainName, "handle", handle)
					return
				}
			}
			t.Fatalf("no masquerade rule to delete in:\n%s", out)
		}, "rules"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			node := nettest.NewNode(t, binDir)
			list := node.ConfList(t, nettest.NetConf{PodCIDRs: testkit.DualStack()})
			pod := node.NewPod(t, "checked")
			// Everything an attachment can own: a host port and both shaping directions.
			pod.RT.CapabilityArgs = map[string]any{
				"portMappings": []map[string]any{{"hostPort": 30080, "containerPort": 80, "protocol": "tcp"}},
				"bandwidth":    map[string]any{"ingressRate": 10_000_000, "egressRate": 20_000_000},
			}
			node.MustAdd(t, list, pod)
			tc.tamper(t, node, pod)
			err := node.Check(list, pod)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Errorf("CHECK failed on an intact attachment: %v", err)
			case tc.wantErr != "" && err == nil:
				t.Errorf("CHECK passed after %s", tc.name)
			case tc.wantErr != "" && !strings.Contains(err.Error(), tc.wantErr):
				t.Errorf("CHECK error %q does not say %q", err, tc.wantErr)
			}
		})
	}
}

// TestCheckNeedsPrevResultAndVersion: CHECK without prevResult fails clearly; CHECK for a config
// older than 0.4.0 is refused with code 1.
func TestCheckNeedsPrevResultAndVersion(t *testing.T) {
	node := nettest.NewNode(t, binDir)
	pod := node.NewPod(t, "prev")
	conf := map[string]any{"cniVersion": "1.0.0", "name": "kubenet", "type": "kubenet",
		"podCIDRs": []string{"10.244.1.0/24"}, "dataDir": node.DataDir()}
	env := map[string]string{"CNI_COMMAND": "CHECK", "CNI_CONTAINERID": "prev", "CNI_NETNS": pod.NS.Path(),
		"CNI_IFNAME": "eth0", "CNI_PATH": binDir}
	for _, tc := range []struct {
		version  string
		wantCode uint
		wantMsg  string
	}{{"1.0.0", types.ErrInvalidNetworkConfig, "prevResult"}, {"0.3.1", types.ErrIncompatibleCNIVersion, "CHECK"}} {
		conf["cniVersion"] = tc.version
		stdin, _ := json.Marshal(conf)
		run, err := node.ExecPlugin(binDir, env, stdin)
		if err != nil {
			t.Fatal(err)
		}
		if run.Err == nil || run.Err.Code != tc.wantCode || !strings.Contains(run.Err.Msg+run.Err.Details, tc.wantMsg) {
			t.Errorf("CHECK with cniVersion %s: %+v, want code %d naming %q", tc.version, run.Err, tc.wantCode, tc.wantMsg)
		}
	}
}

// TestStatus: STATUS is 0 when an ADD can succeed and 50 with the reason when it cannot.
func TestStatus(t *testing.T) {
	cases := []struct {
		name    string
		conf    nettest.NetConf
		prepare func(*testing.T, *nettest.Node)
		wantMsg string // "" = ready
	}{
		{"ready", nettest.NetConf{PodCIDRs: testkit.DualStack()}, nil, ""},
		{"no pod CIDR", nettest.NetConf{}, nil, "podCIDRs"},
		{"pool exhausted", nettest.NetConf{PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/30")}},
			func(t *testing.T, node *nettest.Node) {
				list := node.ConfList(t, nettest.NetConf{PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/30")}})
				node.MustAdd(t, list, node.NewPod(t, "only"))
			}, "no free address in pod CIDR 10.244.1.0/30"},
		{"data dir unusable", nettest.NetConf{PodCIDRs: testkit.DualStack()}, func(t *testing.T, node *nettest.Node) {
			if err := os.WriteFile(node.DataDir(), []byte("a file, not a dir"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, "data dir"},
		{"bridge name taken", nettest.NetConf{PodCIDRs: testkit.DualStack()}, func(t *testing.T, node *nettest.Node) {
			nettest.Do(t, node.NS, func() error {
				return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "cbr0"}, PeerName: "cbr0peer"})
			})
		}, `bridge "cbr0": is an existing veth link of the node, not a bridge`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			node := nettest.NewNode(t, binDir)
			if tc.prepare != nil {
				tc.prepare(t, node)
			}
			err := node.Status(node.ConfList(t, tc.conf))
			switch {
			case tc.wantMsg == "" && err != nil:
				t.Errorf("STATUS failed on a ready node: %v", err)
			case tc.wantMsg != "" && err == nil:
				t.Errorf("STATUS ready, want not available: %s", tc.wantMsg)
			case tc.wantMsg != "" && (testkit.CNICode(err) != core.ErrPluginNotAvailable || !strings.Contains(err.Error(), tc.wantMsg)):
				t.Errorf("STATUS = %v (code %d), want code 50 naming %q", err, testkit.CNICode(err), tc.wantMsg)
			}
		})
	}
}

// TestGC: GC through libcni removes every attachment not in the valid list — also when libcni
// has no cached result to synthesize a DEL from — plus reservations without a record, and keeps
// the valid pods working, the lock and cursors, and other networks' files.
func TestGC(t *testing.T) {
	node := nettest.NewNode(t, binDir)
	list := node.ConfList(t, nettest.NetConf{PodCIDRs: testkit.DualStack()})
	keep, gone1, gone2 := node.NewPod(t, "keep"), node.NewPod(t, "gone-1"), node.NewPod(t, "gone-2")
	for i, p := range []*nettest.Pod{keep, gone1, gone2} {
		p.RT.CapabilityArgs = map[string]any{
			"portMappings": []map[string]any{{"hostPort": 30080 + i, "containerPort": 80, "protocol": "tcp"}},
			"bandwidth":    map[string]any{"egressRate": 20_000_000},
		}
		node.MustAdd(t, list, p)
	}
	// Only GC itself, not libcni's synthesized DELs, may clean up gone-2.
	if err := os.Remove(filepath.Join(node.Dir, "cache", "results", "kubenet-gone-2-eth0")); err != nil {
		t.Fatal(err)
	}
	netDir := filepath.Join(node.DataDir(), "kubenet")
	orphan := filepath.Join(netDir, "10.244.1.200")
	other := filepath.Join(node.DataDir(), "other-net", "10.244.1.201")
	for path, content := range map[string]string{orphan: "host-local-era\r\neth0", other: "someone\r\neth0"} {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	if err := node.GC(list, []types.GCAttachment{{ContainerID: "keep", IfName: "eth0"}}); err != nil {
		t.Fatalf("GC: %v", err)
	}
	for _, p := range []*nettest.Pod{gone1, gone2} {
		testkit.AssertNoResidue(t, node, "kubenet", testkit.AttachmentOf(p), p.IPs())
	}
	if _, err := os.Stat(orphan); err == nil {
		t.Error("GC kept a reservation that no valid attachment holds")
	}
	if _, err := os.Stat(other); err != nil {
		t.Errorf("GC touched another network's reservation: %v", err)
	}
	if err := node.Check(list, keep); err != nil {
		t.Errorf("the valid pod no longer passes CHECK after GC: %v", err)
	}
	peer := nettest.StartTCPEcho(t, keep.NS, netip.AddrPortFrom(keep.IPs()[0], 8080))
	testkit.ExpectReachable(t, node.NS, peer, testkit.GatewayOf(nettest.PodCIDR4))

	if err := node.GC(list, nil); err != nil {
		t.Fatalf("GC with an empty list: %v", err)
	}
	testkit.AssertNoResidue(t, node, "kubenet", testkit.AttachmentOf(keep), keep.IPs())
	files := testkit.DataDirFiles(t, node)
	for _, want := range []string{"kubenet/lock", "kubenet/last_reserved_ip.0", "kubenet/last_reserved_ip.1", "other-net/10.244.1.201"} {
		if !contains(files, want) {
			t.Errorf("GC removed %s; data dir now %v", want, files)
		}
	}
	if left := stateFiles(t, node); len(left) != 1 {
		t.Errorf("after GC with an empty list the data dir holds %v, want only the other network's file", left)
	}
}

// TestCollectSparesYoung: Collect with a cutoff (what kubenet-agent's stale-sandbox GC passes)
// removes attachments and orphan reservations written before it and spares those written after
// it, though the caller did not list them as in use: an ADD that started after the caller asked
// the runtime. Without the cutoff the same attachment is collected, so the cutoff is what spared
// it.
func TestCollectSparesYoung(t *testing.T) {
	node := nettest.NewNode(t, binDir)
	list := node.ConfList(t, nettest.NetConf{PodCIDRs: testkit.DualStack()})
	cfg := coreConfig(t, list)
	live, old, young := node.NewPod(t, "live"), node.NewPod(t, "old"), node.NewPod(t, "young")
	for i, p := range []*nettest.Pod{live, old, young} {
		p.RT.CapabilityArgs = map[string]any{
			"portMappings": []map[string]any{{"hostPort": 30180 + i, "containerPort": 80, "protocol": "tcp"}},
		}
		node.MustAdd(t, list, p)
	}
	netDir := filepath.Join(node.DataDir(), "kubenet")
	oldOrphan, youngOrphan := filepath.Join(netDir, "10.244.1.200"), filepath.Join(netDir, "10.244.1.201")
	for path, content := range map[string]string{oldOrphan: "crashed-long-ago\r\neth0", youngOrphan: "crashed-just-now\r\neth0"} {
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// An hour ago: the old pod's reservations and record, and the old orphan.
	longAgo := time.Now().Add(-time.Hour)
	oldFiles := []string{oldOrphan, core.RecordPath(netDir, core.Attachment{ContainerID: "old", IfName: "eth0"})}
	for _, ip := range old.IPs() {
		oldFiles = append(oldFiles, filepath.Join(netDir, ip.String()))
	}
	for _, f := range oldFiles {
		if err := os.Chtimes(f, longAgo, longAgo); err != nil {
			t.Fatal(err)
		}
	}

	collect := func(k core.Keeper) core.GCReport {
		t.Helper()
		var report core.GCReport
		nettest.Do(t, node.NS, func() error {
			var err error
			report, err = core.Collect(context.Background(), cfg, k)
			return err
		})
		return report
	}
	onlyLive := func(id, _ string) bool { return id == "live" }
	report := collect(core.Keeper{InUse: onlyLive, WrittenBefore: time.Now().Add(-10 * time.Minute)})

	if len(report.Attachments) != 1 || report.Attachments[0].ContainerID != "old" {
		t.Errorf("collected attachments %+v, want only old", report.Attachments)
	}
	if len(report.Addresses) != 1 || report.Addresses[0] != netip.MustParseAddr("10.244.1.200") {
		t.Errorf("released orphan reservations %v, want only 10.244.1.200", report.Addresses)
	}
	// The runtime's result cache is libcni's, not kubenet's: a runtime that lost the sandbox
	// lost that too.
	_ = os.Remove(filepath.Join(node.Dir, "cache", "results", "kubenet-old-eth0"))
	testkit.AssertNoResidue(t, node, "kubenet", testkit.AttachmentOf(old), old.IPs())
	if _, err := os.Stat(oldOrphan); err == nil {
		t.Error("the orphan reservation written an hour ago was kept")
	}
	if _, err := os.Stat(youngOrphan); err != nil {
		t.Errorf("the orphan reservation written after the cutoff was released: %v", err)
	}
	for _, p := range []*nettest.Pod{live, young} {
		// CHECK covers the reservation, record, veth, addresses, routes and host-port rules.
		if err := node.Check(list, p); err != nil {
			t.Errorf("%s no longer passes CHECK after the collection: %v", p.RT.ContainerID, err)
		}
		srv := nettest.StartTCPEcho(t, p.NS, netip.AddrPortFrom(p.IPs()[0], 8080))
		testkit.ExpectReachable(t, node.NS, srv, testkit.GatewayOf(nettest.PodCIDR4))
	}

	// The control: the same call without a cutoff takes the young attachment and orphan.
	report = collect(core.Keeper{InUse: onlyLive})
	if len(report.Attachments) != 1 || report.Attachments[0].ContainerID != "young" || len(report.Addresses) != 1 {
		t.Errorf("without a cutoff collected %+v and released %v, want young and its orphan", report.Attachments, report.Addresses)
	}
	_ = os.Remove(filepath.Join(node.Dir, "cache", "results", "kubenet-young-eth0"))
	testkit.AssertNoResidue(t, node, "kubenet", testkit.AttachmentOf(young), young.IPs())
	if err := node.Check(list, live); err != nil {
		t.Errorf("live no longer passes CHECK: %v", err)
	}
}

// coreConfig parses the plugin entry of list as the runtime would pass it.
func coreConfig(t *testing.T, list *libcni.NetworkConfigList) *core.Config {
	t.Helper()
	var plugin map[string]any
	if err := json.Unmarshal(list.Plugins[0].Bytes, &plugin); err != nil {
		t.Fatal(err)
	}
	plugin["name"], plugin["cniVersion"] = list.Name, list.CNIVersion
	raw, err := json.Marshal(plugin)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := core.ParseConfig(raw)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
