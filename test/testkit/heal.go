package testkit

import (
	"fmt"
	"net/netip"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/vishvananda/netlink"

	"github.com/kubenet-dev/kubenet/core"
	"github.com/kubenet-dev/kubenet/hostport"
	"github.com/kubenet-dev/kubenet/internal/ipnet"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

// PluginConfig parses the kubenet entry of list the way the plugin receives it from libcni
// (the list's name and cniVersion injected), for tests that call the core in-process.
func PluginConfig(t testing.TB, list *libcni.NetworkConfigList) *core.Config {
	t.Helper()
	for _, p := range list.Plugins {
		if p.Network.Type != "kubenet" {
			continue
		}
		p, err := libcni.InjectConf(p, map[string]any{"name": list.Name, "cniVersion": list.CNIVersion})
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := core.ParseConfig(p.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	t.Fatal("no kubenet plugin in the conflist")
	return nil
}

// LocalnetAttack turns pod into an attacker on the node's 127.0.0.0/8 (plugins#729): it gives up
// its own loopback address and sends 127.0.0.0/8 to its gateway, with route_localnet on so its
// kernel lets such packets out. The node gets a private service on 127.0.0.1:port. The returned
// function tries to reach that service from the pod within timeout, and returns nil when it
// does: the attack worked.
func LocalnetAttack(t testing.TB, node *nettest.Node, pod *nettest.Pod, port uint16) func(timeout time.Duration) error {
	t.Helper()
	private := nettest.StartTCPEcho(t, node.NS, netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port))
	nettest.Do(t, pod.NS, func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.AddrDel(lo, &netlink.Addr{IPNet: ipnet.FromPrefix(netip.MustParsePrefix("127.0.0.1/8"))})
	})
	nettest.WriteSysctl(t, pod.NS, "net/ipv4/conf/eth0/route_localnet", "1")
	nettest.AddRoute(t, pod.NS, netip.MustParsePrefix("127.0.0.0/8"), GatewayOf(nettest.PodCIDR4))
	return func(timeout time.Duration) error {
		r, err := nettest.TCPRequest(pod.NS, private.Addr, "sneak", timeout)
		return nettest.ExpectFrom(r, err, pod.IP(nettest.NodeUplink4.Addr()))
	}
}

// FlushLocalnetGuard empties both chains of the localnet guard (nftables backend): the NAT
// chain that drops a connection's first packet and the input chain that drops every packet the
// node receives on a device other than lo. Either alone stops the plain attack.
func FlushLocalnetGuard(t testing.TB, node *nettest.Node) {
	t.Helper()
	for _, chain := range []string{hostport.ChainLocalnetNAT, hostport.ChainLocalnetInput} {
		nettest.Run(t, node.NS, "nft", "flush", "chain", "inet", HostPortTable, chain)
	}
}

// ExpectAttackFails checks that the localnet attack does not reach the node's service.
func ExpectAttackFails(t testing.TB, attack func(time.Duration) error, when string) {
	t.Helper()
	if err := attack(UnreachableTimeout); err == nil {
		t.Errorf("%s: a pod reached the node's 127.0.0.1 service", when)
	}
}

// ExpectAttackWorks checks that the attack reaches the node's service, which shows that the
// guard, and nothing else, is what stops it.
func ExpectAttackWorks(t testing.TB, attack func(time.Duration) error, when string) {
	t.Helper()
	if err := nettest.Eventually(TrafficTimeout, func() error { return attack(time.Second) }); err != nil {
		t.Errorf("%s: the pod should reach 127.0.0.1 without the guard (else the test proves nothing): %v", when, err)
	}
}

// EditRule changes one rule with the nft tool the way a person would, keeping its comment and
// its position: the rule of family/table/chain whose comment contains marker gets its text with
// old replaced by replacement (`nft replace rule ... handle N`). It returns the rule as it was.
func EditRule(t testing.TB, node *nettest.Node, family, table, chain, marker, old, replacement string) string {
	t.Helper()
	listing := nettest.Run(t, node.NS, "nft", "-a", "list", "chain", family, table, chain)
	re := regexp.MustCompile(`^\s*(.*comment "[^"]*` + regexp.QuoteMeta(marker) + `[^"]*") # handle (\d+)$`)
	for _, line := range strings.Split(listing, "\n") {
		m := re.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		if !strings.Contains(m[1], old) {
			t.Fatalf("rule %q does not contain %q", m[1], old)
		}
		nettest.Run(t, node.NS, "nft", "replace", "rule", family, table, chain, "handle", m[2], strings.Replace(m[1], old, replacement, 1))
		return m[1]
	}
	t.Fatalf("no rule with comment %q in\n%s", marker, listing)
	return ""
}

// StatusCode runs STATUS and returns its CNI error code (0: ready) and message.
func StatusCode(t testing.TB, node *nettest.Node, list *libcni.NetworkConfigList) (uint, string) {
	t.Helper()
	err := node.Status(list)
	if err == nil {
		return 0, ""
	}
	code := CNICode(err)
	if code == 0 {
		t.Fatalf("STATUS failed without a CNI error: %v", err)
	}
	return code, err.Error()
}

// NodeRulesOK checks inside the node that the network's node-wide rules are as planned.
func NodeRulesOK(t testing.TB, node *nettest.Node, cfg *core.Config) error {
	t.Helper()
	var err error
	nettest.Do(t, node.NS, func() error { err = core.CheckNode(cfg); return nil })
	if err != nil {
		return fmt.Errorf("node-wide rules: %w", err)
	}
	return nil
}
