package netpoldiff

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"

	"github.com/kubenet-dev/kubenet/internal/ipnet"
	"github.com/kubenet-dev/kubenet/test/nettest"
	"github.com/kubenet-dev/kubenet/test/testkit"
)

// Network is the CNI network the lab's node runs.
const Network = "kubenet"

// Names of the places that are not sandboxes (a sandbox's place is named by its key).
const (
	placeNode     = "node"
	placePeer     = "peer-host" // the peer host, which also carries the other node's pods
	placeExternal = "external-host"
)

// place is a network namespace where probes start and arrive.
type place struct {
	name string
	ns   ns.NetNS
	// the interface on the pods' link (eth0 in a pod, the bridge on the node), for link-local
	// zones and multicast; empty on the hosts
	ifName  string
	ifIndex int
}

// Lab is the physical side of the tester: a node running the plugin with networkPolicy on and
// six pod sandboxes attached through it, the node's peer host (which also carries three
// addresses of another node's pod CIDR), the external host, and receivers in every one of them
// that record what arrives. Cases share it: a case only changes the API's objects.
type Lab struct {
	Topo   *Topology
	node   *nettest.Node
	places map[string]*place
	rec    *recorder
	// NoSCTP says why SCTP probes cannot be sent (nil: they can).
	NoSCTP error
	serial atomic.Uint32 // numbers the probes' tokens, unique over the lab's life
}

// The lab's layout: the sandboxes' pods (fixed at ADD), the namespaces cases may create.
var (
	sandboxLayout  = [][2]string{{"n0", "p0"}, {"n0", "p1"}, {"n0", "p2"}, {"n1", "p3"}, {"n1", "p4"}, {"n2", "p5"}}
	namespaceNames = []string{"n0", "n1", "n2", "n3"}
	remoteCIDR4    = netip.MustParsePrefix("10.244.2.0/24")
	remoteCIDR6    = netip.MustParsePrefix("fd00:10:244:2::/64")
)

// NewLab builds the lab for t; everything is removed when t ends.
func NewLab(t testing.TB, binDir string) *Lab {
	t.Helper()
	node := nettest.NewNode(t, binDir)
	l := &Lab{node: node, places: map[string]*place{}, rec: newRecorder()}
	list := node.ConfList(t, nettest.NetConf{
		PodCIDRs:           testkit.DualStack(),
		NonMasqueradeCIDRs: []netip.Prefix{nettest.NonMasquerade4, nettest.NonMasquerade6},
		Extra:              map[string]any{"networkPolicy": true},
	})
	topo := baseTopology()
	l.Topo = topo

	for i, s := range sandboxLayout {
		pod := node.NewPod(t, fmt.Sprintf("npdiff-%d-%d", i, time.Now().UnixNano()%1e9))
		pod.RT.Args = [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", s[0]}, {"K8S_POD_NAME", s[1]}}
		node.MustAdd(t, list, pod)
		mac, err := net.ParseMAC(pod.Result.Interfaces[2].Mac)
		if err != nil {
			t.Fatalf("sandbox %s/%s: MAC %q: %v", s[0], s[1], pod.Result.Interfaces[2].Mac, err)
		}
		sb := Sandbox{Namespace: s[0], Name: s[1], Addrs: pod.IPs(), LinkLocal: testkit.LinkLocal(mac)}
		if len(sb.Addrs) != 2 || !sb.Addrs[0].Is4() || !sb.Addrs[1].Is6() {
			t.Fatalf("sandbox %s: addresses %v, want one IPv4 and one IPv6", sb.Key(), sb.Addrs)
		}
		topo.Sandboxes = append(topo.Sandboxes, sb)
		l.places[sb.Key()] = &place{name: sb.Key(), ns: pod.NS, ifName: "eth0", ifIndex: testkit.Link(t, pod.NS, "eth0").Attrs().Index}
	}
	l.places[placeNode] = &place{name: placeNode, ns: node.NS, ifName: "cbr0", ifIndex: testkit.Link(t, node.NS, "cbr0").Attrs().Index}
	l.places[placePeer] = &place{name: placePeer, ns: node.Peer}
	l.places[placeExternal] = &place{name: placeExternal, ns: node.External}
	for _, p := range testkit.AllAddrs(t, node.NS, "cbr0") {
		if p.Addr().Is6() && p.Addr().IsLinkLocalUnicast() {
			topo.BridgeLL = p.Addr()
		}
	}
	if !topo.BridgeLL.IsValid() {
		t.Fatal("the bridge has no IPv6 link-local address")
	}

	// The other node's pods live on the peer host; the node routes their CIDR to it, and the
	// external host reaches the node's pod CIDRs through the node (as a cloud route would).
	for _, slot := range topo.Remote {
		for _, a := range slot {
			addAddr(t, node.Peer, "lo", netip.PrefixFrom(a, a.BitLen()))
		}
	}
	nettest.AddRoute(t, node.NS, remoteCIDR4, topo.Peer4)
	nettest.AddRoute(t, node.NS, remoteCIDR6, topo.Peer6)
	nettest.AddRoute(t, node.External, netip.MustParsePrefix("10.244.0.0/16"), topo.NodeUplink4)
	nettest.AddRoute(t, node.External, netip.MustParsePrefix("fd00:10:244::/48"), topo.NodeUplink6)

	// Link-local traffic needs both ends past duplicate address detection.
	for _, s := range topo.Sandboxes {
		testkit.WaitAddrUsable(t, l.places[s.Key()].ns, "eth0", s.LinkLocal, testkit.TrafficTimeout)
	}
	testkit.WaitAddrUsable(t, node.NS, "cbr0", topo.BridgeLL, testkit.TrafficTimeout)

	l.NoSCTP = sctpRawAvailable(node.NS)
	for _, p := range l.places {
		l.startReceivers(t, p)
	}
	return l
}

// baseTopology is the lab's topology without what only the kernel knows (the sandboxes'
// addresses and link-local addresses, the bridge's link-local address).
func baseTopology() *Topology {
	t := &Topology{
		PodCIDR4: nettest.PodCIDR4, PodCIDR6: nettest.PodCIDR6, RemoteCIDR4: remoteCIDR4, RemoteCIDR6: remoteCIDR6,
		Gateway4: testkit.GatewayOf(nettest.PodCIDR4), Gateway6: testkit.GatewayOf(nettest.PodCIDR6),
		NodePeer4: nettest.NodePeerLink4.Addr(), NodePeer6: nettest.NodePeerLink6.Addr(),
		NodeUplink4: nettest.NodeUplink4.Addr(), NodeUplink6: nettest.NodeUplink6.Addr(),
		Peer4: nettest.Peer4.Addr(), Peer6: nettest.Peer6.Addr(),
		External4: nettest.External4.Addr(), External6: nettest.External6.Addr(),
		Multicast4: []netip.Addr{netip.MustParseAddr("239.255.0.1"), netip.MustParseAddr("224.0.0.1")},
		Multicast6: []netip.Addr{netip.MustParseAddr("ff02::1"), netip.MustParseAddr("ff05::db8:1")},
		Broadcast4: []netip.Addr{ipnet.Last(nettest.PodCIDR4), netip.MustParseAddr("255.255.255.255")},
		// Neighbouring ports, so that a range's or a port's off-by-one shows.
		TCPPorts: []uint16{80, 81, 443, 8080}, UDPPorts: []uint16{53, 5353, 5354, 8080}, SCTPPorts: []uint16{80, 81, 3868, 9090},
		GroupPort: 5000, PortNames: []string{"http", "web", "dns", "metrics", "alt"},
		NamespaceNames: namespaceNames,
		LabelKeys:      []string{"app", "tier", "role"}, LabelValues: []string{"a", "b", "c"},
		NamespaceLabelKeys: []string{"team", "env"}, NamespaceLabelValues: []string{"x", "y"},
	}
	for i := range 3 {
		a4, a6 := remoteCIDR4.Addr().As4(), remoteCIDR6.Addr().As16()
		a4[3], a6[15] = byte(0x10+i), byte(0x10+i)
		t.Remote = append(t.Remote, [2]netip.Addr{netip.AddrFrom4(a4), netip.AddrFrom16(a6)})
	}
	return t
}

// ExampleTopology is the lab's topology with the addresses a lab typically gets, for checking
// generated objects without a kernel (test/agent hands them to a real API server).
func ExampleTopology() *Topology {
	t := baseTopology()
	for i, s := range sandboxLayout {
		a4, a6 := nettest.PodCIDR4.Addr().As4(), nettest.PodCIDR6.Addr().As16()
		a4[3], a6[15] = byte(2+i), byte(2+i)
		ll := netip.MustParseAddr(fmt.Sprintf("fe80::2c0:ffff:fe00:%x", i))
		t.Sandboxes = append(t.Sandboxes, Sandbox{Namespace: s[0], Name: s[1], Addrs: []netip.Addr{netip.AddrFrom4(a4), netip.AddrFrom16(a6)}, LinkLocal: ll})
	}
	t.BridgeLL = netip.MustParseAddr("fe80::c0:ffff:fe00:1")
	return t
}

func addAddr(t testing.TB, n ns.NetNS, ifname string, p netip.Prefix) {
	t.Helper()
	nettest.Do(t, n, func() error {
		l, err := netlink.LinkByName(ifname)
		if err != nil {
			return err
		}
		return netlink.AddrAdd(l, &netlink.Addr{IPNet: ipnet.FromPrefix(p), Flags: unix.IFA_F_NODAD})
	})
}

// sctpRawAvailable tells whether SCTP packets can be sent and seen through raw sockets of
// protocol 132 (the kernel needs no SCTP stack for that: it has SCTP conntrack and nftables
// matching even without CONFIG_IP_SCTP).
func sctpRawAvailable(n ns.NetNS) error {
	return n.Do(func(ns.NetNS) error {
		c, err := net.ListenPacket("ip4:132", "0.0.0.0")
		if err != nil {
			return fmt.Errorf("raw socket of protocol 132: %w", err)
		}
		return c.Close()
	})
}

// sctpSockets tells whether the kernel has SCTP sockets (CONFIG_IP_SCTP), for the report.
func sctpSockets(n ns.NetNS) error {
	return n.Do(func(ns.NetNS) error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_SCTP)
		if err != nil {
			return err
		}
		return unix.Close(fd)
	})
}

// listen opens a socket inside p's namespace; it stays there when the thread leaves, so the
// goroutines serving it may run anywhere. It is closed when t ends.
func listen[T interface{ Close() error }](t testing.TB, p *place, open func() (T, error)) T {
	t.Helper()
	var c T
	nettest.Do(t, p.ns, func() error {
		var err error
		c, err = open()
		return err
	})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// startReceivers starts, in p, a TCP and a UDP echo server on every port of the topology (both
// families, replying from the address the request went to), raw ICMP and SCTP listeners, and on
// the pods' link (sandboxes, the node) the broadcast and multicast receivers.
func (l *Lab) startReceivers(t testing.TB, p *place) {
	t.Helper()
	topo := l.Topo
	for _, port := range topo.TCPPorts {
		ln := listen(t, p, func() (net.Listener, error) { return net.Listen("tcp", fmt.Sprintf("[::]:%d", port)) })
		go l.serveTCP(p.name, ln)
	}
	for _, port := range topo.UDPPorts {
		c4 := listen(t, p, func() (net.PacketConn, error) { return net.ListenPacket("udp4", fmt.Sprintf("0.0.0.0:%d", port)) })
		c6 := listen(t, p, func() (net.PacketConn, error) { return listenUDP6Only(fmt.Sprintf("[::]:%d", port)) })
		pc4, pc6 := ipv4.NewPacketConn(c4), ipv6.NewPacketConn(c6)
		if err := pc4.SetControlMessage(ipv4.FlagDst|ipv4.FlagInterface, true); err != nil {
			t.Fatal(err)
		}
		if err := pc6.SetControlMessage(ipv6.FlagDst|ipv6.FlagInterface, true); err != nil {
			t.Fatal(err)
		}
		go l.serveUDP(p.name, readUDP4(pc4))
		go l.serveUDP(p.name, readUDP6(pc6))
	}
	for proto, network := range map[int]string{1: icmpNetwork(false), 58: icmpNetwork(true)} {
		c := listen(t, p, func() (net.PacketConn, error) { return net.ListenPacket(network, anyAddr(network)) })
		go serve(c, l.recordICMP(p.name, proto))
	}
	if l.NoSCTP == nil {
		for _, network := range []string{sctpNetwork(false), sctpNetwork(true)} {
			c := listen(t, p, func() (net.PacketConn, error) { return net.ListenPacket(network, anyAddr(network)) })
			go serve(c, l.recordSCTP(p.name))
		}
	}
	if p.ifName == "" {
		return
	}
	// Broadcast and multicast: an IPv4 socket on the group port receives the subnet's and the
	// limited broadcast and (IP_MULTICAST_ALL) every group the interface joined; 224.0.0.1 and
	// ff02::1 need no join.
	ifi := &net.Interface{Index: p.ifIndex, Name: p.ifName}
	c4 := listen(t, p, func() (net.PacketConn, error) {
		return net.ListenPacket("udp4", fmt.Sprintf("0.0.0.0:%d", topo.GroupPort))
	})
	c6 := listen(t, p, func() (net.PacketConn, error) { return listenUDP6Only(fmt.Sprintf("[::]:%d", topo.GroupPort)) })
	nettest.Do(t, p.ns, func() error {
		for _, g := range topo.Multicast4 {
			if g.IsLinkLocalMulticast() {
				continue
			}
			if err := ipv4.NewPacketConn(c4).JoinGroup(ifi, &net.UDPAddr{IP: g.AsSlice()}); err != nil {
				return fmt.Errorf("join %s on %s: %w", g, p.ifName, err)
			}
		}
		for _, g := range topo.Multicast6 {
			if g == netip.IPv6LinkLocalAllNodes() {
				continue
			}
			if err := ipv6.NewPacketConn(c6).JoinGroup(ifi, &net.UDPAddr{IP: g.AsSlice()}); err != nil {
				return fmt.Errorf("join %s on %s: %w", g, p.ifName, err)
			}
		}
		return nil
	})
	for _, c := range []net.PacketConn{c4, c6} {
		go serve(c, l.recordGroup(p.name))
	}
}

func anyAddr(network string) string {
	if strings.HasPrefix(network, "ip4") {
		return "0.0.0.0"
	}
	return "::"
}

// listenUDP6Only listens on an IPv6-only UDP socket (the IPv4 one of the same port is separate,
// so each can answer from the address a request went to).
func listenUDP6Only(addr string) (net.PacketConn, error) {
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 1) })
		return errors.Join(err, serr)
	}}
	return lc.ListenPacket(context.Background(), "udp6", addr)
}

// token is the first word of a probe's payload.
func token(payload []byte) string {
	s := string(payload)
	if i := strings.IndexAny(s, " \n"); i >= 0 {
		s = s[:i]
	}
	return s
}

func addrOf(a net.Addr) netip.Addr {
	switch a := a.(type) {
	case *net.TCPAddr:
		return a.AddrPort().Addr().Unmap().WithZone("")
	case *net.UDPAddr:
		return a.AddrPort().Addr().Unmap().WithZone("")
	case *net.IPAddr:
		ip, _ := netip.AddrFromSlice(a.IP)
		return ip.Unmap()
	}
	return netip.Addr{}
}

func (l *Lab) serveTCP(where string, ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			buf := make([]byte, 256)
			var line []byte
			for !strings.Contains(string(line), "\n") {
				n, err := c.Read(buf)
				if err != nil {
					return
				}
				line = append(line, buf[:n]...)
			}
			tok := token(line)
			l.rec.saw(tok, where, addrOf(c.RemoteAddr()))
			_, _ = fmt.Fprintf(c, "%s\n", tok)
		}()
	}
}

// serveUDP echoes every datagram from the address it was sent to (so that the answer matches
// the flow the node tracks); read reads one and returns its source and how to answer it.
func (l *Lab) serveUDP(where string, read func([]byte) (int, net.Addr, func([]byte), error)) {
	buf := make([]byte, 64<<10)
	for {
		n, from, answer, err := read(buf)
		if err != nil {
			return
		}
		l.rec.saw(token(buf[:n]), where, addrOf(from))
		answer(buf[:n])
	}
}

func readUDP4(c *ipv4.PacketConn) func([]byte) (int, net.Addr, func([]byte), error) {
	return func(b []byte) (int, net.Addr, func([]byte), error) {
		n, cm, from, err := c.ReadFrom(b)
		var reply *ipv4.ControlMessage
		if cm != nil {
			reply = &ipv4.ControlMessage{Src: cm.Dst}
		}
		return n, from, func(b []byte) { _, _ = c.WriteTo(b, reply, from) }, err
	}
}

func readUDP6(c *ipv6.PacketConn) func([]byte) (int, net.Addr, func([]byte), error) {
	return func(b []byte) (int, net.Addr, func([]byte), error) {
		n, cm, from, err := c.ReadFrom(b)
		var reply *ipv6.ControlMessage
		if cm != nil {
			reply = &ipv6.ControlMessage{Src: cm.Dst, IfIndex: cm.IfIndex}
		}
		return n, from, func(b []byte) { _, _ = c.WriteTo(b, reply, from) }, err
	}
}

// serve hands every datagram or packet c reads to handle, until c is closed.
func serve(c net.PacketConn, handle func(b []byte, from net.Addr)) {
	buf := make([]byte, 64<<10)
	for {
		n, from, err := c.ReadFrom(buf)
		if err != nil {
			return
		}
		handle(buf[:n], from)
	}
}

// recordGroup records broadcast and multicast datagrams; nothing answers them.
func (l *Lab) recordGroup(where string) func([]byte, net.Addr) {
	return func(b []byte, from net.Addr) { l.rec.saw(token(b), where, addrOf(from)) }
}

// recordICMP records echo requests arriving in where (the kernel answers them) and echo
// replies (the answer to a probe sent from where).
func (l *Lab) recordICMP(where string, proto int) func([]byte, net.Addr) {
	return func(b []byte, from net.Addr) {
		m, err := icmp.ParseMessage(proto, b)
		if err != nil {
			return
		}
		echo, ok := m.Body.(*icmp.Echo)
		if !ok {
			return
		}
		switch m.Type {
		case ipv4.ICMPTypeEcho, ipv6.ICMPTypeEchoRequest:
			l.rec.saw(token(echo.Data), where, addrOf(from))
		case ipv4.ICMPTypeEchoReply, ipv6.ICMPTypeEchoReply:
			l.rec.answer(token(echo.Data))
		}
	}
}

// recordSCTP records SCTP INIT chunks; the probe's token is in the initiate tag.
func (l *Lab) recordSCTP(where string) func([]byte, net.Addr) {
	return func(b []byte, from net.Addr) {
		if tag, ok := parseSCTPInit(b); ok {
			l.rec.saw(sctpToken(tag), where, addrOf(from))
		}
	}
}

func sctpToken(tag uint32) string { return fmt.Sprintf("sctp-%d", tag) }

// recorder is what the receivers saw: for every token, where it arrived and from which source
// address, and whether the sender got an ICMP echo reply.
type recorder struct {
	mu       sync.Mutex
	seen     map[string]map[string]netip.Addr // token → place → source address
	answered map[string]bool
}

func newRecorder() *recorder {
	return &recorder{seen: map[string]map[string]netip.Addr{}, answered: map[string]bool{}}
}

func (r *recorder) saw(tok, where string, from netip.Addr) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.seen[tok] == nil {
		r.seen[tok] = map[string]netip.Addr{}
	}
	r.seen[tok][where] = from
}

func (r *recorder) answer(tok string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.answered[tok] = true
}

// arrived tells whether tok arrived at where, and from which source.
func (r *recorder) arrived(tok, where string) (netip.Addr, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	from, ok := r.seen[tok][where]
	return from, ok
}

func (r *recorder) wasAnswered(tok string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.answered[tok]
}

// forget drops what the tokens of a finished batch left.
func (r *recorder) forget(toks []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, t := range toks {
		delete(r.seen, t)
		delete(r.answered, t)
	}
}

// flushConntrack forgets every connection the node tracks.
func (l *Lab) flushConntrack() error {
	return l.node.NS.Do(func(ns.NetNS) error {
		if err := netlink.ConntrackTableFlush(netlink.ConntrackTable); err != nil {
			return fmt.Errorf("flush the node's conntrack table: %w", err)
		}
		return nil
	})
}
