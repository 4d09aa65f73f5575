package overlay_test

// Adversarial kernel tests of the overlay (issue #25 review): every test builds its own network
// namespaces (nettest), never touches the test process's own, and checks one way a hostile pod,
// another tool on the node or a changed configuration gets VXLAN frames decapsulated that the
// firewall should have dropped, or breaks the overlay without the agent noticing.

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/kubenet-dev/kubenet/core"
	"github.com/kubenet-dev/kubenet/overlay"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

const (
	advDevice = "kubenet-vxlan"
	advBridge = "kbr0"
	sinkPort  = 7000
)

// advNode is a simulated node: an underlay address, a pod bridge holding the first address of
// its pod CIDR, and (once synced) the overlay.
type advNode struct {
	name  string
	ns    ns.NetNS
	addr  netip.Addr
	cidr  netip.Prefix
	gwPod netip.Addr // the bridge's address: the first host of the pod CIDR
}

// advWorld is two nodes and a host that is no node on one segment.
type advWorld struct {
	under    *nettest.Underlay
	a, b     *advNode
	outsider ns.NetNS
	outAddr  netip.Addr
}

func newAdvNode(t *testing.T, u *nettest.Underlay, name string, addr netip.Prefix, cidr netip.Prefix) *advNode {
	t.Helper()
	n := &advNode{name: name, ns: nettest.NewNS(t), addr: addr.Addr(), cidr: cidr, gwPod: cidr.Addr().Next()}
	u.Attach(t, n.ns, "eth0", addr)
	nettest.WriteSysctl(t, n.ns, "net/ipv4/ip_forward", "1")
	nettest.Do(t, n.ns, func() error {
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: advBridge}}
		if err := netlink.LinkAdd(br); err != nil {
			return err
		}
		l, err := netlink.LinkByName(advBridge)
		if err != nil {
			return err
		}
		if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: n.gwPod.AsSlice(), Mask: net.CIDRMask(cidr.Bits(), 32)}}); err != nil {
			return err
		}
		return netlink.LinkSetUp(l)
	})
	return n
}

func newAdvWorld(t *testing.T) *advWorld {
	t.Helper()
	u := nettest.NewUnderlay(t, 0)
	w := &advWorld{under: u,
		a: newAdvNode(t, u, "node-a", netip.MustParsePrefix("192.0.2.1/24"), netip.MustParsePrefix("10.244.1.0/24")),
		b: newAdvNode(t, u, "node-b", netip.MustParsePrefix("192.0.2.2/24"), netip.MustParsePrefix("10.244.2.0/24")),
		// The outsider is on the segment but is no Node.
		outsider: nettest.NewNS(t), outAddr: netip.MustParseAddr("192.0.2.99"),
	}
	u.Attach(t, w.outsider, "eth0", netip.MustParsePrefix("192.0.2.99/24"))
	return w
}

// spec is the overlay node n needs to reach peer through the device, as the agent builds it.
func (w *advWorld) spec(n, peer *advNode) core.Overlay {
	return core.Overlay{
		Device: advDevice, VNI: 1, Port: 8472, Local: n.addr, MTU: 1450, Bridge: advBridge,
		Peers:       []core.OverlayPeer{{Node: peer.name, Underlay: peer.addr, PodCIDRs: []netip.Prefix{peer.cidr}}},
		Nodes:       []netip.Addr{w.a.addr, w.b.addr},
		PodNetworks: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")},
	}
}

// syncOverlay runs core.SyncOverlay inside n and points the route to the peer's CIDR at the
// device as the agent does (onlink via the CIDR's first address).
func syncOverlay(t *testing.T, n *advNode, o core.Overlay) error {
	t.Helper()
	var serr error
	nettest.Do(t, n.ns, func() error {
		st, err := core.SyncOverlay(o)
		if err != nil {
			serr = err
			return nil
		}
		for node, err := range st.Failed {
			return fmt.Errorf("peer %s: %w", node, err)
		}
		for _, p := range o.Peers {
			for _, c := range p.PodCIDRs {
				r := &netlink.Route{Dst: &net.IPNet{IP: c.Addr().AsSlice(), Mask: net.CIDRMask(c.Bits(), 32)}, Gw: overlay.NextHop(c).AsSlice(),
					LinkIndex: st.Device, Flags: int(netlink.FLAG_ONLINK)}
				if err := netlink.RouteReplace(r); err != nil {
					return err
				}
			}
		}
		return nil
	})
	return serr
}

func mustSync(t *testing.T, n *advNode, o core.Overlay) {
	t.Helper()
	if err := syncOverlay(t, n, o); err != nil {
		t.Fatalf("SyncOverlay on %s: %v", n.name, err)
	}
}

// vxlanFrame is a VXLAN payload (what goes after the outer UDP header) carrying one IPv4/UDP
// datagram from src to dst:dport, in an Ethernet frame addressed to dstMAC.
func vxlanFrame(vni uint32, dstMAC net.HardwareAddr, src, dst netip.Addr, dport uint16, payload string) []byte {
	b := []byte{0x08, 0, 0, 0, byte(vni >> 16), byte(vni >> 8), byte(vni), 0}
	b = append(b, dstMAC...)
	b = append(b, 0x02, 0, 0, 0, 0, 0x01, 0x08, 0x00)
	total := 20 + 8 + len(payload)
	ip := make([]byte, 20)
	ip[0], ip[8], ip[9] = 0x45, 64, unix.IPPROTO_UDP
	binary.BigEndian.PutUint16(ip[2:], uint16(total))
	s, d := src.As4(), dst.As4()
	copy(ip[12:], s[:])
	copy(ip[16:], d[:])
	binary.BigEndian.PutUint16(ip[10:], checksum(ip))
	udp := make([]byte, 8)
	binary.BigEndian.PutUint16(udp[0:], 40000)
	binary.BigEndian.PutUint16(udp[2:], dport)
	binary.BigEndian.PutUint16(udp[4:], uint16(8+len(payload)))
	b = append(b, ip...)
	b = append(b, udp...)
	return append(b, payload...)
}

func checksum(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s > 0xffff {
		s = s>>16 + s&0xffff
	}
	return ^uint16(s)
}

// sendUDP sends one datagram from an ordinary UDP socket inside from (the kernel picks the
// source address): what any process can do, no capability needed.
func sendUDP(t *testing.T, from ns.NetNS, to netip.AddrPort, data []byte) {
	t.Helper()
	nettest.Do(t, from, func() error {
		c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(to))
		if err != nil {
			return err
		}
		defer c.Close()
		_, _ = c.Write(data)
		return nil
	})
}

// sendUDPAsNobody is sendUDP from a process of user nobody with no capabilities at all.
func sendUDPAsNobody(t *testing.T, from ns.NetNS, to netip.AddrPort, data []byte) {
	t.Helper()
	py := "import socket,sys; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.sendto(bytes.fromhex(sys.argv[1]), (sys.argv[2], int(sys.argv[3])))"
	nettest.Run(t, from, "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all",
		"/usr/bin/python3", "-c", py, hex.EncodeToString(data), to.Addr().String(), fmt.Sprint(to.Port()))
}

// delivered says how many datagrams with payload reached sink, once a barrier datagram sent
// after them (from the namespace the sink listens in) has arrived: what was sent before had its
// chance. No sleep.
func delivered(sink *nettest.EchoServer, payload string) int {
	if err := sink.Barrier(); err != nil {
		panic(err) // the sink's own namespace cannot reach it: nothing measured means anything
	}
	return sink.Received(payload)
}

// injectFrom sends a crafted VXLAN frame to victim's VTEP from the namespace from, a few times.
func injectFrom(t *testing.T, from ns.NetNS, to netip.AddrPort, victim *advNode, vni uint32, spoofed netip.Addr, payload string) {
	t.Helper()
	frame := vxlanFrame(vni, overlay.MAC(victim.addr), spoofed, victim.gwPod, sinkPort, payload)
	for range 3 {
		sendUDP(t, from, to, frame)
	}
}

// expectInjectionWorksWithoutFirewall proves the injector: with the firewall table deleted, the
// outsider's frame is decapsulated and delivered. Without this control a "dropped" proves nothing.
func expectInjectionWorksWithoutFirewall(t *testing.T, w *advWorld, sink *nettest.EchoServer, port uint16) {
	t.Helper()
	nettest.Run(t, w.b.ns, "nft", "delete", "table", "inet", "kubenet-overlay")
	err := nettest.Eventually(5*time.Second, func() error {
		injectFrom(t, w.outsider, netip.AddrPortFrom(w.b.addr, port), w.b, 1, netip.MustParseAddr("10.244.1.77"), "control")
		if delivered(sink, "control") == 0 {
			return fmt.Errorf("control: the crafted frame is not decapsulated even without the firewall; the injector is broken")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestAdvFirewallDormantTable: `nft add table inet kubenet-overlay '{ flags dormant; }'` (one
// command of another tool on the node) unhooks both chains while the table, its chains, rules and
// sets all stay as planned. Firewall.Sync compares only those, finds nothing to do, and writes
// nothing: the device decapsulates VXLAN from any host until the table is rewritten for some
// other reason.
func TestAdvFirewallDormantTable(t *testing.T) {
	w := newAdvWorld(t)
	sink := nettest.StartUDPEcho(t, w.b.ns, netip.AddrPortFrom(w.b.gwPod, sinkPort))
	mustSync(t, w.b, w.spec(w.b, w.a))
	expectInjectionWorksWithoutFirewall(t, w, sink, 8472)
	mustSync(t, w.b, w.spec(w.b, w.a))
	injectFrom(t, w.outsider, netip.AddrPortFrom(w.b.addr, 8472), w.b, 1, netip.MustParseAddr("10.244.1.77"), "with-firewall")
	if got := delivered(sink, "with-firewall"); got != 0 {
		t.Fatalf("%d frames of a host that is no node decapsulated with the firewall in place", got)
	}
	nettest.Run(t, w.b.ns, "nft", "add", "table", "inet", "kubenet-overlay", "{ flags dormant; }")
	// The agent's reaction to the nftables event: a sync.
	mustSync(t, w.b, w.spec(w.b, w.a))
	injectFrom(t, w.outsider, netip.AddrPortFrom(w.b.addr, 8472), w.b, 1, netip.MustParseAddr("10.244.1.77"), "dormant")
	if got := delivered(sink, "dormant"); got != 0 {
		out, _ := nettest.Output(w.b.ns, "nft", "list", "table", "inet", "kubenet-overlay")
		t.Fatalf("the firewall table was made dormant and SyncOverlay left it so: %d frames of a host that is no node were decapsulated\n%s", got, out)
	}
}

// TestAdvRenamedDevice: another tool renames the device (down, rename, up). The agent looks its
// device up by name only: it creates a new one, which the kernel refuses (EEXIST: the renamed
// device still holds the VNI on the port), so the overlay stays down until a person deletes the
// renamed device. Meanwhile the renamed device keeps decapsulating, and the firewall's rules that
// name the device (no VXLAN out of the overlay, the overlay delivers to the pods' bridge only) no
// longer apply to it.
func TestAdvRenamedDevice(t *testing.T) {
	w := newAdvWorld(t)
	mustSync(t, w.b, w.spec(w.b, w.a))
	nettest.Run(t, w.b.ns, "ip", "link", "set", advDevice, "down")
	nettest.Run(t, w.b.ns, "ip", "link", "set", advDevice, "name", "renamed0")
	nettest.Run(t, w.b.ns, "ip", "link", "set", "renamed0", "up")
	if err := syncOverlay(t, w.b, w.spec(w.b, w.a)); err != nil {
		t.Fatalf("SyncOverlay after the device was renamed: %v (the overlay stays down until someone deletes renamed0)", err)
	}
	out := nettest.Run(t, w.b.ns, "ip", "-d", "link", "show", "type", "vxlan")
	if strings.Contains(out, "renamed0") {
		t.Fatalf("the renamed overlay device still decapsulates, outside the firewall's device rules:\n%s", out)
	}
}

// TestAdvDeviceNameAndPortChanged: the agent restarted with another --vxlan-device and
// --vxlan-port (a documented flag change: "the flag and a rollout"). The sync only knows the new
// name: the old device stays, listening on the old port, which the firewall no longer filters.
// Any host then gets frames decapsulated and, since the forward rule names the new device only,
// forwarded anywhere.
func TestAdvDeviceNameAndPortChanged(t *testing.T) {
	w := newAdvWorld(t)
	sink := nettest.StartUDPEcho(t, w.b.ns, netip.AddrPortFrom(w.b.gwPod, sinkPort))
	mustSync(t, w.b, w.spec(w.b, w.a))
	changed := w.spec(w.b, w.a)
	changed.Device, changed.Port = "kubenet-vx2", 4789
	mustSync(t, w.b, changed)
	injectFrom(t, w.outsider, netip.AddrPortFrom(w.b.addr, 8472), w.b, 1, netip.MustParseAddr("10.244.1.77"), "old-port")
	if got := delivered(sink, "old-port"); got != 0 {
		out := nettest.Run(t, w.b.ns, "ip", "-d", "link", "show", "type", "vxlan")
		t.Fatalf("after --vxlan-device/--vxlan-port changed, %d frames of a host that is no node were decapsulated by the old device on the old port:\n%s", got, out)
	}
}

// TestAdvTunnelParametersTampered: `ip link set kubenet-vxlan type vxlan ttl 1` (tos, df likewise)
// changes the device in place. Ensure compares VNI, port, local, learning, group and
// collect-metadata only, so the sync keeps a device whose packets die at the first router: every
// peer behind one is cut off while the condition says the routes are in place.
func TestAdvTunnelParametersTampered(t *testing.T) {
	w := newAdvWorld(t)
	mustSync(t, w.b, w.spec(w.b, w.a))
	nettest.Run(t, w.b.ns, "ip", "link", "set", advDevice, "type", "vxlan", "ttl", "1", "tos", "0x10", "df", "set")
	mustSync(t, w.b, w.spec(w.b, w.a))
	out := nettest.Run(t, w.b.ns, "ip", "-d", "link", "show", advDevice)
	for _, bad := range []string{"ttl 1 ", "tos 0x10", "df set"} {
		if strings.Contains(out, bad) {
			t.Errorf("SyncOverlay kept a tampered device (%q):\n%s", bad, out)
		}
	}
}

// TestAdvLocalProcessInjects: every Node's InternalIP is a trusted sender, this node's own too.
// A process on the node with no capability at all (user nobody; a hostNetwork pod) sends a UDP
// datagram to the node's own address and port 8472: its source is the node's address, the
// firewall lets it in, and the device decapsulates a frame whose inner source the process chose
// freely (here a pod of another node): spoofing that needed CAP_NET_RAW before.
func TestAdvLocalProcessInjects(t *testing.T) {
	w := newAdvWorld(t)
	sink := nettest.StartUDPEcho(t, w.b.ns, netip.AddrPortFrom(w.b.gwPod, sinkPort))
	mustSync(t, w.b, w.spec(w.b, w.a))
	frame := vxlanFrame(1, overlay.MAC(w.b.addr), netip.MustParseAddr("10.244.1.77"), w.b.gwPod, sinkPort, "local-nobody")
	for range 3 {
		sendUDPAsNobody(t, w.b.ns, netip.AddrPortFrom(w.b.addr, 8472), frame)
	}
	if got := delivered(sink, "local-nobody"); got != 0 {
		t.Fatalf("%d frames an unprivileged local process sent to its own node's VXLAN port were decapsulated (inner source 10.244.1.77 spoofed)", got)
	}
}

// TestAdvMasqueradedSenders: the receiving node trusts any packet whose source is a Node's
// address, and only the kubenet bridge's traffic is kept from reaching another node's VXLAN port
// (and only where the agent has an overlay). Whatever else a node masquerades gets its address
// and is decapsulated by the peer.
func TestAdvMasqueradedSenders(t *testing.T) {
	// attach puts a host behind n on bridge br (created if needed) with addr, default route via gw.
	attach := func(t *testing.T, n *advNode, br string, brAddr, addr netip.Prefix) ns.NetNS {
		h := nettest.NewNS(t)
		nettest.Link(t, nettest.Endpoint{NS: n.ns, IfName: "veth-" + br}, nettest.Endpoint{NS: h, IfName: "eth0", Addrs: []netip.Prefix{addr}})
		nettest.Do(t, n.ns, func() error {
			l, err := netlink.LinkByName(br)
			if err != nil {
				if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: br}}); err != nil {
					return err
				}
				if l, err = netlink.LinkByName(br); err != nil {
					return err
				}
				if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: brAddr.Addr().AsSlice(), Mask: net.CIDRMask(brAddr.Bits(), 32)}}); err != nil {
					return err
				}
				if err := netlink.LinkSetUp(l); err != nil {
					return err
				}
			}
			v, err := netlink.LinkByName("veth-" + br)
			if err != nil {
				return err
			}
			return netlink.LinkSetMaster(v, l)
		})
		nettest.AddRoute(t, h, netip.MustParsePrefix("0.0.0.0/0"), brAddr.Addr())
		return h
	}
	// masquerade is what the network's SNAT does to traffic from src leaving the node, except to
	// except (kubenet: the pod CIDR and --cluster-cidr; docker: its own bridge).
	masquerade := func(t *testing.T, n *advNode, src netip.Prefix, except string) {
		nettest.Run(t, n.ns, "nft", "add", "table", "ip", "advnat")
		nettest.Run(t, n.ns, "nft", "add", "chain", "ip", "advnat", "post", "{ type nat hook postrouting priority 100; }")
		rule := fmt.Sprintf("ip saddr %s ip daddr != %s fib daddr type != local masquerade", src, except)
		nettest.Run(t, n.ns, "sh", "-c", "nft add rule ip advnat post "+rule)
	}

	t.Run("a container on another bridge of an overlay node", func(t *testing.T) {
		w := newAdvWorld(t)
		sink := nettest.StartUDPEcho(t, w.b.ns, netip.AddrPortFrom(w.b.gwPod, sinkPort))
		mustSync(t, w.a, w.spec(w.a, w.b))
		mustSync(t, w.b, w.spec(w.b, w.a))
		c := attach(t, w.a, "docker0", netip.MustParsePrefix("172.17.0.1/16"), netip.MustParsePrefix("172.17.0.2/16"))
		masquerade(t, w.a, netip.MustParsePrefix("172.17.0.0/16"), "172.17.0.0/16")
		injectFrom(t, c, netip.AddrPortFrom(w.b.addr, 8472), w.b, 1, netip.MustParseAddr("10.244.1.77"), "docker")
		if got := delivered(sink, "docker"); got != 0 {
			t.Fatalf("%d frames a container on docker0 of node-a sent to node-b's VXLAN port were decapsulated (masqueraded to node-a's address)", got)
		}
	})
	t.Run("a pod of a node whose agent needs no overlay", func(t *testing.T) {
		// --routing=direct: the agent keeps no device, and (since the review) keeps the firewall
		// whose forward rules keep its pods' VXLAN from other nodes. Those nodes may still run an overlay (a mixed rollout; a peer that
		// sees this node as not on-link).
		w := newAdvWorld(t)
		sink := nettest.StartUDPEcho(t, w.b.ns, netip.AddrPortFrom(w.b.gwPod, sinkPort))
		// What the agent does there: the firewall without the device.
		noDevice := w.spec(w.a, w.b)
		noDevice.NoDevice = true
		nettest.Do(t, w.a.ns, func() error { _, err := core.SyncOverlay(noDevice); return err })
		mustSync(t, w.b, w.spec(w.b, w.a))
		pod := attach(t, w.a, advBridge, netip.MustParsePrefix("10.244.1.1/24"), netip.MustParsePrefix("10.244.1.5/24"))
		masquerade(t, w.a, w.a.cidr, "10.244.0.0/16")
		injectFrom(t, pod, netip.AddrPortFrom(w.b.addr, 8472), w.b, 1, netip.MustParseAddr("10.244.1.77"), "direct-node-pod")
		if got := delivered(sink, "direct-node-pod"); got != 0 {
			t.Fatalf("%d frames a pod of node-a (no overlay there) sent to node-b's VXLAN port were decapsulated", got)
		}
	})
	t.Run("a pod whose pod traffic is masqueraded, to a peer's bridge address", func(t *testing.T) {
		// Without --cluster-cidr (or with one family only on a dual-stack cluster) pod-to-pod
		// traffic is masqueraded. The forward rule lets pods send VXLAN to any pod address,
		// the peer's own bridge address included, and the peer's socket listens on every
		// local address.
		w := newAdvWorld(t)
		sink := nettest.StartUDPEcho(t, w.b.ns, netip.AddrPortFrom(w.b.gwPod, sinkPort))
		mustSync(t, w.a, w.spec(w.a, w.b))
		mustSync(t, w.b, w.spec(w.b, w.a))
		// node-a reaches node-b's pods directly (on-link), as --routing=auto does on one subnet.
		nettest.Do(t, w.a.ns, func() error {
			return netlink.RouteReplace(&netlink.Route{Dst: &net.IPNet{IP: w.b.cidr.Addr().AsSlice(), Mask: net.CIDRMask(24, 32)}, Gw: w.b.addr.AsSlice()})
		})
		pod := attach(t, w.a, advBridge, netip.MustParsePrefix("10.244.1.1/24"), netip.MustParsePrefix("10.244.1.5/24"))
		masquerade(t, w.a, w.a.cidr, w.a.cidr.String())
		injectFrom(t, pod, netip.AddrPortFrom(w.b.gwPod, 8472), w.b, 1, netip.MustParseAddr("10.244.1.77"), "to-bridge-addr")
		if got := delivered(sink, "to-bridge-addr"); got != 0 {
			t.Fatalf("%d frames a pod sent to node-b's bridge address %s:8472 were decapsulated", got, w.b.gwPod)
		}
	})
}

// TestAdvPodShrinksPathMTU: a pod sends its node one ICMP "fragmentation needed" (MTU 552) that
// quotes a VXLAN packet of the node to a peer. The kernel hands it to the VXLAN socket
// (udp encap_err_lookup) and lowers the node's path MTU to that peer for everybody: every pod of
// the node then has a ~500-byte path to every pod of that peer for ten minutes, renewable at will.
// With direct routes the node originates nothing a pod can quote this way.
func TestAdvPodShrinksPathMTU(t *testing.T) {
	w := newAdvWorld(t)
	mustSync(t, w.a, w.spec(w.a, w.b))
	mustSync(t, w.b, w.spec(w.b, w.a))
	pod := nettest.NewNS(t)
	nettest.Link(t, nettest.Endpoint{NS: w.a.ns, IfName: "vethpod"}, nettest.Endpoint{NS: pod, IfName: "eth0", Addrs: []netip.Prefix{netip.MustParsePrefix("10.244.1.5/24")}})
	nettest.Run(t, w.a.ns, "ip", "link", "set", "vethpod", "master", advBridge)
	nettest.AddRoute(t, pod, netip.MustParsePrefix("0.0.0.0/0"), w.a.gwPod)
	mtuTo := func() string {
		return nettest.Run(t, w.a.ns, "ip", "route", "get", w.b.addr.String())
	}
	if out := mtuTo(); strings.Contains(out, "mtu") {
		t.Fatalf("a path MTU to node-b before the test: %s", out)
	}
	// The quoted packet: node-a -> node-b, UDP to 8472, VNI 1.
	quoted := make([]byte, 20+8+8)
	quoted[0], quoted[8], quoted[9] = 0x45, 64, unix.IPPROTO_UDP
	binary.BigEndian.PutUint16(quoted[2:], 1500)
	binary.BigEndian.PutUint16(quoted[6:], 0x4000)
	sa, da := w.a.addr.As4(), w.b.addr.As4()
	copy(quoted[12:], sa[:])
	copy(quoted[16:], da[:])
	binary.BigEndian.PutUint16(quoted[10:], checksum(quoted[:20]))
	binary.BigEndian.PutUint16(quoted[20:], 51234)
	binary.BigEndian.PutUint16(quoted[22:], 8472)
	binary.BigEndian.PutUint16(quoted[24:], 1480)
	copy(quoted[28:], []byte{0x08, 0, 0, 0, 0, 0, 1, 0})
	icmp := append([]byte{3, 4, 0, 0, 0, 0, 0x02, 0x28}, quoted...) // type 3 code 4, next-hop MTU 552
	binary.BigEndian.PutUint16(icmp[2:], checksum(icmp))
	nettest.Do(t, pod, func() error {
		c, err := net.ListenPacket("ip4:icmp", "0.0.0.0")
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.WriteTo(icmp, &net.IPAddr{IP: w.a.gwPod.AsSlice()})
		return err
	})
	// A datagram the pod sends after the ICMP message, on the same way into the node: once it
	// is in, the message has been handled.
	after := nettest.StartUDPEcho(t, w.a.ns, netip.AddrPortFrom(w.a.gwPod, 7799))
	err := nettest.Eventually(10*time.Second, func() error {
		_, _ = nettest.UDPRequest(pod, after.Addr, "after-icmp", 100*time.Millisecond)
		if after.Received("after-icmp") == 0 {
			return fmt.Errorf("the pod's datagram after the ICMP message did not reach the node")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if out := mtuTo(); strings.Contains(out, "mtu 552") {
		t.Fatalf("one ICMP message from a pod set node-a's path MTU to node-b (the overlay's underlay) to 552:\n%s", out)
	}
}

// TestAdvManyNodeAddresses: Firewall.Sync adds each set's elements in one netlink message, whose
// element list is one attribute with a 16-bit length (netpol/apply.go chunks its sets for that
// reason). Past 2340 IPv6 (4095 IPv4) addresses the length wraps and the kernel keeps what the
// wrapped length covers, without an error: 2500 dual-stack Nodes leave 159 IPv6 addresses in the
// set, so most Nodes' VXLAN is dropped, and every sync finds the set short and rewrites the table
// (an nftables event, which asks for another sync: the agent rewrites it for ever). One hostile
// Node with ~2400 IPv6 InternalIPs in its status (130 KB) does the same to every node. Past the
// socket's send buffer (5000 dual-stack Nodes, Kubernetes' supported maximum) the transaction
// fails outright ("message too long") and every overlay path is refused.
func TestAdvManyNodeAddresses(t *testing.T) {
	for _, nodes := range []int{2500, 5000} {
		t.Run(fmt.Sprintf("%d dual-stack Nodes", nodes), func(t *testing.T) {
			n := nettest.NewNS(t)
			var addrs []netip.Addr
			a, b := netip.MustParseAddr("100.64.0.1"), netip.MustParseAddr("fd00:77::1")
			for range nodes {
				addrs = append(addrs, a, b)
				a, b = a.Next(), b.Next()
			}
			fw := overlay.Firewall{Port: 8472, Device: advDevice, Bridge: advBridge, Nodes: addrs, PodNetworks: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}}
			nettest.Do(t, n, func() error {
				if written, err := fw.Sync(); err != nil || !written {
					return fmt.Errorf("first write: written %v, %v", written, err)
				}
				return nil
			})
			for _, set := range []string{"nodes4", "nodes6"} {
				out := nettest.Run(t, n, "nft", "list", "set", "inet", "kubenet-overlay", set)
				if got := strings.Count(out, "100.64.") + strings.Count(out, "fd00:77::"); got != nodes {
					t.Errorf("set %s holds %d addresses after the write, want %d", set, got, nodes)
				}
			}
			nettest.Do(t, n, func() error {
				if written, err := fw.Sync(); err != nil || written {
					return fmt.Errorf("second sync: written %v, %v (want in place: nothing to write)", written, err)
				}
				return nil
			})
		})
	}
}

// TestAdvHeldIPv6Fragments (holds on de614e1): on an IPv6 underlay a host that is no node sends
// VXLAN in two fragments whose first carries no UDP header (a destination-options header pushes
// it into the second), so the input rule cannot read the port of the first fragment and IPv6
// reassembles only after the input hook. Checked with and without conntrack (whose defrag
// reassembles before the hook); also a plain unfragmented datagram.
func TestAdvHeldIPv6Fragments(t *testing.T) {
	for _, withCT := range []bool{false, true} {
		t.Run(fmt.Sprintf("conntrack=%v", withCT), func(t *testing.T) {
			u := nettest.NewUnderlay(t, 0)
			b := newAdvNode(t, u, "node-b", netip.MustParsePrefix("2001:db8::2/64"), netip.MustParsePrefix("10.244.2.0/24"))
			out := nettest.NewNS(t)
			u.Attach(t, out, "eth0", netip.MustParsePrefix("2001:db8::99/64"))
			sink := nettest.StartUDPEcho(t, b.ns, netip.AddrPortFrom(b.gwPod, sinkPort))
			if withCT {
				nettest.Run(t, b.ns, "nft", "add", "table", "inet", "advct")
				nettest.Run(t, b.ns, "nft", "add", "chain", "inet", "advct", "pre", "{ type filter hook prerouting priority 0; }")
				nettest.Run(t, b.ns, "nft", "add", "rule", "inet", "advct", "pre", "ct", "state", "new", "counter")
			}
			a := netip.MustParseAddr("2001:db8::1")
			mustSync(t, b, core.Overlay{Device: advDevice, VNI: 1, Port: 8472, Local: b.addr, MTU: 1430, Bridge: advBridge,
				Peers: []core.OverlayPeer{{Node: "node-a", Underlay: a, PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}}},
				Nodes: []netip.Addr{a, b.addr}, PodNetworks: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}})
			var mac net.HardwareAddr
			nettest.Do(t, b.ns, func() error {
				l, err := netlink.LinkByName("eth0")
				mac = l.Attrs().HardwareAddr
				return err
			})
			src := netip.MustParseAddr("2001:db8::99")
			// how: "whole" (one datagram), "frag" (two fragments, the UDP header in the first),
			// "split" (two fragments, the UDP header in the second).
			fragID := 0
			send := func(tag, how string) {
				frame := vxlanFrame(1, overlay.MAC(b.addr), netip.MustParseAddr("10.244.1.77"), b.gwPod, sinkPort, tag)
				udp := make([]byte, 8, 8+len(frame))
				binary.BigEndian.PutUint16(udp[0:], 40000)
				binary.BigEndian.PutUint16(udp[2:], 8472)
				binary.BigEndian.PutUint16(udp[4:], uint16(8+len(frame)))
				udp = append(udp, frame...)
				pseudo := append(append(src.AsSlice(), b.addr.AsSlice()...), 0, 0, byte(len(udp)>>8), byte(len(udp)), 0, 0, 0, unix.IPPROTO_UDP)
				binary.BigEndian.PutUint16(udp[6:], checksum(append(pseudo, udp...)))
				ip6 := func(nh byte, payload []byte) []byte {
					h := make([]byte, 40)
					h[0] = 0x60
					binary.BigEndian.PutUint16(h[4:], uint16(len(payload)))
					h[6], h[7] = nh, 64
					copy(h[8:], src.AsSlice())
					copy(h[24:], b.addr.AsSlice())
					return append(h, payload...)
				}
				var pkts [][]byte
				fragID++
				frag := func(nh byte, off int, more bool, data []byte) []byte {
					fh := []byte{nh, 0, 0, 0, 0, 0, 0x12, byte(fragID)}
					v := uint16(off/8) << 3
					if more {
						v |= 1
					}
					binary.BigEndian.PutUint16(fh[2:], v)
					return ip6(44, append(fh, data...))
				}
				switch how {
				case "whole":
					pkts = [][]byte{ip6(unix.IPPROTO_UDP, udp)}
				case "frag":
					pkts = [][]byte{frag(unix.IPPROTO_UDP, 0, true, udp[:48]), frag(unix.IPPROTO_UDP, 48, false, udp[48:])}
				case "split":
					// Fragmentable part: destination options (16 bytes, PadN) then UDP.
					dst := append([]byte{unix.IPPROTO_UDP, 1, 1, 12}, make([]byte, 12)...)
					pkts = [][]byte{frag(60, 0, true, dst), frag(60, 16, false, udp)}
				}
				nettest.Do(t, out, func() error {
					fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM, int(htons(unix.ETH_P_IPV6)))
					if err != nil {
						return err
					}
					defer unix.Close(fd)
					l, err := netlink.LinkByName("eth0")
					if err != nil {
						return err
					}
					sa := &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_IPV6), Ifindex: l.Attrs().Index, Halen: 6}
					copy(sa.Addr[:], mac)
					for _, p := range pkts {
						if err := unix.Sendto(fd, p, 0, sa); err != nil {
							return err
						}
					}
					return nil
				})
			}
			hows := []string{"whole", "frag", "split"}
			for _, how := range hows {
				send(how, how)
			}
			if err := sink.Barrier(); err != nil {
				t.Fatal(err)
			}
			for _, how := range hows {
				if got := sink.Received(how); got != 0 {
					t.Errorf("%s: %d frames of a host that is no node decapsulated on an IPv6 underlay", how, got)
				}
			}
			// The control: without the firewall the same packets are decapsulated (the split
			// header chain excepted: the kernel drops such a first fragment itself, RFC 8200).
			nettest.Run(t, b.ns, "nft", "delete", "table", "inet", "kubenet-overlay")
			for _, how := range hows {
				send(how+"-nofw", how)
			}
			if err := sink.Barrier(); err != nil {
				t.Fatal(err)
			}
			t.Logf("without the firewall: whole %d, frag %d, split %d delivered", sink.Received("whole-nofw"), sink.Received("frag-nofw"), sink.Received("split-nofw"))
			if sink.Received("whole-nofw") == 0 || sink.Received("frag-nofw") == 0 {
				t.Error("control: the injector's whole or fragmented datagram is not decapsulated even without the firewall")
			}
		})
	}
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// TestAdvDuplicateInternalIPCutsOffVictim: a Node whose InternalIP copies another node's (a
// kubelet may write any address into its own Node's status, NodeRestriction or not) collides
// with it in the derived VTEP MAC, and Sync refuses both peers: every node drops its overlay path
// to the victim. With direct routes the same Node only routes its own CIDR to the victim's
// address, and the victim keeps its routes.
func TestAdvDuplicateInternalIPCutsOffVictim(t *testing.T) {
	w := newAdvWorld(t)
	o := w.spec(w.b, w.a)
	o.Peers = append(o.Peers, core.OverlayPeer{Node: "copycat", Underlay: w.a.addr, PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.9.0/24")}})
	nettest.Do(t, w.b.ns, func() error {
		st, err := core.SyncOverlay(o)
		if err != nil {
			return err
		}
		if err := st.Failed[w.a.name]; err != nil {
			t.Errorf("node-a lost its overlay path because node copycat copied its InternalIP: %v", err)
		}
		return nil
	})
}

// TestAdvHeldNodeFramesPass (holds): the control of every test above, on both underlay families:
// a frame a Node sends to the peer's underlay address is decapsulated with the firewall in place.
func TestAdvHeldNodeFramesPass(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		t.Run(fmt.Sprintf("ipv6=%v", v6), func(t *testing.T) {
			u := nettest.NewUnderlay(t, 0)
			pa, pb := netip.MustParsePrefix("192.0.2.1/24"), netip.MustParsePrefix("192.0.2.2/24")
			if v6 {
				pa, pb = netip.MustParsePrefix("2001:db8::1/64"), netip.MustParsePrefix("2001:db8::2/64")
			}
			a := newAdvNode(t, u, "node-a", pa, netip.MustParsePrefix("10.244.1.0/24"))
			b := newAdvNode(t, u, "node-b", pb, netip.MustParsePrefix("10.244.2.0/24"))
			sink := nettest.StartUDPEcho(t, b.ns, netip.AddrPortFrom(b.gwPod, sinkPort))
			mustSync(t, b, core.Overlay{Device: advDevice, VNI: 1, Port: 8472, Local: b.addr, MTU: 1400, Bridge: advBridge,
				Peers: []core.OverlayPeer{{Node: a.name, Underlay: a.addr, PodCIDRs: []netip.Prefix{a.cidr}}},
				Nodes: []netip.Addr{a.addr, b.addr}, PodNetworks: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}})
			err := nettest.Eventually(5*time.Second, func() error {
				injectFrom(t, a.ns, netip.AddrPortFrom(b.addr, 8472), b, 1, netip.MustParseAddr("10.244.1.7"), "from-a-node")
				if delivered(sink, "from-a-node") == 0 {
					return fmt.Errorf("a frame node-a sent to node-b's underlay address was not decapsulated")
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}
