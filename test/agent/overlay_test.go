//go:build kubenet_e2e_agent

package agent

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"

	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubenet-dev/kubenet/agent"
	"github.com/kubenet-dev/kubenet/test/controlplane"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

// The far subnet of the overlay test: behind a router that knows no pod CIDR.
var (
	routerNear = []netip.Prefix{netip.MustParsePrefix("192.168.77.1/24"), netip.MustParsePrefix("fd00:77::1/64")}
	routerFar  = []netip.Prefix{netip.MustParsePrefix("192.168.88.1/24"), netip.MustParsePrefix("fd00:88::1/64")}
	intruder   = []netip.Prefix{netip.MustParsePrefix("192.168.88.66/24"), netip.MustParsePrefix("fd00:88::66/64")}
)

const overlayDevice = "kubenet-vxlan"

// farAddrs are the addresses of node i on the far subnet.
func farAddrs(i int) []netip.Prefix {
	return []netip.Prefix{
		netip.MustParsePrefix(fmt.Sprintf("192.168.88.%d/24", 10+i)),
		netip.MustParsePrefix(fmt.Sprintf("fd00:88::%d/64", 10+i)),
	}
}

// routedCluster is three nodes, two on the control plane's subnet and one behind a router, with
// a host on the far subnet that is no node.
type routedCluster struct {
	cp       *controlplane.ControlPlane
	nodes    []*simNode
	router   ns.NetNS
	intruder ns.NetNS
}

func defaultRoutes(t testing.TB, n ns.NetNS, via []netip.Prefix) {
	t.Helper()
	for _, gw := range via {
		dst := netip.MustParsePrefix("0.0.0.0/0")
		if gw.Addr().Is6() {
			dst = netip.MustParsePrefix("::/0")
		}
		nettest.AddRoute(t, n, dst, gw.Addr())
	}
}

// startRoutedCluster starts the cluster; with ipv6Only the Nodes have only their IPv6 InternalIPs
// and IPv6 pod CIDRs (the simulated hosts keep IPv4 to reach the test's IPv4-only API server).
func startRoutedCluster(t *testing.T, ipv6Only bool) *routedCluster {
	t.Helper()
	near, cp, agentUser := startCluster(t)
	far := nettest.NewUnderlay(t, 0)
	rc := &routedCluster{cp: cp, router: nettest.NewNS(t), intruder: nettest.NewNS(t)}
	near.Attach(t, rc.router, "near", routerNear...)
	far.Attach(t, rc.router, "far", routerFar...)
	nettest.WriteSysctl(t, rc.router, "net/ipv4/ip_forward", "1")
	nettest.WriteSysctl(t, rc.router, "net/ipv6/conf/all/forwarding", "1")
	// Strict reverse-path filtering, as routers with uRPF and cloud networks' source checks do:
	// a packet with a pod's address as source has no route back here and is dropped. The
	// overlay must keep every packet of pods (replies to the nodes' own included) inside it.
	nettest.WriteSysctl(t, rc.router, "net/ipv4/conf/all/rp_filter", "1")
	defaultRoutes(t, cp.NS, routerNear[:1]) // the control plane has an IPv4 address only
	far.Attach(t, rc.intruder, "eth0", intruder...)
	defaultRoutes(t, rc.intruder, routerFar)
	rc.nodes = []*simNode{
		newSimNode(t, near, cp, "node-1", 1, agentUser),
		newSimNode(t, near, cp, "node-2", 2, agentUser),
		newSimNodeWith(t, far, cp, "node-3", farAddrs(3), agentUser),
	}
	defaultRoutes(t, rc.nodes[0].ns, routerNear)
	defaultRoutes(t, rc.nodes[1].ns, routerNear)
	defaultRoutes(t, rc.nodes[2].ns, routerFar)
	for _, n := range rc.nodes {
		nettest.WriteSysctl(t, n.ns, "net/ipv4/conf/all/rp_filter", "1")
	}
	for i, n := range rc.nodes {
		addrs, cidrs := n.addrs, podCIDRs(i+1)
		if ipv6Only {
			addrs, cidrs = addrs[1:], cidrs[1:]
		}
		createNode(t, cp.Admin, nodeObject(n.name, addrs, cidrs))
	}
	return rc
}

// overlayRoute is how agentRoutes shows the route to a peer CIDR through the overlay.
func overlayRoute(cidr netip.Prefix) string {
	return fmt.Sprintf("%s via %s", cidr, cidr.Masked().Addr())
}

// wantPaths are the routes node self should have when the nodes in overlaid are reached
// through the overlay and the others directly.
func wantPaths(self *simNode, nodes []*simNode, overlaid ...*simNode) []string {
	var out []string
	for i, n := range nodes {
		if n == self {
			continue
		}
		for _, c := range podCIDRs(i + 1) {
			if slices.Contains(overlaid, n) {
				out = append(out, overlayRoute(c))
			} else {
				out = append(out, fmt.Sprintf("%s via %s", c, n.addr(c.Addr())))
			}
		}
	}
	return out
}

// overlayEntries reads n's overlay device: its forwarding entries ("mac dst ip") and neighbour
// entries ("ip lladdr mac"), sorted; nil, nil without the device.
func overlayEntries(n ns.NetNS) (fdb, neigh []string, err error) {
	err = n.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(overlayDevice)
		if err != nil {
			if _, ok := err.(netlink.LinkNotFoundError); ok {
				return nil
			}
			return err
		}
		fs, err := netlink.NeighList(l.Attrs().Index, unix.AF_BRIDGE)
		if err != nil {
			return err
		}
		for _, f := range fs {
			if f.IP != nil {
				fdb = append(fdb, fmt.Sprintf("%s dst %s", f.HardwareAddr, f.IP))
			}
		}
		for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
			ns, err := netlink.NeighList(l.Attrs().Index, fam)
			if err != nil {
				return err
			}
			for _, e := range ns {
				if e.State&netlink.NUD_PERMANENT != 0 {
					neigh = append(neigh, fmt.Sprintf("%s lladdr %s", e.IP, e.HardwareAddr))
				}
			}
		}
		return nil
	})
	slices.Sort(fdb)
	slices.Sort(neigh)
	return fdb, neigh, err
}

// vtepMAC is the MAC every node derives for the node with underlay address a (docs/agent.md).
func vtepMAC(a netip.Addr) string {
	if a.Is4() {
		b := a.As4()
		return net.HardwareAddr{0x0e, 0x4b, b[0], b[1], b[2], b[3]}.String()
	}
	b := a.As16()
	sum := sha256.Sum256(b[:])
	return net.HardwareAddr{0x0e, sum[0], sum[1], sum[2], sum[3], sum[4]}.String()
}

// wantEntries are the overlay entries a node needs for peers reached through it, over the
// underlay of the family of the peers' first address (or of like, when given).
func wantEntries(peers map[*simNode][]netip.Prefix, like ...netip.Addr) (fdb, neigh []string) {
	for n, cidrs := range peers {
		u := n.addrs[0].Addr()
		if len(like) > 0 {
			u = n.addr(like[0])
		}
		fdb = append(fdb, fmt.Sprintf("%s dst %s", vtepMAC(u), u))
		for _, c := range cidrs {
			neigh = append(neigh, fmt.Sprintf("%s lladdr %s", c.Masked().Addr(), vtepMAC(u)))
		}
	}
	slices.Sort(fdb)
	slices.Sort(neigh)
	return fdb, neigh
}

func expectEntries(t *testing.T, n *simNode, peers map[*simNode][]netip.Prefix, like ...netip.Addr) {
	t.Helper()
	wantFDB, wantNeigh := wantEntries(peers, like...)
	err := nettest.Eventually(converge, func() error {
		fdb, neigh, err := overlayEntries(n.ns)
		if err != nil {
			return err
		}
		if !slices.Equal(fdb, wantFDB) || !slices.Equal(neigh, wantNeigh) {
			return fmt.Errorf("overlay entries of %s:\n fdb %q\nwant %q\nneigh %q\n want %q", n.name, fdb, wantFDB, neigh, wantNeigh)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// peersOf fetches the agent's /peers.
func peersOf(n *simNode) ([]agent.Path, error) {
	code, body, err := n.get("/peers")
	if err != nil {
		return nil, err
	}
	if code != 200 {
		return nil, fmt.Errorf("/peers: HTTP %d: %s", code, body)
	}
	var paths []agent.Path
	return paths, json.Unmarshal([]byte(body), &paths)
}

// dfSocket is a UDP socket inside src, connected to dst, that never fragments: the kernel sets DF
// (IPv4) and refuses a datagram larger than the path MTU it knows with EMSGSIZE.
func dfSocket(t *testing.T, src ns.NetNS, dst netip.AddrPort) *net.UDPConn {
	t.Helper()
	c, err := nettest.DialIn(src)(context.Background(), "udp", dst.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	conn := c.(*net.UDPConn)
	raw, err := conn.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	err = raw.Control(func(fd uintptr) {
		if dst.Addr().Is4() {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO)
		} else {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_MTU_DISCOVER, unix.IPV6_PMTUDISC_DO)
		}
	})
	if err != nil || serr != nil {
		t.Fatalf("DF socket: %v %v", err, serr)
	}
	return conn
}

// pathMTU is the path MTU the socket's kernel knows for its destination.
func pathMTU(t *testing.T, c *net.UDPConn, is4 bool) int {
	t.Helper()
	raw, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var mtu int
	var gerr error
	_ = raw.Control(func(fd uintptr) {
		if is4 {
			mtu, gerr = unix.GetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_MTU)
		} else {
			mtu, gerr = unix.GetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_MTU)
		}
	})
	if gerr != nil {
		t.Fatal(gerr)
	}
	return mtu
}

// datagram is a UDP payload of exactly size bytes, distinct per tag.
func datagram(tag string, size int) string {
	return tag + strings.Repeat("x", size-len(tag))
}

// udpPayload is the largest UDP payload that fits mtu unfragmented towards dst.
func udpPayload(mtu int, dst netip.Addr) int {
	if dst.Is4() {
		return mtu - 20 - 8
	}
	return mtu - 40 - 8
}

// injectVXLAN sends one UDP datagram with payload from src (any address: a sender that crafts
// the inner packet chooses it freely) to dst:port inside a VXLAN frame from the namespace from,
// addressed to the VTEP at underlay with that node's MAC.
func injectVXLAN(t *testing.T, from ns.NetNS, local, underlay netip.Addr, src, dst netip.Addr, port uint16, payload string) {
	t.Helper()
	const dev = "inject0"
	mac, _ := net.ParseMAC(vtepMAC(underlay))
	nettest.Do(t, from, func() error {
		if l, err := netlink.LinkByName(dev); err == nil {
			_ = netlink.LinkDel(l)
		}
		v := &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: dev}, VxlanId: 1, Port: 8472, SrcAddr: local.AsSlice(), Learning: false}
		if err := netlink.LinkAdd(v); err != nil {
			return fmt.Errorf("intruder's vxlan: %w", err)
		}
		l, err := netlink.LinkByName(dev)
		if err != nil {
			return err
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return err
		}
		bits := 32
		if src.Is6() {
			bits = 128
		}
		if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: src.AsSlice(), Mask: net.CIDRMask(bits, bits)}, Flags: unix.IFA_F_NODAD}); err != nil {
			return fmt.Errorf("spoofed address: %w", err)
		}
		gw := dst // on-link next hop: the victim routes the inner packet by its destination
		if err := netlink.NeighSet(&netlink.Neigh{LinkIndex: l.Attrs().Index, Family: family(gw), State: netlink.NUD_PERMANENT, IP: gw.AsSlice(), HardwareAddr: mac}); err != nil {
			return fmt.Errorf("neighbour: %w", err)
		}
		if err := netlink.NeighAppend(&netlink.Neigh{LinkIndex: l.Attrs().Index, Family: unix.AF_BRIDGE, State: netlink.NUD_PERMANENT, Flags: netlink.NTF_SELF,
			IP: underlay.AsSlice(), HardwareAddr: mac}); err != nil {
			return fmt.Errorf("forwarding entry: %w", err)
		}
		return netlink.RouteReplace(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: &net.IPNet{IP: dst.AsSlice(), Mask: net.CIDRMask(bits, bits)}, Src: src.AsSlice()})
	})
	// The device and its route go once the datagram is sent: a pod keeps no trace of the attack.
	defer nettest.Do(t, from, func() error {
		l, err := netlink.LinkByName(dev)
		if err != nil {
			return err
		}
		return netlink.LinkDel(l)
	})
	// A datagram, no answer expected: the receiver counts what arrives.
	_, _ = nettest.UDPRequest(from, netip.AddrPortFrom(dst, port), payload, 200*time.Millisecond)
}

func family(a netip.Addr) int {
	if a.Is4() {
		return unix.AF_INET
	}
	return unix.AF_INET6
}

// TestAgentOverlay: two nodes on one subnet and one behind a router that routes no pod CIDR; the
// agents choose direct routes on the subnet and the VXLAN overlay across the router.
func TestAgentOverlay(t *testing.T) {
	rc := startRoutedCluster(t, false)
	api := rc.cp.Admin
	n1, n2, n3 := rc.nodes[0], rc.nodes[1], rc.nodes[2]
	nodes := rc.nodes
	for _, n := range nodes {
		// --mtu=0: the pods' MTU is the agent's to choose (the overlay's).
		n.startAgent(t, "--mtu=0")
	}
	for _, n := range nodes {
		expectReady(t, n)
	}
	// The pods live as long as the test (a subtest's cleanup would delete them after its step).
	p1, p2, p3 := addPod(t, n1, "ov-1"), addPod(t, n2, "ov-2"), addPod(t, n3, "ov-3")

	// Agents restarted in a step run on after it: they belong to the whole test.
	top := t
	steps := []struct {
		name string
		run  func(t *testing.T)
	}{
		{"direct on the subnet, vxlan across the router", func(t *testing.T) {
			expectRoutes(t, n1, wantPaths(n1, nodes, n3))
			expectRoutes(t, n2, wantPaths(n2, nodes, n3))
			expectRoutes(t, n3, wantPaths(n3, nodes, n1, n2))
			expectEntries(t, n1, map[*simNode][]netip.Prefix{n3: podCIDRs(3)})
			expectEntries(t, n3, map[*simNode][]netip.Prefix{n1: podCIDRs(1), n2: podCIDRs(2)})
			// The router knows no pod CIDR: whatever crosses it is encapsulated.
			if out := nettest.Run(t, rc.router, "ip", "route", "show"); strings.Contains(out, "10.244.") {
				t.Fatalf("the router has a pod route:\n%s", out)
			}
			paths, err := peersOf(n1)
			if err != nil {
				t.Fatal(err)
			}
			vias := map[string]string{}
			for _, p := range paths {
				vias[p.PodCIDR.String()] = p.Via
				if p.Reason == "" || p.Error != "" {
					t.Errorf("/peers of node-1: %+v: want a reason and no error", p)
				}
			}
			want := map[string]string{"10.244.2.0/24": "direct", "fd00:10:244:2::/64": "direct", "10.244.3.0/24": "vxlan", "fd00:10:244:3::/64": "vxlan"}
			if fmt.Sprint(vias) != fmt.Sprint(want) {
				t.Fatalf("/peers of node-1: %v, want %v", vias, want)
			}
			// Each path is announced once, as an Event on the node, with its reason.
			expectEvent(t, api, n1.name, agent.EventPeerPath, "node node-3's pod CIDR 10.244.3.0/24: through the VXLAN overlay to 192.168.88.13", "is on none of this node's networks")
			expectEvent(t, api, n1.name, agent.EventPeerPath, "node node-2's pod CIDR 10.244.2.0/24: direct via 192.168.77.12", "is on this node's network 192.168.77.0/24")
			// kubenetctl shows the same, one line per CIDR.
			table := nettest.Run(t, n1.ns, testBins.ctl, "peers", "--agent", "http://"+metricsAddr)
			for _, line := range []string{
				`node-2\s+10\.244\.2\.0/24\s+direct\s+192\.168\.77\.12\s+-\s+its InternalIP 192\.168\.77\.12 is on this node's network 192\.168\.77\.0/24`,
				`node-3\s+10\.244\.3\.0/24\s+vxlan\s+10\.244\.3\.0\s+192\.168\.88\.13\s+its InternalIP 192\.168\.88\.13 is on none of this node's networks`,
				`node-3\s+fd00:10:244:3::/64\s+vxlan\s+fd00:10:244:3::\s+192\.168\.88\.13\s`,
			} {
				if !regexp.MustCompile(line).MatchString(table) {
					t.Errorf("kubenetctl peers does not show %s:\n%s", line, table)
				}
			}
			m := n1.waitSynced(t)
			if m[`kubenet_agent_peer_routes{path="vxlan"}`] != 2 || m[`kubenet_agent_peer_routes{path="direct"}`] != 2 {
				t.Fatalf("peer route metrics: vxlan %v direct %v, want 2 and 2", m[`kubenet_agent_peer_routes{path="vxlan"}`], m[`kubenet_agent_peer_routes{path="direct"}`])
			}
			err = nettest.Eventually(converge, func() error {
				c, err := networkCondition(api, n1.name)
				if err != nil || c == nil {
					return fmt.Errorf("condition %v %v", c, err)
				}
				if c.Reason != agent.ReasonRoutesCreated || !strings.Contains(c.Message, "2 direct, 2 through the VXLAN overlay") {
					return fmt.Errorf("condition of node-1: %s %q", c.Reason, c.Message)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		}},
		{"the conflist leaves room for the encapsulation", func(t *testing.T) {
			for _, n := range nodes {
				err := nettest.Eventually(converge, func() error {
					list, err := libcni.ConfListFromFile(n.confFile())
					if err != nil {
						return err
					}
					var conf struct {
						MTU int `json:"mtu"`
					}
					if err := json.Unmarshal(list.Plugins[0].Bytes, &conf); err != nil {
						return err
					}
					if conf.MTU != 1450 {
						return fmt.Errorf("conflist mtu of %s = %d, want 1450 (1500 less 50 of VXLAN over IPv4)", n.name, conf.MTU)
					}
					return nil
				})
				if err != nil {
					t.Fatal(err)
				}
			}
		}},
		{"pods reach each other in every direction with their own addresses", func(t *testing.T) {
			for _, pair := range [][2]*nettest.Pod{{p1, p3}, {p3, p1}, {p2, p3}, {p3, p2}, {p1, p2}, {p2, p1}} {
				expectTraffic(t, pair[0], pair[1])
			}
		}},
		{"full-size packets with DF pass the overlay", func(t *testing.T) {
			sink := nettest.StartUDPEcho(t, p3.NS, netip.AddrPortFrom(netip.IPv6Unspecified(), 7792))
			for _, dst := range p3.IPs() {
				size := udpPayload(1450, dst)
				c := dfSocket(t, p1.NS, netip.AddrPortFrom(dst, 7792))
				full := datagram("full-"+dst.String()+"-", size)
				err := nettest.Eventually(10*time.Second, func() error {
					if _, err := c.Write([]byte(full)); err != nil {
						return err
					}
					if sink.Received(full) == 0 {
						return fmt.Errorf("a %d-byte DF datagram %s -> %s did not arrive", size, p1.RT.ContainerID, dst)
					}
					return nil
				})
				if err != nil {
					t.Fatal(err)
				}
				if _, err := c.Write([]byte(datagram("over-", size+1))); err == nil {
					t.Fatalf("a %d-byte DF datagram was sent on a 1450-byte path", size+1)
				}
			}
		}},
		{"path MTU discovery: a pod with a bigger MTU learns the overlay's", func(t *testing.T) {
			// A pod whose interface says 1500 (attached before the overlay was needed): the
			// node answers its too-big packets with the overlay's MTU, and the pod's kernel
			// remembers it.
			sink := nettest.StartUDPEcho(t, p3.NS, netip.AddrPortFrom(netip.IPv6Unspecified(), 7793))
			host := hostVeth(t, n1, p1)
			nettest.Run(t, n1.ns, "ip", "link", "set", host, "mtu", "1500")
			nettest.Run(t, p1.NS, "ip", "link", "set", "eth0", "mtu", "1500")
			defer nettest.Run(t, p1.NS, "ip", "link", "set", "eth0", "mtu", "1450")
			defer nettest.Run(t, n1.ns, "ip", "link", "set", host, "mtu", "1450")
			for _, dst := range p3.IPs() {
				c := dfSocket(t, p1.NS, netip.AddrPortFrom(dst, 7793))
				big := datagram("big-", udpPayload(1500, dst))
				err := nettest.Eventually(10*time.Second, func() error {
					_, _ = c.Write([]byte(big)) // the first goes out; the node answers "too big"
					if mtu := pathMTU(t, c, dst.Is4()); mtu != 1450 {
						return fmt.Errorf("path MTU to %s known in the pod: %d, want 1450", dst, mtu)
					}
					return nil
				})
				if err != nil {
					t.Fatal(err)
				}
				if sink.Received(big) != 0 {
					t.Fatalf("a DF datagram of 1500 bytes crossed a 1450-byte overlay to %s", dst)
				}
				fits := datagram("fits-", udpPayload(1450, dst))
				err = nettest.Eventually(10*time.Second, func() error {
					if _, err := c.Write([]byte(fits)); err != nil {
						return err
					}
					if sink.Received(fits) == 0 {
						return fmt.Errorf("a datagram of the discovered size did not arrive at %s", dst)
					}
					return nil
				})
				if err != nil {
					t.Fatal(err)
				}
			}
		}},
		{"pod to node and node to pod across the router", func(t *testing.T) {
			nettest.StartTCPEcho(t, n3.ns, netip.AddrPortFrom(n3.addrs[0].Addr(), 7780))
			err := nettest.Eventually(10*time.Second, func() error {
				r, err := nettest.TCPRequest(p1.NS, netip.AddrPortFrom(n3.addrs[0].Addr(), 7780), "to-node", 2*time.Second)
				// Outside the cluster CIDR: masqueraded to node-1's address.
				return nettest.ExpectFrom(r, err, n1.addrs[0].Addr())
			})
			if err != nil {
				t.Fatalf("pod on node-1 -> node-3: %v", err)
			}
			// The node's own packets through the overlay come from its pod gateway (the routes'
			// src), so the answers come back through the overlay: the router's and the nodes'
			// strict reverse-path filters see no pod address on the underlay.
			for _, pair := range []struct {
				from *simNode
				to   *nettest.Pod
				src  netip.Addr
			}{{n1, p3, netip.MustParseAddr("10.244.1.1")}, {n3, p1, netip.MustParseAddr("10.244.3.1")}} {
				for _, dst := range pair.to.IPs() {
					err := nettest.Eventually(10*time.Second, func() error {
						r, err := nettest.TCPRequest(pair.from.ns, netip.AddrPortFrom(dst, 7777), "node-to-pod", 2*time.Second)
						if dst.Is4() {
							return nettest.ExpectFrom(r, err, pair.src)
						}
						return err
					})
					if err != nil {
						t.Fatalf("%s -> pod %s across the router: %v", pair.from.name, dst, err)
					}
				}
			}
		}},
		{"hostPort across the overlay", func(t *testing.T) {
			list, err := libcni.ConfListFromFile(n3.confFile())
			if err != nil {
				t.Fatal(err)
			}
			createPod(t, api, "default", "ov-hostport", n3.name, nil)
			hp := n3.cni.NewPod(t, "ov-hostport")
			hp.RT.CapabilityArgs = map[string]any{"portMappings": []map[string]any{{"hostPort": 30481, "containerPort": 7777, "protocol": "tcp"}}}
			n3.cni.MustAdd(t, list, hp)
			nettest.StartTCPEcho(t, hp.NS, netip.AddrPortFrom(netip.IPv6Unspecified(), 7777))
			for _, src := range []ns.NetNS{p1.NS, n1.ns} {
				err := nettest.Eventually(10*time.Second, func() error {
					_, err := nettest.TCPRequest(src, netip.AddrPortFrom(n3.addrs[0].Addr(), 30481), "hostport", 2*time.Second)
					return err
				})
				if err != nil {
					t.Fatalf("hostPort 30481 of node-3 from node-1's side: %v", err)
				}
			}
		}},
		{"VXLAN from a host that is no node is dropped before decapsulation", func(t *testing.T) {
			sink := nettest.StartUDPEcho(t, p3.NS, netip.AddrPortFrom(netip.IPv6Unspecified(), 7790))
			dst := p3.IP(netip.MustParseAddr("10.0.0.0"))
			spoofed := netip.MustParseAddr("10.244.1.99") // a pod address of node-1
			for range 3 {
				injectVXLAN(t, rc.intruder, intruder[0].Addr(), n3.addrs[0].Addr(), spoofed, dst, 7790, "injected")
			}
			// The same frames from a Node's address are decapsulated: the intruder made a Node.
			createNode(t, api, nodeObject("intruder", intruder, nil))
			err := nettest.Eventually(converge, func() error {
				injectVXLAN(t, rc.intruder, intruder[0].Addr(), n3.addrs[0].Addr(), spoofed, dst, 7790, "from-a-node")
				if sink.Received("from-a-node") == 0 {
					return fmt.Errorf("a VXLAN frame from a Node's InternalIP was not delivered")
				}
				return nil
			})
			if err != nil {
				t.Fatalf("control: %v (the injection itself does not work, so the test above proves nothing)", err)
			}
			if got := sink.Received("injected"); got != 0 {
				t.Fatalf("%d datagrams encapsulated by a host that is no node reached the pod", got)
			}
			// Even a Node's frames are delivered only to this node's pods: the overlay is no
			// router into the node's other networks (here: node-1 on the other subnet).
			beyond := nettest.StartUDPEcho(t, n1.ns, netip.AddrPortFrom(n1.addrs[0].Addr(), 7796))
			for range 3 {
				injectVXLAN(t, rc.intruder, intruder[0].Addr(), n3.addrs[0].Addr(), spoofed, n1.addrs[0].Addr(), 7796, "beyond")
			}
			injectVXLAN(t, rc.intruder, intruder[0].Addr(), n3.addrs[0].Addr(), spoofed, dst, 7790, "from-a-node-again")
			err = nettest.Eventually(converge, func() error {
				if sink.Received("from-a-node-again") == 0 {
					return fmt.Errorf("the control frame sent after the others did not arrive")
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if got := beyond.Received("beyond"); got != 0 {
				t.Fatalf("node-3 forwarded %d datagrams from the overlay to node-1's underlay address", got)
			}
			deleteNode(t, api, "intruder")
			err = nettest.Eventually(converge, func() error {
				before := sink.Received("after-delete")
				injectVXLAN(t, rc.intruder, intruder[0].Addr(), n3.addrs[0].Addr(), spoofed, dst, 7790, "after-delete")
				if sink.Received("after-delete") > before {
					return fmt.Errorf("still decapsulated after the Node was deleted")
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		}},
		{"a pod cannot send VXLAN to a node", func(t *testing.T) {
			sink := nettest.StartUDPEcho(t, p3.NS, netip.AddrPortFrom(netip.IPv6Unspecified(), 7791))
			dst := p3.IP(netip.MustParseAddr("10.0.0.0"))
			// node-1 would masquerade the pod's frame to its own address, a Node's: only node-1's
			// firewall stands between a pod and node-3's decapsulation.
			for range 3 {
				injectVXLAN(t, p1.NS, p1.IP(dst), n3.addrs[0].Addr(), netip.MustParseAddr("10.244.2.77"), dst, 7791, "from-a-pod")
			}
			if got := sink.Received("from-a-pod"); got != 0 {
				t.Fatalf("%d datagrams a pod encapsulated itself were decapsulated by node-3", got)
			}
		}},
		{"node added, changed and deleted", func(t *testing.T) {
			n4 := &simNode{name: "node-4", addrs: farAddrs(4)}
			all := append(slices.Clone(nodes), n4)
			start := time.Now()
			createNode(t, api, nodeObject(n4.name, n4.addrs, podCIDRs(4)))
			expectRoutes(t, n1, wantPaths(n1, all, n3, n4))
			expectEntries(t, n1, map[*simNode][]netip.Prefix{n3: podCIDRs(3), n4: podCIDRs(4)})
			t.Logf("node-4 programmed on node-1 %v after its creation (polled)", time.Since(start))
			// Moved onto node-1's subnet: direct, and its overlay entries go.
			moved := nodeObject(n4.name, nodeAddrs(4), podCIDRs(4))
			node, err := api.CoreV1().Nodes().Get(context.Background(), n4.name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			node.Status.Addresses = moved.Status.Addresses
			if _, err := api.CoreV1().Nodes().UpdateStatus(context.Background(), node, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			n4.addrs = nodeAddrs(4)
			expectRoutes(t, n1, wantPaths(n1, all, n3))
			expectEntries(t, n1, map[*simNode][]netip.Prefix{n3: podCIDRs(3)})
			// Pod CIDRs are immutable once set: a Node deleted and registered again is how its
			// CIDR changes.
			deleteNode(t, api, n4.name)
			expectRoutes(t, n1, wantPaths(n1, nodes, n3))
			expectEntries(t, n1, map[*simNode][]netip.Prefix{n3: podCIDRs(3)})
			createNode(t, api, nodeObject(n4.name, farAddrs(4), podCIDRs(5)))
			n4.addrs = farAddrs(4)
			wantNew := append(wantPaths(n1, nodes, n3), overlayRoute(podCIDRs(5)[0]), overlayRoute(podCIDRs(5)[1]))
			expectRoutes(t, n1, wantNew)
			expectEntries(t, n1, map[*simNode][]netip.Prefix{n3: podCIDRs(3), n4: podCIDRs(5)})
			deleteNode(t, api, n4.name)
			expectRoutes(t, n1, wantPaths(n1, nodes, n3))
			expectEntries(t, n1, map[*simNode][]netip.Prefix{n3: podCIDRs(3)})
		}},
		{"what is removed behind the agent's back comes back", func(t *testing.T) {
			tamper := [][]string{
				{"ip", "link", "del", overlayDevice},
				{"bridge", "fdb", "del", vtepMAC(n3.addrs[0].Addr()), "dev", overlayDevice, "dst", n3.addrs[0].Addr().String()},
				{"ip", "neigh", "flush", "dev", overlayDevice, "nud", "permanent"},
				{"ip", "route", "del", podCIDRs(3)[0].String()},
				{"nft", "delete", "table", "inet", "kubenet-overlay"},
			}
			for _, cmd := range tamper {
				at := time.Now()
				nettest.Run(t, n1.ns, cmd[0], cmd[1:]...)
				expectRoutes(t, n1, wantPaths(n1, nodes, n3))
				expectEntries(t, n1, map[*simNode][]netip.Prefix{n3: podCIDRs(3)})
				err := nettest.Eventually(converge, func() error {
					_, err := nettest.Output(n1.ns, "nft", "list", "table", "inet", "kubenet-overlay")
					return err
				})
				if err != nil {
					t.Fatalf("after %q the firewall did not come back: %v", cmd, err)
				}
				t.Logf("%q repaired after %v (polled)", strings.Join(cmd, " "), time.Since(at))
				expectTraffic(t, p1, p3)
			}
		}},
		{"agent restarts interrupt no traffic", func(t *testing.T) {
			sink := nettest.StartUDPEcho(t, p3.NS, netip.AddrPortFrom(netip.IPv6Unspecified(), 7794))
			dst := p3.IP(netip.MustParseAddr("10.0.0.0"))
			c := dfSocket(t, p1.NS, netip.AddrPortFrom(dst, 7794))
			// A datagram every 10 ms from before the first stop to after the second start.
			stop, sent := make(chan struct{}), make(chan int)
			go func() {
				n := 0
				tick := time.NewTicker(10 * time.Millisecond)
				defer tick.Stop()
				for {
					select {
					case <-stop:
						sent <- n
						return
					case <-tick.C:
						if _, err := c.Write([]byte(fmt.Sprintf("flow-%d", n))); err == nil {
							n++
						}
					}
				}
			}()
			for _, n := range []*simNode{n1, n3} {
				if err := n.agent.Stop(); err != nil {
					t.Fatal(err)
				}
				n.startAgent(top, "--mtu=0")
				n.waitSynced(t)
			}
			close(stop)
			total := <-sent
			var lost []int
			err := nettest.Eventually(5*time.Second, func() error {
				lost = lost[:0]
				for i := range total {
					if sink.Received(fmt.Sprintf("flow-%d", i)) == 0 {
						lost = append(lost, i)
					}
				}
				if len(lost) > 0 {
					return fmt.Errorf("%d of %d datagrams lost across two agent restarts (first %d)", len(lost), total, lost[0])
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%d datagrams across two agent restarts, none lost", total)
		}},
		{"--routing=vxlan on one subnet", func(t *testing.T) {
			for _, n := range []*simNode{n1, n2} {
				if err := n.agent.Stop(); err != nil {
					t.Fatal(err)
				}
				n.startAgent(top, "--mtu=0", "--routing=vxlan")
				n.waitSynced(t) // stopped before its informers synced, an agent exits 1
			}
			expectRoutes(t, n1, wantPaths(n1, nodes, n2, n3))
			expectEntries(t, n1, map[*simNode][]netip.Prefix{n2: podCIDRs(2), n3: podCIDRs(3)})
			expectEvent(t, api, n1.name, agent.EventPeerPath, "node node-2's pod CIDR 10.244.2.0/24: through the VXLAN overlay to 192.168.77.12", "--routing=vxlan")
			expectTraffic(t, p1, p2)
			expectTraffic(t, p2, p1)
			// And back: the flag and a restart are all a switch needs.
			for _, n := range []*simNode{n1, n2} {
				if err := n.agent.Stop(); err != nil {
					t.Fatal(err)
				}
				n.startAgent(top, "--mtu=0", "--routing=direct")
				n.waitSynced(t) // stopped before its informers synced, an agent exits 1
			}
			expectRoutes(t, n1, []string{
				fmt.Sprintf("%s via %s", podCIDRs(2)[0], n2.addrs[0].Addr()), fmt.Sprintf("%s via %s", podCIDRs(2)[1], n2.addrs[1].Addr()),
			})
			err := nettest.Eventually(converge, func() error {
				if _, err := nettest.Output(n1.ns, "ip", "link", "show", overlayDevice); err == nil {
					return fmt.Errorf("the overlay device stays with --routing=direct")
				}
				// The firewall stays: its forward rules keep this node's pods from sending VXLAN to
				// the nodes that still run a device.
				if out, err := nettest.Output(n1.ns, "nft", "list", "chain", "inet", "kubenet-overlay", "forward"); err != nil || !strings.Contains(out, "nothing forwarded is VXLAN for a Node") {
					return fmt.Errorf("the overlay firewall's forward rules are gone with --routing=direct: %v\n%s", err, out)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			expectTraffic(t, p1, p2)
		}},
	}
	for _, s := range steps {
		if !t.Run(s.name, s.run) {
			break
		}
	}
}

// hostVeth is the name of pod's host-side interface on n.
func hostVeth(t *testing.T, n *simNode, pod *nettest.Pod) string {
	t.Helper()
	var name string
	nettest.Do(t, pod.NS, func() error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		peer := l.Attrs().ParentIndex
		return n.ns.Do(func(ns.NetNS) error {
			hl, err := netlink.LinkByIndex(peer)
			if err != nil {
				return err
			}
			name = hl.Attrs().Name
			return nil
		})
	})
	return name
}

// TestAgentOverlayIPv6: an IPv6-only cluster (Nodes with only IPv6 InternalIPs and pod CIDRs)
// with one node behind the router: the overlay runs over the IPv6 underlay, leaves 70 bytes of
// room, and accepts VXLAN only from the Nodes' IPv6 addresses.
func TestAgentOverlayIPv6(t *testing.T) {
	rc := startRoutedCluster(t, true)
	n1, n2, n3 := rc.nodes[0], rc.nodes[1], rc.nodes[2]
	for _, n := range rc.nodes {
		n.startAgent(t, "--mtu=0")
	}
	for _, n := range rc.nodes {
		expectReady(t, n)
	}
	v6 := netip.MustParseAddr("::")
	cidr := func(i int) netip.Prefix { return podCIDRs(i)[1] }
	expectRoutes(t, n1, []string{fmt.Sprintf("%s via %s", cidr(2), n2.addr(v6)), overlayRoute(cidr(3))})
	expectRoutes(t, n3, []string{overlayRoute(cidr(1)), overlayRoute(cidr(2))})
	expectEntries(t, n1, map[*simNode][]netip.Prefix{n3: {cidr(3)}}, v6)
	expectEntries(t, n3, map[*simNode][]netip.Prefix{n1: {cidr(1)}, n2: {cidr(2)}}, v6)
	link := nettest.Run(t, n1.ns, "ip", "-d", "link", "show", overlayDevice)
	if !strings.Contains(link, "local "+n1.addr(v6).String()) || !strings.Contains(link, "mtu 1430") {
		t.Fatalf("the overlay device is not on the IPv6 underlay with MTU 1430:\n%s", link)
	}
	p1, p3 := addPod(t, n1, "ov6-1"), addPod(t, n3, "ov6-3")
	if len(p1.IPs()) != 1 || !p1.IPs()[0].Is6() {
		t.Fatalf("pod on an IPv6-only node has addresses %v", p1.IPs())
	}
	expectTraffic(t, p1, p3)
	expectTraffic(t, p3, p1)
	sink := nettest.StartUDPEcho(t, p3.NS, netip.AddrPortFrom(netip.IPv6Unspecified(), 7795))
	dst := p3.IPs()[0]
	c := dfSocket(t, p1.NS, netip.AddrPortFrom(dst, 7795))
	full := datagram("full6-", udpPayload(1430, dst))
	err := nettest.Eventually(10*time.Second, func() error {
		if _, err := c.Write([]byte(full)); err != nil {
			return err
		}
		if sink.Received(full) == 0 {
			return fmt.Errorf("a 1430-byte packet did not cross the IPv6 overlay")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// A host that is no Node, on node-3's subnet, encapsulating over IPv6.
	for range 3 {
		injectVXLAN(t, rc.intruder, intruder[1].Addr(), n3.addr(v6), netip.MustParseAddr("fd00:10:244:1::99"), dst, 7795, "injected6")
	}
	createNode(t, rc.cp.Admin, nodeObject("intruder", intruder[1:], nil))
	err = nettest.Eventually(converge, func() error {
		injectVXLAN(t, rc.intruder, intruder[1].Addr(), n3.addr(v6), netip.MustParseAddr("fd00:10:244:1::99"), dst, 7795, "from-a-node6")
		if sink.Received("from-a-node6") == 0 {
			return fmt.Errorf("a VXLAN frame from a Node's IPv6 InternalIP was not delivered")
		}
		return nil
	})
	if err != nil {
		t.Fatalf("control: %v (the injection itself does not work, so the check proves nothing)", err)
	}
	if got := sink.Received("injected6"); got != 0 {
		t.Fatalf("%d datagrams encapsulated over IPv6 by a host that is no node reached the pod", got)
	}
}
