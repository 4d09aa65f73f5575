//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubenet-dev/kubenet/internal/ipnet"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

// What deploy/kubenet.yaml's agent (--routing=auto, the default) makes for peers it shares no
// link with: the overlay device of kubenet's defaults (docs/agent.md) and its firewall table.
const (
	overlayDevice   = "kubenet-vxlan"
	overlayPort     = 8472
	overlayVNI      = 1
	overlayOverhead = 50 // on an IPv4 underlay: outer IPv4, UDP, VXLAN, inner Ethernet
	overlayTable    = "kubenet-overlay"
	kubeUnderlayMTU = 1500 // buildUnderlay's
	agentHTTP       = "http://127.0.0.1:9309"
)

// kubePeer is what a node needs to know of another node to check the path to its pods.
type kubePeer struct {
	node     *KubeNode
	index    int // 1-based, as in the node's name
	podCIDRs []netip.Prefix
}

// overlaid says whether the agents reach node j's pods from node i through the overlay: the
// topology puts them on different subnets.
func (c *KubeCluster) overlaid(i, j int) bool {
	return c.cfg.Topology.nodeSubnet(i) != c.cfg.Topology.nodeSubnet(j)
}

// usesOverlay says whether node i reaches some peer through the overlay.
func (c *KubeCluster) usesOverlay(i int) bool {
	for j := 1; j <= len(c.Nodes); j++ {
		if j != i && c.overlaid(i, j) {
			return true
		}
	}
	return false
}

// podMTU is the MTU the agent gives node i's pods: the underlay's, less the encapsulation when a
// peer is reached through the overlay (the conflist's mtu; 0 there means detect, the underlay's).
func (c *KubeCluster) podMTU(i int) int {
	if c.usesOverlay(i) {
		return kubeUnderlayMTU - overlayOverhead
	}
	return kubeUnderlayMTU
}

// peers reads every node's pod CIDRs from the API.
func (c *KubeCluster) peers(t *testing.T) []kubePeer {
	t.Helper()
	var out []kubePeer
	for i, n := range c.Nodes {
		node, err := c.cp.Admin.CoreV1().Nodes().Get(context.Background(), n.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p := kubePeer{node: n, index: i + 1}
		for _, s := range node.Spec.PodCIDRs {
			p.podCIDRs = append(p.podCIDRs, netip.MustParsePrefix(s))
		}
		out = append(out, p)
	}
	return out
}

// addrOf is the node's underlay address of the family of like.
func (n *KubeNode) addrOf(like netip.Addr) netip.Addr {
	for _, a := range n.Addrs {
		if a.Addr().Is4() == like.Is4() {
			return a.Addr()
		}
	}
	return netip.Addr{}
}

// checkPaths checks how each node reaches the others' pods, in any topology: a peer on the
// node's subnet by a route via its InternalIP on eth0, a peer on another subnet by a route
// through the VXLAN device to the CIDR's first address (the overlay's next hop); the agent's
// /peers and its KubenetPeerPath Events on the Node say the same, and the Node's
// NetworkUnavailable condition counts both. A node
// with an overlaid peer has the device (its VNI, port, local address = its InternalIP, MTU =
// the underlay's less 50), the firewall that accepts VXLAN from the Nodes' InternalIPs only, and
// a conflist whose mtu leaves room for the encapsulation; a node without keeps the device and
// the firewall too (auto mode: a peer may see it off its networks), and its conflist detects
// the MTU. On two subnets the router has no route to any pod
// CIDR, so the overlay is the only way between them.
func checkPaths(t *testing.T, c *KubeCluster) {
	peers := c.peers(t)
	var nodeAddrs []netip.Addr
	for _, p := range peers {
		for _, a := range p.node.Addrs {
			nodeAddrs = append(nodeAddrs, a.Addr())
		}
	}
	if c.router != nil {
		var errs []error
		for _, p := range peers {
			for _, cidr := range p.podCIDRs {
				if err := noRoute(c.router, cidr.Addr().Next()); err != nil {
					errs = append(errs, err)
				}
			}
		}
		Check(t, errors.Join(errs...), "the router between the subnets has no route to any pod CIDR: pods on different subnets reach each other only through the overlay")
	}
	for _, self := range peers {
		n := self.node
		var wantPaths []string
		for _, p := range peers {
			if p.index == self.index {
				continue
			}
			for _, cidr := range p.podCIDRs {
				via, gw, dev := "direct", p.node.addrOf(cidr.Addr()), "eth0"
				if c.overlaid(self.index, p.index) {
					via, gw, dev = "vxlan", cidr.Masked().Addr(), overlayDevice
				}
				wantPaths = append(wantPaths, fmt.Sprintf("%s %s %s", p.node.Name, cidr, via))
				err := c.eventually(30*time.Second, func(context.Context) error { return routeVia(n.NS, cidr, gw, dev) })
				Check(t, err, "%s routes %s's pod CIDR %s via %s dev %s", n.Name, p.node.Name, cidr, gw, dev)
				event := fmt.Sprintf("node %s's pod CIDR %s: direct via %s (", p.node.Name, cidr, gw)
				if via == "vxlan" {
					event = fmt.Sprintf("node %s's pod CIDR %s: through the VXLAN overlay to %s (", p.node.Name, cidr, p.node.Addrs[0].Addr())
				}
				err = c.eventually(30*time.Second, func(ctx context.Context) error { return c.nodeEvent(ctx, n.Name, "KubenetPeerPath", event) })
				Check(t, err, "%s's agent announced the path in an Event KubenetPeerPath: %q...", n.Name, strings.TrimSuffix(event, " ("))
			}
		}
		slices.Sort(wantPaths)
		paths, err := agentPaths(n)
		if err == nil && !slices.Equal(paths, wantPaths) {
			err = fmt.Errorf("/peers says %q", paths)
		}
		Check(t, err, "%s's agent reports its paths (/peers): %s", n.Name, strings.Join(wantPaths, ", "))
		checkRouteCondition(t, c, self, len(wantPaths))

		// Every node with peers keeps its device and firewall (--routing=auto): a peer that sees
		// it as off its networks may send through the overlay, and its forward rules keep its
		// pods from sending VXLAN to the Nodes.
		overlay := c.usesOverlay(self.index)
		Check(t, overlayDeviceAs(n), "%s has %s: VXLAN, VNI %d, port %d, local %s, MTU %d, up", n.Name, overlayDevice, overlayVNI, overlayPort, n.Addrs[0].Addr(), kubeUnderlayMTU-overlayOverhead)
		senders, err := overlaySenders(n.NS)
		if err == nil && !slices.Equal(senders, sortedAddrs(nodeAddrs)) {
			err = fmt.Errorf("its sets hold %v", senders)
		}
		Check(t, err, "%s's firewall (inet %s) accepts VXLAN from the Nodes' InternalIPs %v only", n.Name, overlayTable, sortedAddrs(nodeAddrs))
		wantMTU, why := 0, "every peer direct: the pods get the uplink's, detected"
		if overlay {
			wantMTU, why = c.podMTU(self.index), fmt.Sprintf("the underlay's %d less %d of VXLAN", kubeUnderlayMTU, overlayOverhead)
		}
		mtu, err := conflistMTU(n)
		if err == nil && mtu != wantMTU {
			err = fmt.Errorf("mtu %d", mtu)
		}
		Check(t, err, "%s's conflist has mtu %d (%s)", n.Name, wantMTU, why)
	}
}

// checkPodToPod runs a pod on every node with nettest's TCP and UDP echo servers in its network
// namespace and checks, for every ordered pair of pods on different nodes and every family: the
// request arrives with the client pod's own address (no SNAT, whatever the path), a packet of
// the pods' full MTU with fragmentation forbidden is echoed (the path carries it, encapsulation
// included), and one byte more is refused by the client's own MTU. Each pod's eth0 has the MTU
// the agent chose for its node.
func checkPodToPod(t *testing.T, c *KubeCluster) {
	const namespace = "kubenet-pod-to-pod"
	c.createNamespace(t, namespace)
	type podEnd struct {
		name  string
		index int
		ns    ns.NetNS
		ips   []netip.Addr
		tcp   map[bool]netip.AddrPort // by family (IPv6)
		udp   map[bool]netip.AddrPort
	}
	var pods []*podEnd
	for i, n := range c.Nodes {
		pod := c.createRunning(t, namespace, agnhostPod("echo-"+n.Name, n.Name, nil))
		podNS, err := c.PodNetNS(pod)
		Require(t, err, "found the network namespace of pod %s on %s", pod.Name, n.Name)
		t.Cleanup(func() { _ = podNS.Close() })
		e := &podEnd{name: pod.Name, index: i + 1, ns: podNS, tcp: map[bool]netip.AddrPort{}, udp: map[bool]netip.AddrPort{}}
		for _, ip := range pod.Status.PodIPs {
			a := netip.MustParseAddr(ip.IP)
			e.ips = append(e.ips, a)
			e.tcp[a.Is6()] = nettest.StartTCPEcho(t, podNS, netip.AddrPortFrom(a, 0)).Addr
			e.udp[a.Is6()] = nettest.StartUDPEcho(t, podNS, netip.AddrPortFrom(a, 0)).Addr
		}
		mtu := c.podMTU(i + 1)
		Check(t, linkMTUs(podNS, mtu, "eth0"), "pod %s on %s: eth0 has MTU %d", pod.Name, n.Name, mtu)
		pods = append(pods, e)
	}
	for _, from := range pods {
		for _, to := range pods {
			if from == to {
				continue
			}
			path := "directly"
			if c.overlaid(from.index, to.index) {
				path = "through the overlay"
			}
			for _, src := range from.ips {
				fam := familyName(src.Is6())
				for _, udp := range []bool{false, true} {
					dst, proto := to.tcp[src.Is6()], "TCP"
					if udp {
						dst, proto = to.udp[src.Is6()], "UDP"
					}
					Check(t, ExpectEchoFrom(from.ns, dst, udp, src), "%s -> %s (%s %s, %s): arrives from the client pod's own address %s", from.name, to.name, proto, fam, path, src)
				}
				mtu := c.podMTU(from.index)
				Check(t, UDPDontFragment(from.ns, to.udp[src.Is6()], mtu, 5*time.Second),
					"%s -> %s (%s, %s): a %d-byte packet with fragmentation forbidden is echoed", from.name, to.name, fam, path, mtu)
				err := UDPDontFragment(from.ns, to.udp[src.Is6()], mtu+1, 5*time.Second)
				if errors.Is(err, unix.EMSGSIZE) {
					err = nil
				} else {
					err = fmt.Errorf("want EMSGSIZE, got %v", err)
				}
				Check(t, err, "%s -> %s (%s): a %d-byte packet is refused by the pod's own MTU", from.name, to.name, fam, mtu+1)
			}
		}
	}
}

// noRoute checks that n has no route to a.
func noRoute(n ns.NetNS, a netip.Addr) error {
	return n.Do(func(ns.NetNS) error {
		rs, err := netlink.RouteGet(a.AsSlice())
		if err == nil {
			return fmt.Errorf("%s is routed: %v", a, rs)
		}
		if !errors.Is(err, unix.ENETUNREACH) {
			return fmt.Errorf("route to %s: %w", a, err)
		}
		return nil
	})
}

// routeVia checks that n routes dst (exactly that prefix) via gw on the link dev.
func routeVia(n ns.NetNS, dst netip.Prefix, gw netip.Addr, dev string) error {
	return n.Do(func(ns.NetNS) error {
		family := netlink.FAMILY_V4
		if dst.Addr().Is6() {
			family = netlink.FAMILY_V6
		}
		rs, err := netlink.RouteListFiltered(family, &netlink.Route{Dst: ipnet.FromPrefix(dst)}, netlink.RT_FILTER_DST)
		if err != nil {
			return err
		}
		if len(rs) != 1 {
			return fmt.Errorf("%d routes to %s: %v", len(rs), dst, rs)
		}
		r := rs[0]
		l, err := netlink.LinkByIndex(r.LinkIndex)
		if err != nil {
			return err
		}
		got, _ := netip.AddrFromSlice(r.Gw)
		if got.Unmap() != gw || l.Attrs().Name != dev {
			return fmt.Errorf("route %s via %s dev %s", dst, got, l.Attrs().Name)
		}
		return nil
	})
}

// agentPaths asks the node's agent how it reaches each peer's pod CIDRs (/peers, on its metrics
// address in the node's namespace) and returns "node cidr via" per path, sorted; a path with an
// error is returned with it.
func agentPaths(n *KubeNode) ([]string, error) {
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: nettest.DialIn(n.NS), DisableKeepAlives: true}}
	resp, err := client.Get(agentHTTP + "/peers")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var paths []struct {
		Node    string `json:"node"`
		PodCIDR string `json:"podCIDR"`
		Via     string `json:"via"`
		Error   string `json:"error"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&paths); err != nil {
		return nil, fmt.Errorf("/peers: %w", err)
	}
	var out []string
	for _, p := range paths {
		s := fmt.Sprintf("%s %s %s", p.Node, p.PodCIDR, p.Via)
		if p.Error != "" {
			s += " error: " + p.Error
		}
		out = append(out, s)
	}
	slices.Sort(out)
	return out, nil
}

// checkRouteCondition checks the Node's NetworkUnavailable condition: False, every route in
// place, and counting the overlaid ones when there are any.
func checkRouteCondition(t *testing.T, c *KubeCluster, self kubePeer, paths int) {
	t.Helper()
	overlaid := 0
	for _, p := range c.peers(t) {
		if p.index != self.index && c.overlaid(self.index, p.index) {
			overlaid += len(p.podCIDRs)
		}
	}
	node, err := c.cp.Admin.CoreV1().Nodes().Get(context.Background(), self.node.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := "the routes to every other node's pod CIDRs are in place"
	if overlaid > 0 {
		want += fmt.Sprintf(" (%d direct, %d through the VXLAN overlay)", paths-overlaid, overlaid)
	}
	cond := nodeCondition(node, corev1.NodeNetworkUnavailable)
	if cond == nil || cond.Status != corev1.ConditionFalse || !strings.HasSuffix(cond.Message, want) {
		err = fmt.Errorf("condition %+v", cond)
	}
	Check(t, err, "%s's NetworkUnavailable is False: %q", self.node.Name, want)
}

// nodeEvent finds an Event on the Node named node with reason and a message starting with
// prefix (Node events live in the default namespace).
func (c *KubeCluster) nodeEvent(ctx context.Context, node, reason, prefix string) error {
	list, err := c.cp.Admin.CoreV1().Events("default").List(ctx, metav1.ListOptions{
		FieldSelector: "involvedObject.kind=Node,involvedObject.name=" + node + ",reason=" + reason,
	})
	if err != nil {
		return err
	}
	var msgs []string
	for _, e := range list.Items {
		if strings.HasPrefix(e.Message, prefix) {
			return nil
		}
		msgs = append(msgs, e.Message)
	}
	return fmt.Errorf("events %s of node %s: %q", reason, node, msgs)
}

// overlayDeviceAs checks the node's overlay device.
func overlayDeviceAs(n *KubeNode) error {
	return n.NS.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(overlayDevice)
		if err != nil {
			return err
		}
		v, ok := l.(*netlink.Vxlan)
		if !ok {
			return fmt.Errorf("a %s link", l.Type())
		}
		local, _ := netip.AddrFromSlice(v.SrcAddr)
		want := n.Addrs[0].Addr()
		if v.VxlanId != overlayVNI || v.Port != overlayPort || local.Unmap() != want || v.MTU != kubeUnderlayMTU-overlayOverhead || v.Flags&net.FlagUp == 0 {
			return fmt.Errorf("VNI %d, port %d, local %s, MTU %d, flags %v", v.VxlanId, v.Port, local, v.MTU, v.Flags)
		}
		return nil
	})
}

// overlaySenders lists the addresses in the overlay firewall's sets of accepted senders.
func overlaySenders(n ns.NetNS) ([]netip.Addr, error) {
	dump, err := nftListTable(n, "inet", overlayTable)
	if err != nil {
		return nil, err
	}
	if dump == nil {
		return nil, fmt.Errorf("no table inet %s", overlayTable)
	}
	var d struct {
		Nftables []struct {
			Set *struct {
				Name string          `json:"name"`
				Elem json.RawMessage `json:"elem"`
			} `json:"set"`
		} `json:"nftables"`
	}
	if err := json.Unmarshal(dump, &d); err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, o := range d.Nftables {
		// The senders' sets; the pods' interval sets (pods4, pods6) list prefixes.
		if o.Set == nil || (o.Set.Name != "nodes4" && o.Set.Name != "nodes6") || len(o.Set.Elem) == 0 {
			continue
		}
		var elems []string
		if err := json.Unmarshal(o.Set.Elem, &elems); err != nil {
			return nil, fmt.Errorf("set %s: %w", o.Set.Name, err)
		}
		for _, e := range elems {
			a, err := netip.ParseAddr(e)
			if err != nil {
				return nil, fmt.Errorf("set %s: element %q: %w", o.Set.Name, e, err)
			}
			out = append(out, a)
		}
	}
	return sortedAddrs(out), nil
}

// conflistMTU reads the mtu of kubenet's entry in the conflist the agent wrote on the node.
func conflistMTU(n *KubeNode) (int, error) {
	b, err := os.ReadFile(n.HostPath(filepath.Join(nodeCNIConfDir, "10-kubenet.conflist")))
	if err != nil {
		return 0, err
	}
	var list struct {
		Plugins []struct {
			Type string `json:"type"`
			MTU  int    `json:"mtu"`
		} `json:"plugins"`
	}
	if err := json.Unmarshal(b, &list); err != nil {
		return 0, err
	}
	for _, p := range list.Plugins {
		if p.Type == "kubenet" {
			return p.MTU, nil
		}
	}
	return 0, fmt.Errorf("no kubenet plugin in %s", b)
}

func sortedAddrs(as []netip.Addr) []netip.Addr {
	out := slices.Clone(as)
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}
