package cni

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/kubenet-dev/kubenet/hostport"
	"github.com/kubenet-dev/kubenet/internal/ipt"
	"github.com/kubenet-dev/kubenet/isolation"
	"github.com/kubenet-dev/kubenet/test/nettest"
	"github.com/kubenet-dev/kubenet/test/testkit"
)

// The hostile-pod tests: one pod ("evil", with CAP_NET_RAW as containerd grants by default)
// writes raw frames on its interface to become a router for the others, to impersonate the
// gateway or another pod, and to reach what a pod must not reach. Every attempt is checked where
// it would do harm: the victims' routes and neighbour tables, the bridge's forwarding table,
// and the traffic that did or did not arrive. The honest pods ("victim" and "honest") must keep
// working throughout.

// Ports of the servers the tests run.
const (
	hostileTCPPort  = 8080  // TCP echo in victim and honest
	hostileUDPPort  = 8081  // UDP echo in victim (and the target of its host port)
	hostileHostPort = 31081 // the victim's UDP host port
	nodeTCPPort     = 7000  // TCP echo on the node, every address
	nodeUDPPort     = 7001  // UDP echo on the node, every address (link-local traffic)
	nodeLocalPort   = 7100  // UDP echo on the node's 127.0.0.1 and ::1 only
)

// hostileNode is a node with three pods: evil (the attacker), victim and honest.
type hostileNode struct {
	node                 *nettest.Node
	list                 *libcni.NetworkConfigList
	evil, victim, honest *nettest.Pod
	mac                  map[*nettest.Pod]net.HardwareAddr
	bridgeMAC            net.HardwareAddr
	bridgeLL             netip.Addr
	gateway              map[bool]netip.Addr // by "is IPv6", for the families of the network
	capture              *testkit.Capture    // frames arriving at the victim
	victimUDP            *nettest.EchoServer // behind the victim's host port too
	nodeLocal            map[bool]*nettest.EchoServer
	seq                  int
	backend              string // netfilter backend ("" is the default)
}

func newHostileNode(t *testing.T, mode, backend string, cidrs []netip.Prefix, extra map[string]any) *hostileNode {
	t.Helper()
	h := &hostileNode{node: nettest.NewNode(t, binDir), mac: map[*nettest.Pod]net.HardwareAddr{}, gateway: map[bool]netip.Addr{}, backend: backend}
	h.list = h.node.ConfList(t, nettest.NetConf{
		PodCIDRs:           cidrs,
		NonMasqueradeCIDRs: []netip.Prefix{nettest.NonMasquerade4, nettest.NonMasquerade6},
		HairpinMode:        mode,
		NetfilterBackend:   backend,
		Extra:              extra,
	})
	for _, c := range cidrs {
		h.gateway[c.Addr().Is6()] = testkit.GatewayOf(c)
	}
	h.evil, h.victim, h.honest = h.node.NewPod(t, "evil"), h.node.NewPod(t, "victim"), h.node.NewPod(t, "honest")
	h.victim.RT.CapabilityArgs = hpArgs(false, hpMapping{hostileHostPort, hostileUDPPort, "udp", ""})
	for _, p := range []*nettest.Pod{h.evil, h.victim, h.honest} {
		h.node.MustAdd(t, h.list, p)
		mac, err := net.ParseMAC(p.Result.Interfaces[2].Mac)
		if err != nil {
			t.Fatal(err)
		}
		h.mac[p] = mac
	}
	var err error
	if h.bridgeMAC, err = net.ParseMAC(h.victim.Result.Interfaces[0].Mac); err != nil {
		t.Fatal(err)
	}
	for _, p := range testkit.AllAddrs(t, h.node.NS, "cbr0") {
		if p.Addr().Is6() && p.Addr().IsLinkLocalUnicast() {
			h.bridgeLL = p.Addr()
		}
	}
	if !h.bridgeLL.IsValid() {
		t.Fatal("the bridge has no IPv6 link-local address")
	}

	h.victimUDP = nettest.StartUDPEcho(t, h.victim.NS, netip.AddrPortFrom(netip.IPv6Unspecified(), hostileUDPPort))
	nettest.StartTCPEcho(t, h.victim.NS, netip.AddrPortFrom(netip.IPv6Unspecified(), hostileTCPPort))
	nettest.StartTCPEcho(t, h.honest.NS, netip.AddrPortFrom(netip.IPv6Unspecified(), hostileTCPPort))
	nettest.StartUDPEcho(t, h.honest.NS, netip.AddrPortFrom(netip.IPv6Unspecified(), hostileUDPPort))
	nettest.StartTCPEcho(t, h.node.NS, netip.AddrPortFrom(netip.IPv6Unspecified(), nodeTCPPort))
	nettest.StartTCPEcho(t, h.node.External, netip.AddrPortFrom(netip.IPv6Unspecified(), nodeTCPPort))
	nettest.StartUDPEcho(t, h.node.NS, netip.AddrPortFrom(netip.IPv6Unspecified(), nodeUDPPort))
	h.nodeLocal = map[bool]*nettest.EchoServer{
		false: nettest.StartUDPEcho(t, h.node.NS, netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), nodeLocalPort)),
		true:  nettest.StartUDPEcho(t, h.node.NS, netip.AddrPortFrom(netip.IPv6Loopback(), nodeLocalPort)),
	}

	// Fill the neighbour tables an attacker would poison: the victim's entries for the gateway
	// and for the honest pod (global and link-local), and the node's entries for the honest pod.
	for _, gw := range h.gateway {
		h.expectTCP(t, "victim to the gateway", h.victim, netip.AddrPortFrom(gw, nodeTCPPort), h.victim.IP(gw))
		h.expectTCP(t, "victim to honest", h.victim, netip.AddrPortFrom(h.honest.IP(gw), hostileTCPPort), h.victim.IP(gw))
		h.expectTCP(t, "node to honest", nil, netip.AddrPortFrom(h.honest.IP(gw), hostileTCPPort), gw)
	}
	// Link-local traffic needs both ends past duplicate address detection: on an IPv4-only
	// network the pods keep DAD on, and their interfaces have just come up. Every pod's address
	// is waited for here, the evil pod's too, which sends to the honest pod's at the end.
	for _, p := range []*nettest.Pod{h.honest, h.evil, h.victim} {
		testkit.WaitAddrUsable(t, p.NS, "eth0", h.ll(p), testkit.TrafficTimeout)
	}
	for _, dst := range []netip.Addr{h.bridgeLL, h.ll(h.honest)} {
		to := netip.AddrPortFrom(onLink(t, h.victim, dst), pick[uint16](dst == h.bridgeLL, nodeUDPPort, hostileUDPPort))
		// Polled: the bridge's link-local address may still be in duplicate address detection.
		err := nettest.Eventually(testkit.TrafficTimeout, func() error {
			_, err := nettest.UDPRequest(h.victim.NS, to, "ll", time.Second)
			return err
		})
		if err != nil {
			t.Fatalf("victim to %s over IPv6 link-local: %v", dst, err)
		}
	}
	h.capture = testkit.StartCapture(t, h.victim.NS, "eth0")
	return h
}

// onLink scopes a link-local address to p's eth0. The zone is the interface index: Go resolves
// zone names through a process-wide cache, which cannot tell one namespace's eth0 from another's.
func onLink(t *testing.T, p *nettest.Pod, a netip.Addr) netip.Addr {
	return a.WithZone(fmt.Sprint(testkit.Link(t, p.NS, "eth0").Attrs().Index))
}

func pick[T any](c bool, a, b T) T {
	if c {
		return a
	}
	return b
}

// ll is the pod's IPv6 link-local address (its interface's EUI-64 address).
func (h *hostileNode) ll(p *nettest.Pod) netip.Addr { return testkit.LinkLocal(h.mac[p]) }

func (h *hostileNode) has(ipv6 bool) bool { _, ok := h.gateway[ipv6]; return ok }

// expectTCP checks a TCP request from p (nil: the node) to dst and the source the server saw.
func (h *hostileNode) expectTCP(t *testing.T, what string, p *nettest.Pod, dst netip.AddrPort, wantFrom netip.Addr) {
	t.Helper()
	from := h.node.NS
	if p != nil {
		from = p.NS
	}
	r, err := nettest.TCPRequest(from, dst, what, testkit.TrafficTimeout)
	if err := nettest.ExpectFrom(r, err, wantFrom); err != nil {
		t.Errorf("%s (%s): %v", what, dst, err)
	}
}

// send writes frames from evil, then a marker datagram from evil's own addresses to the victim,
// and waits until the marker has arrived: frames sent before it on the same veth have been
// handled by then (the node and the victim handle a veth's frames in order). It fails the test
// when the marker does not arrive, since evil's honest traffic must keep working.
func (h *hostileNode) send(t *testing.T, frames ...[]byte) {
	t.Helper()
	h.seq++
	marker := []byte(fmt.Sprintf("marker-%d", h.seq))
	is6 := !h.has(false)
	src, dst := h.evil.IP(h.gateway[is6]), h.victim.IP(h.gateway[is6])
	frames = append(frames, testkit.IPFrame(h.mac[h.victim], h.mac[h.evil], testkit.UDPPacket(src, dst, 40000, 9, marker)))
	testkit.SendFrames(t, h.evil.NS, "eth0", frames...)
	err := h.capture.WaitFor(testkit.TrafficTimeout, "marker", func(f testkit.Frame) bool {
		_, _, payload, ok := f.UDP()
		return ok && string(payload) == string(marker)
	})
	if err != nil {
		t.Fatalf("evil's own datagram to the victim (%s -> %s) did not arrive: %v", src, dst, err)
	}
}

// expectNotCaptured fails when the victim received a frame that match accepts.
func (h *hostileNode) expectNotCaptured(t *testing.T, what string, match func(testkit.Frame) bool) {
	t.Helper()
	if got := h.capture.Matching(match); len(got) > 0 {
		t.Errorf("%s: %d frame(s) reached the victim, first: % x", what, len(got), []byte(got[0]))
	}
}

// expectNeighbor fails when the neighbour entry for ip on ifname in p (nil: the node's bridge)
// names another MAC than want. mustExist: the entry has to be there (it was made before).
func (h *hostileNode) expectNeighbor(t *testing.T, what string, p *nettest.Pod, ip netip.Addr, want net.HardwareAddr, mustExist bool) {
	t.Helper()
	n, ifname, who := h.node.NS, "cbr0", "the node"
	if p != nil {
		n, ifname, who = p.NS, "eth0", p.RT.ContainerID
	}
	got := testkit.NeighborMAC(t, n, ifname, ip)
	switch {
	case got == nil && mustExist:
		t.Errorf("%s: %s has no neighbour entry for %s any more", what, who, ip)
	case got != nil && got.String() != want.String():
		t.Errorf("%s: %s now sends %s to %s, want %s", what, who, ip, got, want)
	}
}

// fromPods restricts match to frames that did not come from the node itself (the bridge's
// MAC): the node may send redirects of its own, which is no attack.
func (h *hostileNode) fromPods(match func(testkit.Frame) bool) func(testkit.Frame) bool {
	return func(f testkit.Frame) bool { return f.Src().String() != h.bridgeMAC.String() && match(f) }
}

func isICMP(typ int) func(testkit.Frame) bool {
	return func(f testkit.Frame) bool {
		got, _, ok := f.ICMP()
		return ok && got == typ
	}
}

func isUDPTo(port uint16) func(testkit.Frame) bool {
	return func(f testkit.Frame) bool {
		_, dst, _, ok := f.UDP()
		return ok && dst == port
	}
}

// qinq puts an 802.1ad (service) tag with VLAN ID 0 in front of frame's ether type.
func qinq(frame []byte) []byte {
	out := append([]byte{}, frame[:12]...)
	out = append(out, 0x88, 0xa8, 0, 0)
	return append(out, frame[12:]...)
}

// containsBytes matches frames that carry s anywhere (a TCP payload, which Frame does not parse).
func containsBytes(s string) func(testkit.Frame) bool {
	return func(f testkit.Frame) bool { return bytes.Contains(f, []byte(s)) }
}

func hasPayload(payload string) func(testkit.Frame) bool {
	return func(f testkit.Frame) bool {
		_, _, p, ok := f.UDP()
		return ok && string(p) == payload
	}
}

// ndTarget matches neighbour advertisements for target.
func ndTarget(typ int, target netip.Addr) func(testkit.Frame) bool {
	return func(f testkit.Frame) bool {
		got, body, ok := f.ICMP()
		if !ok || got != typ || len(body) < 20 {
			return false
		}
		a, _ := netip.AddrFromSlice(body[4:20])
		return a == target.WithZone("")
	}
}

func arpClaim(spa netip.Addr, sha net.HardwareAddr) func(testkit.Frame) bool {
	return func(f testkit.Frame) bool {
		_, s, p, _, ok := f.ARP()
		return ok && p == spa && s.String() == sha.String()
	}
}

// routerAttacks: evil announces itself as a router (RA, also priority-tagged and with the
// gateway's link-local source), solicits routers with another pod's address, sends redirects
// (ICMPv6 and ICMP, from its own address and from the gateway's) and DHCP server replies.
func (h *hostileNode) routerAttacks(t *testing.T) {
	evil, evilMAC, evilLL := h.evil, h.mac[h.evil], h.ll(h.evil)
	allNodes := netip.MustParseAddr("ff02::1")
	bogus := netip.MustParsePrefix("2001:db8:bad::/64")
	ra := func(src netip.Addr, mac net.HardwareAddr) []byte {
		return testkit.IPFrame(testkit.MulticastMAC(allNodes), mac,
			testkit.ICMPPacket(src, allNodes, testkit.ICMPv6RouterAdvertisement, 0, testkit.RouterAdvertisementBody(mac, bogus)))
	}
	t.Run("router advertisement", func(t *testing.T) {
		h.send(t, ra(evilLL, evilMAC), testkit.PriorityTagged(ra(evilLL, evilMAC)), ra(h.bridgeLL, evilMAC), ra(h.bridgeLL, h.bridgeMAC))
		h.expectNotCaptured(t, "router advertisement", isICMP(testkit.ICMPv6RouterAdvertisement))
		for _, p := range []*nettest.Pod{h.victim, h.honest} {
			for _, r := range testkit.Routes(t, p.NS, true) {
				gw, _ := netip.AddrFromSlice(r.Gw)
				dst := routeDst(r)
				// The only IPv6 default route a pod may have is kubenet's, via the gateway.
				if (dst.Bits() == 0 && gw != h.gateway[true]) || (dst.Bits() > 0 && dst.Overlaps(bogus)) {
					t.Errorf("%s took a route from the RA: %s", p.RT.ContainerID, r)
				}
			}
			for _, a := range testkit.AllAddrs(t, p.NS, "eth0") {
				if bogus.Contains(a.Addr()) {
					t.Errorf("%s configured an address from the RA's prefix: %s", p.RT.ContainerID, a)
				}
			}
		}
		for _, r := range testkit.Routes(t, h.node.NS, true) {
			if dst := routeDst(r); dst.Bits() > 0 && dst.Overlaps(bogus) {
				t.Errorf("the node took a route from the RA: %s", r)
			}
		}
	})
	t.Run("router solicitation with another pod's address", func(t *testing.T) {
		allRouters := netip.MustParseAddr("ff02::2")
		var frames [][]byte
		for _, src := range h.honestV6Addrs() {
			frames = append(frames, testkit.IPFrame(testkit.MulticastMAC(allRouters), evilMAC,
				testkit.ICMPPacket(src, allRouters, testkit.ICMPv6RouterSolicitation, 0, testkit.RouterSolicitationBody(evilMAC))))
		}
		h.send(t, frames...)
		// The victim's own host veth (the node's end, IPv6 on) solicits routers too, straight
		// to its peer: only evil's count.
		h.expectNotCaptured(t, "router solicitation", func(f testkit.Frame) bool {
			src, _, _, _, _ := f.IP()
			return isICMP(testkit.ICMPv6RouterSolicitation)(f) && (f.Src().String() == evilMAC.String() || slices.Contains(h.honestV6Addrs(), src))
		})
		for _, src := range h.honestV6Addrs() {
			h.expectNeighbor(t, "router solicitation", nil, src, h.mac[h.honest], false)
		}
	})
	t.Run("ICMPv6 redirect", func(t *testing.T) {
		dst := nettest.External6.Addr()
		var frames [][]byte
		for _, src := range []netip.Addr{evilLL, h.bridgeLL} {
			for _, to := range h.victimV6Addrs() {
				frames = append(frames, testkit.IPFrame(h.mac[h.victim], evilMAC,
					testkit.ICMPPacket(src, to, testkit.ICMPv6Redirect, 0, testkit.RedirectV6Body(evilLL, dst))))
			}
		}
		h.send(t, frames...)
		h.expectNotCaptured(t, "ICMPv6 redirect", h.fromPods(isICMP(testkit.ICMPv6Redirect)))
		if h.has(true) {
			if gw := testkit.RouteGateway(t, h.victim.NS, dst); gw != h.gateway[true] {
				t.Errorf("victim routes %s via %s, want the gateway %s", dst, gw, h.gateway[true])
			}
		}
	})
	t.Run("DHCPv6 reply", func(t *testing.T) {
		h.send(t, testkit.IPFrame(h.mac[h.victim], evilMAC, testkit.UDPPacket(evilLL, h.ll(h.victim), 547, 546, []byte("dhcpv6 reply"))))
		h.expectNotCaptured(t, "DHCPv6 server reply", isUDPTo(546))
	})
	if !h.has(false) {
		return
	}
	gw4, victim4 := h.gateway[false], h.victim.IP(h.gateway[false])
	t.Run("ICMP redirect", func(t *testing.T) {
		dst := nettest.External4.Addr()
		invoking := testkit.UDPPacket(victim4, dst, 5000, 53, []byte("query"))
		var frames [][]byte
		for _, src := range []netip.Addr{evil.IP(gw4), gw4} {
			redirect := testkit.IPFrame(h.mac[h.victim], evilMAC, testkit.ICMPPacket(src, victim4, testkit.ICMPRedirect, 1, testkit.RedirectV4Body(evil.IP(gw4), invoking)))
			// The first one makes the victim resolve the new gateway, the second one takes.
			frames = append(frames, redirect, redirect)
		}
		h.send(t, frames...)
		h.expectNotCaptured(t, "ICMP redirect", h.fromPods(isICMP(testkit.ICMPRedirect)))
		if gw := testkit.RouteGateway(t, h.victim.NS, dst); gw != gw4 {
			t.Errorf("victim routes %s via %s, want the gateway %s", dst, gw, gw4)
		}
	})
	t.Run("ICMP router advertisement and DHCP offer", func(t *testing.T) {
		allHosts, bcast := netip.MustParseAddr("224.0.0.1"), netip.MustParseAddr("255.255.255.255")
		h.send(t,
			testkit.IPFrame(net.HardwareAddr{0x01, 0, 0x5e, 0, 0, 1}, evilMAC, testkit.ICMPPacket(evil.IP(gw4), allHosts, testkit.ICMPRouterAdvertisement, 0, append([]byte{1, 2, 0, 0}, append(evil.IP(gw4).AsSlice(), 0, 0, 0, 1)...))),
			testkit.IPFrame(testkit.Broadcast, evilMAC, testkit.UDPPacket(evil.IP(gw4), bcast, 67, 68, []byte("dhcp offer"))))
		h.expectNotCaptured(t, "ICMP router advertisement", isICMP(testkit.ICMPRouterAdvertisement))
		h.expectNotCaptured(t, "DHCP server reply", isUDPTo(68))
	})
}

// routeDst is an IPv6 route's destination (::/0 for a default route).
func routeDst(r netlink.Route) netip.Prefix {
	if r.Dst == nil {
		return netip.PrefixFrom(netip.IPv6Unspecified(), 0)
	}
	a, _ := netip.AddrFromSlice(r.Dst.IP)
	ones, _ := r.Dst.Mask.Size()
	return netip.PrefixFrom(a, ones)
}

func (h *hostileNode) honestV6Addrs() []netip.Addr {
	out := []netip.Addr{h.ll(h.honest)}
	if h.has(true) {
		out = append(out, h.honest.IP(h.gateway[true]))
	}
	return out
}

func (h *hostileNode) victimV6Addrs() []netip.Addr {
	out := []netip.Addr{h.ll(h.victim)}
	if h.has(true) {
		out = append(out, h.victim.IP(h.gateway[true]))
	}
	return out
}

// spoofingAttacks: evil claims the gateway's and the honest pod's addresses in ARP and neighbour
// advertisements, sends from addresses and MACs that are not its own, and hides another MAC in
// ARP and neighbour discovery messages.
func (h *hostileNode) spoofingAttacks(t *testing.T) {
	evilMAC, honestMAC := h.mac[h.evil], h.mac[h.honest]
	// TCP, which the bridge's rules let through on fast paths (one lookup of port . MAC .
	// address, the guard's checks in one rule): another pod's address, its MAC, both, a
	// priority tag, each must stay out; evil's own segment (the control) must arrive.
	t.Run("TCP from another pod's address or MAC, or tagged", func(t *testing.T) {
		for is6, gw := range h.gateway {
			evilIP, honestIP, victimIP := h.evil.IP(gw), h.honest.IP(gw), h.victim.IP(gw)
			segment := func(what string, src netip.Addr) []byte {
				return testkit.TCPPacket(src, victimIP, 40100, hostileTCPPort, testkit.TCPPsh|testkit.TCPAck, []byte(fmt.Sprintf("tcp-%v-%s.", is6, what)))
			}
			attacks := map[string][]byte{
				"address":         testkit.IPFrame(h.mac[h.victim], evilMAC, segment("address", honestIP)),
				"MAC":             testkit.IPFrame(h.mac[h.victim], honestMAC, segment("MAC", evilIP)),
				"MAC and address": testkit.IPFrame(h.mac[h.victim], honestMAC, segment("MAC and address", honestIP)),
				"priority tag":    testkit.PriorityTagged(testkit.IPFrame(h.mac[h.victim], evilMAC, segment("priority tag", evilIP))),
				// An 802.1ad tag in front of a priority tag: neither the ether type after the MACs
				// nor the one skb->protocol holds (behind the outer tag) is IP.
				"802.1ad tag over a priority tag": qinq(testkit.PriorityTagged(testkit.IPFrame(h.mac[h.victim], evilMAC, segment("802.1ad tag over a priority tag", honestIP)))),
			}
			control := testkit.IPFrame(h.mac[h.victim], evilMAC, segment("own", evilIP))
			var frames [][]byte
			for _, f := range attacks {
				frames = append(frames, f)
			}
			h.send(t, append(frames, control)...)
			for what := range attacks {
				h.expectNotCaptured(t, fmt.Sprintf("TCP over %s with another pod's %s", family(gw), what), containsBytes(fmt.Sprintf("tcp-%v-%s.", is6, what)))
			}
			if len(h.capture.Matching(containsBytes(fmt.Sprintf("tcp-%v-own.", is6)))) == 0 {
				t.Errorf("evil's own TCP segment over %s did not reach the victim: the test cannot see TCP", family(gw))
			}
		}
	})
	if h.has(false) {
		gw4, honest4, evil4 := h.gateway[false], h.honest.IP(h.gateway[false]), h.evil.IP(h.gateway[false])
		t.Run("gratuitous ARP for the gateway and another pod", func(t *testing.T) {
			var frames [][]byte
			for _, ip := range []netip.Addr{gw4, honest4} {
				for _, op := range []uint16{1, 2} {
					frames = append(frames, testkit.Ethernet(testkit.Broadcast, evilMAC, testkit.EtherTypeARP, testkit.ARPPacket(op, evilMAC, ip, testkit.Broadcast, ip)))
				}
				// And a reply to the victim directly, as if it had asked.
				frames = append(frames, testkit.Ethernet(h.mac[h.victim], evilMAC, testkit.EtherTypeARP, testkit.ARPPacket(2, evilMAC, ip, h.mac[h.victim], h.victim.IP(gw4))))
			}
			h.send(t, frames...)
			h.expectNotCaptured(t, "ARP for the gateway", arpClaim(gw4, evilMAC))
			h.expectNotCaptured(t, "ARP for the honest pod", arpClaim(honest4, evilMAC))
			h.expectNeighbor(t, "ARP for the gateway", h.victim, gw4, h.bridgeMAC, true)
			h.expectNeighbor(t, "ARP for the honest pod", h.victim, honest4, honestMAC, true)
			h.expectNeighbor(t, "ARP for the honest pod", nil, honest4, honestMAC, true)
		})
		t.Run("ARP with another pod's MAC", func(t *testing.T) {
			h.send(t, testkit.Ethernet(testkit.Broadcast, evilMAC, testkit.EtherTypeARP, testkit.ARPPacket(2, honestMAC, evil4, testkit.Broadcast, evil4)))
			h.expectNotCaptured(t, "ARP naming another pod's MAC", arpClaim(evil4, honestMAC))
		})
	}
	// Neighbour advertisements for the gateway (global on an IPv6 network, the bridge's
	// link-local address always) and for the honest pod.
	gws := []netip.Addr{h.bridgeLL}
	if h.has(true) {
		gws = append(gws, h.gateway[true])
	}
	allNodes := netip.MustParseAddr("ff02::1")
	na := func(src, dst netip.Addr, dstMAC net.HardwareAddr, target netip.Addr, tlla net.HardwareAddr) []byte {
		return testkit.IPFrame(dstMAC, evilMAC, testkit.ICMPPacket(src, dst, testkit.ICMPv6NeighborAdvertisement, 0,
			testkit.NeighborAdvertisementBody(target, tlla, false)))
	}
	t.Run("neighbour advertisements for the gateway and another pod", func(t *testing.T) {
		h.skipNDOnEbtables(t)
		var frames [][]byte
		for _, target := range append(slices.Clone(gws), h.honestV6Addrs()...) {
			frames = append(frames, na(h.ll(h.evil), allNodes, testkit.MulticastMAC(allNodes), target, evilMAC))
			// Sent from the target's own address, as its owner would.
			frames = append(frames, na(target, allNodes, testkit.MulticastMAC(allNodes), target, evilMAC))
		}
		h.send(t, frames...)
		for _, gw := range gws {
			h.expectNotCaptured(t, "neighbour advertisement for "+gw.String(), ndTarget(testkit.ICMPv6NeighborAdvertisement, gw))
			h.expectNeighbor(t, "neighbour advertisement for the gateway", h.victim, gw, h.bridgeMAC, true)
		}
		for _, a := range h.honestV6Addrs() {
			h.expectNotCaptured(t, "neighbour advertisement for "+a.String(), ndTarget(testkit.ICMPv6NeighborAdvertisement, a))
			h.expectNeighbor(t, "neighbour advertisement for the honest pod", h.victim, a, honestMAC, true)
			h.expectNeighbor(t, "neighbour advertisement for the honest pod", nil, a, honestMAC, !a.IsLinkLocalUnicast())
		}
	})
	t.Run("neighbour discovery with another pod's MAC", func(t *testing.T) {
		h.skipNDOnEbtables(t)
		var frames [][]byte
		for _, own := range h.evilV6Addrs() {
			frames = append(frames,
				na(own, allNodes, testkit.MulticastMAC(allNodes), own, honestMAC),
				testkit.IPFrame(h.mac[h.victim], evilMAC, testkit.ICMPPacket(own, h.ll(h.victim), testkit.ICMPv6NeighborSolicitation, 0,
					testkit.NeighborSolicitationBody(h.ll(h.victim), honestMAC))))
		}
		h.send(t, frames...)
		h.expectNotCaptured(t, "neighbour discovery naming another pod's MAC", func(f testkit.Frame) bool {
			typ, body, ok := f.ICMP()
			return ok && (typ == testkit.ICMPv6NeighborAdvertisement || typ == testkit.ICMPv6NeighborSolicitation) &&
				len(body) >= 28 && net.HardwareAddr(body[22:28]).String() == honestMAC.String()
		})
		for _, own := range h.evilV6Addrs() {
			if mac := testkit.NeighborMAC(t, h.victim.NS, "eth0", own); mac != nil && mac.String() == honestMAC.String() {
				t.Errorf("victim sends evil's %s to the honest pod's MAC", own)
			}
		}
	})
	// The fast IPv6 path lets evil's own addresses through for all but ICMPv6: an advertisement
	// from evil's own link-local address behind a hop-by-hop header (which the receiver skips)
	// must still meet the neighbour discovery checks, whatever header hides it.
	t.Run("neighbour advertisements behind a hop-by-hop header", func(t *testing.T) {
		h.skipNDOnEbtables(t)
		var frames [][]byte
		for _, target := range append(slices.Clone(gws), h.honestV6Addrs()...) {
			frames = append(frames, testkit.IPFrame(testkit.MulticastMAC(allNodes), evilMAC, testkit.WithHopByHop(
				testkit.ICMPPacket(h.ll(h.evil), allNodes, testkit.ICMPv6NeighborAdvertisement, 0, testkit.NeighborAdvertisementBody(target, evilMAC, false)))))
		}
		h.send(t, frames...)
		h.expectNotCaptured(t, "neighbour advertisement behind a hop-by-hop header", func(f testkit.Frame) bool {
			return len(f) > 14+40+8 && f[12] == 0x86 && f[13] == 0xdd && f[14+6] == 0 && f[14+40] == 58 && f[14+48] == testkit.ICMPv6NeighborAdvertisement
		})
		for _, gw := range gws {
			h.expectNeighbor(t, "neighbour advertisement behind a hop-by-hop header for the gateway", h.victim, gw, h.bridgeMAC, true)
		}
		for _, a := range h.honestV6Addrs() {
			h.expectNeighbor(t, "neighbour advertisement behind a hop-by-hop header for the honest pod", h.victim, a, honestMAC, true)
		}
	})
	t.Run("spoofed source addresses", func(t *testing.T) {
		type spoof struct {
			name     string
			src, dst netip.Addr
			srcMAC   net.HardwareAddr
		}
		var spoofs []spoof
		for is6, gw := range h.gateway {
			outside := pick(is6, netip.MustParseAddr("2001:db8:dead::7"), netip.MustParseAddr("203.0.113.7"))
			victim := h.victim.IP(gw)
			spoofs = append(spoofs,
				spoof{"another pod's address", h.honest.IP(gw), victim, evilMAC},
				spoof{"the gateway's address", gw, victim, evilMAC},
				spoof{"an address outside the pod CIDR", outside, victim, evilMAC},
				spoof{"its own address with another pod's MAC", h.evil.IP(gw), victim, honestMAC})
		}
		spoofs = append(spoofs, spoof{"another pod's link-local address", h.ll(h.honest), h.ll(h.victim), evilMAC})
		var frames [][]byte
		for i, s := range spoofs {
			payload := fmt.Sprintf("spoof-%d", i)
			frames = append(frames, testkit.IPFrame(h.mac[h.victim], s.srcMAC, testkit.UDPPacket(s.src, s.dst, 40001, hostileUDPPort, []byte(payload))))
		}
		h.send(t, frames...)
		h.flushVictimUDP(t)
		for i, s := range spoofs {
			payload := fmt.Sprintf("spoof-%d", i)
			h.expectNotCaptured(t, s.name, hasPayload(payload))
			if n := h.victimUDP.Received(payload); n > 0 {
				t.Errorf("%s (%s): the victim's server received it", s.name, s.src)
			}
		}
		if ports := testkit.FDBPorts(t, h.node.NS, honestMAC); !slices.Equal(ports, []string{testkit.KubenetNames(h.honest).HostVeth}) {
			t.Errorf("the bridge has the honest pod's MAC on ports %v, want only %s", ports, testkit.KubenetNames(h.honest).HostVeth)
		}
	})
}

// skipNDOnEbtables skips the checks of what neighbour discovery messages claim on the iptables
// backend: ebtables' ip6 match stops at the ICMPv6 type, so the target address and link-layer
// option of a pod's neighbour advertisements and solicitations are not checked there (README,
// "Pod isolation"; isolation/ebtables.go). Source addresses and MACs are, below.
func (h *hostileNode) skipNDOnEbtables(t *testing.T) {
	if h.backend == "iptables" {
		t.Skip("documented limit of the iptables backend: ebtables cannot read a neighbour discovery message's target or options")
	}
}

func (h *hostileNode) evilV6Addrs() []netip.Addr {
	out := []netip.Addr{h.ll(h.evil)}
	if h.has(true) {
		out = append(out, h.evil.IP(h.gateway[true]))
	}
	return out
}

// flushVictimUDP makes the victim's UDP server handle everything queued before: a datagram
// from the victim itself goes through the same socket queue.
func (h *hostileNode) flushVictimUDP(t *testing.T) {
	t.Helper()
	lo := pick(h.has(false), netip.MustParseAddr("127.0.0.1"), netip.IPv6Loopback())
	if _, err := nettest.UDPRequest(h.victim.NS, netip.AddrPortFrom(lo, hostileUDPPort), "flush", testkit.TrafficTimeout); err != nil {
		t.Fatalf("victim's own request to its UDP server: %v", err)
	}
}

// localhostAndHostPorts: evil sends to the node's 127.0.0.1 and ::1 services (route_localnet is
// on for the bridge: the victim has a host port) and to the victim's host port with another
// pod's source address and through 127.0.0.1.
func (h *hostileNode) localhostAndHostPorts(t *testing.T) {
	evilMAC := h.mac[h.evil]
	type attempt struct {
		name     string
		src, dst netip.AddrPort
		server   *nettest.EchoServer
	}
	var attempts []attempt
	local4, local6 := netip.MustParseAddr("127.0.0.1"), netip.IPv6Loopback()
	for is6, gw := range h.gateway {
		evil := h.evil.IP(gw)
		src := netip.AddrPortFrom(evil, 40002)
		local := pick(is6, local6, local4)
		attempts = append(attempts,
			attempt{"the node's localhost service", src, netip.AddrPortFrom(local, nodeLocalPort), h.nodeLocal[is6]},
			attempt{"the node's localhost service, from a localhost source", netip.AddrPortFrom(local, 40003), netip.AddrPortFrom(local, nodeLocalPort), h.nodeLocal[is6]},
			attempt{"the victim's host port through localhost", src, netip.AddrPortFrom(local, hostileHostPort), h.victimUDP},
			attempt{"the victim's host port with another pod's source", netip.AddrPortFrom(h.honest.IP(gw), 40004), netip.AddrPortFrom(gw, hostileHostPort), h.victimUDP})
	}
	var frames [][]byte
	for i, a := range attempts {
		frames = append(frames, testkit.IPFrame(h.bridgeMAC, evilMAC, testkit.UDPPacket(a.src.Addr(), a.dst.Addr(), a.src.Port(), a.dst.Port(), fmt.Appendf(nil, "local-%d", i))))
	}
	h.send(t, frames...)
	h.flushVictimUDP(t)
	for is6, srv := range h.nodeLocal {
		if _, err := nettest.UDPRequest(h.node.NS, srv.Addr, "flush", testkit.TrafficTimeout); err != nil {
			t.Fatalf("the node's own request to its localhost server (ipv6 %v): %v", is6, err)
		}
	}
	for i, a := range attempts {
		if n := a.server.Received(fmt.Sprintf("local-%d", i)); n > 0 {
			t.Errorf("%s (%s -> %s) got through", a.name, a.src, a.dst)
		}
	}
}

// honestTrafficWorks: after the attacks, the honest pods reach each other (global and
// link-local), the gateway, the outside and the victim's host port; and the attacker's own
// honest traffic works too. It also checks that what a pod legitimately sends from no address
// (an ARP probe, duplicate address detection) still passes.
func (h *hostileNode) honestTrafficWorks(t *testing.T) {
	for is6, gw := range h.gateway {
		v, o := h.victim.IP(gw), h.honest.IP(gw)
		h.expectTCP(t, "victim to honest", h.victim, netip.AddrPortFrom(o, hostileTCPPort), v)
		h.expectTCP(t, "honest to victim", h.honest, netip.AddrPortFrom(v, hostileTCPPort), o)
		h.expectTCP(t, "evil to victim", h.evil, netip.AddrPortFrom(v, hostileTCPPort), h.evil.IP(gw))
		h.expectTCP(t, "victim to the gateway", h.victim, netip.AddrPortFrom(gw, nodeTCPPort), v)
		external, uplink := pick(is6, nettest.External6, nettest.External4), pick(is6, nettest.NodeUplink6, nettest.NodeUplink4)
		h.expectTCP(t, "victim to the outside (SNAT)", h.victim, netip.AddrPortFrom(external.Addr(), nodeTCPPort), uplink.Addr())
		if r, err := nettest.UDPRequest(h.honest.NS, netip.AddrPortFrom(gw, hostileHostPort), "via host port", testkit.TrafficTimeout); err != nil || r.Payload != "via host port" {
			t.Errorf("honest to the victim's host port %s: %+v, %v", netip.AddrPortFrom(gw, hostileHostPort), r, err)
		}
	}
	for _, p := range []*nettest.Pod{h.evil, h.victim} {
		if _, err := nettest.UDPRequest(p.NS, netip.AddrPortFrom(onLink(t, p, h.ll(h.honest)), hostileUDPPort), "ll", testkit.TrafficTimeout); err != nil {
			t.Errorf("%s to the honest pod's link-local address: %v", p.RT.ContainerID, err)
		}
	}
	evilMAC := h.mac[h.evil]
	probe := netip.MustParseAddr("fe80::abcd")
	frames := [][]byte{testkit.IPFrame(testkit.MulticastMAC(testkit.SolicitedNode(probe)), evilMAC,
		testkit.ICMPPacket(netip.IPv6Unspecified(), testkit.SolicitedNode(probe), testkit.ICMPv6NeighborSolicitation, 0, testkit.NeighborSolicitationBody(probe, nil)))}
	probe4 := netip.MustParseAddr("10.244.1.250")
	if h.has(false) {
		frames = append(frames, testkit.Ethernet(testkit.Broadcast, evilMAC, testkit.EtherTypeARP, testkit.ARPPacket(1, evilMAC, netip.IPv4Unspecified(), make(net.HardwareAddr, 6), probe4)))
	}
	testkit.SendFrames(t, h.evil.NS, "eth0", frames...)
	if err := h.capture.WaitFor(testkit.TrafficTimeout, "duplicate address detection", ndTarget(testkit.ICMPv6NeighborSolicitation, probe)); err != nil {
		t.Errorf("evil's duplicate address detection for %s: %v", probe, err)
	}
	if h.has(false) {
		err := h.capture.WaitFor(testkit.TrafficTimeout, "ARP probe", func(f testkit.Frame) bool {
			op, _, spa, tpa, ok := f.ARP()
			return ok && op == 1 && spa == netip.IPv4Unspecified() && tpa == probe4
		})
		if err != nil {
			t.Errorf("evil's ARP probe for %s: %v", probe4, err)
		}
	}
}

// TestHostilePods runs the attacks in every hairpin mode on IPv4, IPv6 and dual-stack networks,
// then deletes the pods and audits the node for leftovers; on the iptables backend in every mode
// on a dual-stack network, and on an IPv4-only one (an IPv6 router advertisement there).
func TestHostilePods(t *testing.T) {
	type variant struct {
		backend, mode string
		fam           string
		cidrs         []netip.Prefix
	}
	var variants []variant
	for _, mode := range []string{"hairpin-veth", "promiscuous-bridge", "none"} {
		for _, fam := range familyCases {
			variants = append(variants, variant{"nftables", mode, fam.name, fam.cidrs})
		}
		variants = append(variants, variant{"iptables", mode, "dual", testkit.DualStack()})
	}
	variants = append(variants, variant{"iptables", "hairpin-veth", "ipv4", []netip.Prefix{nettest.PodCIDR4}})
	for _, v := range variants {
		t.Run(v.backend+"/"+v.mode+"/"+v.fam, func(t *testing.T) {
			t.Parallel()
			h := newHostileNode(t, v.mode, v.backend, v.cidrs, nil)
			t.Run("router", h.routerAttacks)
			t.Run("spoofing", h.spoofingAttacks)
			t.Run("localhost and host ports", h.localhostAndHostPorts)
			t.Run("honest traffic", h.honestTrafficWorks)
			for _, p := range []*nettest.Pod{h.evil, h.victim, h.honest} {
				if err := h.node.Del(h.list, p); err != nil {
					t.Fatalf("DEL %s: %v", p.RT.ContainerID, err)
				}
				testkit.AssertNoResidue(t, h.node, "kubenet", testkit.AttachmentOf(p), p.IPs())
			}
		})
	}
}

// TestAntiSpoofingOff: with "antiSpoofing": false a pod still cannot act as a router, but a
// spoofed source address gets through, which shows that the anti-spoofing rules are what stops
// it in TestHostilePods.
func TestAntiSpoofingOff(t *testing.T) {
	h := newHostileNode(t, "hairpin-veth", "nftables", testkit.DualStack(), map[string]any{"antiSpoofing": false})
	t.Run("router", h.routerAttacks)
	for is6, gw := range h.gateway {
		payload := fmt.Sprintf("spoofed-%v", is6)
		h.send(t, testkit.IPFrame(h.mac[h.victim], h.mac[h.evil], testkit.UDPPacket(h.honest.IP(gw), h.victim.IP(gw), 40001, hostileUDPPort, []byte(payload))))
		h.flushVictimUDP(t)
		if n := h.victimUDP.Received(payload); n != 1 {
			t.Errorf("without anti-spoofing the victim received a datagram from a spoofed %s %d times, want 1", h.honest.IP(gw), n)
		}
	}
	for _, set := range []string{isolation.SetAntiSpoofPorts, isolation.SetMAC, isolation.SetIPv4, isolation.SetIPv6, isolation.SetFastIPv4, isolation.SetFastIPv6} {
		if out := nettest.Run(t, h.node.NS, "nft", "list", "set", "bridge", testkit.HostPortTable, set); strings.Contains(out, "evil/eth0") {
			t.Errorf("anti-spoofing is off, yet set %s has elements of the pods:\n%s", set, out)
		}
	}
	if out := nettest.Run(t, h.node.NS, "nft", "list", "set", "bridge", testkit.HostPortTable, isolation.SetPodPorts); !strings.Contains(out, "evil/eth0") {
		t.Errorf("the guard's set %s lacks evil's port:\n%s", isolation.SetPodPorts, out)
	}
	t.Run("honest traffic", h.honestTrafficWorks)
}

// TestLocalnetGuardAlone: the localnet guard by itself, with every other layer that would stop
// these frames taken away (anti-spoofing off, the bridge's guards emptied, its drop of VLAN-tagged
// frames included): the evil pod writes UDP datagrams to and from the node's loopback addresses,
// through the gateway's MAC, broadcast, a VLAN-0 tag (which only the emptied bridge guard would
// otherwise have stopped), two of them (a VLAN frame still at the bridge device's ingress hook:
// the kernel strips the second tag only after it), a made-up source MAC and another pod's MAC,
// and to the victim's host
// port through 127.0.0.1 or from a 127.0.0.1 source (which the host-port rules would take for the
// node's own and masquerade). None may arrive, with the guard whole and with each of its chains
// alone: the NAT chain drops a connection's first packet before any dstnat (the host port through
// 127.0.0.1 or ::1 never reaches the node's stack: the bridge forwards the translated frame to
// the victim); the guard's input chain drops what conntrack does not track (here a notrack rule
// of another tool; invalid packets alike), which no NAT chain sees. Emptying the chain that
// held shows it was what stopped them. The node's own use of its host ports through 127.0.0.1
// works with the guard (TestFlushedRulesetHealedByNextAdd's reachable).
func TestLocalnetGuardAlone(t *testing.T) {
	h := newHostileNode(t, "hairpin-veth", "nftables", testkit.DualStack(), map[string]any{"antiSpoofing": false})
	for _, chain := range []string{isolation.ChainGuard, isolation.ChainGuardIPv4, isolation.ChainGuardIPv6} {
		nettest.Run(t, h.node.NS, "nft", "flush", "chain", "bridge", testkit.HostPortTable, chain)
	}
	const anyPort = 7200
	anyAddr := nettest.StartUDPEcho(t, h.node.NS, netip.AddrPortFrom(netip.IPv6Unspecified(), anyPort)) // every address, both families
	madeUp := net.HardwareAddr{0x02, 0, 0, 0, 0x26, 0x01}
	type attempt struct {
		name     string
		dstMAC   net.HardwareAddr
		srcMAC   net.HardwareAddr
		src, dst netip.AddrPort
		tags     int // VLAN-0 tags
		server   *nettest.EchoServer
	}
	var attempts []attempt
	evilMAC := h.mac[h.evil]
	const (
		toLoopback       = "IPv4 to the node's loopback service, to the gateway's MAC"
		toLoopbackTagged = "IPv4 to the node's loopback service, VLAN 0"
		toLoopbackQinQ   = "IPv4 to the node's loopback service, two VLAN-0 tags"
		hostPortByLo     = "IPv4 to the victim's host port through loopback"

		toOtherLoopback     = "IPv4 to 127.0.0.2, a service on every address"
		toOtherLoopbackQinQ = "IPv4 to 127.0.0.2, a service on every address, two VLAN-0 tags"
		hostPortByOtherLo   = "IPv4 to the victim's host port through 127.0.0.2"
	)
	// The source ports change from round to round: a datagram that arrived has been answered,
	// and conntrack would take the next one with the same ports for a reply of that answer.
	for is6, gw := range h.gateway {
		evil := netip.AddrPortFrom(h.evil.IP(gw), 40010)
		lo := pick(is6, netip.IPv6Loopback(), netip.MustParseAddr("127.0.0.1"))
		local, fromLocal := netip.AddrPortFrom(lo, nodeLocalPort), netip.AddrPortFrom(lo, 40011)
		family := pick(is6, "IPv6", "IPv4")
		attempts = append(attempts,
			attempt{family + " to the node's loopback service, to the gateway's MAC", h.bridgeMAC, evilMAC, evil, local, 0, h.nodeLocal[is6]},
			attempt{family + " to the node's loopback service, broadcast", testkit.Broadcast, evilMAC, evil, local, 0, h.nodeLocal[is6]},
			attempt{family + " to the node's loopback service, VLAN 0", h.bridgeMAC, evilMAC, evil, local, 1, h.nodeLocal[is6]},
			attempt{family + " to the node's loopback service, two VLAN-0 tags", h.bridgeMAC, evilMAC, evil, local, 2, h.nodeLocal[is6]},
			attempt{family + " to the node's loopback service, from a made-up MAC", h.bridgeMAC, madeUp, evil, local, 0, h.nodeLocal[is6]},
			attempt{family + " to the node's loopback service, to the honest pod's MAC", h.mac[h.honest], evilMAC, evil, local, 0, h.nodeLocal[is6]},
			attempt{family + " to the node's loopback service from a loopback source", h.bridgeMAC, evilMAC, fromLocal, local, 0, h.nodeLocal[is6]},
			attempt{family + " from a loopback source to the gateway's address", h.bridgeMAC, evilMAC, fromLocal, netip.AddrPortFrom(gw, anyPort), 0, anyAddr},
			attempt{family + " to the victim's host port through loopback", h.bridgeMAC, evilMAC, evil, netip.AddrPortFrom(lo, hostileHostPort), 0, h.victimUDP},
			attempt{family + " from a loopback source to the victim's host port", h.bridgeMAC, evilMAC, fromLocal, netip.AddrPortFrom(gw, hostileHostPort), 0, h.victimUDP},
		)
	}
	// Loopback addresses other than 127.0.0.1 are the node's too (a service on every address
	// answers them, a host port translates them); ::ffff:127.0.0.1 would be 127.0.0.1 to a socket
	// of both families, but the kernel does not take it as a local address (it does not arrive
	// with both chains emptied either: this checks the kernel, not the guard).
	otherLo := netip.MustParseAddr("127.0.0.2")
	mapped := netip.AddrFrom16(netip.MustParseAddr("127.0.0.1").As16())
	if gw, ok := h.gateway[false]; ok {
		evil := netip.AddrPortFrom(h.evil.IP(gw), 40012)
		attempts = append(attempts,
			attempt{toOtherLoopback, h.bridgeMAC, evilMAC, evil, netip.AddrPortFrom(otherLo, anyPort), 0, anyAddr},
			attempt{toOtherLoopbackQinQ, h.bridgeMAC, evilMAC, evil, netip.AddrPortFrom(otherLo, anyPort), 2, anyAddr},
			attempt{hostPortByOtherLo, h.bridgeMAC, evilMAC, evil, netip.AddrPortFrom(otherLo, hostileHostPort), 0, h.victimUDP},
		)
	}
	if gw, ok := h.gateway[true]; ok {
		evil := netip.AddrPortFrom(h.evil.IP(gw), 40013)
		attempts = append(attempts,
			attempt{"IPv6 to ::ffff:127.0.0.1, a service on every address", h.bridgeMAC, evilMAC, evil, netip.AddrPortFrom(mapped, anyPort), 0, anyAddr},
			attempt{"IPv6 to the victim's host port through ::ffff:127.0.0.1", h.bridgeMAC, evilMAC, evil, netip.AddrPortFrom(mapped, hostileHostPort), 0, h.victimUDP},
		)
	}
	round := 0
	try := func(t *testing.T) map[string]int {
		t.Helper()
		round++
		var frames [][]byte
		for i, a := range attempts {
			srcPort := a.src.Port() + uint16(100*round)
			frame := testkit.IPFrame(a.dstMAC, a.srcMAC, testkit.UDPPacket(a.src.Addr(), a.dst.Addr(), srcPort, a.dst.Port(), fmt.Appendf(nil, "localnet-%d-%d", round, i)))
			for range a.tags {
				frame = testkit.PriorityTagged(frame)
			}
			frames = append(frames, frame)
		}
		h.send(t, frames...)
		// Each server handles its queue in order: a request of the node's own, answered, comes
		// after every attempt that got into the queue.
		h.flushVictimUDP(t)
		for _, srv := range []*nettest.EchoServer{h.nodeLocal[false], h.nodeLocal[true], anyAddr} {
			if _, err := nettest.UDPRequest(h.node.NS, srv.Addr, "flush", testkit.TrafficTimeout); err != nil {
				t.Fatalf("the node's own request to %s: %v", srv.Addr, err)
			}
		}
		got := map[string]int{}
		for i, a := range attempts {
			got[a.name] = a.server.Received(fmt.Sprintf("localnet-%d-%d", round, i))
		}
		return got
	}
	notrack := "table inet kubenet-test-notrack {\n\tchain raw {\n\t\ttype filter hook prerouting priority raw;\n\t\tiifname \"cbr0\" notrack\n\t}\n}\n"
	script := filepath.Join(t.TempDir(), "notrack.nft")
	if err := os.WriteFile(script, []byte(notrack), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct {
		name   string
		change func()
		arrive []string // what must arrive; nothing else may
	}{
		{"the whole guard", func() {}, nil},
		{"conntrack bypassed (notrack): the guard's input chain alone", func() { nettest.Run(t, h.node.NS, "nft", "-f", script) }, nil},
		{"conntrack bypassed, the input chain emptied", func() {
			nettest.Run(t, h.node.NS, "nft", "flush", "chain", "inet", testkit.HostPortTable, hostport.ChainLocalnetInput)
		}, []string{toLoopback, toLoopbackTagged, toLoopbackQinQ, toOtherLoopback, toOtherLoopbackQinQ}},
		{"the NAT chain alone", func() { nettest.Run(t, h.node.NS, "nft", "delete", "table", "inet", "kubenet-test-notrack") }, nil},
		{"both chains emptied", func() {
			nettest.Run(t, h.node.NS, "nft", "flush", "chain", "inet", testkit.HostPortTable, hostport.ChainLocalnetNAT)
		}, []string{toLoopback, toLoopbackTagged, toLoopbackQinQ, hostPortByLo, toOtherLoopback, toOtherLoopbackQinQ, hostPortByOtherLo}},
	} {
		r.change()
		got := try(t)
		for _, a := range attempts {
			switch want := slices.Contains(r.arrive, a.name); {
			case want && got[a.name] == 0:
				t.Errorf("%s: %s did not arrive: the test does not show that the emptied chain stopped it", r.name, a.name)
			case !want && got[a.name] > 0 && r.arrive == nil:
				t.Errorf("%s: %s arrived %d times", r.name, a.name, got[a.name])
			}
		}
	}
}

// TestGuardDropsLoopbackTCP: the guard's fast path lets TCP through in one rule, but not with a
// loopback source or destination: a pod's TCP segments to or from 127.0.0.1 and ::1 end in the
// bridge's guard, before any later bridge chain (the other layers, the node's localnet guards,
// would stop most of them too, which is why this counts in a bridge chain of the test's own,
// after the guard, instead of looking for them at the node). Anti-spoofing is off, so that the
// guard alone meets the loopback sources. Evil's own TCP to the victim is counted as the
// control: the counting chain sees what the guard lets through.
func TestGuardDropsLoopbackTCP(t *testing.T) {
	h := newHostileNode(t, "hairpin-veth", "nftables", testkit.DualStack(), map[string]any{"antiSpoofing": false})
	const table = "kubenet-test-seen"
	script := filepath.Join(t.TempDir(), "seen.nft")
	rules := "table bridge " + table + " {\n\tcounter loopback {}\n\tcounter control {}\n\tchain seen {\n" +
		"\t\ttype filter hook prerouting priority -100;\n" +
		"\t\tmeta l4proto tcp ip saddr 127.0.0.0/8 counter name loopback\n" +
		"\t\tmeta l4proto tcp ip daddr 127.0.0.0/8 counter name loopback\n" +
		"\t\tmeta l4proto tcp ip6 saddr ::1 counter name loopback\n" +
		"\t\tmeta l4proto tcp ip6 daddr ::1 counter name loopback\n" +
		"\t\ttcp sport 40120 tcp flags & (syn | ack | rst) == syn counter name control\n\t}\n}\n"
	if err := os.WriteFile(script, []byte(rules), 0o600); err != nil {
		t.Fatal(err)
	}
	nettest.Run(t, h.node.NS, "nft", "-f", script)
	packets := func(counter string) int {
		out := nettest.Run(t, h.node.NS, "nft", "list", "counter", "bridge", table, counter)
		m := regexp.MustCompile(`packets (\d+)`).FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("counter %s: %s", counter, out)
		}
		n, _ := strconv.Atoi(m[1])
		return n
	}
	evilMAC := h.mac[h.evil]
	var frames [][]byte
	for is6, gw := range h.gateway {
		lo := pick(is6, netip.IPv6Loopback(), netip.MustParseAddr("127.0.0.1"))
		evil, victim := h.evil.IP(gw), h.victim.IP(gw)
		frames = append(frames,
			testkit.IPFrame(h.bridgeMAC, evilMAC, testkit.TCPPacket(evil, lo, 40110, 22, testkit.TCPSyn, nil)),
			testkit.IPFrame(h.bridgeMAC, evilMAC, testkit.TCPPacket(lo, gw, 40111, 22, testkit.TCPSyn, nil)),
			testkit.IPFrame(h.mac[h.victim], evilMAC, testkit.TCPPacket(lo, victim, 40112, hostileTCPPort, testkit.TCPSyn, nil)),
			testkit.IPFrame(h.mac[h.victim], evilMAC, testkit.TCPPacket(evil, victim, 40120, hostileTCPPort, testkit.TCPSyn, nil)))
	}
	h.send(t, frames...)
	if n := packets("control"); n != len(h.gateway) {
		t.Fatalf("the counting chain saw %d of evil's own %d TCP segments: it cannot tell what the guard let through", n, len(h.gateway))
	}
	if n := packets("loopback"); n != 0 {
		t.Errorf("%d TCP segment(s) with a loopback source or destination from a pod got past the bridge's guard", n)
	}
}

// TestLocalnetGuardStopsForgedLoopbackReplies: a connection of the node's own over lo (a client
// on 127.0.0.1 and a stub resolver on 127.0.0.53, say) is in conntrack, so a forged reply (from
// 127.0.0.53, which is not an address of lo and so passes the kernel's source check with
// rp_filter off) is a packet conntrack takes as established: no NAT chain sees it, and only the
// guard's input chain stands between it and the client's socket. A pod sends it untagged, under
// a VLAN-0 tag and under two (which the bridge device's ingress hook, the chain's place before,
// saw as a VLAN frame, not IPv4), with every other layer taken away (anti-spoofing off, the
// bridge's guards emptied); another host sends it over the node's uplink, with route_localnet
// on for every device as kube-proxy sets it for its localhost NodePorts. With the input chain
// emptied each forged reply arrives, which shows the test reaches the client.
func TestLocalnetGuardStopsForgedLoopbackReplies(t *testing.T) {
	h := newHostileNode(t, "hairpin-veth", "nftables", testkit.DualStack(), map[string]any{"antiSpoofing": false})
	for _, chain := range []string{isolation.ChainGuard, isolation.ChainGuardIPv4, isolation.ChainGuardIPv6} {
		nettest.Run(t, h.node.NS, "nft", "flush", "chain", "bridge", testkit.HostPortTable, chain)
	}
	nettest.Run(t, h.node.NS, "sysctl", "-w", "net.ipv4.conf.all.route_localnet=1")
	if got := strings.TrimSpace(nettest.Run(t, h.node.NS, "sysctl", "-n", "net.ipv4.conf.cbr0.rp_filter", "net.ipv4.conf.eth0.rp_filter", "net.ipv4.conf.all.rp_filter")); got != "0\n0\n0" {
		t.Fatalf("rp_filter on cbr0, eth0 and all = %q, want 0 (the kernel's default), under which the source check lets 127.0.0.53 in", got)
	}
	resolver := netip.MustParseAddrPort("127.0.0.53:5300")
	var server, client *net.UDPConn
	nettest.Do(t, h.node.NS, func() error {
		var err error
		if server, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(resolver)); err != nil {
			return fmt.Errorf("resolver: %w", err)
		}
		client, err = net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(resolver))
		return err
	})
	t.Cleanup(func() { server.Close(); client.Close() })
	clientAddr := client.LocalAddr().(*net.UDPAddr).AddrPort()
	macOf := func(n ns.NetNS, ifname string) net.HardwareAddr {
		var mac net.HardwareAddr
		nettest.Do(t, n, func() error {
			link, err := netlink.LinkByName(ifname)
			if err == nil {
				mac = link.Attrs().HardwareAddr
			}
			return err
		})
		return mac
	}
	nodeMAC, externalMAC := macOf(h.node.NS, "eth0"), macOf(h.node.External, "eth0")
	uplinkEcho := nettest.StartUDPEcho(t, h.node.NS, netip.AddrPortFrom(nettest.NodeUplink4.Addr(), 7300))
	marks := 0
	senders := []struct {
		name string
		send func(t *testing.T, forged func(dst, src net.HardwareAddr, tags int) []byte)
	}{
		{"a pod", func(t *testing.T, forged func(dst, src net.HardwareAddr, tags int) []byte) {
			h.send(t, forged(h.bridgeMAC, h.mac[h.evil], 0), forged(h.bridgeMAC, h.mac[h.evil], 1), forged(h.bridgeMAC, h.mac[h.evil], 2))
		}},
		{"the uplink", func(t *testing.T, forged func(dst, src net.HardwareAddr, tags int) []byte) {
			// A datagram to the node's uplink address behind it: once it arrived, so had they.
			marks++
			mark := fmt.Sprintf("uplink-mark-%d", marks)
			testkit.SendFrames(t, h.node.External, "eth0", forged(nodeMAC, externalMAC, 0),
				testkit.IPFrame(nodeMAC, externalMAC, testkit.UDPPacket(nettest.External4.Addr(), nettest.NodeUplink4.Addr(), 40020, 7300, []byte(mark))))
			if err := nettest.Eventually(testkit.TrafficTimeout, func() error {
				if uplinkEcho.Received(mark) == 0 {
					return fmt.Errorf("%s has not arrived", mark)
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
		}},
	}
	// ask sends a query, so the connection is in conntrack; the resolver answers after the
	// forged frames went (each sender waits until a frame sent after them arrived), so every
	// forged reply that got through is in the client's queue ahead of the answer.
	ask := func(t *testing.T, round string, send func(t *testing.T, forged func(dst, src net.HardwareAddr, tags int) []byte)) []string {
		t.Helper()
		buf := make([]byte, 1500)
		if _, err := client.Write([]byte("query")); err != nil {
			t.Fatal(err)
		}
		if err := server.SetReadDeadline(time.Now().Add(testkit.TrafficTimeout)); err != nil {
			t.Fatal(err)
		}
		_, from, err := server.ReadFromUDPAddrPort(buf)
		if err != nil {
			t.Fatalf("the resolver's query: %v", err)
		}
		send(t, func(dst, src net.HardwareAddr, tags int) []byte {
			frame := testkit.IPFrame(dst, src, testkit.UDPPacket(resolver.Addr(), clientAddr.Addr(), resolver.Port(), clientAddr.Port(), fmt.Appendf(nil, "forged-%s-%d-tags", round, tags)))
			for range tags {
				frame = testkit.PriorityTagged(frame)
			}
			return frame
		})
		if _, err := server.WriteToUDPAddrPort([]byte("answer"), from); err != nil {
			t.Fatal(err)
		}
		var got []string
		for {
			if err := client.SetReadDeadline(time.Now().Add(testkit.TrafficTimeout)); err != nil {
				t.Fatal(err)
			}
			n, err := client.Read(buf)
			if err != nil {
				t.Fatalf("the resolver's answer: %v (forged replies read: %q)", err, got)
			}
			if string(buf[:n]) == "answer" {
				return got
			}
			got = append(got, string(buf[:n]))
		}
	}
	for _, s := range senders {
		if got := ask(t, "guarded", s.send); len(got) != 0 {
			t.Errorf("forged replies from %s reached the node's loopback client through the localnet guard: %q", s.name, got)
		}
	}
	nettest.Run(t, h.node.NS, "nft", "flush", "chain", "inet", testkit.HostPortTable, hostport.ChainLocalnetInput)
	for _, s := range senders {
		want := []string{"forged-emptied-0-tags", "forged-emptied-1-tags", "forged-emptied-2-tags"}
		if s.name == "the uplink" {
			want = want[:1]
		}
		if got := ask(t, "emptied", s.send); !slices.Equal(got, want) {
			t.Errorf("from %s with the input chain emptied the client read %q, want %q: the test does not show that the chain stopped them", s.name, got, want)
		}
	}
}

// TestEbtablesGuardPolicyPutBackByNextAdd: on the iptables backend, a guard chain whose policy
// another tool set to ACCEPT (ebtables -P) accepts every frame of every pod at its end, before
// the pod's own chain checks the frame's source: the evil pod's datagram from the honest pod's
// address reaches the victim. ebtables -L prints that chain's policy as RETURN; the next ADD
// must put the guard back anyway, and CHECK must report it.
func TestEbtablesGuardPolicyPutBackByNextAdd(t *testing.T) {
	h := newHostileNode(t, "hairpin-veth", "iptables", []netip.Prefix{nettest.PodCIDR4}, nil)
	gw := h.gateway[false]
	spoof := func(payload string) int {
		h.send(t, testkit.IPFrame(h.mac[h.victim], h.mac[h.evil], testkit.UDPPacket(h.honest.IP(gw), h.victim.IP(gw), 40001, hostileUDPPort, []byte(payload))))
		h.flushVictimUDP(t)
		return h.victimUDP.Received(payload)
	}
	if n := spoof("spoofed-intact"); n != 0 {
		t.Fatalf("with the guard intact the victim received a spoofed datagram %d times", n)
	}
	nettest.Run(t, h.node.NS, "ebtables", "-t", "nat", "-P", "KUBENET-GUARD-"+ipt.ChainSuffix("kubenet"), "ACCEPT")
	if n := spoof("spoofed-accept"); n != 1 {
		t.Fatalf("with the guard's policy ACCEPT the victim received a spoofed datagram %d times, want 1 (else the test proves nothing)", n)
	}
	if err := h.node.Check(h.list, h.evil); err == nil {
		t.Error("CHECK of the evil pod with the guard's policy ACCEPT: nil, want the guard's difference")
	}
	h.node.MustAdd(t, h.list, h.node.NewPod(t, "after-policy"))
	if n := spoof("spoofed-after-add"); n != 0 {
		t.Errorf("after the next ADD the victim received a spoofed datagram %d times, want 0", n)
	}
	if err := h.node.Check(h.list, h.evil); err != nil {
		t.Errorf("CHECK of the evil pod after the next ADD: %v", err)
	}
}
