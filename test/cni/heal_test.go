package cni

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/kubenet-dev/kubenet/core"
	"github.com/kubenet-dev/kubenet/hairpin"
	"github.com/kubenet-dev/kubenet/hostport"
	"github.com/kubenet-dev/kubenet/internal/statedir"
	"github.com/kubenet-dev/kubenet/isolation"
	"github.com/kubenet-dev/kubenet/masq"
	"github.com/kubenet-dev/kubenet/test/nettest"
	"github.com/kubenet-dev/kubenet/test/testkit"
)

// healNode is a dual-stack node with an honest pod that has host ports (TCP on both families,
// UDP, one on a hostIP) with servers behind them, and an attacker pod aimed at the node's
// 127.0.0.1. reachable checks every host port from another host and from the node's
// 127.0.0.1.
type healNode struct {
	node      *nettest.Node
	list      *libcni.NetworkConfigList
	holder    *nettest.Pod
	attack    func(time.Duration) error
	reachable func(t *testing.T, when string)
}

func newHealNode(t *testing.T) *healNode {
	t.Helper()
	node, list, _ := hpNode(t)
	h := &healNode{node: node, list: list, holder: node.NewPod(t, "heal-holder")}
	h.holder.RT.CapabilityArgs = hpArgs(true,
		hpMapping{30180, 8080, "tcp", ""}, hpMapping{30181, 8081, "udp", ""}, hpMapping{30182, 8080, "tcp", nettest.NodeUplink4.Addr().String()})
	node.MustAdd(t, list, h.holder)
	nettest.StartTCPEcho(t, h.holder.NS, netip.AddrPortFrom(netip.IPv6Unspecified(), 8080))
	nettest.StartUDPEcho(t, h.holder.NS, netip.AddrPortFrom(netip.IPv6Unspecified(), 8081))
	// The external host routes the pod CIDR back through the node, so that a pod's packet that
	// leaves unmasqueraded gets its answer (TestRuleChangedInPlace sees its source).
	nettest.AddRoute(t, node.External, nettest.PodCIDR4, nettest.NodeUplink4.Addr())
	attacker := node.NewPod(t, "heal-attacker")
	node.MustAdd(t, list, attacker)
	h.attack = testkit.LocalnetAttack(t, node, attacker, 9999)
	h.reachable = func(t *testing.T, when string) {
		t.Helper()
		for _, c := range []struct {
			proto string
			from  ns.NetNS
			dst   netip.AddrPort
			want  netip.Addr
		}{
			{"tcp", node.External, netip.AddrPortFrom(nettest.NodeUplink4.Addr(), 30180), nettest.External4.Addr()},
			{"tcp", node.External, netip.AddrPortFrom(nettest.NodeUplink6.Addr(), 30180), nettest.External6.Addr()},
			{"udp", node.External, netip.AddrPortFrom(nettest.NodeUplink4.Addr(), 30181), nettest.External4.Addr()},
			{"udp", node.External, netip.AddrPortFrom(nettest.NodeUplink6.Addr(), 30181), nettest.External6.Addr()},
			{"tcp", node.External, netip.AddrPortFrom(nettest.NodeUplink4.Addr(), 30182), nettest.External4.Addr()},
			{"tcp", node.NS, netip.MustParseAddrPort("127.0.0.1:30180"), testkit.GatewayOf(nettest.PodCIDR4)},
			// The pod reaching its own host port is masqueraded (its hairpin element).
			{"tcp", h.holder.NS, netip.AddrPortFrom(nettest.NodeUplink4.Addr(), 30180), testkit.GatewayOf(nettest.PodCIDR4)},
			{"tcp", h.holder.NS, netip.AddrPortFrom(nettest.NodeUplink6.Addr(), 30180), testkit.GatewayOf(nettest.PodCIDR6)},
		} {
			err := nettest.Eventually(testkit.TrafficTimeout, func() error {
				r, err := hpRequest(c.proto, c.from, c.dst, "heal", time.Second)
				return nettest.ExpectFrom(r, err, c.want)
			})
			if err != nil {
				t.Errorf("%s: %s to host port %s: %v", when, c.proto, c.dst, err)
			}
		}
	}
	return h
}

// expectHealthy checks the node as kubenet left it: the attack fails, every host port works,
// STATUS and the holder's CHECK pass, the map elements are the ones before.
func (h *healNode) expectHealthy(t *testing.T, when string, elements []testkit.HostPortElement) {
	t.Helper()
	testkit.ExpectAttackFails(t, h.attack, when)
	h.reachable(t, when)
	if code, msg := testkit.StatusCode(t, h.node, h.list); code != 0 {
		t.Errorf("%s: STATUS = %d %s, want ready", when, code, msg)
	}
	if err := h.node.Check(h.list, h.holder); err != nil {
		t.Errorf("%s: CHECK of the host-port pod: %v", when, err)
	}
	if got := testkit.HostPortElements(t, h.node); !slices.Equal(got, elements) {
		t.Errorf("%s: map elements\n%v\nwant\n%v", when, got, elements)
	}
}

// flush runs `nft flush ruleset` in the node, as a firewall reload does, and checks the damage:
// the attack works, STATUS reports the missing rules with code 50, CHECK fails, the host ports
// lead nowhere.
func (h *healNode) flush(t *testing.T) {
	t.Helper()
	nettest.Run(t, h.node.NS, "nft", "flush", "ruleset")
	testkit.ExpectAttackWorks(t, h.attack, "after nft flush ruleset")
	code, msg := testkit.StatusCode(t, h.node, h.list)
	if code != core.ErrPluginNotAvailable || !testkit.ContainsAll(msg, "missing", hostport.ChainLocalnetNAT, hostport.ChainLocalnetInput, masq.ChainName, "map "+hostport.MapIPv4) {
		t.Errorf("STATUS after the flush = %d %q, want 50 naming the missing chains and maps", code, msg)
	}
	if err := h.node.Check(h.list, h.holder); err == nil {
		t.Error("CHECK passed after the flush")
	}
	r, err := nettest.TCPRequest(h.node.External, netip.AddrPortFrom(nettest.NodeUplink4.Addr(), 30180), "gone", testkit.UnreachableTimeout)
	if err == nil {
		t.Errorf("a host port answered after the flush (%+v): the test would not see it restored", r)
	}
}

// TestFlushedRulesetHealedByNextAdd: after another tool flushes the whole ruleset, the
// localhost attack works and the host ports are gone, STATUS says so, and the next ADD (of any
// pod, without host ports) puts back every node-wide rule and the running pod's map elements.
func TestFlushedRulesetHealedByNextAdd(t *testing.T) {
	h := newHealNode(t)
	elements := testkit.HostPortElements(t, h.node)
	if len(elements) != 5 {
		t.Fatalf("map elements %v, want the holder's 5", elements)
	}
	h.expectHealthy(t, "before the flush", elements)

	h.flush(t)
	if got := testkit.Sysctl(t, h.node.NS, "net/ipv4/conf/cbr0/route_localnet"); got != "1" {
		t.Fatalf("route_localnet = %s after the flush, want it still on (what makes the flush dangerous)", got)
	}
	h.node.MustAdd(t, h.list, h.node.NewPod(t, "heal-next"))
	h.expectHealthy(t, "after the next ADD", elements)
}

// TestStatusReportsMissingRules: STATUS reports node-wide rules missing only once the network
// set them up (the bridge exists), counts the host-port chains only once host ports were used,
// and never reports rules that merely differ (a configuration edited since the last ADD: the
// next ADD rewrites them).
func TestStatusReportsMissingRules(t *testing.T) {
	node := nettest.NewNode(t, binDir)
	list := node.ConfList(t, nettest.NetConf{PodCIDRs: testkit.DualStack()})
	if code, msg := testkit.StatusCode(t, node, list); code != 0 {
		t.Fatalf("STATUS on a node that never had a pod = %d %s, want ready", code, msg)
	}
	node.MustAdd(t, list, node.NewPod(t, "status-plain"))
	// A node set up before the host-port chains were node-wide: they are not there, and no pod
	// ever used a host port.
	for _, chain := range []string{hostport.ChainLocalnetNAT, hostport.ChainLocalnetInput} {
		nettest.Run(t, node.NS, "nft", "delete", "chain", "inet", testkit.HostPortTable, chain)
	}
	if code, msg := testkit.StatusCode(t, node, list); code != 0 {
		t.Errorf("STATUS without host-port chains on a node that never used host ports = %d %s, want ready", code, msg)
	}
	// A configuration edited since the last ADD: the SNAT rules differ, nothing is missing.
	edited := node.ConfList(t, nettest.NetConf{PodCIDRs: testkit.DualStack(), NonMasqueradeCIDRs: []netip.Prefix{nettest.NonMasquerade4}})
	if code, msg := testkit.StatusCode(t, node, edited); code != 0 {
		t.Errorf("STATUS with an edited configuration = %d %s, want ready", code, msg)
	}
	nettest.Run(t, node.NS, "nft", "delete", "table", "inet", testkit.HostPortTable)
	code, msg := testkit.StatusCode(t, node, list)
	if code != core.ErrPluginNotAvailable || !strings.Contains(msg, masq.ChainName) || strings.Contains(msg, "hostport-localnet") {
		t.Errorf("STATUS after the table was deleted = %d %q, want 50 naming %s (and not the unused host-port chains)", code, msg, masq.ChainName)
	}
	node.MustAdd(t, list, node.NewPod(t, "status-next"))
	if code, msg := testkit.StatusCode(t, node, list); code != 0 {
		t.Errorf("STATUS after the next ADD = %d %s, want ready", code, msg)
	}
}

// TestRuleChangedInPlace: a node-wide rule changed in place with the nft tool, its comment kept,
// is found by CHECK (rules are compared by their expressions), and both the next ADD and
// EnsureNode rewrite it: the traffic it governs behaves as before.
func TestRuleChangedInPlace(t *testing.T) {
	type phase string
	const (
		edited   phase = "edited"
		restored phase = "restored"
	)
	cases := []struct {
		name                     string
		hairpin                  string
		family, table, chain     string
		marker, old, replacement string
		// traffic checks what the rule does in each phase (nil: no traffic to check).
		traffic func(t *testing.T, h *healNode, p phase)
	}{
		{
			name: "localnet guard drop becomes accept", family: "inet", table: testkit.HostPortTable, chain: hostport.ChainLocalnetInput,
			marker: "drop packets to 127.0.0.0/8", old: " drop ", replacement: " accept ",
			traffic: func(t *testing.T, h *healNode, p phase) {
				if p == restored {
					testkit.ExpectAttackFails(t, h.attack, "with the guard restored")
					return
				}
				// The bridge's guard (isolation) and the guard's NAT chain (a connection's first
				// packet) stop the attack too: only with both emptied does the edit show. They
				// are put back as they were before CHECK, which names the first difference.
				testkit.ExpectAttackFails(t, h.attack, "with the localnet guard's input chain edited and the other guards in place")
				natChain := nettest.Run(t, h.node.NS, "nft", "list", "chain", "inet", testkit.HostPortTable, hostport.ChainLocalnetNAT)
				nettest.Run(t, h.node.NS, "nft", "flush", "chain", "bridge", testkit.HostPortTable, isolation.ChainGuardIPv4)
				nettest.Run(t, h.node.NS, "nft", "flush", "chain", "inet", testkit.HostPortTable, hostport.ChainLocalnetNAT)
				testkit.ExpectAttackWorks(t, h.attack, "with the localnet guard's input chain edited and the other guards emptied")
				nettest.Do(t, h.node.NS, func() error {
					_, err := isolation.Ensure(isolation.Config{Network: "kubenet", AntiSpoofing: true})
					return err
				})
				script := filepath.Join(t.TempDir(), "nat.nft")
				if err := os.WriteFile(script, []byte(natChain), 0o600); err != nil {
					t.Fatal(err)
				}
				nettest.Run(t, h.node.NS, "nft", "-f", script)
				if got := nettest.Run(t, h.node.NS, "nft", "list", "chain", "inet", testkit.HostPortTable, hostport.ChainLocalnetNAT); got != natChain {
					t.Fatalf("the NAT chain was not put back:\n%s\nwant\n%s", got, natChain)
				}
			},
		},
		{
			name: "SNAT to outside becomes accept", family: "inet", table: testkit.HostPortTable, chain: masq.ChainName,
			marker: "to outside: SNAT", old: " masquerade ", replacement: " accept ",
			traffic: func(t *testing.T, h *healNode, p phase) {
				srv := nettest.StartTCPEcho(t, h.node.External, netip.AddrPortFrom(nettest.External4.Addr(), 0))
				want := nettest.NodeUplink4.Addr()
				if p == edited {
					want = h.holder.IP(want)
				}
				err := nettest.Eventually(testkit.TrafficTimeout, func() error {
					r, err := nettest.TCPRequest(h.holder.NS, srv.Addr, string(p), time.Second)
					return nettest.ExpectFrom(r, err, want)
				})
				if err != nil {
					t.Errorf("%s SNAT rule: the external host should see %s: %v", p, want, err)
				}
			},
		},
		{
			name: "host-port DNAT of other hosts' traffic becomes accept", family: "inet", table: testkit.HostPortTable, chain: hostport.ChainDNAT,
			marker: "hostports-ipv4 from anywhere else", old: "meta nfproto ipv4 dnat ip to meta l4proto . th dport map @hostports-ipv4 ", replacement: "meta nfproto ipv4 accept ",
			traffic: func(t *testing.T, h *healNode, p phase) {
				dst := netip.AddrPortFrom(nettest.NodeUplink4.Addr(), 30180)
				if p == edited {
					if r, err := nettest.TCPRequest(h.node.External, dst, "edited", testkit.UnreachableTimeout); err == nil {
						t.Errorf("host port %s answered (%+v) with its DNAT rule edited away", dst, r)
					}
					return
				}
				h.reachable(t, "with the DNAT rule restored")
			},
		},
		{
			name: "router advertisement drop becomes accept", family: "bridge", table: testkit.HostPortTable, chain: isolation.ChainGuardIPv6,
			marker: "router advertisement from a pod dropped", old: " drop ", replacement: " accept ",
		},
		{
			name: "duplicate-frame drop becomes accept", hairpin: string(hairpin.PromiscuousBridge), family: "bridge", table: testkit.HostPortTable, chain: hairpin.DedupChain,
			marker: "duplicate frames from pods in 10.244.1.0/24", old: " drop ", replacement: " accept ",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHealNode(t)
			if tc.hairpin != "" {
				h.list = h.node.ConfList(t, nettest.NetConf{PodCIDRs: testkit.DualStack(),
					NonMasqueradeCIDRs: []netip.Prefix{nettest.NonMasquerade4, nettest.NonMasquerade6}, HairpinMode: tc.hairpin})
				h.node.MustAdd(t, h.list, h.node.NewPod(t, "heal-promisc"))
			}
			cfg := testkit.PluginConfig(t, h.list)
			listChain := func() string { return nettest.Run(t, h.node.NS, "nft", "list", "chain", tc.family, tc.table, tc.chain) }
			want := listChain()
			for _, repair := range []struct {
				name string
				run  func() error
			}{
				{"the next ADD", func() error { return h.node.Add(h.list, h.node.NewPod(t, "heal-edit-next")) }},
				{"EnsureNode", func() error {
					return h.node.NS.Do(func(ns.NetNS) error { return core.EnsureNode(context.Background(), cfg) })
				}},
			} {
				before := testkit.EditRule(t, h.node, tc.family, tc.table, tc.chain, tc.marker, tc.old, tc.replacement)
				if got := listChain(); got == want || !strings.Contains(got, tc.marker) {
					t.Fatalf("the edit of %q did not take, or lost the comment:\n%s", before, got)
				}
				if tc.traffic != nil {
					tc.traffic(t, h, edited)
				}
				if err := h.node.Check(h.list, h.holder); err == nil || !strings.Contains(err.Error(), tc.chain) || !strings.Contains(err.Error(), "changed in place") {
					t.Errorf("CHECK after the edit = %v, want it to name %s changed in place", err, tc.chain)
				}
				if code, msg := testkit.StatusCode(t, h.node, h.list); code != 0 {
					t.Errorf("STATUS after the edit = %d %s: a changed rule is not a missing one", code, msg)
				}
				if err := repair.run(); err != nil {
					t.Fatalf("%s: %v", repair.name, err)
				}
				if got := listChain(); got != want {
					t.Errorf("after %s the chain is\n%s\nwant\n%s", repair.name, got, want)
				}
				if err := testkit.NodeRulesOK(t, h.node, cfg); err != nil {
					t.Errorf("after %s: %v", repair.name, err)
				}
				if err := h.node.Check(h.list, h.holder); err != nil {
					t.Errorf("CHECK after %s: %v", repair.name, err)
				}
				if tc.traffic != nil {
					tc.traffic(t, h, restored)
				}
			}
		})
	}
}

// TestNodeRulesStable: on every configuration the node-wide rules read back exactly as planned
// (expressions and comments), so an ADD on a healthy node rewrites nothing: no rule handle
// changes across ADDs.
func TestNodeRulesStable(t *testing.T) {
	for _, c := range []struct {
		cidrs   []netip.Prefix
		hairpin string
	}{
		{[]netip.Prefix{nettest.PodCIDR4}, ""},
		{[]netip.Prefix{nettest.PodCIDR6}, ""},
		{testkit.DualStack(), ""},
		{testkit.DualStack(), string(hairpin.PromiscuousBridge)},
	} {
		t.Run(fmt.Sprint(c.cidrs, c.hairpin), func(t *testing.T) {
			t.Parallel()
			node := nettest.NewNode(t, binDir)
			list := node.ConfList(t, nettest.NetConf{PodCIDRs: c.cidrs, NonMasqueradeCIDRs: []netip.Prefix{nettest.NonMasquerade4, nettest.NonMasquerade6}, HairpinMode: c.hairpin})
			node.MustAdd(t, list, node.NewPod(t, "stable-1"))
			if err := testkit.NodeRulesOK(t, node, testkit.PluginConfig(t, list)); err != nil {
				t.Fatal(err)
			}
			// Terse: set elements (every pod adds its isolation elements) are not node-wide rules.
			before := nettest.Run(t, node.NS, "nft", "-a", "-t", "list", "ruleset")
			node.MustAdd(t, list, node.NewPod(t, "stable-2"))
			if after := nettest.Run(t, node.NS, "nft", "-a", "-t", "list", "ruleset"); after != before {
				t.Errorf("a second ADD rewrote node-wide rules:\nbefore\n%s\nafter\n%s", before, after)
			}
		})
	}
}

// TestHealLeavesAttachmentInFlight: the node's healing puts back the isolation elements of
// running pods from their records, but not those of a pod whose DEL is in flight. DEL removes the
// elements first and the record last; a heal pass that read the record in between and put the
// elements back would leave a deleted pod's port, MAC and addresses in the sets. Here the DEL is
// held at that point: its attachment lock taken, its elements gone, its record still there.
func TestHealLeavesAttachmentInFlight(t *testing.T) {
	node := nettest.NewNode(t, binDir)
	list := node.ConfList(t, nettest.NetConf{PodCIDRs: testkit.DualStack()})
	cfg := testkit.PluginConfig(t, list)
	running, leaving := node.NewPod(t, "heal-running"), node.NewPod(t, "heal-leaving")
	node.MustAdd(t, list, running)
	node.MustAdd(t, list, leaving)
	portOf := func(p *nettest.Pod) string {
		return core.NamesFor(cfg.Network, core.Attachment{ContainerID: p.RT.ContainerID, IfName: p.RT.IfName}).HostVeth
	}
	elementsOf := func(p *nettest.Pod) int {
		n := 0
		for _, e := range testkit.IsolationElements(t, node) {
			if strings.Contains(e.Key, portOf(p)) {
				n++
			}
		}
		return n
	}
	if elementsOf(running) == 0 || elementsOf(leaving) == 0 {
		t.Fatalf("isolation elements before: %v", testkit.IsolationElements(t, node))
	}

	// The DEL of "leaving", held after it removed the elements: its lock, as DEL takes it.
	store, err := statedir.Open(cfg.DataDir, cfg.Network)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	unlock, err := store.LockAttachment(leaving.RT.ContainerID, leaving.RT.IfName)
	if err != nil {
		t.Fatal(err)
	}
	nettest.Run(t, node.NS, "nft", "flush", "ruleset")

	heal := func() core.NodeRepair {
		var rep core.NodeRepair
		nettest.Do(t, node.NS, func() (err error) {
			rep, err = core.HealNode(context.Background(), cfg, true)
			return err
		})
		return rep
	}
	rep := heal()
	if rep.IsolatedPorts != 1 || elementsOf(running) == 0 {
		t.Errorf("heal put back %d pods' elements (running pod: %d elements), want the running pod's", rep.IsolatedPorts, elementsOf(running))
	}
	if n := elementsOf(leaving); n != 0 {
		t.Errorf("heal put back %d elements of a pod whose DEL is in flight", n)
	}
	if err := unlock(); err != nil {
		t.Fatal(err)
	}
	if err := node.Del(list, leaving); err != nil {
		t.Fatalf("DEL of the pod after its lock was let go: %v", err)
	}
	heal()
	if n := elementsOf(leaving); n != 0 {
		t.Errorf("%d elements of the deleted pod after its DEL and another heal", n)
	}
	if err := node.Check(list, running); err != nil {
		t.Errorf("CHECK of the running pod after the heal: %v", err)
	}
}

// TestLocalnetGuardAfterBridgeRecreated: the localnet guard's input chain is bound to no device,
// so deleting the bridge (a person, a network manager) leaves it in place for the next bridge;
// another tool may delete the chain as well. Either way the guard must hold
// once the bridge is back: CheckNode names the chain when it is gone, and the heal or the next
// ADD (which makes the bridge again) puts it back. The guard's input chain is tested alone (the
// bridge's loopback guard and the guard's NAT chain emptied): the attack fails, and works once
// that chain is emptied too.
func TestLocalnetGuardAfterBridgeRecreated(t *testing.T) {
	for _, tc := range []struct {
		name      string
		chainGoes bool // deleted by another tool
		heal      bool // else the next ADD repairs
	}{
		{"chain kept, heal", false, true},
		{"chain deleted, heal", true, true},
		{"chain deleted, next ADD", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node, list, _ := hpNode(t)
			holder := node.NewPod(t, "recreate-holder")
			holder.RT.CapabilityArgs = hpArgs(false, hpMapping{30190, 8080, "tcp", ""})
			node.MustAdd(t, list, holder)
			cfg := testkit.PluginConfig(t, list)
			checkNode := func() error {
				var err error
				nettest.Do(t, node.NS, func() error { err = core.CheckNode(cfg); return nil })
				return err
			}
			nettest.Run(t, node.NS, "ip", "link", "del", "cbr0")
			if tc.chainGoes {
				nettest.Run(t, node.NS, "nft", "delete", "chain", "inet", testkit.HostPortTable, hostport.ChainLocalnetInput)
				if err := checkNode(); !strings.Contains(fmt.Sprint(err), hostport.ChainLocalnetInput) {
					t.Errorf("CheckNode without the guard's input chain = %v, want it named", err)
				}
			}
			if tc.heal {
				nettest.Do(t, node.NS, func() error {
					_, err := core.HealNode(context.Background(), cfg, true)
					return err
				})
			}
			attacker := node.NewPod(t, "recreate-attacker")
			node.MustAdd(t, list, attacker)
			if err := checkNode(); err != nil {
				t.Errorf("CheckNode after the bridge came back: %v", err)
			}
			if got := nettest.Run(t, node.NS, "nft", "list", "chain", "inet", testkit.HostPortTable, hostport.ChainLocalnetInput); !strings.Contains(got, "hook input") {
				t.Errorf("the guard's input chain after the bridge came back:\n%s", got)
			}
			attack := testkit.LocalnetAttack(t, node, attacker, 9999)
			nettest.Run(t, node.NS, "nft", "flush", "chain", "bridge", testkit.HostPortTable, isolation.ChainGuardIPv4)
			nettest.Run(t, node.NS, "nft", "flush", "chain", "inet", testkit.HostPortTable, hostport.ChainLocalnetNAT)
			testkit.ExpectAttackFails(t, attack, "with the guard's input chain alone on the new bridge")
			nettest.Run(t, node.NS, "nft", "flush", "chain", "inet", testkit.HostPortTable, hostport.ChainLocalnetInput)
			testkit.ExpectAttackWorks(t, attack, "with the guard's input chain emptied too")
		})
	}
}
