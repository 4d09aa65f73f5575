package cni

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kubenet-dev/kubenet/test/testkit"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/kubenet-dev/kubenet/core"
	"github.com/kubenet-dev/kubenet/hostport"
	"github.com/kubenet-dev/kubenet/internal/ipnet"
	"github.com/kubenet-dev/kubenet/isolation"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

// hpMapping is one portMappings entry as a runtime sends it.
type hpMapping struct {
	host, container int
	proto, hostIP   string
}

// hpArgs renders mappings as the portMappings capability: with containerd's keys (go-cni's
// structs have no JSON tags, so HostPort, ContainerPort, Protocol and an always present HostIP)
// or with CRI-O's and podman's (hostPort, ..., hostIP only when set).
func hpArgs(containerd bool, ms ...hpMapping) map[string]any {
	list := []map[string]any{}
	for _, m := range ms {
		if containerd {
			list = append(list, map[string]any{"HostPort": m.host, "ContainerPort": m.container, "Protocol": m.proto, "HostIP": m.hostIP})
			continue
		}
		e := map[string]any{"hostPort": m.host, "containerPort": m.container, "protocol": m.proto}
		if m.hostIP != "" {
			e["hostIP"] = m.hostIP
		}
		list = append(list, e)
	}
	return map[string]any{"portMappings": list}
}

// hpNode is a dual-stack node, plus a "non-local" destination for each family: an address on
// the peer host that the external host routes through the node. Traffic to it passes the node
// and must never be DNATed, whatever its port.
func hpNode(t *testing.T) (*nettest.Node, *libcni.NetworkConfigList, map[bool]netip.Addr) {
	t.Helper()
	node := nettest.NewNode(t, binDir)
	list := node.ConfList(t, nettest.NetConf{
		PodCIDRs:           testkit.DualStack(),
		NonMasqueradeCIDRs: []netip.Prefix{nettest.NonMasquerade4, nettest.NonMasquerade6},
	})
	nonLocal := map[bool]netip.Addr{false: netip.MustParseAddr("203.0.113.5"), true: netip.MustParseAddr("2001:db8:f::5")}
	nettest.Do(t, node.Peer, func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		for _, a := range nonLocal {
			if err := netlink.AddrAdd(lo, &netlink.Addr{IPNet: ipnet.FromPrefix(netip.PrefixFrom(a, a.BitLen()))}); err != nil {
				return err
			}
		}
		return nil
	})
	nettest.AddRoute(t, node.Peer, nettest.NodeUplink4.Masked(), nettest.NodePeerLink4.Addr())
	nettest.AddRoute(t, node.Peer, nettest.NodeUplink6.Masked(), nettest.NodePeerLink6.Addr())
	nettest.AddRoute(t, node.NS, netip.MustParsePrefix("203.0.113.0/24"), nettest.Peer4.Addr())
	nettest.AddRoute(t, node.NS, netip.MustParsePrefix("2001:db8:f::/64"), nettest.Peer6.Addr())
	nettest.AddRoute(t, node.External, netip.MustParsePrefix("203.0.113.0/24"), nettest.NodeUplink4.Addr())
	nettest.AddRoute(t, node.External, netip.MustParsePrefix("2001:db8:f::/64"), nettest.NodeUplink6.Addr())
	return node, list, nonLocal
}

// hpRequest sends payload over proto from inside n to dst and returns the echo.
func hpRequest(proto string, n ns.NetNS, dst netip.AddrPort, payload string, timeout time.Duration) (nettest.Reply, error) {
	if proto == "udp" {
		return nettest.UDPRequest(n, dst, payload, timeout)
	}
	return nettest.TCPRequest(n, dst, payload, timeout)
}

// expectNotReached checks that a request did not reach the pod: for TCP the node itself refused
// it (nothing translated it), for UDP the pod's server never saw the payload.
func expectNotReached(t testing.TB, proto string, src ns.NetNS, dst netip.AddrPort, pod *nettest.EchoServer, payload string) {
	t.Helper()
	r, err := hpRequest(proto, src, dst, payload, testkit.UnreachableTimeout)
	if err == nil {
		t.Errorf("%s to %s was answered (%+v), want it not to reach the pod", proto, dst, r)
		return
	}
	if proto == "tcp" && !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("TCP to %s: %v, want connection refused by the node", dst, err)
	}
	if proto == "udp" && pod.Received(payload) > 0 {
		t.Errorf("UDP to %s reached the pod", dst)
	}
}

// TestHostPortReachability: a pod's TCP and UDP host ports, IPv4 and IPv6, on any local address
// and on one hostIP, reached from another host, from the node itself, from 127.0.0.1 on the
// node and from the pod itself; kept apart from addresses that are not the node's.
func TestHostPortReachability(t *testing.T) {
	node, list, nonLocal := hpNode(t)
	pod := node.NewPod(t, "hp-reach")
	uplink := map[bool]netip.Addr{false: nettest.NodeUplink4.Addr(), true: nettest.NodeUplink6.Addr()}
	pod.RT.CapabilityArgs = hpArgs(true,
		hpMapping{30080, 8080, "TCP", ""},
		hpMapping{30081, 8081, "UDP", ""},
		hpMapping{30082, 8080, "tcp", uplink[false].String()},
		hpMapping{30082, 8080, "tcp", uplink[true].String()},
		hpMapping{30083, 8081, "udp", uplink[false].String()},
		hpMapping{30083, 8081, "udp", uplink[true].String()},
		hpMapping{30084, 9000, "SCTP", ""},
	)
	node.MustAdd(t, list, pod)
	servers := map[string]*nettest.EchoServer{
		"tcp": nettest.StartTCPEcho(t, pod.NS, netip.AddrPortFrom(netip.IPv6Unspecified(), 8080)),
		"udp": nettest.StartUDPEcho(t, pod.NS, netip.AddrPortFrom(netip.IPv6Unspecified(), 8081)),
	}
	if got := testkit.Sysctl(t, node.NS, "net/ipv4/conf/cbr0/route_localnet"); got != "1" {
		t.Errorf("route_localnet on the bridge = %s, want 1 (localhost access)", got)
	}

	external := map[bool]netip.Addr{false: nettest.External4.Addr(), true: nettest.External6.Addr()}
	peer := map[bool]netip.Addr{false: nettest.Peer4.Addr(), true: nettest.Peer6.Addr()}
	peerLink := map[bool]netip.Addr{false: nettest.NodePeerLink4.Addr(), true: nettest.NodePeerLink6.Addr()}
	gateway := map[bool]netip.Addr{false: testkit.GatewayOf(nettest.PodCIDR4), true: testkit.GatewayOf(nettest.PodCIDR6)}

	type source struct {
		name string
		from ns.NetNS
		to   netip.Addr
		// want is the source address the pod must see; invalid: the mapping must not apply.
		want netip.Addr
	}
	for _, tc := range []struct {
		proto    string
		is6      bool
		hostPort uint16
		specific bool
	}{
		{"tcp", false, 30080, false}, {"tcp", true, 30080, false},
		{"udp", false, 30081, false}, {"udp", true, 30081, false},
		{"tcp", false, 30082, true}, {"tcp", true, 30082, true},
		{"udp", false, 30083, true}, {"udp", true, 30083, true},
	} {
		kind := "any address"
		if tc.specific {
			kind = "hostIP " + uplink[tc.is6].String()
		}
		t.Run(fmt.Sprintf("%s/%s/%s", tc.proto, family(uplink[tc.is6]), kind), func(t *testing.T) {
			sources := []source{
				{"another host", node.External, uplink[tc.is6], external[tc.is6]},
				{"the node itself", node.NS, uplink[tc.is6], uplink[tc.is6]},
				{"the pod itself (hairpin)", pod.NS, uplink[tc.is6], gateway[tc.is6]},
			}
			// The peer reaches the node on another of its addresses: a wildcard mapping
			// applies there, a hostIP mapping does not.
			viaPeer := source{"another host, to another node address", node.Peer, peerLink[tc.is6], peer[tc.is6]}
			localhost := source{"localhost", node.NS, netip.MustParseAddr("127.0.0.1"), gateway[false]}
			if tc.specific {
				viaPeer.want, localhost.want = netip.Addr{}, netip.Addr{}
			}
			sources = append(sources, viaPeer)
			if tc.is6 {
				// IPv6 has no route_localnet: ::1 cannot leave lo, so it is not translated and
				// the node refuses the connection instead of letting it hang.
				localhost = source{"localhost (::1)", node.NS, netip.IPv6Loopback(), netip.Addr{}}
			}
			sources = append(sources, localhost)
			for i, s := range sources {
				dst := netip.AddrPortFrom(s.to, tc.hostPort)
				payload := fmt.Sprintf("%s-%d", t.Name(), i)
				if !s.want.IsValid() {
					expectNotReached(t, tc.proto, s.from, dst, servers[tc.proto], payload)
					continue
				}
				err := nettest.Eventually(testkit.TrafficTimeout, func() error {
					r, err := hpRequest(tc.proto, s.from, dst, payload, time.Second)
					return nettest.ExpectFrom(r, err, s.want)
				})
				if err != nil {
					t.Errorf("from %s to %s: %v", s.name, dst, err)
				}
			}

			// To an address that is not the node's, the port is not translated: the real
			// destination answers, and conntrack shows the flow untranslated.
			dst := netip.AddrPortFrom(nonLocal[tc.is6], tc.hostPort)
			var real *nettest.EchoServer
			if tc.proto == "tcp" {
				real = nettest.StartTCPEcho(t, node.Peer, dst)
			} else {
				real = nettest.StartUDPEcho(t, node.Peer, dst)
			}
			payload := t.Name() + "-transit"
			r, err := hpRequest(tc.proto, node.External, dst, payload, testkit.TrafficTimeout)
			if err := nettest.ExpectFrom(r, err, external[tc.is6]); err != nil {
				t.Errorf("transit to %s: %v", dst, err)
			}
			if tc.proto == "udp" && (real.Received(payload) != 1 || servers["udp"].Received(payload) != 0) {
				t.Errorf("transit UDP to %s: destination got %d, pod got %d, want 1 and 0", dst, real.Received(payload), servers["udp"].Received(payload))
			}
			for _, f := range testkit.HostPortConntrack(t, node, false, int(tc.hostPort)) {
				if strings.Contains(f, "dst="+nonLocal[tc.is6].String()+" ") && !strings.Contains(f, "src="+nonLocal[tc.is6].String()+" ") {
					t.Errorf("transit flow was translated: %s", f)
				}
			}
		})
	}

	t.Run("elements", func(t *testing.T) {
		// One element per (family, mapping), each naming its owner; SCTP like the others.
		owner := "hp-reach/eth0"
		v4, v6 := pod.IP(uplink[false]).String(), pod.IP(uplink[true]).String()
		want := []string{
			testkit.HostPortElement{Map: hostport.MapIPv4, Key: "tcp . 30080", Value: v4 + " . 8080", Comment: owner}.String(),
			testkit.HostPortElement{Map: hostport.MapIPv4, Key: "udp . 30081", Value: v4 + " . 8081", Comment: owner}.String(),
			testkit.HostPortElement{Map: hostport.MapIPv4, Key: "sctp . 30084", Value: v4 + " . 9000", Comment: owner}.String(),
			testkit.HostPortElement{Map: hostport.MapIPv4Addr, Key: "198.18.0.1 . tcp . 30082", Value: v4 + " . 8080", Comment: owner}.String(),
			testkit.HostPortElement{Map: hostport.MapIPv4Addr, Key: "198.18.0.1 . udp . 30083", Value: v4 + " . 8081", Comment: owner}.String(),
			testkit.HostPortElement{Map: hostport.MapIPv6, Key: "tcp . 30080", Value: v6 + " . 8080", Comment: owner}.String(),
			testkit.HostPortElement{Map: hostport.MapIPv6, Key: "udp . 30081", Value: v6 + " . 8081", Comment: owner}.String(),
			testkit.HostPortElement{Map: hostport.MapIPv6, Key: "sctp . 30084", Value: v6 + " . 9000", Comment: owner}.String(),
			testkit.HostPortElement{Map: hostport.MapIPv6Addr, Key: "2001:db8:e::1 . tcp . 30082", Value: v6 + " . 8080", Comment: owner}.String(),
			testkit.HostPortElement{Map: hostport.MapIPv6Addr, Key: "2001:db8:e::1 . udp . 30083", Value: v6 + " . 8081", Comment: owner}.String(),
		}
		var got []string
		for _, e := range testkit.HostPortElements(t, node) {
			got = append(got, e.String())
		}
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("map elements:\n got %q\nwant %q", got, want)
		}
	})

	t.Run("DEL removes everything", func(t *testing.T) {
		if err := node.Del(list, pod); err != nil {
			t.Fatal(err)
		}
		testkit.AssertNoHostPortResidue(t, node, pod.IPs(), 30080, 30081, 30082, 30083, 30084)
		for _, is6 := range []bool{false, true} {
			expectNotReached(t, "tcp", node.External, netip.AddrPortFrom(uplink[is6], 30080), servers["tcp"], "after-del")
		}
	})
}

// hpUDPClient keeps sending numbered datagrams from one fixed source address and port, the way
// a long-lived UDP client does, and records every echo it gets back.
type hpUDPClient struct {
	conn    net.PacketConn
	replies atomic.Int64
	sent    atomic.Int64
}

// awaitUntranslated waits until the client's flow (from port 40000) is an untranslated conntrack
// entry to the node's own address to, on hostPort: what a client sending before any pod holds
// the port leaves behind.
func (c *hpUDPClient) awaitUntranslated(t *testing.T, node *nettest.Node, hostPort int, to netip.Addr) {
	t.Helper()
	if err := nettest.Eventually(testkit.TrafficTimeout, func() error {
		for _, f := range testkit.HostPortConntrack(t, node, false, hostPort) {
			if strings.Contains(f, "sport=40000") && strings.Contains(f, "\tsrc="+to.String()+" ") {
				return nil
			}
		}
		return errors.New("no untranslated conntrack entry for the client yet")
	}); err != nil {
		t.Fatal(err)
	}
}

// echoedSince waits until the client gets an echo after it had before of them; the error says
// that the stale entry still holds its flow, with the port's conntrack entries.
func (c *hpUDPClient) echoedSince(t *testing.T, node *nettest.Node, hostPort int, before int64, whose string) error {
	err := nettest.Eventually(testkit.TrafficTimeout, func() error {
		if c.replies.Load() <= before {
			return fmt.Errorf("the client got no echo since %s came up (sent %d)", whose, c.sent.Load())
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("stale conntrack entry still blackholes the client: %v\n%s", err, strings.Join(testkit.HostPortConntrack(t, node, false, hostPort), "\n"))
	}
	return nil
}

// receivedBy counts the client's datagrams that srv received.
func (c *hpUDPClient) receivedBy(srv *nettest.EchoServer) int {
	received := 0
	for i := range c.sent.Load() {
		received += srv.Received(fmt.Sprintf("seq-%d", i+1))
	}
	return received
}

func startUDPClient(t *testing.T, n ns.NetNS, from, to netip.AddrPort) *hpUDPClient {
	t.Helper()
	c := &hpUDPClient{}
	nettest.Do(t, n, func() error {
		var err error
		c.conn, err = net.ListenPacket("udp", from.String())
		return err
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	t.Cleanup(func() {
		cancel()
		_ = c.conn.Close()
		<-done
		<-done
	})
	go func() {
		defer func() { done <- struct{}{} }()
		buf := make([]byte, 2048)
		for {
			if _, _, err := c.conn.ReadFrom(buf); err != nil {
				return
			}
			c.replies.Add(1)
		}
	}()
	go func() {
		defer func() { done <- struct{}{} }()
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				n := c.sent.Add(1)
				_, _ = c.conn.WriteTo([]byte(fmt.Sprintf("seq-%d", n)), net.UDPAddrFromAddrPort(to))
			}
		}
	}()
	return c
}

// TestHostPortUDPPodReplaced: a UDP client keeps sending to a hostPort from one source port
// while the pod behind it is replaced by a pod with another address. While no pod holds the
// port, its datagrams create an untranslated conntrack entry that would keep capturing them for
// as long as they keep coming; ADD of the new pod must clear it.
func TestHostPortUDPPodReplaced(t *testing.T) {
	node, list, _ := hpNode(t)
	const hostPort = 31000
	args := hpArgs(false, hpMapping{hostPort, 8081, "udp", ""})
	oldPod := node.NewPod(t, "udp-old")
	oldPod.RT.CapabilityArgs = args
	node.MustAdd(t, list, oldPod)
	oldSrv := nettest.StartUDPEcho(t, oldPod.NS, netip.AddrPortFrom(netip.IPv6Unspecified(), 8081))

	client := startUDPClient(t, node.External, netip.AddrPortFrom(nettest.External4.Addr(), 40000),
		netip.AddrPortFrom(nettest.NodeUplink4.Addr(), hostPort))
	if err := nettest.Eventually(testkit.TrafficTimeout, func() error {
		if oldSrv.Received("seq-1") == 0 && client.replies.Load() == 0 {
			return errors.New("no echo from the old pod yet")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	if err := node.Del(list, oldPod); err != nil {
		t.Fatal(err)
	}
	client.awaitUntranslated(t, node, hostPort, nettest.NodeUplink4.Addr())

	newPod := node.NewPod(t, "udp-new")
	newPod.RT.CapabilityArgs = args
	newSrv := nettest.StartUDPEcho(t, newPod.NS, netip.AddrPortFrom(netip.IPv6Unspecified(), 8081))
	node.MustAdd(t, list, newPod)
	if newPod.IP(nettest.NodeUplink4.Addr()) == oldPod.IP(nettest.NodeUplink4.Addr()) {
		t.Fatalf("the new pod got the old pod's address %s; the test needs a new one", newPod.IPs())
	}
	if err := client.echoedSince(t, node, hostPort, client.replies.Load(), "the new pod"); err != nil {
		t.Error(err)
	}
	if client.receivedBy(newSrv) == 0 {
		t.Error("the new pod's server received nothing from the client")
	}
}

// hpSnapshot is the node state a refused ADD must leave unchanged: the ruleset (without handles
// and without state: counters, elements' expiry countdowns), the data dir's reservations,
// records and index, and the node's links.
func hpSnapshot(t testing.TB, node *nettest.Node) string {
	t.Helper()
	var links []string
	nettest.Do(t, node.NS, func() error {
		ls, err := netlink.LinkList()
		for _, l := range ls {
			links = append(links, l.Attrs().Name)
		}
		return err
	})
	slices.Sort(links)
	ruleset, err := nettest.SettledRuleset(node.NS, "-s")
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("links %v\nfiles %v\n%s", links, stateFiles(t, node), ruleset)
}

// TestHostPortConflict: a mapping that overlaps one another attachment holds is refused with
// code 103 naming the port and the holder, and the refused ADD changes nothing; mappings that
// do not overlap are accepted.
func TestHostPortConflict(t *testing.T) {
	node, list, _ := hpNode(t)
	for i, tc := range []struct {
		name      string
		held, req hpMapping
		conflict  bool
	}{
		{"same port, any address", hpMapping{32000, 80, "tcp", ""}, hpMapping{32000, 81, "tcp", ""}, true},
		{"any address, then a hostIP", hpMapping{32000, 80, "tcp", ""}, hpMapping{32000, 80, "tcp", "198.18.0.1"}, true},
		{"a hostIP, then any address", hpMapping{32000, 80, "tcp", "198.18.0.1"}, hpMapping{32000, 80, "tcp", ""}, true},
		{"IPv6 hostIP under a dual-stack wildcard", hpMapping{32000, 80, "udp", ""}, hpMapping{32000, 80, "udp", "2001:db8:e::1"}, true},
		{"0.0.0.0 and a hostIP", hpMapping{32000, 80, "tcp", "0.0.0.0"}, hpMapping{32000, 80, "tcp", "10.200.0.1"}, true},
		{"two hostIPs", hpMapping{32000, 80, "tcp", "198.18.0.1"}, hpMapping{32000, 80, "tcp", "10.200.0.1"}, false},
		{"tcp and udp", hpMapping{32000, 80, "tcp", ""}, hpMapping{32000, 80, "udp", ""}, false},
		{"0.0.0.0 and ::", hpMapping{32000, 80, "tcp", "0.0.0.0"}, hpMapping{32000, 80, "tcp", "::"}, false},
		{"0.0.0.0 and an IPv6 hostIP", hpMapping{32000, 80, "tcp", "0.0.0.0"}, hpMapping{32000, 80, "tcp", "2001:db8:e::1"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			holder := node.NewPod(t, fmt.Sprintf("holder-%d", i))
			holder.RT.CapabilityArgs = hpArgs(i%2 == 0, tc.held)
			node.MustAdd(t, list, holder)
			other := node.NewPod(t, fmt.Sprintf("other-%d", i))
			other.RT.CapabilityArgs = hpArgs(i%2 == 1, hpMapping{32001, 90, "tcp", ""}, tc.req)
			before := hpSnapshot(t, node)
			err := node.Add(list, other)
			if !tc.conflict {
				if err != nil {
					t.Fatalf("ADD of a non-overlapping mapping: %v", err)
				}
				if err := node.Del(list, other); err != nil {
					t.Fatal(err)
				}
			} else {
				if err == nil {
					t.Cleanup(func() { _ = node.Del(list, other) })
					t.Fatal("ADD of an overlapping mapping succeeded")
				}
				if testkit.CNICode(err) != core.ErrPortConflict || !strings.Contains(err.Error(), "32000/"+tc.req.proto) || !strings.Contains(err.Error(), `"`+holder.RT.ContainerID+`"`) {
					t.Errorf("ADD error = %v (code %d), want code %d naming 32000/%s and %q", err, testkit.CNICode(err), core.ErrPortConflict, tc.req.proto, holder.RT.ContainerID)
				}
				if after := hpSnapshot(t, node); after != before {
					t.Errorf("the refused ADD changed the node:\nbefore %s\nafter  %s", before, after)
				}
				if err := node.Del(list, other); err != nil {
					t.Errorf("DEL after the refused ADD: %v", err)
				}
			}
			if err := node.Del(list, holder); err != nil {
				t.Fatal(err)
			}
			ips := holder.IPs()
			if other.Result != nil {
				ips = append(ips, other.IPs()...)
			}
			testkit.AssertNoHostPortResidue(t, node, ips, 32000, 32001)
		})
	}
}

// TestHostPortDelKeepsNewHolder: a late or repeated DEL of the pod that held a port before
// removes nothing of the pod that holds it now, even when the runtime sends the mapping again.
func TestHostPortDelKeepsNewHolder(t *testing.T) {
	node, list, _ := hpNode(t)
	args := hpArgs(true, hpMapping{32100, 8080, "tcp", ""})
	first := node.NewPod(t, "first")
	first.RT.CapabilityArgs = args
	node.MustAdd(t, list, first)
	if err := node.Del(list, first); err != nil {
		t.Fatal(err)
	}
	second := node.NewPod(t, "second")
	second.RT.CapabilityArgs = args
	node.MustAdd(t, list, second)
	srv := nettest.StartTCPEcho(t, second.NS, netip.AddrPortFrom(netip.IPv6Unspecified(), 8080))
	held := testkit.HostPortElements(t, node)

	if err := node.Del(list, first); err != nil { // with runtimeConfig.portMappings again
		t.Fatal(err)
	}
	if after := testkit.HostPortElements(t, node); !slices.Equal(after, held) {
		t.Errorf("DEL of the former holder changed the maps:\nbefore %v\nafter  %v", held, after)
	}
	r, err := nettest.TCPRequest(node.External, netip.AddrPortFrom(nettest.NodeUplink4.Addr(), 32100), "still", testkit.TrafficTimeout)
	if err := nettest.ExpectFrom(r, err, nettest.External4.Addr()); err != nil {
		t.Errorf("the new holder's port after DEL of the old one: %v (server %s)", err, srv.Addr)
	}
}

// TestHostPortManyPods: 50 pods with two host ports each (TCP and UDP, both families, added and
// deleted by 8 parallel plugin processes) are all reachable, and DEL of all of them leaves no
// element, index file or conntrack entry behind.
func TestHostPortManyPods(t *testing.T) {
	const pods = 50
	node, list, _ := hpNode(t)
	all := make([]*nettest.Pod, pods)
	var ports []int
	for i := range all {
		all[i] = node.NewPod(t, fmt.Sprintf("many-%02d", i))
		// Half the pods speak containerd's JSON, half CRI-O's.
		all[i].RT.CapabilityArgs = hpArgs(i%2 == 0, hpMapping{33000 + i, 8080, "tcp", ""}, hpMapping{34000 + i, 8081, "udp", ""})
		ports = append(ports, 33000+i, 34000+i)
		nettest.StartTCPEcho(t, all[i].NS, netip.AddrPortFrom(netip.IPv6Unspecified(), 8080))
		nettest.StartUDPEcho(t, all[i].NS, netip.AddrPortFrom(netip.IPv6Unspecified(), 8081))
	}
	runParallel(t, 8, all, func(p *nettest.Pod) error { return node.Add(list, p) })
	if t.Failed() {
		t.FailNow()
	}
	t.Cleanup(func() {
		for _, p := range all {
			_ = node.Del(list, p)
		}
	})
	if got := len(testkit.HostPortElements(t, node)); got != 4*pods {
		t.Errorf("%d map elements, want %d", got, 4*pods)
	}
	external := map[bool]netip.Addr{false: nettest.External4.Addr(), true: nettest.External6.Addr()}
	for i := range all {
		for _, uplink := range []netip.Addr{nettest.NodeUplink4.Addr(), nettest.NodeUplink6.Addr()} {
			for _, c := range []struct {
				proto string
				port  int
			}{{"tcp", 33000 + i}, {"udp", 34000 + i}} {
				dst := netip.AddrPortFrom(uplink, uint16(c.port))
				err := nettest.Eventually(testkit.TrafficTimeout, func() error {
					r, err := hpRequest(c.proto, node.External, dst, "many", time.Second)
					return nettest.ExpectFrom(r, err, external[uplink.Is6()])
				})
				if err != nil {
					t.Errorf("%s to %s (pod %d): %v", c.proto, dst, i, err)
				}
			}
		}
	}
	var ips []netip.Addr
	for _, p := range all {
		ips = append(ips, p.IPs()...)
	}
	runParallel(t, 8, all, func(p *nettest.Pod) error { return node.Del(list, p) })
	testkit.AssertNoHostPortResidue(t, node, ips, ports...)
}

// TestHostPortDelWithoutNetNSOrRuntimeConfig: DEL after the pod's netns is gone, with no
// portMappings from the runtime, removes the attachment's host ports from its record alone.
func TestHostPortDelWithoutNetNSOrRuntimeConfig(t *testing.T) {
	node, list, _ := hpNode(t)
	pod := node.NewPod(t, "gone")
	pod.RT.CapabilityArgs = hpArgs(false,
		hpMapping{32200, 8080, "tcp", ""}, hpMapping{32201, 8081, "udp", "198.18.0.1"}, hpMapping{32202, 9000, "sctp", "2001:db8:e::1"})
	node.MustAdd(t, list, pod)
	if got := len(testkit.HostPortElements(t, node)); got != 4 {
		t.Fatalf("%d map elements after ADD, want 4", got)
	}
	// A flow through the UDP port, so the audit sees its conntrack entry go.
	udpFlowThroughHostPort(t, node, pod, 8081, netip.MustParseAddrPort("198.18.0.1:32201"))
	ips := pod.IPs()
	nettest.DeleteNS(t, pod.NS)
	pod.RT.CapabilityArgs = nil
	for i := range 2 {
		if err := node.Del(list, pod); err != nil {
			t.Fatalf("DEL #%d: %v", i+1, err)
		}
	}
	testkit.AssertNoHostPortResidue(t, node, ips, 32200, 32201, 32202)
	testkit.AssertNoResidue(t, node, "kubenet", testkit.AttachmentOf(pod), ips)
}

// TestHostPortDelLeavesAReusedAddressAlone: a DEL that lost the pod's record and reservations
// finds its host ports in the index, but the address they lead to may be another pod's by then.
// That pod's flows survive the DEL; the host port's translated flows do not.
func TestHostPortDelLeavesAReusedAddressAlone(t *testing.T) {
	node, list, _ := hpNode(t)
	old := node.NewPod(t, "old")
	old.RT.CapabilityArgs = hpArgs(true, hpMapping{32400, 8081, "udp", ""})
	node.MustAdd(t, list, old)
	udpFlowThroughHostPort(t, node, old, 8081, netip.MustParseAddrPort("198.18.0.1:32400"))

	// The old pod's state is lost, its netns gone, and the allocator hands its addresses out
	// next (each cursor set to the address before the old pod's).
	dir := filepath.Join(node.DataDir(), "kubenet")
	lost := []string{core.RecordPath(dir, testkit.AttachmentOf(old))}
	for _, ip := range old.IPs() {
		lost = append(lost, filepath.Join(dir, ip.String()))
	}
	for _, f := range lost {
		if err := os.Remove(f); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 2 {
		cursor := filepath.Join(dir, fmt.Sprintf("last_reserved_ip.%d", i))
		b, err := os.ReadFile(cursor)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(cursor, []byte(netip.MustParseAddr(strings.TrimSpace(string(b))).Prev().String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	oldIPs := old.IPs()
	nettest.DeleteNS(t, old.NS)

	reuser := node.NewPod(t, "reuser")
	node.MustAdd(t, list, reuser)
	if !slices.Equal(reuser.IPs(), oldIPs) {
		t.Fatalf("the new pod got %v, not the old pod's %v; the test needs the same", reuser.IPs(), oldIPs)
	}
	// A flow of the new pod: UDP to an external host, masqueraded.
	nettest.StartUDPEcho(t, node.External, netip.AddrPortFrom(nettest.External4.Addr(), 9000))
	if err := nettest.Eventually(testkit.TrafficTimeout, func() error {
		r, err := nettest.UDPRequest(reuser.NS, netip.AddrPortFrom(nettest.External4.Addr(), 9000), "mine", time.Second)
		return nettest.ExpectFrom(r, err, nettest.NodeUplink4.Addr())
	}); err != nil {
		t.Fatalf("UDP from the new pod to the external host: %v", err)
	}
	if len(testkit.HostPortConntrack(t, node, false, 9000)) == 0 {
		t.Fatal("no conntrack entry for the new pod's flow; the test needs one")
	}

	if err := node.Del(list, old); err != nil {
		t.Fatal(err)
	}
	if len(testkit.HostPortConntrack(t, node, false, 9000)) == 0 {
		t.Errorf("the old pod's DEL forgot the new pod's flow from %v", oldIPs)
	}
	testkit.AssertNoHostPortResidue(t, node, nil, 32400)
	if err := node.Del(list, reuser); err != nil {
		t.Fatal(err)
	}
}

// udpFlowThroughHostPort serves UDP echo on the pod's containerPort and has the external host
// reach it through hostPort, which leaves a translated conntrack entry behind.
func udpFlowThroughHostPort(t *testing.T, node *nettest.Node, pod *nettest.Pod, containerPort uint16, hostPort netip.AddrPort) {
	t.Helper()
	srv := nettest.StartUDPEcho(t, pod.NS, netip.AddrPortFrom(netip.IPv6Unspecified(), containerPort))
	if err := nettest.Eventually(testkit.TrafficTimeout, func() error {
		r, err := nettest.UDPRequest(node.External, hostPort, "flow", time.Second)
		return nettest.ExpectFrom(r, err, nettest.External4.Addr())
	}); err != nil {
		t.Fatalf("UDP through host port %s: %v (server %s)", hostPort, err, srv.Addr)
	}
}

// TestHostPortDelForgetsTranslatedFlows: DEL forgets the translated conntrack flows of a pod's
// host ports however little it knows of the pod: with its record (one walk for the pod's
// addresses covers them), from its address reservations alone, or, with both lost, from the
// host-port index alone (then by port: the address may be another pod's by now).
func TestHostPortDelForgetsTranslatedFlows(t *testing.T) {
	cases := []struct {
		name  string
		loses func(dataDir string, pod *nettest.Pod) []string // files to remove before DEL
	}{
		{"record and reservations", func(string, *nettest.Pod) []string { return nil }},
		{"reservations only", func(dir string, pod *nettest.Pod) []string {
			return []string{core.RecordPath(dir, testkit.AttachmentOf(pod))}
		}},
		{"host-port index only", func(dir string, pod *nettest.Pod) []string {
			files := []string{core.RecordPath(dir, testkit.AttachmentOf(pod))}
			for _, ip := range pod.IPs() {
				files = append(files, filepath.Join(dir, ip.String()))
			}
			return files
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			node, list, _ := hpNode(t)
			pod := node.NewPod(t, "flows")
			pod.RT.CapabilityArgs = hpArgs(true, hpMapping{32300, 8081, "udp", ""})
			node.MustAdd(t, list, pod)
			udpFlowThroughHostPort(t, node, pod, 8081, netip.MustParseAddrPort("198.18.0.1:32300"))
			if flows := testkit.HostPortConntrack(t, node, true, 32300); len(flows) == 0 {
				t.Fatal("no translated conntrack entry for the host port before DEL; the test needs one")
			}
			for _, f := range tc.loses(filepath.Join(node.DataDir(), "kubenet"), pod) {
				if err := os.Remove(f); err != nil {
					t.Fatal(err)
				}
			}
			ips := pod.IPs()
			if err := node.Del(list, pod); err != nil {
				t.Fatal(err)
			}
			testkit.AssertNoHostPortResidue(t, node, ips, 32300)
			testkit.AssertNoResidue(t, node, "kubenet", testkit.AttachmentOf(pod), ips)
		})
	}
}

// hookCtx is a context whose Err fails from its failAt-th call on, after running onFail once:
// Add checks ctx.Err() before each step, so this fails ADD right before a chosen step.
type hookCtx struct {
	context.Context
	calls  atomic.Int32
	failAt int32 // 0: never
	onFail func()
}

func (c *hookCtx) Err() error {
	n := c.calls.Add(1)
	if c.failAt == 0 || n < c.failAt {
		return nil
	}
	if n == c.failAt && c.onFail != nil {
		c.onFail()
	}
	return context.Canceled
}

// TestHostPortFailedAddRollsBack: when a step after the host ports fails, ADD removes the
// mappings it had installed. ADD runs in-process with a context that fails before the last step.
func TestHostPortFailedAddRollsBack(t *testing.T) {
	node, _, _ := hpNode(t)
	pod := node.NewPod(t, "rollback")
	conf, err := json.Marshal(map[string]any{
		"cniVersion": "1.1.0", "name": "kubenet", "type": "kubenet", "dataDir": node.DataDir(),
		"podCIDRs": testkit.DualStack(), "nonMasqueradeCIDRs": []netip.Prefix{nettest.NonMasquerade4, nettest.NonMasquerade6},
		"runtimeConfig": hpArgs(false, hpMapping{32300, 8080, "tcp", ""}, hpMapping{32301, 8081, "udp", "198.18.0.1"}),
	})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := core.ParseConfig(conf)
	if err != nil {
		t.Fatal(err)
	}
	att := testkit.AttachmentOf(pod)
	run := func(ctx context.Context, f func(context.Context) error) error {
		return node.NS.Do(func(ns.NetNS) error { return f(ctx) })
	}

	// A successful ADD tells how many steps ADD has.
	probe := &hookCtx{Context: context.Background()}
	if err := run(probe, func(ctx context.Context) error { _, err := core.Add(ctx, cfg, att); return err }); err != nil {
		t.Fatalf("probe ADD: %v", err)
	}
	if err := run(context.Background(), func(ctx context.Context) error { return core.Del(ctx, cfg, att) }); err != nil {
		t.Fatalf("probe DEL: %v", err)
	}
	testkit.AssertNoHostPortResidue(t, node, nil, 32300, 32301)

	var installed []testkit.HostPortElement
	failing := &hookCtx{Context: context.Background(), failAt: probe.calls.Load(), onFail: func() { installed = testkit.HostPortElements(t, node) }}
	err = run(failing, func(ctx context.Context) error { _, err := core.Add(ctx, cfg, att); return err })
	if err == nil {
		t.Fatal("ADD succeeded with a context that fails before its last step")
	}
	if len(installed) != 3 {
		t.Errorf("before the failing step the maps held %v, want the pod's 3 elements (host ports come before the last step)", installed)
	}
	testkit.AssertNoHostPortResidue(t, node, nil, 32300, 32301)
	testkit.AssertNoResidue(t, node, "kubenet", att, nil)
}

// TestHostPortSCTP: an SCTP mapping is installed for both families and removed by DEL. (Go
// has no SCTP sockets, so no traffic.)
func TestHostPortSCTP(t *testing.T) {
	node, list, _ := hpNode(t)
	pod := node.NewPod(t, "sctp")
	pod.RT.CapabilityArgs = hpArgs(true, hpMapping{32400, 9000, "SCTP", ""}, hpMapping{32401, 9001, "sctp", "198.18.0.1"})
	node.MustAdd(t, list, pod)
	var got []string
	for _, e := range testkit.HostPortElements(t, node) {
		got = append(got, e.Map+": "+e.Key)
	}
	want := []string{hostport.MapIPv4 + ": sctp . 32400", hostport.MapIPv4Addr + ": 198.18.0.1 . sctp . 32401", hostport.MapIPv6 + ": sctp . 32400"}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("SCTP elements %q, want %q", got, want)
	}
	if err := node.Del(list, pod); err != nil {
		t.Fatal(err)
	}
	testkit.AssertNoHostPortResidue(t, node, pod.IPs(), 32400, 32401)
}

// TestHostPortLocalnetGuard: localhost access turns route_localnet on for the bridge, which
// would let a pod reach services the node binds to 127.0.0.1 (plugins#729). A pod that routes
// 127.0.0.0/8 to the node must not get through. Two guards stop it: the bridge's isolation
// chain drops loopback destinations from pods, and the host ports' localnet chain drops
// 127.0.0.0/8 that does not come from lo. With the first emptied the second still holds; with
// both emptied the pod gets through, which shows that the guards are what stop it.
func TestHostPortLocalnetGuard(t *testing.T) {
	node, list, _ := hpNode(t)
	pod := node.NewPod(t, "localnet")
	pod.RT.CapabilityArgs = hpArgs(false, hpMapping{32500, 8080, "tcp", ""})
	node.MustAdd(t, list, pod)
	attack := testkit.LocalnetAttack(t, node, pod, 9999)
	testkit.ExpectAttackFails(t, attack, "with the guard")
	// Either guard alone stops the attack: the bridge's (isolation) drops the frames, the host
	// ports' localnet chain the routed packets.
	nettest.Run(t, node.NS, "nft", "flush", "chain", "bridge", testkit.HostPortTable, isolation.ChainGuardIPv4)
	testkit.ExpectAttackFails(t, attack, "with the bridge's guard emptied")
	testkit.FlushLocalnetGuard(t, node)
	testkit.ExpectAttackWorks(t, attack, "with both guard chains emptied")
}

// TestHostPortLimit: a dual-stack pod with hostport.MaxMappings mappings (two map elements
// each) is set up, reachable on its first and last ports, checked, and torn down without
// residue, also by a repeated DEL; one mapping more is refused with code 7 naming the key and
// the count, and changes nothing. (One nftables message per element made ADD fail with ENOBUFS
// from about 120 such mappings, after the kernel had committed them, and DEL fail forever from
// about 75.)
func TestHostPortLimit(t *testing.T) {
	node, list, _ := hpNode(t)
	mappings := func(n int) []hpMapping {
		var ms []hpMapping
		for i := range n {
			m := hpMapping{31000 + i, 8080, "tcp", ""}
			if i%2 == 1 {
				m = hpMapping{31000 + i, 8081, "udp", ""}
			}
			ms = append(ms, m)
		}
		return ms
	}
	pod := node.NewPod(t, "limit")
	pod.RT.CapabilityArgs = hpArgs(true, mappings(hostport.MaxMappings)...)
	node.MustAdd(t, list, pod)
	nettest.StartTCPEcho(t, pod.NS, netip.AddrPortFrom(netip.IPv6Unspecified(), 8080))
	nettest.StartUDPEcho(t, pod.NS, netip.AddrPortFrom(netip.IPv6Unspecified(), 8081))
	if got := len(testkit.HostPortElements(t, node)); got != 2*hostport.MaxMappings {
		t.Errorf("%d map elements, want %d", got, 2*hostport.MaxMappings)
	}
	for _, c := range []struct {
		proto string
		port  uint16
	}{{"tcp", 31000}, {"udp", 31000 + hostport.MaxMappings - 1}} {
		for _, uplink := range []netip.Addr{nettest.NodeUplink4.Addr(), nettest.NodeUplink6.Addr()} {
			want := nettest.External4.Addr()
			if uplink.Is6() {
				want = nettest.External6.Addr()
			}
			dst := netip.AddrPortFrom(uplink, c.port)
			err := nettest.Eventually(testkit.TrafficTimeout, func() error {
				r, err := hpRequest(c.proto, node.External, dst, "limit", time.Second)
				return nettest.ExpectFrom(r, err, want)
			})
			if err != nil {
				t.Errorf("%s to %s: %v", c.proto, dst, err)
			}
		}
	}
	if err := node.Check(list, pod); err != nil {
		t.Errorf("CHECK at the limit: %v", err)
	}

	over := node.NewPod(t, "over-limit")
	over.RT.CapabilityArgs = hpArgs(false, mappings(hostport.MaxMappings+1)...)
	before := hpSnapshot(t, node)
	err := node.Add(list, over)
	want := fmt.Sprintf("runtimeConfig.portMappings %d", hostport.MaxMappings+1)
	if testkit.CNICode(err) != 7 || !strings.Contains(err.Error(), want) {
		t.Errorf("ADD with %d mappings = %v (code %d), want code 7 naming %q", hostport.MaxMappings+1, err, testkit.CNICode(err), want)
	}
	if after := hpSnapshot(t, node); after != before {
		t.Errorf("the refused ADD changed the node:\nbefore %s\nafter  %s", before, after)
	}
	if err := node.Del(list, over); err != nil {
		t.Errorf("DEL after the refused ADD: %v", err)
	}

	ips := pod.IPs()
	for i := range 2 {
		if err := node.Del(list, pod); err != nil {
			t.Fatalf("DEL #%d of the pod at the limit: %v", i+1, err)
		}
	}
	var ports []int
	for i := range hostport.MaxMappings {
		ports = append(ports, 31000+i)
	}
	testkit.AssertNoHostPortResidue(t, node, ips, ports...)
	testkit.AssertNoResidue(t, node, "kubenet", testkit.AttachmentOf(pod), ips)
}

// TestHostPortUDPStaleEntryOnOtherLocalAddress: a UDP client that sent to a hostPort before a
// pod held it has an untranslated conntrack entry to the node, and ADD of the pod must clear it
// on every local address an "any address" mapping answers on, or the client keeps missing the
// pod for as long as it keeps sending. Two such addresses that are not simply the node's listed
// ones: 127.0.0.2 (all of 127.0.0.0/8 is local; a stub resolver on 127.0.0.53 is one), sent to
// by a node process, and an IPv4 link-local address of the node (NodeLocal DNSCache puts
// 169.254.20.10 on a dummy interface), sent to by a neighbour.
func TestHostPortUDPStaleEntryOnOtherLocalAddress(t *testing.T) {
	linkLocal := netip.MustParseAddr("169.254.20.10")
	cases := []struct {
		name     string
		hostPort uint16
		client   func(node *nettest.Node) ns.NetNS
		from, to netip.Addr
		setup    func(t *testing.T, node *nettest.Node)
	}{
		{"127.0.0.2 from the node", 31012, func(node *nettest.Node) ns.NetNS { return node.NS },
			netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2"), func(*testing.T, *nettest.Node) {}},
		{"an IPv4 link-local address of the node from a neighbour", 31013, func(node *nettest.Node) ns.NetNS { return node.External },
			nettest.External4.Addr(), linkLocal, func(t *testing.T, node *nettest.Node) {
				nettest.Do(t, node.NS, func() error {
					// On lo: dummy interfaces need a module this machine may not have.
					lo, err := netlink.LinkByName("lo")
					if err != nil {
						return err
					}
					return netlink.AddrAdd(lo, &netlink.Addr{IPNet: ipnet.FromPrefix(netip.PrefixFrom(linkLocal, 32))})
				})
				nettest.AddRoute(t, node.External, netip.PrefixFrom(linkLocal, 32), nettest.NodeUplink4.Addr())
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			node, list, _ := hpNode(t)
			tc.setup(t, node)
			// A pod with another host port: the node tracks connections from then on, as a
			// node with pods does.
			bystander := node.NewPod(t, "bystander")
			bystander.RT.CapabilityArgs = hpArgs(false, hpMapping{int(tc.hostPort) + 100, 8081, "udp", ""})
			node.MustAdd(t, list, bystander)
			to := netip.AddrPortFrom(tc.to, tc.hostPort)
			client := startUDPClient(t, tc.client(node), netip.AddrPortFrom(tc.from, 40000), to)
			client.awaitUntranslated(t, node, int(tc.hostPort), tc.to)

			pod := node.NewPod(t, "udp-any")
			pod.RT.CapabilityArgs = hpArgs(false, hpMapping{int(tc.hostPort), 8081, "udp", ""})
			srv := nettest.StartUDPEcho(t, pod.NS, netip.AddrPortFrom(netip.IPv6Unspecified(), 8081))
			node.MustAdd(t, list, pod)
			// A new flow from another port reaches the pod: the mapping answers on that address.
			if err := nettest.Eventually(testkit.TrafficTimeout, func() error {
				_, err := nettest.UDPRequest(tc.client(node), to, "fresh", time.Second)
				return err
			}); err != nil {
				t.Fatalf("a new flow to %s does not reach the pod: %v", to, err)
			}
			if err := client.echoedSince(t, node, int(tc.hostPort), client.replies.Load(), "the pod"); err != nil {
				t.Fatal(err)
			}
			if client.receivedBy(srv) == 0 {
				t.Error("the pod's server received nothing from the client")
			}
		})
	}
}
