package netpol

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"

	"github.com/kubenet-dev/kubenet/internal/policyrules"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

// The attack tests: what a hostile pod, another host or another tool on the node does to get a
// packet past the policies. Each shows with a control that the path it attacks works, so a
// packet that does not arrive was stopped by the policies.

// arrivesAfterControl sends payload from src to dst:5353 and tells whether to received it, after
// a control datagram sent afterwards on a path that must work (control from controlFrom to
// controlTo) has arrived.
func (n *bridgedNode) arrivesAfterControl(t *testing.T, src ns.NetNS, dst netip.Addr, to *testPod, controlFrom ns.NetNS, controlTo *testPod) bool {
	t.Helper()
	payload := fmt.Sprintf("%s-%d", t.Name(), time.Now().UnixNano())
	sendUDP(t, src, dst, 5353, payload)
	control := payload + "-control"
	if err := nettest.Eventually(3*time.Second, func() error {
		sendUDP(t, controlFrom, controlTo.v4, 5353, control)
		if controlTo.udp.count(control) == 0 {
			return errors.New("control not received")
		}
		return nil
	}); err != nil {
		t.Fatalf("the control datagram never reached %s: %v", controlTo.name, err)
	}
	return to.udp.count(payload) != 0
}

// TestAttackHeldPodReceivesNodeTraffic: a pod whose policies are not installed yet (its port has
// no map element) receives nothing but ARP and on-link neighbour discovery, from the node too,
// while the tables hold the node's other pods.
func TestAttackHeldPodReceivesNodeTraffic(t *testing.T) {
	n := newBridgedNode(t)
	a, c := n.pods["a"], n.pods["c"]
	// a and b released, c held.
	rs := policyrules.Ruleset{}
	for _, p := range []*testPod{a, n.pods["b"]} {
		rs.Pods = append(rs.Pods, policyrules.Pod{Port: p.port, Name: p.name, IPs: p.ips()})
	}
	n.apply(t, rs, Options{})
	for _, dst := range []netip.Addr{c.v4, c.v6} {
		if n.arrivesAfterControl(t, n.node, dst, c, n.node, a) {
			t.Errorf("the node's datagram to the held pod's %s arrived", dst)
		}
	}
}

// TestAttackConntrackMarkThroughTunnel: a tunnel endpoint on the node (here VXLAN with fixed
// ports, whose outer flow conntrack sees both ways and calls established) decapsulates in the
// node's own namespace, keeping the outer packet's mark. The conntrack bit the outer packet got
// must not make the packet inside, a new connection, pass as the reply of an allowed one.
func TestAttackConntrackMarkThroughTunnel(t *testing.T) {
	n := newBridgedNode(t)
	b := n.pods["b"]
	nettest.Run(t, n.node, "ip", "link", "add", "vx0", "type", "vxlan", "id", "42", "local", "10.4.0.1", "remote", "10.4.0.2", "dstport", "4789", "srcport", "4789", "4790", "dev", "x0")
	nettest.Run(t, n.node, "ip", "addr", "add", "10.6.0.1/30", "dev", "vx0")
	nettest.Run(t, n.node, "ip", "link", "set", "vx0", "up")
	nettest.Run(t, n.x, "ip", "link", "add", "vx0", "type", "vxlan", "id", "42", "local", "10.4.0.2", "remote", "10.4.0.1", "dstport", "4789", "srcport", "4789", "4790", "dev", "eth0")
	nettest.Run(t, n.x, "ip", "addr", "add", "10.6.0.2/30", "dev", "vx0")
	nettest.Run(t, n.x, "ip", "link", "set", "vx0", "up")
	nettest.Run(t, n.x, "ip", "route", "replace", "10.3.0.0/24", "via", "10.6.0.1", "dev", "vx0")
	tunnelPeer := netip.MustParseAddr("10.6.0.2")

	n.apply(t, n.open(), Options{})
	if !n.arrivesAfterControl(t, n.x, b.v4, b, n.node, b) {
		// The first datagram may be lost to address resolution across the tunnel: try again.
		if !n.arrivesAfterControl(t, n.x, b.v4, b, n.node, b) {
			t.Fatal("x's datagram through the tunnel never reached b with b open (control)")
		}
	}
	// b takes UDP from the tunnel's peer address only on another port: x's datagram is new.
	n.apply(t, with(n.open(), b.port, allowFrom(&policyrules.Ports{Protocol: policyrules.UDP, First: 9999, Last: 9999}, tunnelPeer), policyrules.Direction{}), Options{})
	if n.arrivesAfterControl(t, n.x, b.v4, b, n.node, b) {
		t.Error("x's new datagram through the tunnel reached b, whose policy denies it")
	}
}

// sendPortUnreachable sends, from inside n to dst, an ICMP port unreachable that quotes a UDP
// datagram from quotedSrc:srcPort to quotedDst:dstPort, followed by marker.
func sendPortUnreachable(t *testing.T, n ns.NetNS, dst, quotedSrc, quotedDst netip.Addr, srcPort, dstPort uint16, marker string) {
	t.Helper()
	quoted := make([]byte, 28)
	quoted[0], quoted[8], quoted[9] = 0x45, 64, unix.IPPROTO_UDP
	binary.BigEndian.PutUint16(quoted[2:], uint16(28+len(marker)))
	copy(quoted[12:16], quotedSrc.AsSlice())
	copy(quoted[16:20], quotedDst.AsSlice())
	binary.BigEndian.PutUint16(quoted[10:], inetChecksum(quoted[:20]))
	binary.BigEndian.PutUint16(quoted[20:], srcPort)
	binary.BigEndian.PutUint16(quoted[22:], dstPort)
	binary.BigEndian.PutUint16(quoted[24:], uint16(8+len(marker)))
	msg := append([]byte{3, 3, 0, 0, 0, 0, 0, 0}, append(quoted, marker...)...)
	binary.BigEndian.PutUint16(msg[2:], inetChecksum(msg))
	nettest.Do(t, n, func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_ICMP)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return unix.Sendto(fd, msg, 0, &unix.SockaddrInet4{Addr: dst.As4()})
	})
}

func inetChecksum(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}

// TestAttackForgedRelatedICMP: conntrack calls an ICMP error "related" to the connection it
// quotes, whoever sends it (a router on the path may). On the pods' bridge there is no router
// between two pods: a pod that is no end of b's connection and that b's policy denies must not
// get an error about that connection to b (it would reset b's connections, or lower their MTU).
func TestAttackForgedRelatedICMP(t *testing.T) {
	n := newBridgedNode(t)
	a, b, c := n.pods["a"], n.pods["b"], n.pods["c"]
	// b takes everything from a, nothing from c; b's own connections out are open.
	n.apply(t, with(n.open(), b.port, allowFrom(nil, a.v4), policyrules.Direction{}), Options{})
	atB := startICMPReceiver(t, b.ns, false)
	// b's flow to x's UDP port 5555 (nothing listens there: conntrack has the flow, x answers
	// with its own port unreachable, which b's raw socket sees without a marker).
	const bPort = 40123
	nettest.Do(t, b.ns, func() error {
		conn, err := net.DialUDP("udp4", &net.UDPAddr{IP: b.v4.AsSlice(), Port: bPort}, &net.UDPAddr{IP: x4.AsSlice(), Port: 5555})
		if err != nil {
			return err
		}
		defer conn.Close()
		_, err = conn.Write([]byte("flow"))
		return err
	})
	for _, from := range []struct {
		name    string
		pod     *testPod
		port    uint16 // the quoted flow's source port
		arrives bool
	}{
		{"a, allowed (control)", a, bPort, true},
		{"c, quoting no flow of b's (control)", c, bPort + 1, false},
		{"c, quoting b's flow", c, bPort, false},
	} {
		marker := fmt.Sprintf("forged-%s-%d", from.pod.name, time.Now().UnixNano())
		got := nettest.Eventually(testTimeout(from.arrives), func() error {
			sendPortUnreachable(t, from.pod.ns, b.v4, b.v4, x4, from.port, 5555, marker)
			if atB.count(func(m string) bool { return strings.Contains(m, marker) }) == 0 {
				return errors.New("not received")
			}
			return nil
		}) == nil
		if got != from.arrives {
			t.Errorf("%s: a port unreachable about b's flow to x reached b: %v, want %v", from.name, got, from.arrives)
		}
	}
}

// testTimeout is how long a packet that must arrive is waited for, and how long one that must not
// is given to arrive anyway.
func testTimeout(arrives bool) time.Duration {
	if arrives {
		return 3 * time.Second
	}
	return 1500 * time.Millisecond
}

// TestAttackLocalPodAddressFromOutside: a host outside the node sends, through the node, packets
// whose source is the address of one of the node's pods, one that the receiving pod's policy
// allows. A packet from a pod of this node always comes through the pod's own port; one routed in
// from elsewhere with such a source is forged and must not get the pod's rights.
func TestAttackLocalPodAddressFromOutside(t *testing.T) {
	n := newBridgedNode(t)
	a, b := n.pods["a"], n.pods["b"]
	n.apply(t, with(n.open(), b.port, allowFrom(nil, a.v4, a.v6, x4), policyrules.Direction{}), Options{})
	// x takes a's address as an extra address of its own and sends from it through the node (IPv4:
	// the node forwards it, as a node whose reverse-path filter is off or loose does).
	nettest.Run(t, n.x, "ip", "addr", "add", netip.PrefixFrom(a.v4, 32).String(), "dev", "eth0")
	for _, tc := range []struct {
		name     string
		src, dst netip.Addr
		arrives  bool
	}{
		{"x from its own address (control)", x4, b.v4, true},
		{"x forging a's address", a.v4, b.v4, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := sendUDPFrom(t, n.x, tc.src, tc.dst, b, tc.arrives); got != tc.arrives {
				t.Errorf("datagram from x with source %s reached b: %v, want %v", tc.src, got, tc.arrives)
			}
		})
	}
}

// TestAttackSpoofedSource: b's ingress allows a; c takes a's addresses as its own and sends from
// them. Nothing but the policy tables stands in the way here (the node has no anti-spoofing
// table, as after another tool deleted it): the policies must not take c for a.
func TestAttackSpoofedSource(t *testing.T) {
	n := newBridgedNode(t)
	a, b, c := n.pods["a"], n.pods["b"], n.pods["c"]
	n.apply(t, with(n.open(), b.port, allowFrom(nil, a.v4, a.v6), policyrules.Direction{}), Options{})
	for _, forged := range []netip.Addr{a.v4, a.v6} {
		nettest.Run(t, c.ns, "ip", "addr", "add", netip.PrefixFrom(forged, forged.BitLen()).String(), "dev", "eth0", "nodad")
	}
	for _, tc := range []struct {
		name    string
		from    *testPod
		src     netip.Addr
		dst     netip.Addr
		arrives bool
	}{
		{"a from its own IPv4 address (control)", a, a.v4, b.v4, true},
		{"a from its own IPv6 address (control)", a, a.v6, b.v6, true},
		{"c from a's IPv4 address", c, a.v4, b.v4, false},
		{"c from a's IPv6 address", c, a.v6, b.v6, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := sendUDPFrom(t, tc.from.ns, tc.src, tc.dst, b, tc.arrives); got != tc.arrives {
				t.Errorf("datagram from %s's %s to b: arrived %v, want %v", tc.from.name, tc.src, got, tc.arrives)
			}
		})
	}
}

// sendUDPFrom sends datagrams from src (an address of n) to dst:5353 until to's receiver has one
// or the time is up (testTimeout(wanted)), and says whether one arrived.
func sendUDPFrom(t *testing.T, n ns.NetNS, src, dst netip.Addr, to *testPod, wanted bool) bool {
	t.Helper()
	payload := fmt.Sprintf("%s-%d", t.Name(), time.Now().UnixNano())
	return nettest.Eventually(testTimeout(wanted), func() error {
		nettest.Do(t, n, func() error {
			conn, err := net.DialUDP("udp", &net.UDPAddr{IP: src.AsSlice()}, &net.UDPAddr{IP: dst.AsSlice(), Port: 5353})
			if err != nil {
				return err
			}
			defer conn.Close()
			_, err = conn.Write([]byte(payload))
			return err
		})
		if to.udp.count(payload) == 0 {
			return errors.New("not received")
		}
		return nil
	}) == nil
}

// TestMasqueradedFromOutside: what the node forwards into the bridge after masquerading it to the
// bridge's own address (kube-proxy's NodePorts do, for clients elsewhere) carries a source of the
// pod CIDR that is the node's own, not a pod's: it reaches a pod that is open to it.
func TestMasqueradedFromOutside(t *testing.T) {
	n := newBridgedNode(t)
	b := n.pods["b"]
	nettest.Run(t, n.node, "nft", "add table ip masq-emu")
	nettest.Run(t, n.node, "nft", "add chain ip masq-emu pre { type nat hook prerouting priority dstnat; }")
	nettest.Run(t, n.node, "nft", "add chain ip masq-emu post { type nat hook postrouting priority srcnat; }")
	nettest.Run(t, n.node, "nft", "add rule ip masq-emu pre udp dport 31053 dnat to "+b.v4.String()+":5353")
	nettest.Run(t, n.node, "nft", "add rule ip masq-emu post ip saddr "+x4.String()+" oifname br0 masquerade")
	for _, tc := range []struct {
		name    string
		rs      policyrules.Ruleset
		arrives bool
	}{
		{"b open", n.open(), true},
		{"b open to the bridge's address", with(n.open(), b.port, allowFrom(nil, gw4.Addr()), policyrules.Direction{}), true},
		{"b open to x only (judged by the address it arrives with)", with(n.open(), b.port, allowFrom(nil, x4), policyrules.Direction{}), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n.apply(t, tc.rs, Options{})
			payload := fmt.Sprintf("%s-%d", t.Name(), time.Now().UnixNano())
			got := nettest.Eventually(testTimeout(tc.arrives), func() error {
				sendUDP(t, n.x, netip.MustParseAddr("10.4.0.1"), 31053, payload)
				if b.udp.count(payload) == 0 {
					return errors.New("not received")
				}
				return nil
			}) == nil
			if got != tc.arrives {
				t.Errorf("x's datagram to the node's port 31053, forwarded to b and masqueraded: arrived %v, want %v", got, tc.arrives)
			}
		})
	}
}

// TestRoutedBetweenPods: a pod that sends to another pod of the node through the node (a route
// via the gateway) keeps its address and its rights: its packet came through its port, and the
// node routes it back into the bridge.
func TestRoutedBetweenPods(t *testing.T) {
	n := newBridgedNode(t)
	a, b, c := n.pods["a"], n.pods["b"], n.pods["c"]
	for _, p := range []*testPod{a, c} {
		nettest.Run(t, p.ns, "ip", "route", "add", netip.PrefixFrom(b.v4, 32).String(), "via", gw4.Addr().String())
		nettest.Run(t, p.ns, "ip", "-6", "route", "add", netip.PrefixFrom(b.v6, 128).String(), "via", gw6.Addr().String())
	}
	n.apply(t, with(n.open(), b.port, allowFrom(nil, a.v4, a.v6), policyrules.Direction{}), Options{})
	for _, tc := range []struct {
		from    *testPod
		dst     netip.Addr
		arrives bool
	}{{a, b.v4, true}, {a, b.v6, true}, {c, b.v4, false}, {c, b.v6, false}} {
		t.Run(fmt.Sprintf("%s to %s", tc.from.name, tc.dst), func(t *testing.T) {
			src := tc.from.v4
			if tc.dst.Is6() {
				src = tc.from.v6
			}
			if got := sendUDPFrom(t, tc.from.ns, src, tc.dst, b, tc.arrives); got != tc.arrives {
				t.Errorf("routed through the node: arrived %v, want %v", got, tc.arrives)
			}
		})
	}
}
