package cni

import (
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/kubenet-dev/kubenet/core"
	"github.com/kubenet-dev/kubenet/isolation"
	"github.com/kubenet-dev/kubenet/test/nettest"
	"github.com/kubenet-dev/kubenet/test/testkit"
)

// wantIsolationElements is what the isolation sets of node must hold for pod: its port, and with
// anti-spoofing its MAC and addresses (the link-local one derived from the MAC).
func wantIsolationElements(t *testing.T, node *nettest.Node, p *nettest.Pod, antiSpoofing bool) []string {
	t.Helper()
	mac, err := sandboxMAC(p.Result)
	if err != nil {
		t.Fatal(err)
	}
	port := testkit.KubenetNames(p).HostVeth
	mark := testkit.IsolationMark(testkit.NodeBackend(node), port, p.RT.ContainerID+"/"+p.RT.IfName)
	return isolationWant(mark, port, mac, p.IPs(), antiSpoofing)
}

// isolationWant is what the isolation sets hold for one attachment, sorted: its bridge port, and
// with anti-spoofing its MAC and addresses (the link-local one derived from the MAC), each
// element tied to the attachment by mark (testkit.IsolationMark: its comment or its chain).
func isolationWant(mark testkit.IsolationElement, port string, mac net.HardwareAddr, ips []netip.Addr, antiSpoofing bool) []string {
	el := func(set, key string) string {
		return testkit.IsolationElement{Set: set, Key: key, Comment: mark.Comment, Chain: mark.Chain}.String()
	}
	want := []string{el(isolation.SetPodPorts, port)}
	// nftables (its elements carry a comment; ebtables rules none) also joins MAC and address for
	// its fast paths.
	fast := func(a netip.Addr) {
		if mark.Comment != "" {
			want = append(want, el(map[bool]string{false: isolation.SetFastIPv4, true: isolation.SetFastIPv6}[a.Is6()], port+" . "+mac.String()+" . "+a.String()))
		}
	}
	if antiSpoofing {
		want = append(want, el(isolation.SetAntiSpoofPorts, port), el(isolation.SetMAC, port+" . "+mac.String()),
			el(isolation.SetIPv6, port+" . "+testkit.LinkLocal(mac).String()))
		fast(testkit.LinkLocal(mac))
		for _, a := range ips {
			want = append(want, el(map[bool]string{false: isolation.SetIPv4, true: isolation.SetIPv6}[a.Is6()], port+" . "+a.String()))
			fast(a)
		}
	}
	slices.Sort(want)
	return want
}

// sandboxMAC is the MAC of the pod's interface (the one in a sandbox) in an ADD result.
func sandboxMAC(res *current.Result) (net.HardwareAddr, error) {
	for _, i := range res.Interfaces {
		if i.Sandbox != "" {
			return net.ParseMAC(i.Mac)
		}
	}
	return nil, fmt.Errorf("no pod interface in the result %v", res.Interfaces)
}

// addResult reads the pod interface's MAC and the pod's addresses from what ADD printed.
func addResult(stdout string) (net.HardwareAddr, []netip.Addr, error) {
	var res current.Result
	if err := json.Unmarshal([]byte(stdout), &res); err != nil {
		return nil, nil, fmt.Errorf("ADD result: %w: %s", err, stdout)
	}
	mac, err := sandboxMAC(&res)
	return mac, (&nettest.Pod{Result: &res}).IPs(), err
}

// isolationElementsOf lists the elements whose comment names pod or whose key is its port.
func isolationElementsOf(t *testing.T, node *nettest.Node, p *nettest.Pod) []string {
	t.Helper()
	return isolationOfPort(testkit.IsolationElements(t, node), testkit.KubenetNames(p).HostVeth, p.RT.ContainerID+"/"+p.RT.IfName)
}

// isolationOfPort picks, sorted, the elements of els keyed by port or naming owner.
func isolationOfPort(els []testkit.IsolationElement, port, owner string) []string {
	var out []string
	for _, e := range els {
		if e.Comment == owner || e.Key == port || strings.HasPrefix(e.Key, port+" ") {
			out = append(out, e.String())
		}
	}
	slices.Sort(out)
	return out
}

func expectIsolationElements(t *testing.T, node *nettest.Node, p *nettest.Pod, antiSpoofing bool) {
	t.Helper()
	got, want := isolationElementsOf(t, node, p), wantIsolationElements(t, node, p, antiSpoofing)
	if !slices.Equal(got, want) {
		t.Errorf("isolation elements of %s:\n got %q\nwant %q", p.RT.ContainerID, got, want)
	}
}

// removeFastPaths makes node's isolation what a kubenet without the fast paths left: the chains
// without the fast-path rules, no fast sets.
func removeFastPaths(t *testing.T, node *nettest.Node) {
	t.Helper()
	for _, chain := range []string{isolation.ChainAntiSpoof, isolation.ChainGuard} {
		out := nettest.Run(t, node.NS, "nft", "-a", "list", "chain", "bridge", testkit.HostPortTable, chain)
		for _, line := range strings.Split(out, "\n") {
			if strings.Contains(line, "(the checks below would let it through)") {
				handle := line[strings.LastIndex(line, "# handle ")+len("# handle "):]
				nettest.Run(t, node.NS, "nft", "delete", "rule", "bridge", testkit.HostPortTable, chain, "handle", strings.TrimSpace(handle))
			}
		}
	}
	for _, set := range []string{isolation.SetFastIPv4, isolation.SetFastIPv6} {
		nettest.Run(t, node.NS, "nft", "delete", "set", "bridge", testkit.HostPortTable, set)
	}
}

// TestIsolationUpgradeAddsFastPaths: a node whose isolation was set up by a kubenet without the
// fast paths (their rules and sets absent) gets them with the next ADD, and the running pod its
// fast elements with them (the sets are new, so ADD puts back every running pod's elements):
// CHECK of the running pod passes, and the node's rules are as planned.
func TestIsolationUpgradeAddsFastPaths(t *testing.T) {
	node := nettest.NewNode(t, binDir)
	list := node.ConfList(t, nettest.NetConf{PodCIDRs: testkit.DualStack()})
	old := node.NewPod(t, "upgrade-old")
	node.MustAdd(t, list, old)
	removeFastPaths(t, node)
	if err := node.Check(list, old); err == nil {
		t.Fatal("CHECK passes on a node without the fast paths: the test cannot tell them added")
	}
	node.MustAdd(t, list, node.NewPod(t, "upgrade-new"))
	expectIsolationElements(t, node, old, true)
	if err := node.Check(list, old); err != nil {
		t.Errorf("CHECK of the running pod after the next ADD: %v", err)
	}
}

// TestIsolationUpgradeDelBeforeAdd: on a node set up by a kubenet without the fast paths, the
// new binary's first verb may be a DEL: the pod's elements go although the fast sets they would
// have joined do not exist, and the DEL succeeds (leak audit).
func TestIsolationUpgradeDelBeforeAdd(t *testing.T) {
	node := nettest.NewNode(t, binDir)
	list := node.ConfList(t, nettest.NetConf{PodCIDRs: testkit.DualStack()})
	old := node.NewPod(t, "upgrade-del")
	node.MustAdd(t, list, old)
	removeFastPaths(t, node)
	if err := node.Del(list, old); err != nil {
		t.Fatalf("DEL on a node without the fast sets: %v", err)
	}
	testkit.AssertNoResidue(t, node, "kubenet", testkit.AttachmentOf(old), old.IPs())
}

// TestIsolationLifecycle: per family, ADD gives each pod its isolation elements and the pod
// interface the sysctls and MAC the rules rely on; CHECK verifies them and names what is
// missing; DEL removes them (leak audit).
func TestIsolationLifecycle(t *testing.T) {
	for _, fam := range familyCases {
		t.Run(fam.name, func(t *testing.T) {
			t.Parallel()
			node := nettest.NewNode(t, binDir)
			list := node.ConfList(t, nettest.NetConf{PodCIDRs: fam.cidrs})
			a, b := node.NewPod(t, "iso-a"), node.NewPod(t, "iso-b")
			node.MustAdd(t, list, a)
			node.MustAdd(t, list, b)
			for _, p := range []*nettest.Pod{a, b} {
				expectIsolationElements(t, node, p, true)
				if err := node.Check(list, p); err != nil {
					t.Errorf("CHECK %s: %v", p.RT.ContainerID, err)
				}
			}
			mac, _ := net.ParseMAC(a.Result.Interfaces[2].Mac)
			if mac[0]&0x03 != 0x02 {
				t.Errorf("pod MAC %s is not a locally administered unicast address", mac)
			}
			// The pod accepts no router advertisements, on an IPv4-only network too, and its
			// link-local address is the one the rules allow.
			for _, key := range []string{"net/ipv6/conf/eth0/accept_ra", "net/ipv6/conf/all/accept_ra", "net/ipv6/conf/default/accept_ra",
				"net/ipv6/conf/eth0/addr_gen_mode"} {
				if got := testkit.Sysctl(t, a.NS, key); got != "0" {
					t.Errorf("pod %s = %s, want 0", key, got)
				}
			}
			if !slices.ContainsFunc(testkit.AllAddrs(t, a.NS, "eth0"), func(p netip.Prefix) bool { return p.Addr() == testkit.LinkLocal(mac) }) {
				t.Errorf("pod eth0 lacks the link-local address %s derived from its MAC: %v", testkit.LinkLocal(mac), testkit.AllAddrs(t, a.NS, "eth0"))
			}

			t.Run("CHECK names a missing element", func(t *testing.T) {
				port := testkit.KubenetNames(a).HostVeth
				ip := a.IPs()[0]
				set := map[bool]string{false: isolation.SetIPv4, true: isolation.SetIPv6}[ip.Is6()]
				elem := fmt.Sprintf(`{ "%s" . %s }`, port, ip)
				nettest.Run(t, node.NS, "nft", "delete", "element", "bridge", testkit.HostPortTable, set, elem)
				err := node.Check(list, a)
				if err == nil || !strings.Contains(err.Error(), ip.String()) || !strings.Contains(err.Error(), set) {
					t.Errorf("CHECK without %s in %s: %v, want an error naming it", elem, set, err)
				}
				nettest.Run(t, node.NS, "nft", "add", "element", "bridge", testkit.HostPortTable, set, elem)
				if err := node.Check(list, a); err != nil {
					t.Errorf("CHECK after restoring the element: %v", err)
				}
			})
			t.Run("CHECK names accept_ra", func(t *testing.T) {
				nettest.WriteSysctl(t, a.NS, "net/ipv6/conf/eth0/accept_ra", "1")
				if err := node.Check(list, a); err == nil || !strings.Contains(err.Error(), "accept_ra") {
					t.Errorf("CHECK with accept_ra=1 in the pod: %v, want an error naming it", err)
				}
				nettest.WriteSysctl(t, a.NS, "net/ipv6/conf/eth0/accept_ra", "0")
			})
			t.Run("DEL removes them", func(t *testing.T) {
				if err := node.Del(list, a); err != nil {
					t.Fatal(err)
				}
				if got := isolationElementsOf(t, node, a); len(got) > 0 {
					t.Errorf("DEL left isolation elements: %q", got)
				}
				testkit.AssertNoResidue(t, node, "kubenet", testkit.AttachmentOf(a), a.IPs())
				expectIsolationElements(t, node, b, true)
				if err := node.Del(list, a); err != nil {
					t.Errorf("repeated DEL: %v", err)
				}
			})
		})
	}
}

// TestIsolationGC: GC removes the elements of attachments that are not valid, including one
// whose record is gone and elements of a port nobody recorded; DEL without a record finds the
// pod's elements by its port.
func TestIsolationGC(t *testing.T) {
	node := nettest.NewNode(t, binDir)
	list := node.ConfList(t, nettest.NetConf{PodCIDRs: testkit.DualStack()})
	keep, drop, lost := node.NewPod(t, "gc-keep"), node.NewPod(t, "gc-drop"), node.NewPod(t, "gc-lost")
	for _, p := range []*nettest.Pod{keep, drop, lost} {
		node.MustAdd(t, list, p)
	}
	record := func(p *nettest.Pod) string {
		return core.RecordPath(filepath.Join(node.DataDir(), "kubenet"), testkit.AttachmentOf(p))
	}
	if err := os.Remove(record(lost)); err != nil {
		t.Fatal(err)
	}
	nettest.Run(t, node.NS, "nft", "add", "element", "bridge", testkit.HostPortTable, isolation.SetIPv4, `{ "vethghost000000" . 10.244.1.250 comment "ghost/eth0" }`)

	if err := node.GC(list, []types.GCAttachment{{ContainerID: keep.RT.ContainerID, IfName: keep.RT.IfName}}); err != nil {
		t.Fatalf("GC: %v", err)
	}
	for _, p := range []*nettest.Pod{drop, lost} {
		if got := isolationElementsOf(t, node, p); len(got) > 0 {
			t.Errorf("GC left the isolation elements of %s: %q", p.RT.ContainerID, got)
		}
	}
	for _, e := range testkit.IsolationElements(t, node) {
		if e.Comment == "ghost/eth0" {
			t.Errorf("GC left an element of a port nobody recorded: %s", e)
		}
	}
	expectIsolationElements(t, node, keep, true)
	if err := node.Check(list, keep); err != nil {
		t.Errorf("CHECK of the kept pod after GC: %v", err)
	}

	t.Run("DEL without a record", func(t *testing.T) {
		if err := os.Remove(record(keep)); err != nil {
			t.Fatal(err)
		}
		if err := node.Del(list, keep); err != nil {
			t.Fatal(err)
		}
		if got := isolationElementsOf(t, node, keep); len(got) > 0 {
			t.Errorf("DEL without a record left: %q", got)
		}
	})
}

// TestIsolationFailedAddRollsBack: an ADD that fails after the isolation step (its host port is
// taken) leaves no element behind, and the pod that holds the port keeps its own.
func TestIsolationFailedAddRollsBack(t *testing.T) {
	node := nettest.NewNode(t, binDir)
	list := node.ConfList(t, nettest.NetConf{PodCIDRs: testkit.DualStack()})
	holder, loser := node.NewPod(t, "rb-holder"), node.NewPod(t, "rb-loser")
	holder.RT.CapabilityArgs = hpArgs(false, hpMapping{30900, 80, "tcp", ""})
	loser.RT.CapabilityArgs = hpArgs(false, hpMapping{30900, 80, "tcp", ""})
	node.MustAdd(t, list, holder)
	if err := node.Add(list, loser); err == nil {
		t.Fatal("ADD of a pod whose host port is taken succeeded")
	}
	if got := isolationElementsOf(t, node, loser); len(got) > 0 {
		t.Errorf("failed ADD left isolation elements: %q", got)
	}
	testkit.AssertNoResidue(t, node, "kubenet", testkit.AttachmentOf(loser), nil)
	expectIsolationElements(t, node, holder, true)
}

// TestAntiSpoofingSwitch: a node whose configuration turns anti-spoofing on and off again. A pod
// attached while it was off keeps working when it is turned on (no elements: not checked, which
// its CHECK reports); turning it off removes the anti-spoofing chains and keeps the guard.
func TestAntiSpoofingSwitch(t *testing.T) {
	node := nettest.NewNode(t, binDir)
	conf := func(on bool) nettest.NetConf {
		return nettest.NetConf{PodCIDRs: testkit.DualStack(), Extra: map[string]any{"antiSpoofing": on}}
	}
	off, on := node.ConfList(t, conf(false)), node.ConfList(t, conf(true))
	early, late := node.NewPod(t, "sw-early"), node.NewPod(t, "sw-late")
	node.MustAdd(t, off, early)
	expectIsolationElements(t, node, early, false)
	if out, _ := nettest.Output(node.NS, "nft", "list", "chain", "bridge", testkit.HostPortTable, isolation.ChainAntiSpoof); strings.Contains(out, "drop") {
		t.Errorf("anti-spoofing chain present while it is off:\n%s", out)
	}
	node.MustAdd(t, on, late)
	expectIsolationElements(t, node, late, true)
	expectIsolationElements(t, node, early, false)
	for _, gw := range []netip.Addr{testkit.GatewayOf(nettest.PodCIDR4), testkit.GatewayOf(nettest.PodCIDR6)} {
		testkit.ExpectReachable(t, early.NS, nettest.StartTCPEcho(t, late.NS, netip.AddrPortFrom(late.IP(gw), 0)), early.IP(gw))
		testkit.ExpectReachable(t, late.NS, nettest.StartTCPEcho(t, early.NS, netip.AddrPortFrom(early.IP(gw), 0)), late.IP(gw))
	}
	if err := node.Check(on, early); err == nil || !strings.Contains(err.Error(), isolation.SetAntiSpoofPorts) {
		t.Errorf("CHECK of a pod attached while anti-spoofing was off, now on: %v, want its missing elements named", err)
	}
	if err := node.Check(on, late); err != nil {
		t.Errorf("CHECK: %v", err)
	}

	other := node.NewPod(t, "sw-other")
	node.MustAdd(t, off, other)
	if out, err := nettest.Output(node.NS, "nft", "list", "chain", "bridge", testkit.HostPortTable, isolation.ChainAntiSpoof); err == nil {
		t.Errorf("anti-spoofing chain still present after an ADD with it off:\n%s", out)
	}
	if out := nettest.Run(t, node.NS, "nft", "list", "chain", "bridge", testkit.HostPortTable, isolation.ChainGuardIPv6); !strings.Contains(out, "nd-router-advert drop") {
		t.Errorf("the router guard went with anti-spoofing:\n%s", out)
	}
	for _, p := range []*nettest.Pod{early, late, other} {
		if err := node.Del(off, p); err != nil {
			t.Fatal(err)
		}
		if got := isolationElementsOf(t, node, p); len(got) > 0 {
			t.Errorf("DEL with anti-spoofing off left elements of %s: %q", p.RT.ContainerID, got)
		}
	}
}
