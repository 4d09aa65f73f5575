package e2e

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/kubenet-dev/kubenet/test/nettest"
)

// KubeTopology is how a cluster's hosts are wired (-kube.topology, E2E_TOPOLOGY).
type KubeTopology string

const (
	// TopologyOneLink puts the control plane and every node on one segment, 10.250.0.0/24 (and
	// fd00:250::/64): each node reaches every other directly, and the agent routes pod CIDRs
	// via the nodes' InternalIPs. The segment's router forwards nothing.
	TopologyOneLink KubeTopology = "one-link"
	// TopologyTwoSubnets puts the control plane and node1 on subnet A, 10.250.0.0/24 (and
	// fd00:250::/64), node2 (and every second node after it) on subnet B, 10.250.1.0/24 (and
	// fd00:250:1::/64), and a router between them that forwards but has no route to any pod
	// CIDR: pod traffic between the subnets can only go through kubenet's VXLAN overlay.
	TopologyTwoSubnets KubeTopology = "two-subnets"
)

// KubeTopologies are the known topologies.
var KubeTopologies = []KubeTopology{TopologyOneLink, TopologyTwoSubnets}

// kubeSubnets are the underlay's subnets, each with one prefix per family (IPv4, IPv6): one-link
// uses the first, two-subnets both.
var kubeSubnets = [][]netip.Prefix{
	{kubeUnderlay4, kubeUnderlay6},
	{netip.MustParsePrefix("10.250.1.0/24"), netip.MustParsePrefix("fd00:250:1::/64")},
}

// kubeRouterHost is the router's host number on every subnet (kubeUnderlayAddr).
const kubeRouterHost = 254

// ParseKubeTopology reads one topology's name.
func ParseKubeTopology(s string) (KubeTopology, error) {
	for _, k := range KubeTopologies {
		if string(k) == s {
			return k, nil
		}
	}
	return "", fmt.Errorf("topology %q: must be one of %v", s, KubeTopologies)
}

// TopologyFor is the topology spec (-kube.topology) gives the cluster of kube-proxy mode: spec
// is one topology for every cluster, or "mode=topology,..." where a mode not named gets
// one-link.
func TopologyFor(spec, mode string) (KubeTopology, error) {
	spec = strings.TrimSpace(spec)
	if spec == "" {
		return TopologyOneLink, nil
	}
	if !strings.Contains(spec, "=") {
		return ParseKubeTopology(spec)
	}
	topology := TopologyOneLink
	for _, item := range strings.Split(spec, ",") {
		m, name, ok := strings.Cut(strings.TrimSpace(item), "=")
		if !ok {
			return "", fmt.Errorf("-kube.topology %q: %q is not mode=topology", spec, item)
		}
		k, err := ParseKubeTopology(name)
		if err != nil {
			return "", err
		}
		if m == mode {
			topology = k
		}
	}
	return topology, nil
}

// subnets is how many subnets the topology has.
func (k KubeTopology) subnets() int {
	if k == TopologyTwoSubnets {
		return 2
	}
	return 1
}

// nodeSubnet is the subnet of node i (1-based): node1 shares the control plane's.
func (k KubeTopology) nodeSubnet(i int) int { return (i - 1) % k.subnets() }

// kubeHostAddrs are the addresses of host i on subnet s, one per family the cluster has.
func kubeHostAddrs(s, i int, dualStack bool) []netip.Prefix {
	a := []netip.Prefix{kubeUnderlayAddr(kubeSubnets[s][0], i)}
	if dualStack {
		a = append(a, kubeUnderlayAddr(kubeSubnets[s][1], i))
	}
	return a
}

// kubeSegment is one subnet of the cluster's underlay: an L2 segment (a bridge in a namespace
// of its own) and the router's addresses on it, the default gateways of its hosts.
type kubeSegment struct {
	*nettest.Underlay
	prefixes []netip.Prefix // one per family
	router   []netip.Prefix
}

// buildUnderlay makes the cluster's subnets and the router between them. One-link: one
// segment whose bridge carries the router's addresses, in a namespace that forwards nothing.
// Two subnets: a segment per subnet and a router namespace attached to each, forwarding between
// them, with only its connected routes (no pod CIDR).
func (c *KubeCluster) buildUnderlay(t *testing.T) {
	t.Helper()
	topology := c.cfg.Topology
	if topology == "" {
		topology = TopologyOneLink
	}
	const mtu = 1500
	if topology == TopologyOneLink {
		router := kubeHostAddrs(0, kubeRouterHost, c.cfg.DualStack)
		u := nettest.NewUnderlayIn(t, nettest.NewNamedNS(t, c.Name+"-underlay"), mtu, router...)
		c.segments = []*kubeSegment{{Underlay: u, prefixes: kubeSubnets[0], router: router}}
	} else {
		c.router = nettest.NewNamedNS(t, c.Name+"-router")
		for s := range topology.subnets() {
			name := fmt.Sprintf("subnet-%c", 'a'+s)
			router := kubeHostAddrs(s, kubeRouterHost, c.cfg.DualStack)
			u := nettest.NewUnderlayIn(t, nettest.NewNamedNS(t, c.Name+"-"+name), mtu)
			u.Attach(t, c.router, name, router...)
			c.segments = append(c.segments, &kubeSegment{Underlay: u, prefixes: kubeSubnets[s], router: router})
		}
		nettest.WriteSysctl(t, c.router, "net/ipv4/ip_forward", "1")
		if c.cfg.DualStack {
			nettest.WriteSysctl(t, c.router, "net/ipv6/conf/all/forwarding", "1")
		}
	}
	// The nodes' resolv.conf names it: nothing answers DNS there.
	c.routerAddrs = c.segments[0].router
	var subnets []string
	for _, s := range c.segments {
		subnets = append(subnets, nettest.JoinPrefixes(s.prefixes[:len(s.router)]))
	}
	t.Logf("cluster %s: topology %s, subnets %s", c.Name, topology, strings.Join(subnets, " and "))
}

// segment is the subnet that holds a.
func (c *KubeCluster) segment(a netip.Addr) (*kubeSegment, error) {
	for _, s := range c.segments {
		for _, p := range s.prefixes {
			if p.Contains(a) {
				return s, nil
			}
		}
	}
	return nil, fmt.Errorf("%s is on none of the cluster's subnets", a)
}
