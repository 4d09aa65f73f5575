package cni

import (
	"encoding/json"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/vishvananda/netlink"

	"github.com/kubenet-dev/kubenet/core"
	"github.com/kubenet-dev/kubenet/hostport"
	"github.com/kubenet-dev/kubenet/isolation"
	"github.com/kubenet-dev/kubenet/test/nettest"
	"github.com/kubenet-dev/kubenet/test/testkit"
)

// rawNode is a node with the binary run directly (no libcni), for input libcni would not
// send; conf renders the plugin configuration with members replaced.
type rawNode struct {
	*nettest.Node
	t *testing.T
}

func newRawNode(t *testing.T) *rawNode {
	return &rawNode{Node: nettest.NewNode(t, binDir), t: t}
}

func (n *rawNode) conf(members map[string]any) []byte {
	c := map[string]any{
		"cniVersion": "1.1.0", "name": "kubenet", "type": "kubenet", "dataDir": n.DataDir(),
		"podCIDRs": []string{nettest.PodCIDR4.String(), nettest.PodCIDR6.String()},
	}
	maps.Copy(c, members)
	b, err := json.Marshal(c)
	if err != nil {
		n.t.Fatal(err)
	}
	return b
}

// exec runs one verb for pod (nil: a verb without attachment) with env overrides.
func (n *rawNode) exec(command string, pod *nettest.Pod, stdin []byte, env map[string]string) nettest.PluginRun {
	n.t.Helper()
	e := map[string]string{"CNI_COMMAND": command, "CNI_PATH": binDir}
	if pod != nil {
		e["CNI_CONTAINERID"], e["CNI_IFNAME"], e["CNI_NETNS"] = pod.RT.ContainerID, "eth0", pod.NS.Path()
		e["CNI_ARGS"] = "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=" + pod.RT.ContainerID
	}
	maps.Copy(e, env)
	run, err := n.ExecPlugin(binDir, e, stdin)
	if err != nil {
		n.t.Fatal(err)
	}
	if strings.Contains(run.Stderr, "panic:") {
		n.t.Fatalf("%s panicked:\n%s", command, run.Stderr)
	}
	return run
}

// mustAdd attaches pod with a UDP host port and shaping both ways, and returns ADD's result.
func (n *rawNode) mustAdd(pod *nettest.Pod, hostPort int) []byte {
	n.t.Helper()
	run := n.exec("ADD", pod, n.conf(map[string]any{"runtimeConfig": map[string]any{
		"portMappings": []map[string]any{{"hostPort": hostPort, "containerPort": 80, "protocol": "udp"}},
		"bandwidth":    map[string]any{"ingressRate": 10_000_000, "egressRate": 10_000_000},
	}}), nil)
	if run.ExitCode != 0 {
		n.t.Fatalf("ADD %s: %s", pod.RT.ContainerID, run.Stdout)
	}
	return []byte(run.Stdout)
}

func (n *rawNode) mustCheck(pod *nettest.Pod, result []byte) {
	n.t.Helper()
	if run := n.exec("CHECK", pod, n.conf(map[string]any{"prevResult": json.RawMessage(result)}), nil); run.ExitCode != 0 {
		n.t.Errorf("CHECK %s: %s", pod.RT.ContainerID, run.Stdout)
	}
}

// TestDelNeverFailsOnPodAuthorInput: whatever a pod author wrote (host ports, bandwidth
// annotations) and whatever a runtime garbles on the way, DEL, CHECK and GC finish: DEL works
// from what ADD recorded, the capability arguments are at most hints.
func TestDelNeverFailsOnPodAuthorInput(t *testing.T) {
	cases := []struct {
		name    string
		members map[string]any
		env     map[string]string
	}{
		{"hostPort 0", map[string]any{"runtimeConfig": map[string]any{"portMappings": []any{map[string]any{"hostPort": 0, "containerPort": 80}}}}, nil},
		{"hostPort out of range", map[string]any{"runtimeConfig": map[string]any{"portMappings": []any{map[string]any{"hostPort": 70000, "containerPort": -1, "protocol": "icmp"}}}}, nil},
		{"portMappings not a list", map[string]any{"runtimeConfig": map[string]any{"portMappings": "31000"}}, nil},
		{"bad bandwidth annotation", map[string]any{"runtimeConfig": map[string]any{"io.kubernetes.cri.pod-annotations": map[string]string{"kubernetes.io/ingress-bandwidth": "lots", "kubernetes.io/egress-bandwidth": "-1M"}}}, nil},
		{"bandwidth below 1 kbit", map[string]any{"runtimeConfig": map[string]any{"bandwidth": map[string]any{"ingressRate": 5}}}, nil},
		{"bandwidth not an object", map[string]any{"runtimeConfig": map[string]any{"bandwidth": "fast"}}, nil},
		{"ipRanges garbage", map[string]any{"runtimeConfig": map[string]any{"ipRanges": []any{[]any{map[string]any{"subnet": "banana"}}}}}, nil},
		{"prevResult garbage", map[string]any{"prevResult": map[string]any{"cniVersion": "1.1.0", "ips": "x"}}, nil},
		{"CNI_ARGS garbage", nil, map[string]string{"CNI_ARGS": ";;=x;FOO=bar"}},
		{"pod CIDRs changed to garbage", map[string]any{"podCIDRs": []string{"banana"}, "mtu": "big", "hairpinMode": 3}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			n := newRawNode(t)
			pod := n.NewPod(t, "author")
			result := n.mustAdd(pod, 31001)
			ips := podIPs(t, result)
			hostile := n.conf(tc.members)
			// CHECK works from the record: the hostile hints cannot fail it. (Pod CIDRs and the
			// runtime's ipRanges are the network's configuration, not a pod author's: CHECK
			// checks them.)
			if tc.name != "pod CIDRs changed to garbage" && tc.name != "ipRanges garbage" {
				var c map[string]any
				_ = json.Unmarshal(hostile, &c)
				c["prevResult"] = json.RawMessage(result)
				check, _ := json.Marshal(c)
				if run := n.exec("CHECK", pod, check, tc.env); run.ExitCode != 0 {
					t.Errorf("CHECK with %s: %s", tc.name, run.Stdout)
				}
			}
			if run := n.exec("DEL", pod, hostile, tc.env); run.ExitCode != 0 {
				t.Fatalf("DEL with %s failed: %s", tc.name, run.Stdout)
			}
			testkit.AssertNoResidue(t, n.Node, "kubenet", testkit.AttachmentOf(pod), ips)
			testkit.AssertNoHostPortResidue(t, n.Node, ips, 31001)
			// And GC with the same garbage in its configuration.
			other := n.NewPod(t, "gc-author")
			n.mustAdd(other, 31002)
			var c map[string]any
			_ = json.Unmarshal(hostile, &c)
			c["cni.dev/valid-attachments"] = []any{}
			gc, _ := json.Marshal(c)
			if run := n.exec("GC", nil, gc, nil); run.ExitCode != 0 {
				t.Fatalf("GC with %s failed: %s", tc.name, run.Stdout)
			}
			testkit.AssertNoResidue(t, n.Node, "kubenet", testkit.AttachmentOf(other), nil)
			testkit.AssertNoHostPortResidue(t, n.Node, nil, 31002)
		})
	}
}

func podIPs(t *testing.T, result []byte) []netip.Addr {
	t.Helper()
	var r struct {
		IPs []struct {
			Address string `json:"address"`
		} `json:"ips"`
	}
	if err := json.Unmarshal(result, &r); err != nil {
		t.Fatal(err)
	}
	var out []netip.Addr
	for _, ip := range r.IPs {
		out = append(out, netip.MustParsePrefix(ip.Address).Addr())
	}
	return out
}

// damageCase damages one state file of the victim attachment (its record, its hostPort index
// file or a reservation) the way a crash, a full disk or a hand with write access would.
type damageCase struct {
	name  string
	apply func(t *testing.T, netDir string, victim core.Attachment, ips []netip.Addr, hostPort int)
}

func writeFile(t *testing.T, p, content string) {
	t.Helper()
	if err := os.RemoveAll(p); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func damageCases(outside string) []damageCase {
	record := func(content string) func(*testing.T, string, core.Attachment, []netip.Addr, int) {
		return func(t *testing.T, netDir string, a core.Attachment, _ []netip.Addr, _ int) {
			p := core.RecordPath(netDir, a)
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			if content == "truncate" {
				content = string(b[:len(b)/2])
			}
			writeFile(t, p, content)
		}
	}
	index := func(content string) func(*testing.T, string, core.Attachment, []netip.Addr, int) {
		return func(t *testing.T, netDir string, _ core.Attachment, _ []netip.Addr, port int) {
			writeFile(t, filepath.Join(netDir, hostport.IndexDirName, "udp-"+itoa(port), "0.0.0.0"), content)
		}
	}
	reservation := func(content string) func(*testing.T, string, core.Attachment, []netip.Addr, int) {
		return func(t *testing.T, netDir string, _ core.Attachment, ips []netip.Addr, _ int) {
			writeFile(t, filepath.Join(netDir, ips[0].String()), content)
		}
	}
	return []damageCase{
		{"record truncated", record("truncate")},
		{"record empty (power loss)", record("")},
		{"record garbage", record("\x00\xff{")},
		{"record names another attachment", record(`{"containerID":"bystander","ifName":"eth0"}`)},
		{"record is a symlink out of the data dir", func(t *testing.T, netDir string, a core.Attachment, _ []netip.Addr, _ int) {
			p := core.RecordPath(netDir, a)
			b, _ := os.ReadFile(p)
			writeFile(t, outside, string(b))
			if err := os.Remove(p); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(outside, p); err != nil {
				t.Fatal(err)
			}
		}},
		{"record is a directory", func(t *testing.T, netDir string, a core.Attachment, _ []netip.Addr, _ int) {
			p := core.RecordPath(netDir, a)
			if err := os.Remove(p); err != nil {
				t.Fatal(err)
			}
			if err := os.MkdirAll(filepath.Join(p, "x"), 0o755); err != nil {
				t.Fatal(err)
			}
		}},
		{"hostPort index file garbage", index("{garbage")},
		{"hostPort index file truncated", index(`{"containerID":"vic`)},
		{"hostPort index file is a symlink out", func(t *testing.T, netDir string, _ core.Attachment, _ []netip.Addr, port int) {
			p := filepath.Join(netDir, hostport.IndexDirName, "udp-"+itoa(port), "0.0.0.0")
			if err := os.Remove(p); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(outside, p); err != nil {
				t.Fatal(err)
			}
		}},
		{"reservation truncated", reservation("victim\r\ne")},
		{"reservation garbage", reservation("\x00\xff")},
		{"reservation empty", reservation("")},
	}
}

func itoa(i int) string { b, _ := json.Marshal(i); return string(b) }

// TestBrokenStateFiles: one damaged file of an attachment never makes its DEL or GC fail, never
// stops GC for the other attachments, never releases an address while the attachment's veth
// exists, and never touches what it points to outside the data dir. The bystander that stays
// keeps working.
func TestBrokenStateFiles(t *testing.T) {
	outside := filepath.Join(t.TempDir(), "outside-victim")
	for _, d := range damageCases(outside) {
		for _, teardown := range []string{"DEL", "GC"} {
			t.Run(d.name+"/"+teardown, func(t *testing.T) {
				if err := os.WriteFile(outside, []byte("outside"), 0o600); err != nil {
					t.Fatal(err)
				}
				n := newRawNode(t)
				victim, bystander, other := n.NewPod(t, "victim"), n.NewPod(t, "bystander"), n.NewPod(t, "other")
				n.mustAdd(victim, 31101)
				byResult := n.mustAdd(bystander, 31102)
				otherResult := n.mustAdd(other, 31103)
				ips := podIPs(t, []byte(mustResultOf(t, n, victim)))
				netDir := filepath.Join(n.DataDir(), "kubenet")
				d.apply(t, netDir, testkit.AttachmentOf(victim), ips, 31101)

				switch teardown {
				case "DEL":
					if run := n.exec("DEL", victim, n.conf(nil), map[string]string{"CNI_NETNS": ""}); run.ExitCode != 0 {
						t.Fatalf("DEL failed: %s", run.Stdout)
					}
				case "GC":
					// GC keeps the bystander and collects the victim and the other pod: one broken
					// file must not stop the rest.
					gc := n.conf(map[string]any{"cni.dev/valid-attachments": []map[string]string{{"containerID": "bystander", "ifname": "eth0"}}})
					if run := n.exec("GC", nil, gc, nil); run.ExitCode != 0 {
						t.Fatalf("GC failed: %s", run.Stdout)
					}
					testkit.AssertNoResidue(t, n.Node, "kubenet", testkit.AttachmentOf(other), podIPs(t, otherResult))
				}
				testkit.AssertNoResidue(t, n.Node, "kubenet", testkit.AttachmentOf(victim), ips)
				for _, el := range testkit.HostPortElements(t, n.Node) {
					if strings.HasPrefix(el.Comment, "victim/") || strings.HasPrefix(el.Comment, "other/") && teardown == "GC" {
						t.Errorf("element left: %v", el)
					}
				}
				n.mustCheck(bystander, byResult)
				if b, err := os.ReadFile(outside); err != nil || string(b) != "outside" && !strings.Contains(d.name, "record is a symlink") {
					t.Errorf("the file outside the data dir was touched: %q %v", b, err)
				}
				// A damaged file that named nobody is gone, or at least no longer takes a port.
				fresh := n.NewPod(t, "fresh")
				n.mustAdd(fresh, 31101)
			})
		}
	}
}

// mustResultOf reads the pod's addresses from its record (the test did not keep ADD's result).
func mustResultOf(t *testing.T, n *rawNode, pod *nettest.Pod) string {
	t.Helper()
	b, err := os.ReadFile(core.RecordPath(filepath.Join(n.DataDir(), "kubenet"), testkit.AttachmentOf(pod)))
	if err != nil {
		t.Fatal(err)
	}
	var rec core.Record
	if err := json.Unmarshal(b, &rec); err != nil {
		t.Fatal(err)
	}
	out := map[string]any{"ips": []map[string]string{}}
	for _, p := range rec.IPs {
		out["ips"] = append(out["ips"].([]map[string]string), map[string]string{"address": p.String()})
	}
	r, _ := json.Marshal(out)
	return string(r)
}

// TestFailedTeardownKeepsAddresses: while a part of an attachment cannot be removed, DEL fails
// and keeps the attachment's addresses and record, so no new pod is handed an address that old
// rules still lead to; once the obstacle is gone, DEL finishes.
func TestFailedTeardownKeepsAddresses(t *testing.T) {
	n := newRawNode(t)
	pod := n.NewPod(t, "stuck")
	ips := podIPs(t, n.mustAdd(pod, 31201))
	// Someone replaces kubenet's IPv4 isolation set with one of another type: the pod's elements
	// in it cannot be removed until kubenet's set is back (the next ADD puts it back).
	table := testkit.HostPortTable
	for _, ch := range []string{isolation.ChainAntiSpoofIPv4, isolation.ChainAntiSpoofARP} {
		nettest.Run(t, n.NS, "nft", "flush", "chain", "bridge", table, ch)
	}
	nettest.Run(t, n.NS, "nft", "delete", "set", "bridge", table, isolation.SetIPv4)
	nettest.Run(t, n.NS, "nft", "add", "set", "bridge", table, isolation.SetIPv4, "{ type ipv4_addr ; }")
	run := n.exec("DEL", pod, n.conf(nil), nil)
	if run.ExitCode == 0 {
		t.Fatal("DEL succeeded with the hostPort map replaced")
	}
	for _, ip := range ips {
		if b, err := os.ReadFile(filepath.Join(n.DataDir(), "kubenet", ip.String())); err != nil || !strings.HasPrefix(string(b), "stuck\r\n") {
			t.Errorf("after the failed DEL, %s is not reserved for the pod any more: %q %v", ip, b, err)
		}
	}
	if _, err := os.Stat(core.RecordPath(filepath.Join(n.DataDir(), "kubenet"), testkit.AttachmentOf(pod))); err != nil {
		t.Errorf("the failed DEL removed the record: %v", err)
	}
	// A new pod does not get the addresses.
	next := n.NewPod(t, "next")
	nextRun := n.exec("ADD", next, n.conf(nil), nil)
	if nextRun.ExitCode != 0 {
		t.Fatalf("ADD of another pod: %s", nextRun.Stdout)
	}
	for _, ip := range podIPs(t, []byte(nextRun.Stdout)) {
		for _, old := range ips {
			if ip == old {
				t.Errorf("a new pod got %s, which the half-removed pod still held", ip)
			}
		}
	}
	// The next ADD replaced the set (isolation.Ensure), so the obstacle is gone.
	if run := n.exec("DEL", pod, n.conf(nil), nil); run.ExitCode != 0 {
		t.Fatalf("DEL after the set was put back: %s", run.Stdout)
	}
	testkit.AssertNoResidue(t, n.Node, "kubenet", testkit.AttachmentOf(pod), ips)
}

// TestConfigThatBreaksTheNodeIsRefused: pod CIDRs that overlap the node's addresses or connected
// routes, bridge names the kernel treats specially or taken by another link, and a second
// network on a bridge another network's pods use: ADD refuses with code 7 naming the key and
// changes nothing, STATUS answers 50 with the reason.
func TestConfigThatBreaksTheNodeIsRefused(t *testing.T) {
	cases := []struct {
		name    string
		prepare func(t *testing.T, n *rawNode)
		members map[string]any
		names   []string
	}{
		{"pod CIDR is the uplink's subnet", nil, map[string]any{"podCIDRs": []string{"198.18.0.0/24"}}, []string{"podCIDRs", "198.18.0.0/24", "eth0"}},
		{"pod CIDR inside the peer link's subnet", nil, map[string]any{"podCIDRs": []string{"10.200.0.128/25"}}, []string{"podCIDRs", "10.200.0.128/25", "eth1"}},
		{"pod CIDR around the uplink's subnet", nil, map[string]any{"podCIDRs": []string{"198.16.0.0/14"}}, []string{"podCIDRs", "198.16.0.0/14"}},
		{"IPv6 pod CIDR is the uplink's", nil, map[string]any{"podCIDRs": []string{"2001:db8:e::/64"}}, []string{"podCIDRs", "2001:db8:e::/64"}},
		{"pod CIDR holds a node address", func(t *testing.T, n *rawNode) {
			nettest.Do(t, n.NS, func() error {
				d := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "vip0"}}
				if err := netlink.LinkAdd(d); err != nil {
					return err
				}
				return netlink.AddrAdd(d, &netlink.Addr{IPNet: mustIPNet("10.244.1.77/32")})
			})
		}, map[string]any{"podCIDRs": []string{"10.244.1.0/24"}}, []string{"podCIDRs", "10.244.1.77", "vip0"}},
		{"ipRanges overlap the uplink", nil, map[string]any{"runtimeConfig": map[string]any{"ipRanges": []any{[]any{map[string]any{"subnet": "198.18.0.0/25"}}}}}, []string{"ipRanges", "198.18.0.0/25"}},
		{"bridge is the uplink", nil, map[string]any{"bridge": "eth0"}, []string{"bridge", "eth0", "veth"}},
		{"bridge lo", nil, map[string]any{"bridge": "lo"}, []string{"bridge", "lo"}},
		{"bridge all", nil, map[string]any{"bridge": "all"}, []string{"bridge", "all"}},
		{"bridge default", nil, map[string]any{"bridge": "default"}, []string{"bridge", "default"}},
		{"bridge named like kubenet's veths", nil, map[string]any{"bridge": "veth0123456789a"}, []string{"bridge", "veth0123456789a"}},
		{"pod CIDR loopback", nil, map[string]any{"podCIDRs": []string{"127.0.0.0/24"}}, []string{"podCIDRs", "127.0.0.0/24"}},
		{"pod CIDR link-local", nil, map[string]any{"podCIDRs": []string{"169.254.0.0/16"}}, []string{"podCIDRs", "169.254.0.0/16"}},
		{"pod CIDR multicast", nil, map[string]any{"podCIDRs": []string{"ff05::/64"}}, []string{"podCIDRs", "ff05::/64"}},
		{"pod CIDR IPv4-mapped", nil, map[string]any{"podCIDRs": []string{"::ffff:10.244.0.0/120"}}, []string{"podCIDRs"}},
		{"non-masquerade CIDR loopback", nil, map[string]any{"nonMasqueradeCIDRs": []string{"127.0.0.0/8"}}, []string{"nonMasqueradeCIDRs", "127.0.0.0/8"}},
		{"second network on a bridge with pods", func(t *testing.T, n *rawNode) {
			first := n.NewPod(t, "first")
			n.mustAdd(first, 31301)
		}, map[string]any{"name": "second", "podCIDRs": []string{"10.245.0.0/24"}}, []string{"bridge", "cbr0", `"kubenet"`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			n := newRawNode(t)
			if tc.prepare != nil {
				tc.prepare(t, n)
			}
			before := hpSnapshot(t, n.Node)
			pod := n.NewPod(t, "refused")
			stdin := n.conf(tc.members)
			run := n.exec("ADD", pod, stdin, nil)
			if run.ExitCode == 0 || run.Err == nil || run.Err.Code != types.ErrInvalidNetworkConfig {
				t.Fatalf("ADD: exit %d %s; want code 7", run.ExitCode, run.Stdout)
			}
			for _, name := range tc.names {
				if !strings.Contains(run.Err.Msg, name) {
					t.Errorf("message %q does not name %q", run.Err.Msg, name)
				}
			}
			if after := hpSnapshot(t, n.Node); after != before {
				t.Errorf("the refused ADD changed the node:\nbefore %s\nafter  %s", before, after)
			}
			if testkit.LinkExists(t, pod.NS, "eth0") {
				t.Error("the refused ADD made the pod's interface")
			}
			status := n.exec("STATUS", nil, stdin, nil)
			if status.ExitCode == 0 || status.Err == nil || status.Err.Code != core.ErrPluginNotAvailable {
				t.Fatalf("STATUS: exit %d %s; want code 50", status.ExitCode, status.Stdout)
			}
			for _, name := range tc.names[1:] {
				if !strings.Contains(status.Err.Msg, name) {
					t.Errorf("STATUS message %q does not name %q", status.Err.Msg, name)
				}
			}
		})
	}
}

func mustIPNet(s string) *net.IPNet {
	ip, n, err := net.ParseCIDR(s)
	if err != nil {
		panic(err)
	}
	n.IP = ip
	return n
}

// TestBridgeChangesHandsOnlyWhenFree: a second network may take over a bridge once the first
// has no pods on it (a renamed network after a drain); its gateway then replaces the old one.
func TestBridgeChangesHandsOnlyWhenFree(t *testing.T) {
	n := newRawNode(t)
	first := n.NewPod(t, "first")
	n.mustAdd(first, 31401)
	if run := n.exec("DEL", first, n.conf(nil), nil); run.ExitCode != 0 {
		t.Fatal(run.Stdout)
	}
	second := n.NewPod(t, "second")
	stdin := n.conf(map[string]any{"name": "renamed", "podCIDRs": []string{"10.245.0.0/24"}})
	if run := n.exec("ADD", second, stdin, nil); run.ExitCode != 0 {
		t.Fatalf("ADD of the renamed network on the drained bridge: %s", run.Stdout)
	}
	if got := testkit.Addrs(t, n.NS, "cbr0"); len(got) != 1 || got[0] != netip.MustParsePrefix("10.245.0.1/24") {
		t.Errorf("bridge addresses %v, want only the new gateway", got)
	}
	// And now the old network is the one refused.
	again := n.NewPod(t, "again")
	if run := n.exec("ADD", again, n.conf(nil), nil); run.ExitCode == 0 || run.Err.Code != types.ErrInvalidNetworkConfig || !strings.Contains(run.Err.Msg, `"renamed"`) {
		t.Errorf("ADD of the first network on the taken bridge: %s", run.Stdout)
	}
}

// TestUnambiguousIdentifiers: attachments whose identifiers concatenate to the same string get
// distinct state (they shared one record file before), and the DEL of one leaves the other.
func TestUnambiguousIdentifiers(t *testing.T) {
	n := newRawNode(t)
	a := n.NewPod(t, "a_b")
	a.RT.IfName = "c"
	b := n.NewPod(t, "a")
	b.RT.IfName = "b_c"
	results := map[*nettest.Pod][]byte{}
	for _, p := range []*nettest.Pod{a, b} {
		run := n.exec("ADD", p, n.conf(nil), map[string]string{"CNI_IFNAME": p.RT.IfName})
		if run.ExitCode != 0 {
			t.Fatalf("ADD %s/%s: %s", p.RT.ContainerID, p.RT.IfName, run.Stdout)
		}
		results[p] = []byte(run.Stdout)
	}
	if run := n.exec("DEL", a, n.conf(nil), map[string]string{"CNI_IFNAME": "c"}); run.ExitCode != 0 {
		t.Fatal(run.Stdout)
	}
	testkit.AssertNoResidue(t, n.Node, "kubenet", testkit.AttachmentOf(a), podIPs(t, results[a]))
	check := n.conf(map[string]any{"prevResult": json.RawMessage(results[b])})
	if run := n.exec("CHECK", b, check, map[string]string{"CNI_IFNAME": "b_c"}); run.ExitCode != 0 {
		t.Errorf("the other attachment no longer passes CHECK: %s", run.Stdout)
	}
}

// TestHostileDataDir: a data dir others may write is refused (ADD code 7 naming dataDir, STATUS
// 50), and symlinks planted inside one are never followed out of it: where kubenet's own file or
// directory belongs, the symlink is replaced.
func TestHostileDataDir(t *testing.T) {
	cases := []struct {
		name    string
		plant   func(t *testing.T, dataDir, outside string)
		refuse  bool // ADD must fail with code 7 naming dataDir
		addOK   bool
		outside bool // the file outside must be untouched
	}{
		{"world-writable data dir", func(t *testing.T, dataDir, _ string) { mkdirMode(t, dataDir, 0o777) }, true, false, true},
		{"group-writable network dir", func(t *testing.T, dataDir, _ string) { mkdirMode(t, filepath.Join(dataDir, "kubenet"), 0o775) }, true, false, true},
		{"network dir is a symlink out", func(t *testing.T, dataDir, outside string) {
			mkdirMode(t, dataDir, 0o755)
			if err := os.Symlink(filepath.Dir(outside), filepath.Join(dataDir, "kubenet")); err != nil {
				t.Fatal(err)
			}
		}, false, true, true},
		{"lock is a symlink to a file outside", func(t *testing.T, dataDir, outside string) {
			mkdirMode(t, filepath.Join(dataDir, "kubenet"), 0o755)
			if err := os.Symlink(outside, filepath.Join(dataDir, "kubenet", "lock")); err != nil {
				t.Fatal(err)
			}
		}, false, true, true},
		{"records dir is a symlink out", func(t *testing.T, dataDir, outside string) {
			mkdirMode(t, filepath.Join(dataDir, "kubenet"), 0o755)
			if err := os.Symlink(filepath.Dir(outside), filepath.Join(dataDir, "kubenet", core.RecordDirName)); err != nil {
				t.Fatal(err)
			}
		}, false, true, true},
		{"hostPort index is a symlink out", func(t *testing.T, dataDir, outside string) {
			mkdirMode(t, filepath.Join(dataDir, "kubenet"), 0o755)
			if err := os.Symlink(filepath.Dir(outside), filepath.Join(dataDir, "kubenet", hostport.IndexDirName)); err != nil {
				t.Fatal(err)
			}
		}, false, true, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			n := newRawNode(t)
			outsideDir := filepath.Join(t.TempDir(), "outside")
			mkdirMode(t, outsideDir, 0o755)
			outside := filepath.Join(outsideDir, "secret")
			if err := os.WriteFile(outside, []byte("secret"), 0o600); err != nil {
				t.Fatal(err)
			}
			tc.plant(t, n.DataDir(), outside)
			pod := n.NewPod(t, "pod")
			run := n.exec("ADD", pod, n.conf(map[string]any{"runtimeConfig": map[string]any{
				"portMappings": []map[string]any{{"hostPort": 31501, "containerPort": 80, "protocol": "udp"}}}}), nil)
			switch {
			case tc.refuse && (run.Err == nil || run.Err.Code != types.ErrInvalidNetworkConfig || !strings.Contains(run.Err.Msg, "dataDir")):
				t.Errorf("ADD: %s; want code 7 naming dataDir", run.Stdout)
			case tc.addOK && run.ExitCode != 0:
				t.Errorf("ADD: %s", run.Stdout)
			case !tc.addOK && run.ExitCode == 0:
				t.Errorf("ADD succeeded through a planted symlink")
			}
			outsideIntact := func(after string) {
				t.Helper()
				if b, err := os.ReadFile(outside); err != nil || string(b) != "secret" {
					t.Errorf("after %s the file outside the data dir was touched: %q %v", after, b, err)
				}
				if entries, _ := os.ReadDir(outsideDir); len(entries) != 1 {
					t.Errorf("after %s kubenet has written outside the data dir: %v", after, entries)
				}
			}
			outsideIntact("ADD")
			if tc.refuse {
				if st := n.exec("STATUS", nil, n.conf(nil), nil); st.Err == nil || st.Err.Code != core.ErrPluginNotAvailable {
					t.Errorf("STATUS: %s; want code 50", st.Stdout)
				}
			}
			if del := n.exec("DEL", pod, n.conf(nil), nil); tc.addOK && del.ExitCode != 0 {
				t.Errorf("DEL: %s", del.Stdout)
			}
			outsideIntact("DEL")
		})
	}
}

func mkdirMode(t *testing.T, p string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(p, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
}
