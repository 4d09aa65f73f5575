package cni

import (
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/kubenet-dev/kubenet/core"
	"github.com/kubenet-dev/kubenet/hairpin"
	"github.com/kubenet-dev/kubenet/hostport"
	"github.com/kubenet-dev/kubenet/internal/ipt"
	"github.com/kubenet-dev/kubenet/isolation"
	"github.com/kubenet-dev/kubenet/masq"
	"github.com/kubenet-dev/kubenet/test/nettest"
	"github.com/kubenet-dev/kubenet/test/testkit"
)

// backends are the netfilter backends every test of this file runs against.
var backends = []string{"nftables", "iptables"}

// backendNode is a dual-stack node on one backend with a pod that has host ports (TCP and UDP on
// every local address, TCP on the uplink's IPv4 address only) and a client pod, which also plays
// the attacker aimed at the node's 127.0.0.1.
type backendNode struct {
	backend string
	node    *nettest.Node
	list    *libcni.NetworkConfigList
	srv     *nettest.Pod
	cli     *nettest.Pod
	attack  func(time.Duration) error
}

func newBackendNode(t *testing.T, backend string) *backendNode {
	t.Helper()
	node, _, _ := hpNode(t)
	b := &backendNode{backend: backend, node: node}
	b.list = b.conf(t, backend)
	b.srv, b.cli = node.NewPod(t, "be-srv"), node.NewPod(t, "be-cli")
	b.srv.RT.CapabilityArgs = hpArgs(true, hpMapping{30280, 8080, "tcp", ""}, hpMapping{30281, 8081, "udp", ""},
		hpMapping{30282, 8080, "tcp", nettest.NodeUplink4.Addr().String()})
	node.MustAdd(t, b.list, b.srv)
	node.MustAdd(t, b.list, b.cli)
	nettest.StartTCPEcho(t, b.srv.NS, netip.AddrPortFrom(netip.IPv6Unspecified(), 8080))
	nettest.StartUDPEcho(t, b.srv.NS, netip.AddrPortFrom(netip.IPv6Unspecified(), 8081))
	nettest.AddRoute(t, node.External, nettest.PodCIDR4, nettest.NodeUplink4.Addr())
	b.attack = testkit.LocalnetAttack(t, node, b.cli, 9999)
	return b
}

func (b *backendNode) conf(t *testing.T, backend string) *libcni.NetworkConfigList {
	return b.node.ConfList(t, nettest.NetConf{
		PodCIDRs:           testkit.DualStack(),
		NonMasqueradeCIDRs: []netip.Prefix{nettest.NonMasquerade4, nettest.NonMasquerade6},
		NetfilterBackend:   backend,
	})
}

// traffic checks the contract with traffic: SNAT to the outside and none between pods; every
// host port from another host (client kept), from the node's 127.0.0.1 and from the pod itself
// (both masqueraded to the gateway) and from another pod (client kept); no way to 127.0.0.1.
func (b *backendNode) traffic(t *testing.T, when string) {
	t.Helper()
	gw4, gw6 := testkit.GatewayOf(nettest.PodCIDR4), testkit.GatewayOf(nettest.PodCIDR6)
	ext := map[bool]*nettest.EchoServer{
		false: nettest.StartTCPEcho(t, b.node.External, netip.AddrPortFrom(nettest.External4.Addr(), 0)),
		true:  nettest.StartTCPEcho(t, b.node.External, netip.AddrPortFrom(nettest.External6.Addr(), 0)),
	}
	cases := []struct {
		what  string
		proto string
		from  ns.NetNS
		dst   netip.AddrPort
		want  netip.Addr
	}{
		{"pod to the outside, IPv4 (SNAT)", "tcp", b.cli.NS, ext[false].Addr, nettest.NodeUplink4.Addr()},
		{"pod to the outside, IPv6 (SNAT)", "tcp", b.cli.NS, ext[true].Addr, nettest.NodeUplink6.Addr()},
		{"pod to pod, IPv4 (no SNAT)", "tcp", b.cli.NS, netip.AddrPortFrom(b.srv.IP(gw4), 8080), b.cli.IP(gw4)},
		{"pod to pod, IPv6 (no SNAT)", "tcp", b.cli.NS, netip.AddrPortFrom(b.srv.IP(gw6), 8080), b.cli.IP(gw6)},
		{"host port from another host, IPv4", "tcp", b.node.External, netip.AddrPortFrom(nettest.NodeUplink4.Addr(), 30280), nettest.External4.Addr()},
		{"host port from another host, IPv6", "tcp", b.node.External, netip.AddrPortFrom(nettest.NodeUplink6.Addr(), 30280), nettest.External6.Addr()},
		{"UDP host port from another host, IPv4", "udp", b.node.External, netip.AddrPortFrom(nettest.NodeUplink4.Addr(), 30281), nettest.External4.Addr()},
		{"UDP host port from another host, IPv6", "udp", b.node.External, netip.AddrPortFrom(nettest.NodeUplink6.Addr(), 30281), nettest.External6.Addr()},
		{"host port on a hostIP", "tcp", b.node.External, netip.AddrPortFrom(nettest.NodeUplink4.Addr(), 30282), nettest.External4.Addr()},
		{"host port from the node's 127.0.0.1", "tcp", b.node.NS, netip.MustParseAddrPort("127.0.0.1:30280"), gw4},
		{"a pod to its own host port, IPv4", "tcp", b.srv.NS, netip.AddrPortFrom(nettest.NodeUplink4.Addr(), 30280), gw4},
		{"a pod to its own host port, IPv6", "tcp", b.srv.NS, netip.AddrPortFrom(nettest.NodeUplink6.Addr(), 30280), gw6},
		{"another pod to a host port, IPv4 (client kept)", "tcp", b.cli.NS, netip.AddrPortFrom(nettest.NodeUplink4.Addr(), 30280), b.cli.IP(gw4)},
		{"another pod to a host port, IPv6 (client kept)", "tcp", b.cli.NS, netip.AddrPortFrom(nettest.NodeUplink6.Addr(), 30280), b.cli.IP(gw6)},
	}
	for _, c := range cases {
		err := nettest.Eventually(testkit.TrafficTimeout, func() error {
			r, err := hpRequest(c.proto, c.from, c.dst, "contract", time.Second)
			return nettest.ExpectFrom(r, err, c.want)
		})
		if err != nil {
			t.Errorf("%s, %s: %s to %s: %v", b.backend, when, c.what, c.dst, err)
		}
	}
	testkit.ExpectAttackFails(t, b.attack, b.backend+", "+when)
}

// flush does what a firewall reload does to the backend: every rule and chain of every table
// gone. It checks the damage: the attack works and STATUS names missing rules.
func (b *backendNode) flush(t *testing.T) {
	t.Helper()
	if b.backend == "nftables" {
		nettest.Run(t, b.node.NS, "nft", "flush", "ruleset")
	} else {
		for _, cmd := range []string{"iptables", "ip6tables"} {
			for _, table := range []string{"nat", "mangle", "filter"} {
				nettest.Run(t, b.node.NS, cmd, "-t", table, "-F")
				nettest.Run(t, b.node.NS, cmd, "-t", table, "-X")
			}
		}
		for _, table := range []string{"nat", "filter"} {
			nettest.Run(t, b.node.NS, "ebtables", "-t", table, "-F")
			nettest.Run(t, b.node.NS, "ebtables", "-t", table, "-X")
		}
	}
	testkit.ExpectAttackWorks(t, b.attack, b.backend+", after the flush")
	code, msg := testkit.StatusCode(t, b.node, b.list)
	if code != core.ErrPluginNotAvailable || !strings.Contains(msg, "missing") || !strings.Contains(msg, b.backend) {
		t.Errorf("%s: STATUS after the flush = %d %q, want 50 naming the backend and the missing rules", b.backend, code, msg)
	}
	if err := b.node.Check(b.list, b.srv); err == nil {
		t.Errorf("%s: CHECK passed after the flush", b.backend)
	}
}

// onlyBackend checks that the node's rules are in the backend and nothing of the network is in
// the other one.
func (b *backendNode) onlyBackend(t *testing.T, backend string) {
	t.Helper()
	tables := nettest.Run(t, b.node.NS, "nft", "list", "tables")
	hasNFT := strings.Contains(tables, "kubenet-kubenet")
	var ipt []string
	for _, tool := range []string{"iptables-save", "ip6tables-save", "ebtables-save"} {
		if strings.Contains(nettest.Run(t, b.node.NS, tool), "KUBENET-") {
			ipt = append(ipt, tool)
		}
	}
	switch backend {
	case "nftables":
		if !hasNFT || len(ipt) > 0 {
			t.Errorf("nftables node: kubenet's nftables tables present %v, iptables rules in %v:\n%s", hasNFT, ipt, tables)
		}
	case "iptables":
		if hasNFT || len(ipt) != 3 {
			t.Errorf("iptables node: kubenet's nftables tables present %v, rules in %v (want all three tools):\n%s", hasNFT, ipt, tables)
		}
	}
	st, err := nettest.Output(b.node.NS, "cat", b.node.DataDir()+"/kubenet/"+core.NetfilterFile)
	if err != nil || !strings.Contains(st, `"backend":"`+backend+`"`) {
		t.Errorf("backend record %q (%v), want %s", st, err, backend)
	}
}

// TestBackendContract runs the behaviour every backend owes on one node: traffic; CHECK and
// STATUS; a firewall reload that takes every rule (STATUS reports it, the next ADD puts back the
// node-wide rules and the running pods' host ports and isolation); a node-wide rule changed in
// place (CHECK names it, the next ADD rewrites it); GC; and DEL without residue in either backend.
func TestBackendContract(t *testing.T) {
	for _, backend := range backends {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			b := newBackendNode(t, backend)
			b.onlyBackend(t, backend)
			b.traffic(t, "after ADD")
			for _, p := range []*nettest.Pod{b.srv, b.cli} {
				if err := b.node.Check(b.list, p); err != nil {
					t.Errorf("CHECK %s: %v", p.RT.ContainerID, err)
				}
			}
			if code, msg := testkit.StatusCode(t, b.node, b.list); code != 0 {
				t.Errorf("STATUS = %d %s", code, msg)
			}

			b.flush(t)
			b.node.MustAdd(t, b.list, b.node.NewPod(t, "be-next"))
			b.traffic(t, "after the flush and the next ADD")
			for _, p := range []*nettest.Pod{b.srv, b.cli} {
				if err := b.node.Check(b.list, p); err != nil {
					t.Errorf("CHECK %s after the repair: %v", p.RT.ContainerID, err)
				}
			}
			if code, msg := testkit.StatusCode(t, b.node, b.list); code != 0 {
				t.Errorf("STATUS after the repair = %d %s", code, msg)
			}

			// Two layers stop a pod that aims at the node's 127.0.0.1: the bridge's guard and the
			// localnet guard. Each must hold alone.
			b.emptyGuard(t, "bridge")
			testkit.ExpectAttackFails(t, b.attack, backend+", with only the localnet guard")
			b.emptyGuard(t, "localnet")
			testkit.ExpectAttackWorks(t, b.attack, backend+", with both guards emptied")
			b.node.MustAdd(t, b.list, b.node.NewPod(t, "be-guards"))
			testkit.ExpectAttackFails(t, b.attack, backend+", after the next ADD")
			b.emptyGuard(t, "localnet")
			testkit.ExpectAttackFails(t, b.attack, backend+", with only the bridge's guard")
			b.node.MustAdd(t, b.list, b.node.NewPod(t, "be-guards-2"))

			// The SNAT to the outside becomes an accept, its comment kept.
			editSNAT(t, b)
			err := b.node.Check(b.list, b.cli)
			if err == nil || !strings.Contains(err.Error(), "changed in place") {
				t.Errorf("CHECK after the SNAT rule was changed in place = %v", err)
			}
			if code, msg := testkit.StatusCode(t, b.node, b.list); code != 0 {
				t.Errorf("STATUS with a changed rule = %d %s: a changed rule is not a missing one", code, msg)
			}
			b.node.MustAdd(t, b.list, b.node.NewPod(t, "be-after-edit"))
			if err := b.node.Check(b.list, b.cli); err != nil {
				t.Errorf("CHECK after the next ADD: %v", err)
			}
			b.traffic(t, "after the edit was repaired")

			// GC keeps only the host-port pod.
			if err := b.node.GC(b.list, []types.GCAttachment{{ContainerID: b.srv.RT.ContainerID, IfName: b.srv.RT.IfName}}); err != nil {
				t.Fatalf("GC: %v", err)
			}
			testkit.AssertNoResidue(t, b.node, "kubenet", testkit.AttachmentOf(b.cli), b.cli.IPs())
			if err := b.node.Check(b.list, b.srv); err != nil {
				t.Errorf("CHECK of the kept pod after GC: %v", err)
			}
			if err := b.node.Del(b.list, b.srv); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			testkit.AssertNoResidue(t, b.node, "kubenet", testkit.AttachmentOf(b.srv), b.srv.IPs())
			b.onlyBackend(t, backend)
		})
	}
}

// emptyGuard empties one of the two guards against pods aiming at the node's 127.0.0.1: the
// bridge's (isolation: loopback addresses from pods) or the localnet guard (host ports: packets
// of 127.0.0.0/8 not from lo), with the backend's own tool.
func (b *backendNode) emptyGuard(t *testing.T, which string) {
	t.Helper()
	switch {
	case which == "bridge" && b.backend == "nftables":
		nettest.Run(t, b.node.NS, "nft", "flush", "chain", "bridge", testkit.HostPortTable, isolation.ChainGuardIPv4)
	case which == "bridge":
		nettest.Run(t, b.node.NS, "ebtables", "-t", "nat", "-F", "KUBENET-GUARD-"+ipt.ChainSuffix("kubenet"))
	case b.backend == "nftables":
		testkit.FlushLocalnetGuard(t, b.node)
	default:
		nettest.Run(t, b.node.NS, "iptables", "-t", "mangle", "-F", "KUBENET-LOCALNET-"+ipt.ChainSuffix("kubenet"))
	}
}

// editSNAT changes the IPv4 SNAT rule to the outside into an accept (nftables) or a return
// (iptables), keeping its comment, the way a person with the backend's tool would.
func editSNAT(t *testing.T, b *backendNode) {
	t.Helper()
	marker := fmt.Sprintf("pod %s to outside: SNAT to the node", nettest.PodCIDR4)
	if b.backend == "nftables" {
		testkit.EditRule(t, b.node, "inet", testkit.HostPortTable, masq.ChainName, marker, " masquerade ", " accept ")
		return
	}
	chain := masq.IPTablesChain("kubenet")
	rules := ipt.Parse(ipt.IPv4, "nat", []byte(nettest.Run(t, b.node.NS, "iptables-save", "-t", "nat"))).Chains[chain]
	for i, r := range rules {
		if strings.Contains(r, marker) {
			edited := strings.Replace(r, "-j MASQUERADE", "-j RETURN", 1)
			nettest.Run(t, b.node.NS, "sh", "-c", fmt.Sprintf("iptables -t nat -R %s %d %s", chain, i+1, edited))
			return
		}
	}
	t.Fatalf("no rule %q in %s: %q", marker, chain, rules)
}

// TestBackendSwitch: a node whose configuration moves from one backend to the other keeps its
// running pods working and leaves nothing in the backend it left: the next ADD removes the old
// backend's rules and puts the node-wide rules, the host ports (from the index) and the
// isolation (from the records) of the running pods into the new one. Then back again.
func TestBackendSwitch(t *testing.T) {
	b := newBackendNode(t, "nftables")
	b.onlyBackend(t, "nftables")
	for i, to := range []string{"iptables", "nftables"} {
		b.backend, b.list = to, b.conf(t, to)
		b.node.MustAdd(t, b.list, b.node.NewPod(t, fmt.Sprintf("be-switch-%d", i)))
		b.onlyBackend(t, to)
		b.traffic(t, "after switching to "+to)
		for _, p := range []*nettest.Pod{b.srv, b.cli} {
			if err := b.node.Check(b.list, p); err != nil {
				t.Errorf("CHECK %s after switching to %s: %v", p.RT.ContainerID, to, err)
			}
		}
		if code, msg := testkit.StatusCode(t, b.node, b.list); code != 0 {
			t.Errorf("STATUS after switching to %s = %d %s", to, code, msg)
		}
	}
	for _, p := range []*nettest.Pod{b.srv, b.cli} {
		if err := b.node.Del(b.list, p); err != nil {
			t.Fatalf("DEL %s: %v", p.RT.ContainerID, err)
		}
		testkit.AssertNoResidue(t, b.node, "kubenet", testkit.AttachmentOf(p), p.IPs())
	}
}

// TestBackendFoundWithoutRecord: with the backend record gone (a damaged or wiped data dir) the
// next ADD finds the network's rules where they are, in nftables or in iptables (where it looks
// only when the kernel has a nat table), and removes them before setting up the configured
// backend: no rules of the network stay in the other one.
func TestBackendFoundWithoutRecord(t *testing.T) {
	for i, from := range backends {
		to := backends[(i+1)%len(backends)]
		t.Run(from+" to "+to, func(t *testing.T) {
			b := newBackendNode(t, from)
			b.onlyBackend(t, from)
			nettest.Run(t, b.node.NS, "rm", b.node.DataDir()+"/kubenet/"+core.NetfilterFile)
			b.backend, b.list = to, b.conf(t, to)
			b.node.MustAdd(t, b.list, b.node.NewPod(t, "be-norecord"))
			b.onlyBackend(t, to)
			b.traffic(t, "after the ADD without a record")
		})
	}
}

// TestBackendChoice: auto settles on nftables on this kernel and records why; a bad value, and
// NetworkPolicy on the iptables backend, are refused with code 7 naming the key, before anything
// changes, and STATUS says why (50).
func TestBackendChoice(t *testing.T) {
	node := nettest.NewNode(t, binDir)
	auto := node.ConfList(t, nettest.NetConf{PodCIDRs: testkit.DualStack()})
	node.MustAdd(t, auto, node.NewPod(t, "choice-auto"))
	var choice core.BackendChoice
	nettest.Do(t, node.NS, func() (err error) { choice, err = core.NetfilterStatus(testkit.PluginConfig(t, auto)); return err })
	if choice.Backend != core.NetfilterNFTables || !strings.HasPrefix(choice.Reason, "auto: ") {
		t.Errorf("auto chose %+v, want nftables with the probe's reason", choice)
	}
	for _, c := range []struct {
		name  string
		extra map[string]any
		key   string
	}{
		{"unknown backend", map[string]any{"netfilterBackend": "ebpf"}, "netfilterBackend"},
		{"NetworkPolicy on iptables", map[string]any{"netfilterBackend": "iptables", "networkPolicy": true}, "networkPolicy"},
	} {
		t.Run(c.name, func(t *testing.T) {
			fresh := nettest.NewNode(t, binDir)
			list := fresh.ConfList(t, nettest.NetConf{PodCIDRs: testkit.DualStack(), Extra: c.extra})
			err := fresh.Add(list, fresh.NewPod(t, "choice-bad"))
			if code := testkit.CNICode(err); code != types.ErrInvalidNetworkConfig || !strings.Contains(err.Error(), c.key) {
				t.Errorf("ADD = %v, want code 7 naming %s", err, c.key)
			}
			if code, msg := testkit.StatusCode(t, fresh, list); code == 0 || !strings.Contains(msg, c.key) {
				t.Errorf("STATUS = %d %q, want an error naming %s", code, msg, c.key)
			}
			if files := testkit.DataDirFiles(t, fresh); len(stateFiles(t, fresh)) > 0 {
				t.Errorf("the refused ADD left %v", files)
			}
			if out := nettest.Run(t, fresh.NS, "iptables-save"); strings.Contains(out, "KUBENET-") {
				t.Errorf("the refused ADD left iptables rules:\n%s", out)
			}
		})
	}

	// A node on iptables whose configuration moves to nftables with NetworkPolicy: the next ADD
	// switches and succeeds, so STATUS must answer ready (the record still names iptables until
	// then; a NotReady node would never get that ADD).
	t.Run("NetworkPolicy on a node moving to nftables", func(t *testing.T) {
		moving := nettest.NewNode(t, binDir)
		ipt := moving.ConfList(t, nettest.NetConf{PodCIDRs: testkit.DualStack(), NetfilterBackend: "iptables"})
		moving.MustAdd(t, ipt, moving.NewPod(t, "choice-ipt"))
		withPolicy := moving.ConfList(t, nettest.NetConf{PodCIDRs: testkit.DualStack(), NetfilterBackend: "nftables", Extra: map[string]any{"networkPolicy": true}})
		if code, msg := testkit.StatusCode(t, moving, withPolicy); code != 0 {
			t.Errorf("STATUS before the switching ADD = %d %q, want ready", code, msg)
		}
		moving.MustAdd(t, withPolicy, moving.NewPod(t, "choice-nft"))
		if code, msg := testkit.StatusCode(t, moving, withPolicy); code != 0 {
			t.Errorf("STATUS after the switching ADD = %d %q, want ready", code, msg)
		}
	})
}

// TestStatusSeesEachFixedChainEmptied: on the iptables backend STATUS lists kubenet's fixed
// chains by name, several at once; each one emptied alone (what a partial reload or a hand-run
// -F leaves) must make it answer 50 naming that chain, and the next ADD must put it back.
func TestStatusSeesEachFixedChainEmptied(t *testing.T) {
	node, _, _ := hpNode(t)
	list := node.ConfList(t, nettest.NetConf{
		PodCIDRs:           testkit.DualStack(),
		NonMasqueradeCIDRs: []netip.Prefix{nettest.NonMasquerade4, nettest.NonMasquerade6},
		HairpinMode:        "promiscuous-bridge", // the ebtables dedup chain is fixed too
		NetfilterBackend:   "iptables",
	})
	srv := node.NewPod(t, "st-srv")
	srv.RT.CapabilityArgs = hpArgs(true, hpMapping{30290, 8080, "tcp", ""})
	node.MustAdd(t, list, srv)
	nat := hostport.IPTablesChains("kubenet")["nat"]
	cases := []struct{ tool, table, chain string }{
		{"iptables", "nat", masq.IPTablesChain("kubenet")},
		{"ip6tables", "nat", masq.IPTablesChain("kubenet")},
		{"iptables", "nat", nat[0]}, // the host-port entry (jump to the pods' mappings)
		{"ip6tables", "nat", nat[0]},
		{"iptables", "nat", nat[2]}, // the host-port SNAT
		{"ip6tables", "nat", nat[2]},
		{"iptables", "mangle", hostport.IPTablesChains("kubenet")["mangle"][0]}, // the localnet guard
		{"ebtables", "filter", hairpin.EbtablesDedupChain("kubenet")},
	}
	if code, msg := testkit.StatusCode(t, node, list); code != 0 {
		t.Fatalf("STATUS before = %d %s", code, msg)
	}
	for i, c := range cases {
		nettest.Run(t, node.NS, c.tool, "-t", c.table, "-F", c.chain)
		code, msg := testkit.StatusCode(t, node, list)
		if code != core.ErrPluginNotAvailable || !strings.Contains(msg, c.chain) {
			t.Errorf("STATUS with %s -t %s %s emptied = %d %q, want 50 naming the chain", c.tool, c.table, c.chain, code, msg)
		}
		node.MustAdd(t, list, node.NewPod(t, fmt.Sprintf("st-next-%d", i)))
		if code, msg := testkit.StatusCode(t, node, list); code != 0 {
			t.Errorf("STATUS after %s was emptied and the next ADD = %d %s", c.chain, code, msg)
		}
	}
}

// TestRefusedBackendLeavesNodeFiles: a configuration refused because its backend cannot serve it
// (NetworkPolicy on iptables) changes nothing on a node that is set up: not the recorded
// node-wide settings (who owns them, what they are), not the backend record, and the node's
// pods keep being added with the configuration that set it up, as before.
func TestRefusedBackendLeavesNodeFiles(t *testing.T) {
	node := nettest.NewNode(t, binDir)
	good := node.ConfList(t, nettest.NetConf{PodCIDRs: testkit.DualStack()})
	node.MustAdd(t, good, node.NewPod(t, "refused-first"))
	nodeFiles := func() map[string]string {
		out := map[string]string{}
		for _, name := range []string{core.NodeSettingsFile, core.NetfilterFile} {
			b, err := os.ReadFile(filepath.Join(node.DataDir(), "kubenet", name))
			if err != nil {
				t.Fatal(err)
			}
			out[name] = string(b)
		}
		return out
	}
	before := nodeFiles()
	refused := node.ConfList(t, nettest.NetConf{PodCIDRs: testkit.DualStack(), Extra: map[string]any{"netfilterBackend": "iptables", "networkPolicy": true}})
	err := node.Add(refused, node.NewPod(t, "refused-bad"))
	if code := testkit.CNICode(err); code != types.ErrInvalidNetworkConfig || !strings.Contains(err.Error(), "networkPolicy") {
		t.Fatalf("ADD = %v, want code 7 naming networkPolicy", err)
	}
	if after := nodeFiles(); !maps.Equal(before, after) {
		t.Errorf("the refused ADD rewrote the node's files:\nbefore %v\nafter  %v", before, after)
	}
}
