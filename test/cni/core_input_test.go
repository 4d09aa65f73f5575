package cni

import (
	"encoding/json"
	"maps"
	"net/netip"
	"strings"
	"testing"

	"github.com/kubenet-dev/kubenet/test/testkit"

	"github.com/vishvananda/netlink"

	"github.com/kubenet-dev/kubenet/hairpin"
	"github.com/kubenet-dev/kubenet/isolation"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

// TestBadInputChangesNothing feeds the binary malformed configuration and environment and checks
// the CNI error code, that the message names the fault, and that the node is untouched.
func TestBadInputChangesNothing(t *testing.T) {
	node := nettest.NewNode(t, binDir)
	pod := node.NewPod(t, "bad")
	baseConf := func() map[string]any {
		return map[string]any{
			"cniVersion": "1.0.0", "name": "kubenet", "type": "kubenet",
			"podCIDRs": []string{"10.244.1.0/24"}, "dataDir": node.DataDir(),
		}
	}
	baseEnv := map[string]string{
		"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "bad", "CNI_NETNS": pod.NS.Path(),
		"CNI_IFNAME": "eth0", "CNI_PATH": binDir,
	}
	cases := []struct {
		name     string
		conf     func(map[string]any) // mutates the config
		env      map[string]string    // overrides ("" deletes)
		raw      string               // stdin verbatim instead of conf
		wantCode uint
		wantMsg  []string
	}{
		{name: "truncated JSON", raw: `{"cniVersion":"1.0.0","name":`, wantCode: 6},
		{name: "unknown hairpin mode", conf: set("hairpinMode", "sometimes"), wantCode: 7, wantMsg: []string{"hairpinMode", "sometimes"}},
		{name: "pod CIDR with host bits", conf: set("podCIDRs", []string{"10.244.1.5/24"}), wantCode: 7, wantMsg: []string{"podCIDRs", "10.244.1.5/24", "10.244.1.0/24"}},
		{name: "pod CIDR not a CIDR", conf: set("podCIDRs", []string{"banana"}), wantCode: 7, wantMsg: []string{"podCIDRs", "banana"}},
		{name: "two IPv4 pod CIDRs", conf: set("podCIDRs", []string{"10.244.1.0/24", "10.244.2.0/24"}), wantCode: 7, wantMsg: []string{"podCIDRs", "10.244.2.0/24"}},
		{name: "no pod CIDR", conf: set("podCIDRs", []string{}), wantCode: 7, wantMsg: []string{"podCIDRs"}},
		{name: "pod CIDR too small", conf: set("podCIDRs", []string{"10.244.1.0/31"}), wantCode: 7, wantMsg: []string{"10.244.1.0/31"}},
		{name: "MTU out of range", conf: set("mtu", 70000), wantCode: 7, wantMsg: []string{"mtu", "70000"}},
		{name: "MTU not a number", conf: set("mtu", "big"), wantCode: 7, wantMsg: []string{"mtu", "string"}},
		{name: "IPv6 MTU below 1280", conf: func(c map[string]any) { c["mtu"] = 1000; c["podCIDRs"] = []string{"fd00::/64"} }, wantCode: 7, wantMsg: []string{"mtu", "1000"}},
		{name: "bridge name too long", conf: set("bridge", "a-very-long-bridge-name"), wantCode: 7, wantMsg: []string{"bridge", "a-very-long-bridge-name"}},
		{name: "bridge name with slash", conf: set("bridge", "br/0"), wantCode: 7, wantMsg: []string{"bridge", "br/0"}},
		{name: "relative data dir", conf: set("dataDir", "var/lib"), wantCode: 7, wantMsg: []string{"dataDir", "var/lib"}},
		{name: "bad non-masquerade CIDR", conf: set("nonMasqueradeCIDRs", []string{"10.0.0.0/33"}), wantCode: 7, wantMsg: []string{"nonMasqueradeCIDRs", "10.0.0.0/33"}},
		{name: "unsupported CNI version", conf: set("cniVersion", "0.9.9"), wantCode: 1, wantMsg: []string{"0.9.9"}},
		{name: "hostPort out of range", conf: runtimeConfig(`{"portMappings":[{"hostPort":70000,"containerPort":80,"protocol":"tcp"}]}`), wantCode: 7, wantMsg: []string{"hostPort", "70000"}},
		{name: "unknown protocol", conf: runtimeConfig(`{"portMappings":[{"hostPort":8080,"containerPort":80,"protocol":"icmp"}]}`), wantCode: 7, wantMsg: []string{"protocol", "icmp"}},
		{name: "hostIP not an address", conf: runtimeConfig(`{"portMappings":[{"hostPort":8080,"containerPort":80,"hostIP":"localhost"}]}`), wantCode: 7, wantMsg: []string{"hostIP", "localhost"}},
		{name: "ipRanges subnet with host bits", conf: runtimeConfig(`{"ipRanges":[[{"subnet":"10.9.0.1/24"}]]}`), wantCode: 7, wantMsg: []string{"ipRanges", "10.9.0.1/24"}},
		{name: "missing container ID", env: map[string]string{"CNI_CONTAINERID": ""}, wantCode: 4, wantMsg: []string{"CNI_CONTAINERID"}},
		{name: "container ID with path characters", env: map[string]string{"CNI_CONTAINERID": "../../etc"}, wantCode: 4, wantMsg: []string{"../../etc"}},
		{name: "interface name with slash", env: map[string]string{"CNI_IFNAME": "eth0/x"}, wantCode: 4, wantMsg: []string{"eth0/x"}},
		{name: "netns path is not a netns", env: map[string]string{"CNI_NETNS": "/proc/self/status"}, wantCode: 4, wantMsg: []string{"CNI_NETNS", "/proc/self/status"}},
		{name: "netns path does not exist", env: map[string]string{"CNI_NETNS": "/var/run/netns/no-such-pod"}, wantCode: 4, wantMsg: []string{"CNI_NETNS", "no-such-pod"}},
		{name: "unknown command", env: map[string]string{"CNI_COMMAND": "FROB"}, wantCode: 4, wantMsg: []string{"FROB"}},
		{name: "empty stdin", raw: " ", wantCode: 6},
		{name: "JSON array instead of object", raw: `[]`, wantCode: 6},
		{name: "trailing garbage", raw: `{"cniVersion":"1.0.0","name":"kubenet","podCIDRs":["10.244.1.0/24"]} x`, wantCode: 6},
		{name: "missing cniVersion means 0.1.0", conf: func(c map[string]any) { delete(c, "cniVersion") }, wantCode: 1, wantMsg: []string{"0.1.0"}},
		{name: "cniVersion not a string", conf: set("cniVersion", 1), wantCode: 6},
		{name: "network name with a space", conf: set("name", "my net"), wantCode: 7, wantMsg: []string{"my net"}},
		{name: "IPv6 pod CIDR with host bits", conf: set("podCIDRs", []string{"fd00:10:244:1::5/64"}), wantCode: 7, wantMsg: []string{"podCIDRs", "fd00:10:244:1::5/64"}},
		{name: "pod CIDRs not a list", conf: set("podCIDRs", "10.244.1.0/24"), wantCode: 7, wantMsg: []string{"podCIDRs"}},
		{name: "non-masquerade CIDRs not a list", conf: set("nonMasqueradeCIDRs", "10.0.0.0/8"), wantCode: 7, wantMsg: []string{"nonMasqueradeCIDRs"}},
		{name: "hairpin mode not a string", conf: set("hairpinMode", true), wantCode: 7, wantMsg: []string{"hairpinMode"}},
		{name: "MTU below the minimum", conf: set("mtu", 100), wantCode: 7, wantMsg: []string{"mtu", "100"}},
		{name: "MTU negative", conf: set("mtu", -1), wantCode: 7, wantMsg: []string{"mtu", "-1"}},
		{name: "bridge name dot", conf: set("bridge", "."), wantCode: 7, wantMsg: []string{"bridge"}},
		{name: "ipRanges gateway outside subnet", conf: runtimeConfig(`{"ipRanges":[[{"subnet":"10.9.0.0/24","gateway":"10.8.0.1"}]]}`), wantCode: 7, wantMsg: []string{"gateway", "10.8.0.1"}},
		{name: "ipRanges rangeStart not an address", conf: runtimeConfig(`{"ipRanges":[[{"subnet":"10.9.0.0/24","rangeStart":"start"}]]}`), wantCode: 7, wantMsg: []string{"rangeStart", "start"}},
		{name: "ipRanges two sets of one family", conf: runtimeConfig(`{"ipRanges":[[{"subnet":"10.9.0.0/24"}],[{"subnet":"10.8.0.0/24"}]]}`), wantCode: 7, wantMsg: []string{"ipRanges"}},
		{name: "runtimeConfig not an object", conf: set("runtimeConfig", "ports"), wantCode: 7, wantMsg: []string{"runtimeConfig"}},
		{name: "containerPort zero", conf: runtimeConfig(`{"portMappings":[{"hostPort":8080,"containerPort":0}]}`), wantCode: 7, wantMsg: []string{"containerPort", "0"}},
		{name: "hostPort negative", conf: runtimeConfig(`{"portMappings":[{"hostPort":-80,"containerPort":80}]}`), wantCode: 7, wantMsg: []string{"hostPort", "-80"}},
		{name: "hostIP with a zone", conf: runtimeConfig(`{"portMappings":[{"hostPort":8080,"containerPort":80,"hostIP":"fe80::1%eth0"}]}`), wantCode: 7, wantMsg: []string{"hostIP", "fe80::1%eth0"}},
		{name: "bandwidth annotation not a quantity", conf: runtimeConfig(`{"io.kubernetes.cri.pod-annotations":{"kubernetes.io/ingress-bandwidth":"10Q"}}`), wantCode: 7, wantMsg: []string{"kubernetes.io/ingress-bandwidth", "10Q"}},
		{name: "bandwidth annotation above 1P", conf: runtimeConfig(`{"io.kubernetes.cri.pod-annotations":{"kubernetes.io/egress-bandwidth":"2E"}}`), wantCode: 7, wantMsg: []string{"kubernetes.io/egress-bandwidth", "2E"}},
		{name: "bandwidth rate negative", conf: runtimeConfig(`{"bandwidth":{"ingressRate":-5}}`), wantCode: 7, wantMsg: []string{"ingressRate"}},
		{name: "bandwidth rate below 1k", conf: runtimeConfig(`{"bandwidth":{"egressRate":10}}`), wantCode: 7, wantMsg: []string{"10"}},
		{name: "prevResult malformed", conf: set("prevResult", map[string]any{"cniVersion": "1.0.0", "ips": "x"}), wantCode: 6, wantMsg: []string{"prevResult"}},
		{name: "CNI_ARGS unknown key without IgnoreUnknown", env: map[string]string{"CNI_ARGS": "FOO=bar"}, wantCode: 4, wantMsg: []string{"CNI_ARGS", "FOO=bar"}},
		{name: "CNI_ARGS malformed", env: map[string]string{"CNI_ARGS": "IgnoreUnknown=1;novalue"}, wantCode: 4, wantMsg: []string{"CNI_ARGS", "novalue"}},
		{name: "interface name too long", env: map[string]string{"CNI_IFNAME": "eth0123456789012"}, wantCode: 4, wantMsg: []string{"CNI_IFNAME", "eth0123456789012"}},
		{name: "container ID with a space", env: map[string]string{"CNI_CONTAINERID": "a b"}, wantCode: 4, wantMsg: []string{"CNI_CONTAINERID", "a b"}},
		{name: "empty netns on ADD", env: map[string]string{"CNI_NETNS": ""}, wantCode: 4, wantMsg: []string{"CNI_NETNS"}},
		{name: "missing CNI_PATH", env: map[string]string{"CNI_PATH": ""}, wantCode: 4, wantMsg: []string{"CNI_PATH"}},
	}
	if len(cases) < 40 {
		t.Fatalf("the catalogue has %d cases; keep at least 40", len(cases))
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			stdin := []byte(tc.raw)
			if tc.raw == "" {
				conf := baseConf()
				if tc.conf != nil {
					tc.conf(conf)
				}
				stdin, _ = json.Marshal(conf)
			}
			env := maps.Clone(baseEnv)
			for k, v := range tc.env {
				if v == "" {
					delete(env, k)
				} else {
					env[k] = v
				}
			}
			run, err := node.ExecPlugin(binDir, env, stdin)
			if err != nil {
				t.Fatal(err)
			}
			if run.ExitCode == 0 || run.Err == nil {
				t.Fatalf("plugin accepted bad input (exit %d): stdout %q", run.ExitCode, run.Stdout)
			}
			if run.Err.Code != tc.wantCode {
				t.Errorf("code %d, want %d: %s %s", run.Err.Code, tc.wantCode, run.Err.Msg, run.Err.Details)
			}
			msg := run.Err.Msg + " " + run.Err.Details
			for _, w := range tc.wantMsg {
				if !strings.Contains(msg, w) {
					t.Errorf("message %q does not name %q", msg, w)
				}
			}
			assertNodeUntouched(t, node)
		})
	}
}

func set(key string, value any) func(map[string]any) {
	return func(c map[string]any) { c[key] = value }
}

func runtimeConfig(raw string) func(map[string]any) {
	return func(c map[string]any) {
		var rc map[string]any
		if err := json.Unmarshal([]byte(raw), &rc); err != nil {
			panic(err)
		}
		c["runtimeConfig"] = rc
	}
}

// assertNodeUntouched checks that no bridge, veth, nftables table or state file exists.
func assertNodeUntouched(t *testing.T, node *nettest.Node) {
	t.Helper()
	if testkit.LinkExists(t, node.NS, "cbr0") {
		t.Error("bad input created the bridge")
	}
	nettest.Do(t, node.NS, func() error {
		links, err := netlink.LinkList()
		for _, l := range links {
			if strings.HasPrefix(l.Attrs().Name, "veth") {
				t.Errorf("bad input left link %s", l.Attrs().Name)
			}
		}
		return err
	})
	if tables := nettest.Run(t, node.NS, "nft", "list", "tables"); strings.TrimSpace(tables) != "" {
		t.Errorf("bad input created nftables tables: %s", tables)
	}
	if files := testkit.DataDirFiles(t, node); len(files) > 0 {
		t.Errorf("bad input wrote state: %v", files)
	}
}

// TestMTU: without an mtu key the pod MTU follows the link of the node's default route (not the
// smallest link, as old kubenet did); an explicit mtu wins. Bridge and both veth ends agree.
func TestMTU(t *testing.T) {
	for _, tc := range []struct {
		name string
		mtu  int
		want int
	}{{"auto follows default route link", 0, 1400}, {"explicit", 1300, 1300}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			node := nettest.NewNode(t, binDir)
			nettest.Do(t, node.NS, func() error {
				for name, mtu := range map[string]int{"eth0": 1400, "eth1": 1280} {
					l, err := netlink.LinkByName(name)
					if err != nil {
						return err
					}
					if err := netlink.LinkSetMTU(l, mtu); err != nil {
						return err
					}
				}
				return nil
			})
			list := node.ConfList(t, nettest.NetConf{PodCIDRs: testkit.DualStack(), MTU: tc.mtu})
			pod := node.NewPod(t, "mtu")
			node.MustAdd(t, list, pod)
			host := testkit.KubenetNames(pod).HostVeth
			for _, l := range []struct {
				where string
				got   int
			}{
				{"bridge", testkit.Link(t, node.NS, "cbr0").Attrs().MTU},
				{"host veth", testkit.Link(t, node.NS, host).Attrs().MTU},
				{"pod eth0", testkit.Link(t, pod.NS, "eth0").Attrs().MTU},
				{"result", pod.Result.Interfaces[2].Mtu},
			} {
				if l.got != tc.want {
					t.Errorf("%s MTU %d, want %d", l.where, l.got, tc.want)
				}
			}
		})
	}
}

// TestPodCIDRChange: after the node's pod CIDR changes (pods drained, config rewritten), the
// bridge carries only the new gateway, so the old address cannot break new pods.
func TestPodCIDRChange(t *testing.T) {
	node := nettest.NewNode(t, binDir)
	old := node.ConfList(t, nettest.NetConf{PodCIDRs: testkit.DualStack()})
	first := node.NewPod(t, "before")
	if err := node.Add(old, first); err != nil {
		t.Fatal(err)
	}
	if err := node.Del(old, first); err != nil {
		t.Fatal(err)
	}
	newCIDR := netip.MustParsePrefix("10.244.7.0/24")
	changed := node.ConfList(t, nettest.NetConf{PodCIDRs: []netip.Prefix{newCIDR}})
	a, b := node.NewPod(t, "after-a"), node.NewPod(t, "after-b")
	node.MustAdd(t, changed, a)
	node.MustAdd(t, changed, b)
	want := []netip.Prefix{netip.PrefixFrom(testkit.GatewayOf(newCIDR), 24)}
	if got := testkit.Addrs(t, node.NS, "cbr0"); !testkit.SamePrefixes(got, want) {
		t.Errorf("cbr0 addresses %v after CIDR change, want only %v", got, want)
	}
	testkit.ExpectReachable(t, a.NS, nettest.StartTCPEcho(t, b.NS, netip.AddrPortFrom(b.IPs()[0], 8080)), a.IPs()[0])
	testkit.ExpectReachable(t, a.NS, nettest.StartTCPEcho(t, node.NS, netip.AddrPortFrom(testkit.GatewayOf(newCIDR), 8081)), a.IPs()[0])
}

// TestHairpinModeChange: switching from promiscuous-bridge to hairpin-veth removes promiscuous
// mode and the dedup rules; an existing bridge keeps its ifindex throughout.
func TestHairpinModeChange(t *testing.T) {
	node := nettest.NewNode(t, binDir)
	promisc := node.ConfList(t, nettest.NetConf{PodCIDRs: testkit.DualStack(), HairpinMode: "promiscuous-bridge"})
	node.MustAdd(t, promisc, node.NewPod(t, "p1"))
	index := testkit.Link(t, node.NS, "cbr0").Attrs().Index
	veth := node.ConfList(t, nettest.NetConf{PodCIDRs: testkit.DualStack(), HairpinMode: "hairpin-veth"})
	node.MustAdd(t, veth, node.NewPod(t, "p2"))
	br := testkit.Link(t, node.NS, "cbr0")
	if br.Attrs().Index != index {
		t.Errorf("cbr0 ifindex changed from %d to %d", index, br.Attrs().Index)
	}
	if br.Attrs().Promisc != 0 {
		t.Error("cbr0 still promiscuous after switching to hairpin-veth")
	}
	if out, err := nettest.Output(node.NS, "nft", "list", "chain", "bridge", "kubenet-kubenet", hairpin.DedupChain); err == nil {
		t.Errorf("dedup chain still present after switching to hairpin-veth:\n%s", out)
	}
	// The bridge table stays: it holds the isolation chains, which every mode has.
	if out := nettest.Run(t, node.NS, "nft", "list", "chain", "bridge", "kubenet-kubenet", isolation.ChainGuard); !strings.Contains(out, "drop") {
		t.Errorf("isolation chain lost when the dedup chain went:\n%s", out)
	}
}
