package netpol

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/kubenet-dev/kubenet/bridge"
	"github.com/kubenet-dev/kubenet/internal/policyrules"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

// bridgedNode is a node namespace with a bridge (br0: 10.3.0.1/24, fd00:3::1/64, its own
// nf_call options on), three pods a, b, c on it, each with a port guard, the bridge guard, and
// in every pod a TCP echo server on 8080 and UDP receivers on 5353; and an outside host x routed
// through the node (10.4.0.2, fd00:4::2).
type bridgedNode struct {
	network string
	node, x ns.NetNS
	bridge  int
	pods    map[string]*testPod
}

type testPod struct {
	name     string
	ns       ns.NetNS
	port     int // host veth index
	mac      net.HardwareAddr
	v4, v6   netip.Addr
	ll       netip.Addr
	udp      *udpReceiver
	hostName string
}

func (p *testPod) ips() []netip.Addr { return []netip.Addr{p.v4, p.v6, p.ll} }

var (
	gw4, gw6 = netip.MustParsePrefix("10.3.0.1/24"), netip.MustParsePrefix("fd00:3::1/64")
	x4       = netip.MustParseAddr("10.4.0.2")
)

func newBridgedNode(t *testing.T) *bridgedNode {
	t.Helper()
	n := &bridgedNode{network: fmt.Sprintf("np%d", time.Now().UnixNano()%1e6), node: nettest.NewNS(t), x: nettest.NewNS(t), pods: map[string]*testPod{}}
	nettest.WriteSysctl(t, n.node, "net/ipv4/ip_forward", "1")
	nettest.WriteSysctl(t, n.node, "net/ipv6/conf/all/forwarding", "1")
	var br *netlink.Bridge
	nettest.Do(t, n.node, func() (err error) {
		if err := bridge.CheckBridgeNetfilter(); err != nil {
			t.Skipf("this kernel: %v", err)
		}
		br, err = bridge.Ensure(bridge.Config{Name: "br0", MTU: 1500, Gateways: []netip.Prefix{gw4, gw6}, NetfilterCall: true}, bridge.Seen{})
		return err
	})
	n.bridge = br.Index
	for i, name := range []string{"a", "b", "c"} {
		n.addPod(t, name, byte(i+2), byte(i+2))
	}
	nettest.Do(t, n.node, func() error { return GuardBridge(n.bridge) })
	nettest.Link(t, nettest.Endpoint{NS: n.node, IfName: "x0", Addrs: []netip.Prefix{netip.MustParsePrefix("10.4.0.1/24"), netip.MustParsePrefix("fd00:4::1/64")}},
		nettest.Endpoint{NS: n.x, IfName: "eth0", Addrs: []netip.Prefix{netip.MustParsePrefix("10.4.0.2/24"), netip.MustParsePrefix("fd00:4::2/64")}})
	nettest.AddRoute(t, n.x, netip.MustParsePrefix("10.3.0.0/24"), netip.MustParseAddr("10.4.0.1"))
	nettest.AddRoute(t, n.x, netip.MustParsePrefix("fd00:3::/64"), netip.MustParseAddr("fd00:4::1"))
	nettest.StartTCPEcho(t, n.node, netip.AddrPortFrom(netip.IPv6Unspecified(), 9000))
	nettest.StartTCPEcho(t, n.x, netip.AddrPortFrom(netip.IPv6Unspecified(), 9000))
	return n
}

// addPod attaches pod name to the bridge with the addresses 10.3.0.<host> and fd00:3::<host>
// and the MAC 0a:00:00:00:00:<mac>, guards its port, and starts its servers.
func (n *bridgedNode) addPod(t *testing.T, name string, host, mac byte) *testPod {
	t.Helper()
	p := &testPod{name: name, ns: nettest.NewNS(t), v4: netip.AddrFrom4([4]byte{10, 3, 0, host}), v6: netip.MustParseAddr(fmt.Sprintf("fd00:3::%x", host)),
		mac: net.HardwareAddr{0x0a, 0x00, 0, 0, 0, mac}, hostName: "v" + name}
	p.ll = eui64(p.mac)
	nettest.Do(t, n.node, func() error {
		br, err := netlink.LinkByIndex(n.bridge)
		if err != nil {
			return err
		}
		host, err := bridge.AddVeth(bridge.Veth{HostName: p.hostName, PodIfName: "eth0", PodMAC: p.mac, MTU: 1500, Bridge: br.(*netlink.Bridge)}, p.ns)
		if err != nil {
			return err
		}
		p.port = host.Attrs().Index
		return GuardPort(p.port)
	})
	if _, err := bridge.ConfigurePod(p.ns, bridge.Pod{IfName: "eth0", Addrs: []netip.Prefix{netip.PrefixFrom(p.v4, 24), netip.PrefixFrom(p.v6, 64)}, Gateways: []netip.Addr{gw4.Addr(), gw6.Addr()}}); err != nil {
		t.Fatal(err)
	}
	nettest.StartTCPEcho(t, p.ns, netip.AddrPortFrom(netip.IPv6Unspecified(), 8080))
	p.udp = startUDPReceiver(t, p.ns, 5353)
	n.pods[name] = p
	return p
}

// eui64 is the link-local address the kernel derives from mac.
func eui64(mac net.HardwareAddr) netip.Addr {
	b := [16]byte{0xfe, 0x80}
	b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15] = mac[0]^2, mac[1], mac[2], 0xff, 0xfe, mac[3], mac[4], mac[5]
	return netip.AddrFrom16(b)
}

func (n *bridgedNode) apply(t *testing.T, rs policyrules.Ruleset, opt Options) policyrules.Applied {
	t.Helper()
	var res policyrules.Applied
	rs.PodCIDRs, rs.NodeAddrs = []netip.Prefix{gw4.Masked(), gw6.Masked()}, []netip.Addr{gw4.Addr(), gw6.Addr()}
	nettest.Do(t, n.node, func() (err error) { res, err = Apply(n.network, rs, opt); return err })
	return res
}

// open is the ruleset in which no pod is isolated.
func (n *bridgedNode) open() policyrules.Ruleset {
	var rs policyrules.Ruleset
	for _, p := range n.pods {
		rs.Pods = append(rs.Pods, policyrules.Pod{Port: p.port, Name: p.name, IPs: p.ips()})
	}
	return rs
}

// with returns rs with pod name's directions replaced.
func with(rs policyrules.Ruleset, port int, ingress, egress policyrules.Direction) policyrules.Ruleset {
	out := policyrules.Ruleset{PodCIDRs: rs.PodCIDRs}
	for _, p := range rs.Pods {
		if p.Port == port {
			p.Ingress, p.Egress = ingress, egress
		}
		out.Pods = append(out.Pods, p)
	}
	return out
}

func scoped(a netip.Addr) string {
	if a.IsLinkLocalUnicast() {
		return a.WithZone("eth0").String()
	}
	return a.String()
}

// tcpReach tells whether a TCP connection from src to dst:port gets an answer. A wanted answer
// is retried for a few seconds: IPv6 neighbour discovery, which a held pod's guard drops while
// the node has no policy tables yet, may have left a failed neighbour entry to be resolved anew.
func tcpReach(src ns.NetNS, dst netip.Addr, port uint16, want bool) error {
	if want {
		return nettest.Eventually(4*time.Second, func() error { return tcpOnce(src, dst, port, true) })
	}
	return tcpOnce(src, dst, port, false)
}

func tcpOnce(src ns.NetNS, dst netip.Addr, port uint16, want bool) error {
	timeout := 400 * time.Millisecond
	if want {
		timeout = 2 * time.Second
	}
	var err error
	ok := false
	_ = src.Do(func(ns.NetNS) error {
		c, derr := net.DialTimeout("tcp", net.JoinHostPort(scoped(dst), fmt.Sprint(port)), timeout)
		if derr != nil {
			err = derr
			return nil
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(timeout))
		if _, werr := c.Write([]byte("hi\n")); werr != nil {
			err = werr
			return nil
		}
		buf := make([]byte, 64)
		if _, rerr := c.Read(buf); rerr != nil {
			err = rerr
			return nil
		}
		ok = true
		return nil
	})
	switch {
	case want && !ok:
		return fmt.Errorf("%s:%d not reached: %v", dst, port, err)
	case !want && ok:
		return fmt.Errorf("%s:%d reached, want denied", dst, port)
	}
	return nil
}

func (n *bridgedNode) expectTCP(t *testing.T, what string, src ns.NetNS, dst netip.Addr, port uint16, want bool) {
	t.Helper()
	if err := tcpReach(src, dst, port, want); err != nil {
		t.Errorf("%s: %v", what, err)
	}
}

// udpReceiver counts the UDP datagrams a pod receives on a port, IPv4 (broadcast included) and
// IPv6 (multicast to the all-nodes group included), by payload.
type udpReceiver struct {
	mu   sync.Mutex
	seen map[string]int
}

func startUDPReceiver(t *testing.T, n ns.NetNS, port int) *udpReceiver {
	r := &udpReceiver{seen: map[string]int{}}
	for _, network := range []string{"udp4", "udp6"} {
		var pc net.PacketConn
		nettest.Do(t, n, func() (err error) {
			lc := net.ListenConfig{}
			pc, err = lc.ListenPacket(t.Context(), network, fmt.Sprintf(":%d", port))
			return err
		})
		t.Cleanup(func() { _ = pc.Close() })
		go func() {
			buf := make([]byte, 65536)
			for {
				nr, _, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				r.mu.Lock()
				r.seen[string(buf[:nr])]++
				r.mu.Unlock()
			}
		}()
	}
	return r
}

func (r *udpReceiver) count(payload string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seen[payload]
}

// sendUDP sends payload from inside src to dst:port: a unicast, broadcast or multicast address
// (a link-scope one leaves through eth0).
func sendUDP(t *testing.T, src ns.NetNS, dst netip.Addr, port int, payload string) {
	t.Helper()
	nettest.Do(t, src, func() error {
		network := "udp4"
		if dst.Is6() {
			network = "udp6"
		}
		pc, err := net.ListenPacket(network, ":0")
		if err != nil {
			return err
		}
		defer pc.Close()
		if dst.Is4() {
			raw, _ := pc.(*net.UDPConn).SyscallConn()
			_ = raw.Control(func(fd uintptr) { _ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_BROADCAST, 1) })
		}
		to := &net.UDPAddr{IP: dst.AsSlice(), Port: port}
		if dst.IsLinkLocalUnicast() || dst.IsLinkLocalMulticast() || dst.IsInterfaceLocalMulticast() {
			to.Zone = "eth0"
		}
		_, err = pc.WriteTo([]byte(payload), to)
		return err
	})
}

// expectUDP sends a datagram from src and checks whether dst's receiver got it: a wanted one
// must arrive within seconds; an unwanted one is checked after a control datagram that must
// arrive (sent afterwards from the node, which always reaches pods) has arrived.
func (n *bridgedNode) expectUDP(t *testing.T, what string, src ns.NetNS, dst netip.Addr, to *testPod, want bool) {
	t.Helper()
	payload := fmt.Sprintf("%s-%d", strings.ReplaceAll(what, " ", "_"), time.Now().UnixNano())
	sendUDP(t, src, dst, 5353, payload)
	if want {
		// Sent again until it arrives: a datagram may be lost, and a pod's link-local address is
		// tentative until its duplicate address detection ends (a second or more on a busy
		// machine), the kernel choosing its other address as a link-scope multicast's source
		// meanwhile.
		if err := nettest.Eventually(3*time.Second, func() error {
			if to.udp.count(payload) == 0 {
				sendUDP(t, src, dst, 5353, payload)
				return errors.New("not received")
			}
			return nil
		}); err != nil {
			t.Errorf("%s: %s to %s not received by %s", what, payload, dst, to.name)
		}
		return
	}
	control := payload + "-control"
	if err := nettest.Eventually(3*time.Second, func() error {
		sendUDP(t, n.node, to.v4, 5353, control)
		if to.udp.count(control) == 0 {
			return errors.New("control not received")
		}
		return nil
	}); err != nil {
		t.Fatalf("%s: the node's control datagram never reached %s: %v", what, to.name, err)
	}
	if to.udp.count(payload) != 0 {
		t.Errorf("%s: %s to %s received by %s, want dropped", what, payload, dst, to.name)
	}
}

func allowFrom(ports *policyrules.Ports, peers ...netip.Addr) policyrules.Direction {
	d := policyrules.Direction{Isolated: true}
	for _, a := range peers {
		d.Allow = append(d.Allow, policyrules.Entry{Peer: policyrules.Single(a), Ports: ports})
	}
	return d
}

var tcp8080 = &policyrules.Ports{Protocol: policyrules.TCP, First: 8080, Last: 8080}

// TestHeldUntilApplied: a pod with its guard and no elements gets nothing and sends nothing, on
// every address, whoever talks; once the ruleset names it (not isolated), everything passes.
func TestHeldUntilApplied(t *testing.T) {
	n := newBridgedNode(t)
	a, b := n.pods["a"], n.pods["b"]
	for _, dst := range []netip.Addr{b.v4, b.v6, b.ll} {
		n.expectTCP(t, "held: a → b", a.ns, dst, 8080, false)
	}
	n.expectTCP(t, "held: node → a", n.node, a.v4, 8080, false)
	n.expectTCP(t, "held: a → node", a.ns, gw4.Addr(), 9000, false)
	n.expectTCP(t, "held: x → a", n.x, a.v6, 8080, false)
	res := n.apply(t, n.open(), Options{})
	if res.Released != 3 || !res.FixedWritten {
		t.Errorf("first Apply: %+v, want 3 released and the fixed objects written", res)
	}
	for _, dst := range []netip.Addr{b.v4, b.v6, b.ll} {
		n.expectTCP(t, "open: a → b", a.ns, dst, 8080, true)
	}
	n.expectTCP(t, "open: node → a", n.node, a.v4, 8080, true)
	n.expectTCP(t, "open: a → node", a.ns, gw6.Addr(), 9000, true)
	n.expectTCP(t, "open: a → x", a.ns, x4, 9000, true)
	n.expectTCP(t, "open: x → a", n.x, a.v6, 8080, true)
	if again := n.apply(t, n.open(), Options{Verify: true}); again.Changed() {
		t.Errorf("second Apply changed something: %+v", again)
	}
}

// TestGroups: ingress and egress allow lists by peer, protocol and port, replies, the node and an
// outside host; every address of the pod (link-local included) is judged by its port.
func TestGroups(t *testing.T) {
	n := newBridgedNode(t)
	a, b, c := n.pods["a"], n.pods["b"], n.pods["c"]
	// b takes TCP 8080 from a's primary addresses and from x; a sends only to b:8080 (every
	// address of b) and to the node's port 9000 on the bridge's IPv4 address.
	rs := with(n.open(), b.port, allowFrom(tcp8080, a.v4, a.v6, x4), policyrules.Direction{})
	rs = with(rs, a.port, policyrules.Direction{}, policyrules.Direction{Isolated: true, Allow: []policyrules.Entry{
		{Peer: policyrules.Single(b.v4), Ports: tcp8080}, {Peer: policyrules.Single(b.v6), Ports: tcp8080}, {Peer: policyrules.Single(b.ll), Ports: tcp8080},
		{Peer: policyrules.Single(gw4.Addr()), Ports: &policyrules.Ports{Protocol: policyrules.TCP, First: 9000, Last: 9000}},
	}})
	n.apply(t, rs, Options{})
	n.expectTCP(t, "a → b v4", a.ns, b.v4, 8080, true)
	n.expectTCP(t, "a → b v6", a.ns, b.v6, 8080, true)
	n.expectTCP(t, "a → b link-local: a's link-local is no allowed peer of b", a.ns, b.ll, 8080, false)
	n.expectTCP(t, "c → b", c.ns, b.v4, 8080, false)
	n.expectTCP(t, "c → b link-local", c.ns, b.ll, 8080, false)
	n.expectTCP(t, "x → b (ipBlock)", n.x, b.v4, 8080, true)
	n.expectTCP(t, "x → b v6 (not allowed)", n.x, b.v6, 8080, false)
	n.expectTCP(t, "node → b: always", n.node, b.v6, 8080, true)
	n.expectTCP(t, "a → c: a's egress", a.ns, c.v4, 8080, false)
	n.expectTCP(t, "a → c link-local: a's egress", a.ns, c.ll, 8080, false)
	n.expectTCP(t, "a → node v4:9000", a.ns, gw4.Addr(), 9000, true)
	n.expectTCP(t, "a → node v6:9000", a.ns, gw6.Addr(), 9000, false)
	n.expectTCP(t, "a → x", a.ns, x4, 9000, false)
	n.expectTCP(t, "c → a: a's ingress is open, replies pass a's egress", c.ns, a.v4, 8080, true)

	// b's allow list grows by a's link-local address: now that passes too.
	rs = with(rs, b.port, allowFrom(tcp8080, a.v4, a.v6, a.ll, x4), policyrules.Direction{})
	before := n.groupObjects(t)
	oldChain := groupNames(t, n)[MapIngress][b.port]
	res := n.apply(t, rs, Options{})
	if res.EditedGroups != 1 || res.NewGroups != 0 || res.RemovedGroups != 0 || res.MapChanges != 2 {
		t.Errorf("Apply of one changed list: %+v, want b's group edited in place (no group built or removed), one element replaced", res)
	}
	after := n.groupObjects(t)
	d := groupNames(t, n)
	newChain := d[MapIngress][b.port]
	if want := slices.Sorted(slices.Values(append(slices.DeleteFunc(slices.Clone(before), func(o string) bool { return o == oldChain }), newChain))); !slices.Equal(after, want) {
		t.Errorf("group chains and sets before %v, after %v: want %v (b's chain replaced, its sets kept)", before, after, want)
	}
	owner := n.setOwners(t)
	for _, obj := range after {
		if chain, ok := owner[obj]; ok {
			obj = chain
		}
		if !slices.Contains([]string{d[MapIngress][b.port], d[MapEgress][a.port]}, obj) {
			t.Errorf("%s is in the kernel, but no map element leads to it", obj)
		}
	}
	n.expectTCP(t, "a → b link-local (allowed now)", a.ns, b.ll, 8080, true)
}

// TestBroadcastAndMulticast: a pod isolated for ingress receives subnet broadcasts and
// multicast only from peers its policies allow, on the allowed port; a pod isolated for egress
// sends them only where its policies allow the destination address.
func TestBroadcastAndMulticast(t *testing.T) {
	n := newBridgedNode(t)
	a, b, c := n.pods["a"], n.pods["b"], n.pods["c"]
	udp := &policyrules.Ports{Protocol: policyrules.UDP, First: 5353, Last: 5353}
	rs := with(n.open(), b.port, allowFrom(udp, a.v4, a.ll), policyrules.Direction{})
	rs = with(rs, c.port, policyrules.Direction{}, policyrules.Direction{Isolated: true})
	n.apply(t, rs, Options{})
	bcast, allNodes := netip.MustParseAddr("10.3.0.255"), netip.MustParseAddr("ff02::1")
	n.expectUDP(t, "a broadcast → b (allowed)", a.ns, bcast, b, true)
	n.expectUDP(t, "a multicast → b (allowed)", a.ns, allNodes, b, true)
	n.expectUDP(t, "x-less: a multicast reaches c (open ingress)", a.ns, allNodes, c, true)
	n.expectUDP(t, "c broadcast → a (c's egress denies)", c.ns, bcast, a, false)
	n.expectUDP(t, "c multicast → a (c's egress denies)", c.ns, allNodes, a, false)
	n.expectUDP(t, "c broadcast → b", c.ns, bcast, b, false)
	rs = with(rs, c.port, policyrules.Direction{}, policyrules.Direction{})
	n.apply(t, rs, Options{})
	n.expectUDP(t, "c broadcast → a (open)", c.ns, bcast, a, true)
	n.expectUDP(t, "c broadcast → b (not an allowed peer)", c.ns, bcast, b, false)
	n.expectUDP(t, "c multicast → b (not an allowed peer)", c.ns, allNodes, b, false)
	n.expectUDP(t, "c unicast → b (not an allowed peer)", c.ns, b.v4, b, false)
}

// nftIn runs the nft tool inside the node.
func nftIn(t *testing.T, n ns.NetNS, args ...string) {
	t.Helper()
	nettest.Do(t, n, func() error {
		out, err := exec.Command("nft", args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("nft %v: %v: %s", args, err, out)
		}
		return nil
	})
}

// TestBrokenRulesFailClosed: whatever another tool removes — the whole ruleset, the rules of
// the policy tables, one table — leaves every pod denied until the next Apply puts everything
// back; never open.
func TestBrokenRulesFailClosed(t *testing.T) {
	n := newBridgedNode(t)
	a, b := n.pods["a"], n.pods["b"]
	rs := with(n.open(), b.port, allowFrom(tcp8080, a.v4), policyrules.Direction{})
	// What stops passing: everything, when the bridge table's rules go; the node's packets to a
	// pod that does not allow the node (b), when the inet table's go (its mark) — connections
	// the policies allow still pass then, as new ones; a's connections to b when b's group set
	// is emptied.
	everything := []string{"a → b", "a → c", "node → b"}
	for _, breakage := range []struct {
		name   string
		args   []string
		denied []string
		want   func(policyrules.Applied) bool
	}{
		{"flush ruleset", []string{"flush", "ruleset"}, everything, func(r policyrules.Applied) bool { return r.FixedWritten && r.NewGroups == 1 }},
		{"flush bridge table", []string{"flush", "table", "bridge", TableName(n.network)}, everything, func(r policyrules.Applied) bool { return r.FixedWritten && r.RepairedGroups == 1 }},
		{"flush inet table", []string{"flush", "table", "inet", TableName(n.network)}, []string{"node → b"}, func(r policyrules.Applied) bool { return r.FixedWritten }},
		{"delete bridge table", []string{"delete", "table", "bridge", TableName(n.network)}, everything, func(r policyrules.Applied) bool { return r.FixedWritten && r.NewGroups == 1 && r.Released == 3 }},
		{"flush group set", nil, []string{"a → b"}, func(r policyrules.Applied) bool { return r.RepairedGroups == 1 }},
	} {
		t.Run(breakage.name, func(t *testing.T) {
			n.apply(t, rs, Options{})
			probes := map[string]func(bool){
				"a → b":    func(want bool) { n.expectTCP(t, "a → b", a.ns, b.v4, 8080, want) },
				"a → c":    func(want bool) { n.expectTCP(t, "a → c", a.ns, n.pods["c"].v6, 8080, want) },
				"node → b": func(want bool) { n.expectTCP(t, "node → b", n.node, b.v4, 8080, want) },
			}
			for _, p := range everything {
				probes[p](true)
			}
			args := breakage.args
			if args == nil {
				d := groupNames(t, n)
				args = []string{"flush", "set", "bridge", TableName(n.network), n.groupSet(t, d[MapIngress][b.port], "-points-ipv4")}
			}
			nftIn(t, n.node, args...)
			for _, p := range everything {
				probes[p](!slices.Contains(breakage.denied, p))
			}
			res := n.apply(t, rs, Options{Verify: true})
			if !breakage.want(res) {
				t.Errorf("repair: %+v", res)
			}
			n.expectTCP(t, "repaired: a → b", a.ns, b.v4, 8080, true)
			n.expectTCP(t, "repaired: c → b", n.pods["c"].ns, b.v4, 8080, false)
		})
	}
}

// groupObjects lists the group chains and sets of the bridge table, sorted.
func (n *bridgedNode) groupObjects(t *testing.T) []string {
	t.Helper()
	var out []string
	nettest.Do(t, n.node, func() error {
		c, err := nftables.New()
		if err != nil {
			return err
		}
		chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyBridge)
		if err != nil {
			return err
		}
		for _, ch := range chains {
			if ch.Table.Name == TableName(n.network) && IsPodState(ch.Name) {
				out = append(out, ch.Name)
			}
		}
		sets, err := c.GetSets(BridgeTable(n.network))
		if err != nil {
			return err
		}
		for _, s := range sets {
			if _, ok := setStem(s.Name); ok {
				out = append(out, s.Name)
			}
		}
		return nil
	})
	slices.Sort(out)
	return out
}

// unusedGroupObjects are the group chains and sets no map element leads to.
func (n *bridgedNode) unusedGroupObjects(t *testing.T) []string {
	t.Helper()
	used := map[string]bool{}
	for _, ports := range groupNames(t, n) {
		for _, chain := range ports {
			used[chain] = true
		}
	}
	owner := n.setOwners(t)
	var out []string
	for _, o := range n.groupObjects(t) {
		if chain, ok := owner[o]; !used[o] && (!ok || !used[chain]) {
			out = append(out, o)
		}
	}
	return out
}

// setOwners maps each group set a group chain looks up to that chain (Inspect).
func (n *bridgedNode) setOwners(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for name, g := range n.inspect(t).Groups {
		if _, chain := GroupDirection(name); !chain {
			continue
		}
		for _, s := range g.Sets {
			out[s] = name
		}
	}
	return out
}

// groupSet is the set of kind (a suffix: "-ports-ipv4") that chain looks up; fatal without one.
func (n *bridgedNode) groupSet(t *testing.T, chain, kind string) string {
	t.Helper()
	for _, s := range n.inspect(t).Groups[chain].Sets {
		if strings.HasSuffix(s, kind) {
			return s
		}
	}
	t.Fatalf("group %s looks up no set %s", chain, kind)
	return ""
}

func groupNames(t *testing.T, n *bridgedNode) map[string]map[int]string {
	t.Helper()
	var d map[string]map[int]string
	nettest.Do(t, n.node, func() (err error) { d, err = Dispatch(n.network); return err })
	return d
}

// TestConntrackOlderThanThePod: a flow conntrack confirmed for an address before the pod that
// holds it now existed does not reach the new pod, neither while it is held nor after its
// release into a policy that denies the flow's peer.
func TestConntrackOlderThanThePod(t *testing.T) {
	n := newBridgedNode(t)
	a, b := n.pods["a"], n.pods["b"]
	n.apply(t, n.open(), Options{})
	// a talks to b over UDP from one socket: conntrack confirms the flow both ways.
	var conn *net.UDPConn
	nettest.Do(t, a.ns, func() (err error) {
		conn, err = net.DialUDP("udp4", nil, &net.UDPAddr{IP: b.v4.AsSlice(), Port: 5353})
		return err
	})
	defer conn.Close()
	send := func(p string) { _, _ = conn.Write([]byte(p)) }
	send("first")
	if err := nettest.Eventually(3*time.Second, func() error {
		if b.udp.count("first") == 0 {
			return errors.New("no")
		}
		return nil
	}); err != nil {
		t.Fatalf("the flow never reached b")
	}
	// b's reply makes the entry established.
	sendUDP(t, b.ns, a.v4, int(conn.LocalAddr().(*net.UDPAddr).Port), "reply")
	// b goes; a new pod d gets b's address on a new port, with its guard.
	nettest.Do(t, n.node, func() error { return bridge.DelVeth(b.hostName) })
	d := n.addPod(t, "d", 3, 9)
	send("while held")
	// Released into a policy that allows nobody in.
	rs := policyrules.Ruleset{Pods: []policyrules.Pod{{Port: a.port, IPs: a.ips()}, {Port: n.pods["c"].port, IPs: n.pods["c"].ips()}, {Port: d.port, IPs: d.ips(), Ingress: policyrules.Direction{Isolated: true}}}}
	res := n.apply(t, rs, Options{})
	if res.Released != 1 || res.Conntrack == 0 {
		t.Errorf("Apply: %+v, want d released and the old flow's entries removed", res)
	}
	send("after release")
	n.expectUDP(t, "control", n.node, d.v4, d, true)
	for _, p := range []string{"while held", "after release"} {
		if d.udp.count(p) != 0 {
			t.Errorf("the flow older than d reached it (%q)", p)
		}
	}
}

// bigAllow is a as a peer on TCP 8080 and n more prefixes of mixed sizes on TCP 8080 and 443
// (one in five IPv6), none of them covering the node's pods.
func bigAllow(a netip.Addr, n int) policyrules.Direction {
	d := allowFrom(tcp8080, a)
	rng := rand.New(rand.NewPCG(uint64(n), 1))
	for i := range n {
		var p netip.Prefix
		if i%5 == 4 {
			p = netip.PrefixFrom(netip.AddrFrom16([16]byte{0x20, 0x01, byte(rng.IntN(256)), byte(rng.IntN(256)), byte(rng.IntN(256)), byte(rng.IntN(256)), 15: byte(rng.IntN(256))}), 32+rng.IntN(97))
		} else {
			p = netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(20 + rng.IntN(180)), byte(rng.IntN(256)), byte(rng.IntN(256)), byte(rng.IntN(256))}), 16+rng.IntN(17))
		}
		ports := tcp8080
		if i%2 == 1 {
			ports = &policyrules.Ports{Protocol: policyrules.TCP, First: 443, Last: 443}
		}
		d.Allow = append(d.Allow, policyrules.Entry{Peer: policyrules.PrefixRange(p), Ports: ports})
	}
	return d
}

// TestBigGroup: a group of 50 000 ipBlock-like entries is built beside the other pods' groups, in
// transactions of at most maxElementsPerTransaction elements; it works and so do the others, and
// a verifying Apply finds it as built.
func TestBigGroup(t *testing.T) {
	n := newBridgedNode(t)
	a, b, c := n.pods["a"], n.pods["b"], n.pods["c"]
	big := bigAllow(a.v4, 50000)
	g, _ := canonical(big.Allow, maxGroupCost)
	rs := with(with(n.open(), b.port, big, policyrules.Direction{}), c.port, allowFrom(tcp8080, a.v4), policyrules.Direction{})
	res := n.apply(t, rs, Options{})
	if len(res.Refused) > 0 || res.NewGroups != 2 || res.Transactions < g.elements()/maxElementsPerTransaction {
		t.Errorf("Apply of a group of %d elements: %+v, want it built over at least %d transactions", g.elements(), res, g.elements()/maxElementsPerTransaction)
	}
	n.expectTCP(t, "a → b", a.ns, b.v4, 8080, true)
	n.expectTCP(t, "c → b", c.ns, b.v4, 8080, false)
	n.expectTCP(t, "a → c", a.ns, c.v4, 8080, true)
	n.expectTCP(t, "b → c", b.ns, c.v4, 8080, false)
	n.expectTCP(t, "c → a (open)", c.ns, a.v6, 8080, true)
	if again := n.apply(t, rs, Options{Verify: true}); again.Changed() {
		t.Errorf("verified Apply of the same ruleset changed something: %+v", again)
	}
}

// withAny adds peers allowed on every protocol and port to d.
func withAny(d policyrules.Direction, peers ...netip.Addr) policyrules.Direction {
	for _, p := range peers {
		d.Allow = append(d.Allow, policyrules.Entry{Peer: policyrules.Single(p)})
	}
	return d
}

// tooBig is an allow list whose group would cost the kernel more than maxGroupCost: IPv6 ranges
// that split into many prefixes each, and a on TCP 8080.
func tooBig(t *testing.T, a netip.Addr) policyrules.Direction {
	d := allowFrom(tcp8080, a)
	for i := range 600 {
		first := netip.AddrFrom16([16]byte{0x20, 0x01, 0, 0, byte(i >> 8), byte(i), 15: 1})
		last := netip.AddrFrom16([16]byte{0x20, 0x01, 0, 0, byte(i >> 8), byte(i), 6: 0xff, 7: 0xff, 8: 0xff, 9: 0xff, 10: 0xff, 11: 0xff, 12: 0xff, 13: 0xff, 14: 0xff, 15: 0xfe})
		d.Allow = append(d.Allow, policyrules.Entry{Peer: policyrules.Range{First: first, Last: last}, Ports: tcp8080})
	}
	if g, ok := canonical(d.Allow, maxGroupCost); ok && g.cost() <= maxGroupCost {
		t.Fatalf("tooBig costs %d, within the limit %d", g.cost(), maxGroupCost)
	}
	return d
}

// TestRefusedAllowList: an allow list over the limits is left out and everything else is
// applied. Its pod keeps the group it had, a pod that was open in that direction is denied in it
// (never left open), a new pod stays held in it; once the list is within the limits again it is
// installed, and no refused group leaves anything behind.
func TestRefusedAllowList(t *testing.T) {
	n := newBridgedNode(t)
	a, b, c := n.pods["a"], n.pods["b"], n.pods["c"]
	n.apply(t, with(n.open(), b.port, allowFrom(tcp8080, a.v4), policyrules.Direction{}), Options{})
	d := n.addPod(t, "d", 5, 5)

	rs := n.open()
	rs = with(rs, b.port, tooBig(t, a.v4), policyrules.Direction{})                         // had a group: keeps it
	rs = with(rs, c.port, tooBig(t, b.v4), policyrules.Direction{})                         // was open: denied
	rs = with(rs, d.port, tooBig(t, c.v4), policyrules.Direction{})                         // new: held for ingress
	rs = with(rs, a.port, withAny(allowFrom(tcp8080, b.v4), d.v4), policyrules.Direction{}) // a new group: installed
	res := n.apply(t, rs, Options{})
	refused := map[string]bool{}
	for _, r := range res.Refused {
		if !errors.Is(r.Err, policyrules.ErrTooBig) || !r.Ingress || len(r.Pods) != 1 {
			t.Errorf("refusal %+v, want one pod's ingress, too big", r)
		}
		refused[r.Pods[0]] = true
	}
	if len(res.Refused) != 3 || !refused["b"] || !refused["c"] || !refused["d"] || res.Released != 1 || res.NewGroups != 1 {
		t.Errorf("Apply with three lists too big: %+v, want b, c and d refused, d released, a's group new", res)
	}
	n.expectTCP(t, "b keeps its group: a → b", a.ns, b.v4, 8080, true)
	n.expectTCP(t, "b keeps its group: c → b", c.ns, b.v4, 8080, false)
	n.expectTCP(t, "c, open before, denied: b → c", b.ns, c.v4, 8080, false)
	n.expectTCP(t, "d held for ingress: c → d", c.ns, d.v4, 8080, false)
	// d gets no reply while its ingress is held: what it sends is seen arriving.
	n.expectUDP(t, "d released for egress: d → a", d.ns, a.v4, a, true)
	n.expectTCP(t, "a's new group: b → a", b.ns, a.v4, 8080, true)
	n.expectTCP(t, "a's new group: c → a", c.ns, a.v4, 8080, false)
	if left := n.unusedGroupObjects(t); len(left) > 0 {
		t.Errorf("group objects no port uses: %v", left)
	}

	rs = with(rs, b.port, allowFrom(tcp8080, c.v4), policyrules.Direction{})
	rs = with(rs, c.port, allowFrom(tcp8080, b.v4), policyrules.Direction{})
	rs = with(rs, d.port, allowFrom(tcp8080, c.v4), policyrules.Direction{})
	if res := n.apply(t, rs, Options{}); len(res.Refused) != 0 {
		t.Errorf("lists within the limits again: refused %v", res.Refused)
	}
	n.expectTCP(t, "b's new list: c → b", c.ns, b.v4, 8080, true)
	n.expectTCP(t, "b's new list: a → b", a.ns, b.v4, 8080, false)
	n.expectTCP(t, "c's list: b → c", b.ns, c.v4, 8080, true)
	n.expectTCP(t, "d's list: c → d", c.ns, d.v4, 8080, true)
}

// TestKernelRefusedGroup: a group the kernel refuses (here: a chain of its name is already there,
// the drop chain its rules go to jumps to it, and a base chain to the drop chain: the kernel
// refuses the loop, which a base chain reaches, with EMLINK) is refused alone,
// whether it shared its transaction with other groups or was built over transactions of its own
// (whose sets are then removed); every other group is installed, the pass reports the refusal
// rather than failing, and the next Apply installs it.
func TestKernelRefusedGroup(t *testing.T) {
	n := newBridgedNode(t)
	a, b, c := n.pods["a"], n.pods["b"], n.pods["c"]
	n.apply(t, n.open(), Options{})
	for _, tc := range []struct {
		name   string
		forB   policyrules.Direction
		capped int
	}{
		{"small group sharing its transaction", allowFrom(tcp8080, a.v4), 0},
		{"big group over transactions of its own", bigAllow(a.v4, 5000), 1000},
	} {
		g, _ := canonical(tc.forB.Allow, maxGroupCost)
		group := g.name(ingressDir)
		const base = "test-base"
		nftIn(t, n.node, "add", "chain", "bridge", TableName(n.network), group)
		nftIn(t, n.node, "add", "rule", "bridge", TableName(n.network), ChainDropIngress, "jump", group)
		nftIn(t, n.node, "add", "chain", "bridge", TableName(n.network), base, "{ type filter hook input priority 0; }")
		nftIn(t, n.node, "add", "rule", "bridge", TableName(n.network), base, "meta", "mark", "0x12345", "jump", ChainDropIngress)
		rs := with(with(n.open(), b.port, tc.forB, policyrules.Direction{}), c.port, allowFrom(tcp8080, c.v6, a.v4), policyrules.Direction{})
		res := n.apply(t, rs, Options{transactionElements: tc.capped})
		if len(res.Refused) != 1 || res.Refused[0].Group != group || !errors.Is(res.Refused[0].Err, unix.EMLINK) || res.Refused[0].Pods[0] != "b" {
			t.Fatalf("%s: refused %+v, want b's group %s, by the kernel", tc.name, res.Refused, group)
		}
		nftIn(t, n.node, "flush", "chain", "bridge", TableName(n.network), base)
		nftIn(t, n.node, "delete", "chain", "bridge", TableName(n.network), base)
		n.expectTCP(t, tc.name+": b, open before, denied: a → b", a.ns, b.v4, 8080, false)
		n.expectTCP(t, tc.name+": c's group installed: a → c", a.ns, c.v4, 8080, true)
		n.expectTCP(t, tc.name+": c's group installed: b → c", b.ns, c.v4, 8080, false)
		if left := n.unusedGroupObjects(t); len(left) > 0 {
			t.Errorf("%s: group objects no port uses: %v", tc.name, left)
		}
		if res := n.apply(t, rs, Options{transactionElements: tc.capped}); len(res.Refused) != 0 || res.NewGroups != 1 {
			t.Errorf("%s: Apply after the loop went: %+v", tc.name, res)
		}
		n.expectTCP(t, tc.name+": b's group: a → b", a.ns, b.v4, 8080, true)
		n.expectTCP(t, tc.name+": b's group: c → b", c.ns, b.v4, 8080, false)
		n.apply(t, n.open(), Options{})
	}
}

// TestForgetWhileAPassRemoves: a DEL's Forget reads a port's elements, and the agent's pass
// removes them before Forget's delete is sent (the pod is gone from its ruleset). The kernel
// refuses a transaction that deletes a missing element (ENOENT); Forget must read again and
// finish, with the elements gone, or the DEL fails.
func TestForgetWhileAPassRemoves(t *testing.T) {
	n := newBridgedNode(t)
	a, b := n.pods["a"], n.pods["b"]
	n.apply(t, n.open(), Options{})
	withoutB := n.open()
	withoutB.Pods = slices.DeleteFunc(withoutB.Pods, func(p policyrules.Pod) bool { return p.Port == b.port })
	passes := 0
	nettest.Do(t, n.node, func() error {
		return forget(n.network, []int{b.port}, func() {
			if passes++; passes == 1 {
				if _, err := Apply(n.network, withoutB, Options{}); err != nil {
					t.Errorf("the concurrent pass: %v", err)
				}
			}
		})
	})
	if passes != 1 {
		t.Errorf("Forget read %d times before its delete, want 1 (the pass removed everything it read)", passes)
	}
	if d := groupNames(t, n); d[MapEgress][b.port] != "" || d[MapIngress][b.port] != "" || d[MapIngress][a.port] == "" {
		t.Errorf("after Forget of b: %v", d)
	}
}

// TestForgetAndRemove: Forget drops a port's elements (its pod is held again), Remove and
// Unguard leave nothing behind.
func TestForgetAndRemove(t *testing.T) {
	n := newBridgedNode(t)
	a, b := n.pods["a"], n.pods["b"]
	n.apply(t, n.open(), Options{})
	n.expectTCP(t, "a → b", a.ns, b.v4, 8080, true)
	nettest.Do(t, n.node, func() error { return Forget(n.network, []int{b.port, 999999}) })
	if d := groupNames(t, n); d[MapEgress][b.port] != "" || d[MapIngress][b.port] != "" || d[MapIngress][a.port] == "" {
		t.Errorf("after Forget of b: %v", d)
	}
	nettest.Do(t, n.node, func() error {
		src, err := Sources(n.network)
		if err == nil && (len(src[b.port]) != 0 || len(src[a.port]) != 3) {
			err = fmt.Errorf("source sets after Forget of b: %v, want a's three addresses and none of b's", src)
		}
		return err
	})
	n.expectTCP(t, "a → forgotten b", a.ns, b.v4, 8080, false)
	var ports []int
	for _, p := range n.pods {
		ports = append(ports, p.port)
	}
	nettest.Do(t, n.node, func() error {
		if err := Remove(n.network); err != nil {
			return err
		}
		if err := Remove(n.network); err != nil {
			return err
		}
		return Unguard(n.bridge, ports)
	})
	n.expectTCP(t, "no policy at all: a → b", a.ns, b.v4, 8080, true)
	nettest.Do(t, n.node, func() error {
		for _, p := range append(ports, n.bridge) {
			if err := CheckPortGuard(p); !IsGuardMissing(err) {
				return fmt.Errorf("guard of %d after Unguard: %v", p, err)
			}
		}
		out, err := exec.Command("nft", "list", "tables").CombinedOutput()
		if strings.Contains(string(out), TableName(n.network)) || err != nil {
			return fmt.Errorf("tables after Remove: %s %v", out, err)
		}
		return nil
	})
}

// TestOldLayoutReplaced: the inet table of the pending-set layout (kubenet before the guards),
// whose forward chain dropped pending addresses, is replaced as a whole by the first Apply: no
// chain of it keeps filtering.
func TestOldLayoutReplaced(t *testing.T) {
	n := newBridgedNode(t)
	a, b := n.pods["a"], n.pods["b"]
	table := TableName(n.network)
	nftIn(t, n.node, "add", "table", "inet", table)
	nftIn(t, n.node, "add", "chain", "inet", table, "forward", "{ type filter hook forward priority 0; policy accept; }")
	nftIn(t, n.node, "add", "set", "inet", table, "pending-ipv4", "{ type ipv4_addr; }")
	nftIn(t, n.node, "add", "element", "inet", table, "pending-ipv4", "{ "+b.v4.String()+" }")
	nftIn(t, n.node, "add", "rule", "inet", table, "forward", "ip daddr @pending-ipv4 drop")
	res := n.apply(t, n.open(), Options{})
	if !res.FixedWritten {
		t.Errorf("Apply over the old layout: %+v", res)
	}
	n.expectTCP(t, "a → b (pending in the old layout)", a.ns, b.v4, 8080, true)
	nettest.Do(t, n.node, func() error {
		out, err := exec.Command("nft", "list", "table", "inet", table).CombinedOutput()
		if err != nil || strings.Contains(string(out), "pending") || strings.Contains(string(out), "hook forward") {
			return fmt.Errorf("the old layout survived: %v\n%s", err, out)
		}
		return nil
	})
}

// icmpReceiver keeps the ICMP or ICMPv6 messages a namespace receives on a raw socket, as the
// socket hands them over (IPv4: with the IP header; IPv6: from the ICMPv6 header on).
type icmpReceiver struct {
	mu   sync.Mutex
	seen []string
}

func startICMPReceiver(t *testing.T, n ns.NetNS, ipv6 bool) *icmpReceiver {
	t.Helper()
	r := &icmpReceiver{}
	family, proto := unix.AF_INET, unix.IPPROTO_ICMP
	if ipv6 {
		family, proto = unix.AF_INET6, unix.IPPROTO_ICMPV6
	}
	var fd int
	nettest.Do(t, n, func() (err error) {
		fd, err = unix.Socket(family, unix.SOCK_RAW, proto)
		return err
	})
	t.Cleanup(func() { _ = unix.Close(fd) })
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 200000})
	done := make(chan struct{})
	t.Cleanup(func() { close(done) })
	go func() {
		buf := make([]byte, 2048)
		for {
			select {
			case <-done:
				return
			default:
			}
			nr, _, err := unix.Recvfrom(fd, buf, 0)
			if err != nil || nr < 8 {
				continue
			}
			r.mu.Lock()
			r.seen = append(r.seen, string(buf[:nr]))
			r.mu.Unlock()
		}
	}()
	return r
}

// count tells how many messages match.
func (r *icmpReceiver) count(match func(msg string) bool) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, m := range r.seen {
		if match(m) {
			n++
		}
	}
	return n
}

// icmp6Receiver counts the ICMPv6 messages of a namespace whose body is a marker, by type.
type icmp6Receiver struct{ *icmpReceiver }

func startICMP6Receiver(t *testing.T, n ns.NetNS) icmp6Receiver {
	return icmp6Receiver{startICMPReceiver(t, n, true)}
}

func (r icmp6Receiver) count(typ byte, marker string) int {
	return r.icmpReceiver.count(func(m string) bool { return m[0] == typ && strings.TrimRight(m[8:], "\x00") == marker })
}

// sendICMP6 sends an ICMPv6 message of type typ with hop limit 255 and marker as its body from
// inside n to dst.
func sendICMP6(t *testing.T, n ns.NetNS, dst netip.Addr, typ byte, marker string) {
	t.Helper()
	nettest.Do(t, n, func() error {
		fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_RAW, unix.IPPROTO_ICMPV6)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_UNICAST_HOPS, 255); err != nil {
			return err
		}
		msg := append([]byte{typ, 0, 0, 0, 0, 0, 0, 0}, marker...)
		sa := &unix.SockaddrInet6{Addr: dst.As16()}
		if dst.IsLinkLocalUnicast() {
			l, err := netlink.LinkByName("eth0")
			if err != nil {
				return err
			}
			sa.ZoneId = uint32(l.Attrs().Index)
		}
		return unix.Sendto(fd, msg, 0, sa)
	})
}

// TestRoutedNeighbourDiscovery: ICMPv6 of the neighbour-discovery types is exempt from the
// policies only on the pods' link; sent through the node to or from another host, even with a hop
// limit of 255 at the sender, it is judged like any other packet.
func TestRoutedNeighbourDiscovery(t *testing.T) {
	n := newBridgedNode(t)
	a, b := n.pods["a"], n.pods["b"]
	atB, atX := startICMP6Receiver(t, b.ns), startICMP6Receiver(t, n.x)
	deny := policyrules.Direction{Isolated: true}
	// x6 is the outside host's address.
	x6 := netip.MustParseAddr("fd00:4::2")
	for _, c := range []struct {
		name     string
		rs       policyrules.Ruleset
		from     ns.NetNS
		to       netip.Addr
		at       icmp6Receiver
		typ      byte
		received bool
	}{
		{"x → b, b open (control)", n.open(), n.x, b.v6, atB, 135, true},
		{"x → b, b denies ingress", with(n.open(), b.port, deny, policyrules.Direction{}), n.x, b.v6, atB, 135, false},
		{"x → b: router advertisement", with(n.open(), b.port, deny, policyrules.Direction{}), n.x, b.v6, atB, 134, false},
		{"x → b: redirect", with(n.open(), b.port, deny, policyrules.Direction{}), n.x, b.v6, atB, 137, false},
		{"a → x, a open (control)", n.open(), a.ns, x6, atX, 135, true},
		{"a → x, a denies egress", with(n.open(), a.port, policyrules.Direction{}, deny), a.ns, x6, atX, 135, false},
		{"a → x: neighbour advertisement", with(n.open(), a.port, policyrules.Direction{}, deny), a.ns, x6, atX, 136, false},
		{"a → b on the link: exempt", with(with(n.open(), a.port, policyrules.Direction{}, deny), b.port, deny, policyrules.Direction{}), a.ns, b.v6, atB, 135, true},
		{"a → b link-local: exempt", with(with(n.open(), a.port, policyrules.Direction{}, deny), b.port, deny, policyrules.Direction{}), a.ns, b.ll, atB, 136, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			n.apply(t, c.rs, Options{})
			marker := fmt.Sprintf("nd-%d", time.Now().UnixNano())
			if c.received {
				if err := nettest.Eventually(3*time.Second, func() error {
					sendICMP6(t, c.from, c.to, c.typ, marker)
					if c.at.count(c.typ, marker) == 0 {
						return errors.New("not received")
					}
					return nil
				}); err != nil {
					t.Errorf("type %d to %s: %v", c.typ, c.to, err)
				}
				return
			}
			// Denied: an echo request on the same path after it shows the path works for the
			// node's control, so a missing message is the policy's doing.
			for range 3 {
				sendICMP6(t, c.from, c.to, c.typ, marker)
			}
			control := marker + "-control"
			if err := nettest.Eventually(3*time.Second, func() error {
				sendICMP6(t, n.node, c.to, 128, control)
				if c.at.count(128, control) == 0 {
					return errors.New("control not received")
				}
				return nil
			}); err != nil {
				t.Fatalf("the node's control echo to %s: %v", c.to, err)
			}
			if got := c.at.count(c.typ, marker); got != 0 {
				t.Errorf("type %d to %s received %d times, want dropped", c.typ, c.to, got)
			}
		})
	}
}

// TestRoutedFragments: a datagram routed to a pod is cut into fragments after the node's IP
// hooks, so the bridge sees fragments; an allowed one arrives whole, a denied one not at all.
func TestRoutedFragments(t *testing.T) {
	n := newBridgedNode(t)
	b := n.pods["b"]
	udp := &policyrules.Ports{Protocol: policyrules.UDP, First: 5353, Last: 5353}
	// x may reach b on UDP 5353 on IPv4 only.
	n.apply(t, with(n.open(), b.port, allowFrom(udp, x4), policyrules.Direction{}), Options{})
	big := strings.Repeat("f", 3000) // more than the bridge's MTU: fragmented on the way to b
	for _, c := range []struct {
		name string
		to   netip.Addr
		want bool
	}{
		{"x → b IPv4, allowed", b.v4, true},
		{"x → b IPv6, denied", b.v6, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			payload := fmt.Sprintf("%s-%d-%s", c.name, time.Now().UnixNano(), big)
			if c.want {
				if err := nettest.Eventually(3*time.Second, func() error {
					sendUDP(t, n.x, c.to, 5353, payload)
					if b.udp.count(payload) == 0 {
						return errors.New("not received")
					}
					return nil
				}); err != nil {
					t.Errorf("a fragmented datagram to %s: %v", c.to, err)
				}
				return
			}
			sendUDP(t, n.x, c.to, 5353, payload)
			n.expectUDP(t, c.name+" (small, after the big one)", n.x, c.to, b, false)
			if b.udp.count(payload) != 0 {
				t.Errorf("the fragmented datagram to %s arrived, want it denied", c.to)
			}
		})
	}
}

// TestCutDenied: a connection that a policy change denies keeps flowing without CutDenied (the
// API's default) and stops at its next packet with it; a connection the change still allows
// keeps flowing either way, and so does the node's own.
func TestCutDenied(t *testing.T) {
	for _, cut := range []bool{false, true} {
		t.Run(fmt.Sprintf("cut=%v", cut), func(t *testing.T) {
			n := newBridgedNode(t)
			a, b, c := n.pods["a"], n.pods["b"], n.pods["c"]
			n.apply(t, n.open(), Options{})
			at := func(a netip.Addr) netip.AddrPort { return netip.AddrPortFrom(a, 8080) }
			denied, allowed, fromNode := nettest.OpenSession(t, a.ns, at(b.v4), 3*time.Second), nettest.OpenSession(t, c.ns, at(b.v6), 3*time.Second), nettest.OpenSession(t, n.node, at(b.v4), 3*time.Second)
			for _, s := range []*nettest.Session{denied, allowed, fromNode} {
				if !s.RoundTrip("before", 3*time.Second) {
					t.Fatalf("%s: no echo before the change", s.Conn.LocalAddr())
				}
			}
			rs := with(n.open(), b.port, allowFrom(tcp8080, c.ips()...), policyrules.Direction{})
			applied := n.apply(t, rs, Options{})
			var removed uint
			if cut {
				nettest.Do(t, n.node, func() (err error) {
					removed, err = CutDenied(rs, applied, []netip.Addr{gw4.Addr(), gw6.Addr()})
					return err
				})
				if removed == 0 {
					t.Errorf("CutDenied removed no entry")
				}
			}
			if got := denied.RoundTrip("after", 2*time.Second); got == cut {
				t.Errorf("a → b (now denied) after the change: echo %v, want %v", got, !cut)
			}
			if !allowed.RoundTrip("after", 3*time.Second) {
				t.Errorf("c → b (still allowed): no echo after the change")
			}
			if !fromNode.RoundTrip("after", 3*time.Second) {
				t.Errorf("node → b: no echo after the change")
			}
			n.expectTCP(t, "new connection a → b", a.ns, b.v4, 8080, false)
			if cut {
				// Strict mode turned off: the agent clears the marks, and the connection the
				// policy denies flows again, as established connections do without it.
				nettest.Do(t, n.node, func() error { return ClearCuts() })
				if !denied.Catches("cleared", 5*time.Second) {
					t.Errorf("a → b after ClearCuts: the cut connection still does not flow")
				}
				n.expectTCP(t, "new connection a → b after ClearCuts", a.ns, b.v4, 8080, false)
			}
		})
	}
}

// TestCutDeniedKeepsStaged: strict mode never cuts a connection that only staged (audit)
// policies would drop: they change no verdict, of new connections or of established ones.
func TestCutDeniedKeepsStaged(t *testing.T) {
	n := newBridgedNode(t)
	a, b := n.pods["a"], n.pods["b"]
	n.apply(t, n.open(), Options{})
	sessions := []*nettest.Session{
		nettest.OpenSession(t, a.ns, netip.AddrPortFrom(b.v4, 8080), 3*time.Second), // b's staged ingress would drop it
		nettest.OpenSession(t, b.ns, netip.AddrPortFrom(a.v6, 8080), 3*time.Second), // b's staged egress would drop it
	}
	for _, s := range sessions {
		if !s.RoundTrip("before", 3*time.Second) {
			t.Fatalf("%s: no echo before the change", s.Conn.LocalAddr())
		}
	}
	stagedDeny := policyrules.Direction{Isolated: true, Audit: true}
	rs := with(n.open(), b.port, stagedDeny, stagedDeny)
	applied := n.apply(t, rs, Options{})
	var cut uint
	nettest.Do(t, n.node, func() (err error) {
		cut, err = CutDenied(rs, applied, []netip.Addr{gw4.Addr(), gw6.Addr()})
		return err
	})
	if cut != 0 {
		t.Errorf("CutDenied cut %d entries that only staged policies would drop", cut)
	}
	for _, s := range sessions {
		if !s.RoundTrip("after", 3*time.Second) {
			t.Errorf("%s: no echo after staging a deny-all on b", s.Conn.LocalAddr())
		}
	}
}

// TestAuditGroupsPass: a direction isolated only by audit policies passes everything, what its
// list allows and what it does not, on every family, for pods and the outside host; the same
// list enforced drops what it does not allow.
func TestAuditGroupsPass(t *testing.T) {
	n := newBridgedNode(t)
	a, b, c := n.pods["a"], n.pods["b"], n.pods["c"]
	staged := allowFrom(tcp8080, c.ips()...)
	staged.Audit = true
	stagedDeny := policyrules.Direction{Isolated: true, Audit: true}
	rs := with(n.open(), b.port, staged, stagedDeny)
	n.apply(t, rs, Options{Log: policyrules.DropLog{Group: 28, Rate: 100, Burst: 100}})
	lc := n.readDropLog(t, 28)
	for _, dst := range []netip.Addr{b.v4, b.v6} {
		n.expectTCP(t, "audit: c → b (allowed by the staged policy)", c.ns, dst, 8080, true)
		n.expectTCP(t, "audit: a → b (the staged policy would drop it)", a.ns, dst, 8080, true)
		n.expectTCP(t, "audit: x → b", n.x, dst, 8080, true)
	}
	n.expectTCP(t, "audit: b → a (staged deny-all egress)", b.ns, a.v4, 8080, true)
	n.expectTCP(t, "audit: b → x", b.ns, x4, 9000, true)
	// What the staged policies would drop is counted on b's port, as audit, and logged as such;
	// what they allow (c → b) is not.
	counts, _ := n.dropCounts(t)
	for _, ingress := range []bool{true, false} {
		if d := counts[dropKey{b.port, ingress}]; !d.Audit || d.Packets == 0 {
			t.Errorf("b's counter (ingress %v): %+v, want an audit count of what was passed", ingress, d)
		}
	}
	wouldDrop := func(d policyrules.Drop) bool {
		return d.Audit && d.Ingress && d.Port == b.port && d.Src == a.v4 && d.DstPort == 8080
	}
	if err := nettest.Eventually(time.Second, func() error {
		if _, k := lc.find(wouldDrop); k == 0 {
			return errors.New("a → b not in the drop log as audit within 1 s")
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
	if _, k := lc.find(func(d policyrules.Drop) bool { return d.Src == c.v4 || !d.Audit }); k != 0 {
		t.Errorf("%d log entries of allowed traffic (c → b) or not audit, want none", k)
	}
	in := n.inspect(t)
	for _, chain := range []string{in.Ports[b.port].Ingress, in.Ports[b.port].Egress} {
		if g := in.Groups[chain]; !g.Audit || len(g.Damage) > 0 {
			t.Errorf("inspect: b's group %s: audit %v, damage %v; want an undamaged audit group", chain, g.Audit, g.Damage)
		}
	}
	v, err := in.Trace(policyrules.Packet{Src: a.v4, Dst: b.v4, Protocol: policyrules.TCP, Port: 8080}, a.port, b.port)
	if err != nil || !v.Allowed || !strings.Contains(v.Steps[len(v.Steps)-1].Reason, "would drop") {
		t.Errorf("trace a → b: %+v, %v; want allowed, by an audit group that would drop it", v, err)
	}
	enforced := allowFrom(tcp8080, c.ips()...)
	n.apply(t, with(n.open(), b.port, enforced, policyrules.Direction{Isolated: true}), Options{})
	n.expectTCP(t, "enforced: c → b", c.ns, b.v4, 8080, true)
	n.expectTCP(t, "enforced: a → b", a.ns, b.v4, 8080, false)
	n.expectTCP(t, "enforced: b → a", b.ns, a.v4, 8080, false)
	counts, _ = n.dropCounts(t)
	if d := counts[dropKey{b.port, true}]; d.Audit || d.Packets == 0 {
		t.Errorf("b's ingress counter once enforced: %+v, want a count of real drops, apart from the audit one", d)
	}
	if again := n.apply(t, rs, Options{Verify: true}); again.NewGroups == 0 {
		t.Errorf("back to the staged lists: no group made (%+v); the enforced ones were reused", again)
	}
	n.expectTCP(t, "audit again: a → b", a.ns, b.v4, 8080, true)
}

// connPair is one TCP connection whose both ends the test holds: the client's in one pod, the
// server's in another.
type connPair struct{ client, server net.Conn }

func openPair(t *testing.T, from, to *testPod, port uint16) connPair {
	t.Helper()
	var l net.Listener
	nettest.Do(t, to.ns, func() (err error) {
		l, err = net.Listen("tcp", netip.AddrPortFrom(to.v4, port).String())
		return err
	})
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err == nil {
			accepted <- c
		}
		close(accepted)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	client, err := nettest.DialIn(from.ns)(ctx, "tcp", netip.AddrPortFrom(to.v4, port).String())
	if err != nil {
		t.Fatalf("connect %s → %s:%d: %v", from.name, to.name, port, err)
	}
	server := <-accepted
	if server == nil {
		t.Fatalf("%s:%d accepted nothing", to.name, port)
	}
	t.Cleanup(func() { _ = client.Close(); _ = server.Close() })
	return connPair{client, server}
}

// carries tells whether a line written on from arrives on to within wait.
func carries(from, to net.Conn, line string, wait time.Duration) bool {
	_ = from.SetWriteDeadline(time.Now().Add(wait))
	if _, err := fmt.Fprintln(from, line); err != nil {
		return false
	}
	_ = to.SetReadDeadline(time.Now().Add(wait))
	got, err := bufio.NewReader(to).ReadString('\n')
	return err == nil && got == line+"\n"
}

// TestCutDeniedWhicheverEndSendsFirst: a cut connection stays cut whichever end sends next. With
// the kernel's default nf_conntrack_tcp_loose, a mid-stream segment without an entry starts a new
// one in the direction it travels, and the policies judge it as a connection of its sender: a
// server whose egress and client whose ingress are open would take the denied connection back
// up by sending first, and the client's segments would then pass as its replies.
func TestCutDeniedWhicheverEndSendsFirst(t *testing.T) {
	n := newBridgedNode(t)
	a, b := n.pods["a"], n.pods["b"]
	n.apply(t, n.open(), Options{})
	c := openPair(t, a, b, 9100)
	if !carries(c.client, c.server, "before", 3*time.Second) || !carries(c.server, c.client, "before", 3*time.Second) {
		t.Fatal("no traffic before the change")
	}
	rs := with(n.open(), b.port, allowFrom(tcp8080, n.pods["c"].ips()...), policyrules.Direction{})
	applied := n.apply(t, rs, Options{})
	nettest.Do(t, n.node, func() error {
		removed, err := CutDenied(rs, applied, []netip.Addr{gw4.Addr(), gw6.Addr()})
		if err == nil && removed == 0 {
			err = fmt.Errorf("CutDenied removed no entry")
		}
		return err
	})
	if carries(c.server, c.client, "server first", 2*time.Second) {
		t.Errorf("b → a on a → b's cut connection: the server's segment reached the client")
	}
	if carries(c.client, c.server, "client then", 2*time.Second) {
		t.Errorf("a → b on the cut connection after b sent: the client's segment reached the server")
	}
}

// TestSinglePeers: single peers are elements of the hash sets (hosts: an address on every port;
// points: an address on one protocol and port), and the kernel judges by address, protocol and
// port through them, in both families: a point on TCP 8080 lets nothing else of its peer through,
// a point on UDP 5353 no TCP, a host everything of its peer and nothing of another address.
func TestSinglePeers(t *testing.T) {
	n := newBridgedNode(t)
	a, b, c := n.pods["a"], n.pods["b"], n.pods["c"]
	udp5353 := &policyrules.Ports{Protocol: policyrules.UDP, First: 5353, Last: 5353}
	allow := []policyrules.Entry{
		{Peer: policyrules.Single(a.v4), Ports: tcp8080},
		{Peer: policyrules.Single(a.v6), Ports: tcp8080},
		{Peer: policyrules.Single(c.v4), Ports: udp5353},
		{Peer: policyrules.Single(x4)},
	}
	rs := with(n.open(), b.port, policyrules.Direction{Isolated: true, Allow: allow}, policyrules.Direction{})
	n.apply(t, rs, Options{})
	in := n.inspect(t)
	g := in.Groups[in.Ports[b.port].Ingress]
	for _, kind := range []string{"-hosts-ipv4", "-points-ipv4", "-points-ipv6"} {
		n.groupSet(t, g.Name, kind) // fatal without it
	}
	if slices.ContainsFunc(g.Sets, func(s string) bool { return strings.Contains(s, "-ports-") || strings.Contains(s, "-any-") }) {
		t.Errorf("b's group of single peers looks up interval sets: %v", g.Sets)
	}
	if len(g.Damage) > 0 {
		t.Errorf("b's group read back with damage: %v", g.Damage)
	}
	n.expectTCP(t, "point tcp/8080: a → b", a.ns, b.v4, 8080, true)
	n.expectTCP(t, "point tcp/8080: a → b v6", a.ns, b.v6, 8080, true)
	n.expectUDP(t, "point tcp/8080: a → b udp/5353", a.ns, b.v4, b, false)
	n.expectUDP(t, "point udp/5353: c → b", c.ns, b.v4, b, true)
	n.expectTCP(t, "point udp/5353: c → b tcp/8080", c.ns, b.v4, 8080, false)
	n.expectTCP(t, "point udp/5353: c → b v6 tcp/8080", c.ns, b.v6, 8080, false)
	n.expectTCP(t, "host: x → b tcp/8080", n.x, b.v4, 8080, true)
	n.expectUDP(t, "host: x → b udp/5353", n.x, b.v4, b, true)

	// a leaves (its point deleted from the hash set), c gets every port.
	rs = with(rs, b.port, policyrules.Direction{Isolated: true, Allow: []policyrules.Entry{{Peer: policyrules.Single(c.v4)}, {Peer: policyrules.Single(x4)}}}, policyrules.Direction{})
	if res := n.apply(t, rs, Options{}); res.EditedGroups != 1 {
		t.Errorf("b's single peers changed: %+v, want the group edited in place", res)
	}
	n.expectTCP(t, "left: a → b", a.ns, b.v4, 8080, false)
	n.expectTCP(t, "left: a → b v6", a.ns, b.v6, 8080, false)
	n.expectTCP(t, "host now: c → b tcp/8080", c.ns, b.v4, 8080, true)
	n.expectTCP(t, "host kept: x → b tcp/8080", n.x, b.v4, 8080, true)
	if d := n.inspect(t).Groups[n.ingressGroup(t, b.port).chain].Damage; len(d) > 0 {
		t.Errorf("after the edit: damage %v", d)
	}
}
