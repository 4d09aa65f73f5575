package e2e

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/kubenet-dev/kubenet/test/nettest"
)

// Addresses of the simulated cluster. They exist only inside the test's namespaces.
var (
	// The cluster CIDR per family; node i gets the i-th /24 and /64 of it as its pod CIDRs.
	ClusterCIDR4 = netip.MustParsePrefix("10.244.0.0/16")
	ClusterCIDR6 = netip.MustParsePrefix("fd00:10:244::/56")
	// The node network on the underlay bridge; node i is host i, the router is .254 / ::fe.
	NodeNet4 = netip.MustParsePrefix("10.240.0.0/24")
	NodeNet6 = netip.MustParsePrefix("fd00:240::/64")
	Router4  = netip.MustParseAddr("10.240.0.254")
	Router6  = netip.MustParseAddr("fd00:240::fe")
	// An external host behind the router, outside every non-masquerade CIDR. The router has no
	// route to any pod CIDR, so only SNATed traffic can get an answer from it.
	ExternalNet4  = netip.MustParsePrefix("198.18.0.0/24")
	ExternalNet6  = netip.MustParsePrefix("2001:db8:e::/64")
	ExternalHost4 = netip.MustParseAddr("198.18.0.2")
	ExternalHost6 = netip.MustParseAddr("2001:db8:e::2")
	// kubenet's non-masquerade CIDRs on every node (old kubenet's default 10.0.0.0/8 and its
	// IPv6 counterpart): the cluster and node networks, not the external host.
	ClusterNonMasquerade = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")}
)

// UnderlayMTU is the MTU of the node network, below Ethernet's 1500 as in many clouds: kubenet
// must detect it (mtu 0) and give it to the bridge and both veth ends, so that full-size
// packets cross nodes unfragmented.
const UnderlayMTU = 1400

// Cluster is a simulated multi-node cluster: nodes (network namespaces) on an underlay bridge
// that lives in an "underlay" namespace of its own, which also routes to an external host.
// Each node has its pod CIDRs carved from the cluster CIDR and static routes to the other
// nodes' pod CIDRs, as a cloud route controller would install for kubenet.
type Cluster struct {
	Underlay ns.NetNS // the underlay bridge and the router
	External ns.NetNS // a host outside the cluster
	Nodes    []*ClusterNode
}

// ClusterNode is one node of a Cluster.
type ClusterNode struct {
	*nettest.Node
	Name     string
	Addr     map[bool]netip.Addr // the node's underlay address, keyed by "is IPv6"
	PodCIDRs []netip.Prefix      // IPv4, IPv6
	List     *libcni.NetworkConfigList
	Backend  string // netfilterBackend
}

// Gateway is the node's bridge address in the pod CIDR of the family of like.
func (n *ClusterNode) Gateway(like netip.Addr) netip.Addr {
	for _, c := range n.PodCIDRs {
		if c.Addr().Is4() == like.Is4() {
			return c.Addr().Next()
		}
	}
	return netip.Addr{}
}

// NewCluster builds a cluster of n nodes whose plugin binaries are in binDir. Each node's
// kubenet conflist (dual-stack, mtu 0, cniVersion 1.1.0) is in its List.
func NewCluster(t testing.TB, binDir string, n int) *Cluster {
	t.Helper()
	// The underlay bridge carries the router's addresses: the underlay namespace is the router.
	u := nettest.NewUnderlay(t, UnderlayMTU, netip.PrefixFrom(Router4, NodeNet4.Bits()), netip.PrefixFrom(Router6, NodeNet6.Bits()))
	c := &Cluster{Underlay: u.NS, External: nettest.NewNS(t)}
	nettest.WriteSysctl(t, c.Underlay, "net/ipv4/ip_forward", "1")
	nettest.WriteSysctl(t, c.Underlay, "net/ipv6/conf/all/forwarding", "1")
	nettest.Link(t,
		nettest.Endpoint{NS: c.Underlay, IfName: "ext", Addrs: []netip.Prefix{netip.PrefixFrom(ExternalNet4.Addr().Next(), 24), netip.PrefixFrom(ExternalNet6.Addr().Next(), 64)}},
		nettest.Endpoint{NS: c.External, IfName: "eth0", Addrs: []netip.Prefix{netip.PrefixFrom(ExternalHost4, 24), netip.PrefixFrom(ExternalHost6, 64)}})
	nettest.AddRoute(t, c.External, netip.MustParsePrefix("0.0.0.0/0"), ExternalNet4.Addr().Next())
	nettest.AddRoute(t, c.External, netip.MustParsePrefix("::/0"), ExternalNet6.Addr().Next())

	for i := 1; i <= n; i++ {
		node := &ClusterNode{
			Node: &nettest.Node{NS: nettest.NewNS(t), Dir: t.TempDir()},
			Name: fmt.Sprintf("node%d", i),
			Addr: map[bool]netip.Addr{false: hostAddr(NodeNet4, i), true: hostAddr(NodeNet6, i)},
			PodCIDRs: []netip.Prefix{
				netip.PrefixFrom(clusterSubnet4(i), 24),
				netip.PrefixFrom(clusterSubnet6(i), 64),
			},
		}
		node.CNI = libcni.NewCNIConfigWithCacheDir([]string{binDir}, filepath.Join(node.Dir, "cache"), nil)
		u.Attach(t, node.NS, "eth0", netip.PrefixFrom(node.Addr[false], NodeNet4.Bits()), netip.PrefixFrom(node.Addr[true], NodeNet6.Bits()))
		nettest.AddRoute(t, node.NS, netip.MustParsePrefix("0.0.0.0/0"), Router4)
		nettest.AddRoute(t, node.NS, netip.MustParsePrefix("::/0"), Router6)
		// node1 (the host-port pod's) runs the iptables backend, the others nftables: the
		// traffic matrix crosses both, and the residue audit reads both.
		backend := "nftables"
		if i == 1 {
			backend = "iptables"
		}
		node.Backend = backend
		node.List = node.ConfList(t, nettest.NetConf{PodCIDRs: node.PodCIDRs, NonMasqueradeCIDRs: ClusterNonMasquerade, NetfilterBackend: backend})
		c.Nodes = append(c.Nodes, node)
	}
	// The route controller's job: every node routes every other node's pod CIDRs to it.
	for _, from := range c.Nodes {
		for _, to := range c.Nodes {
			if from == to {
				continue
			}
			for _, cidr := range to.PodCIDRs {
				nettest.AddRoute(t, from.NS, cidr, to.Addr[cidr.Addr().Is6()])
			}
		}
	}
	return c
}

// hostAddr is the i-th address of p.
func hostAddr(p netip.Prefix, i int) netip.Addr {
	a := p.Addr()
	for range i {
		a = a.Next()
	}
	return a
}

// clusterSubnet4 is the i-th /24 of ClusterCIDR4.
func clusterSubnet4(i int) netip.Addr {
	b := ClusterCIDR4.Addr().As4()
	b[2] = byte(i)
	return netip.AddrFrom4(b)
}

// clusterSubnet6 is the i-th /64 of ClusterCIDR6.
func clusterSubnet6(i int) netip.Addr {
	b := ClusterCIDR6.Addr().As16()
	b[7] = byte(i)
	return netip.AddrFrom16(b)
}
