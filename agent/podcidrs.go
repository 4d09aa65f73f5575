package agent

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	netutils "k8s.io/utils/net"

	"github.com/kubenet-dev/kubenet/agent/routes"
	"github.com/kubenet-dev/kubenet/internal/ipnet"
)

// CIDRRules are what a Node's pod CIDR must pass before the agent writes a conflist or a route
// for it. Node objects are input: whoever can write one must not be able to take the node's
// own networks, another node's pods or the services with it.
type CIDRRules struct {
	// Cluster are the cluster CIDRs (--cluster-cidr): every pod CIDR lies inside one of its
	// family. Empty: not checked.
	Cluster []netip.Prefix
	// Services are the service CIDRs (--service-cidr): no pod CIDR overlaps one.
	Services []netip.Prefix
	// Networks are this node's own networks (routes.NodeNetworks): no pod CIDR overlaps one.
	Networks []routes.Network
}

// clusterError says why c can be no node's pod CIDR anywhere in the cluster, or nil.
func (r CIDRRules) clusterError(c netip.Prefix) error {
	if s, ok := ipnet.OverlappingSpecial(c); ok {
		return fmt.Errorf("overlaps %s (%s)", s.Prefix, s.What)
	}
	if len(r.Cluster) > 0 && !slices.ContainsFunc(r.Cluster, func(cc netip.Prefix) bool { return cc.Bits() <= c.Bits() && cc.Contains(c.Addr()) }) {
		return fmt.Errorf("is outside the cluster CIDRs %s (--cluster-cidr)", prefixList(r.Cluster))
	}
	if i := slices.IndexFunc(r.Services, c.Overlaps); i >= 0 {
		return fmt.Errorf("overlaps the service CIDR %s (--service-cidr)", r.Services[i])
	}
	return nil
}

// nodeError says why c cannot be a pod CIDR seen from this node, or nil.
func (r CIDRRules) nodeError(c netip.Prefix) error {
	for _, n := range r.Networks {
		if c.Overlaps(n.Prefix) {
			return fmt.Errorf("overlaps this node's network %s (%s)", n.Prefix, n.Source)
		}
	}
	return nil
}

// gatewayError says why a peer's address cannot be the gateway of a route to its pods, or nil.
func (r CIDRRules) gatewayError(gw netip.Addr) error {
	if s, ok := ipnet.SpecialHolding(gw); ok {
		return fmt.Errorf("its InternalIP %s is in %s (%s)", gw, s.Prefix, s.What)
	}
	for _, n := range r.Networks {
		if n.Addr == gw {
			return fmt.Errorf("its InternalIP %s is this node's own address (%s)", gw, n.Source)
		}
	}
	return nil
}

// onLink returns the node's network that holds a (an address of the node's in it, or a connected
// route): a route via a is accepted without any other router.
func (r CIDRRules) onLink(a netip.Addr) (routes.Network, bool) {
	for _, n := range r.Networks {
		if n.Prefix.Contains(a) {
			return n, true
		}
	}
	return routes.Network{}, false
}

func prefixList(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ", ")
}

// claim is one pod CIDR one Node claims.
type claim struct {
	node string
	cidr netip.Prefix
}

// claims are every Node's pod CIDRs, checked against the rules that hold cluster-wide, with the
// other Nodes each valid one overlaps. Two Nodes claiming overlapping CIDRs cannot both be
// right and the agent cannot tell which one is: neither gets a route, and a node whose own CIDR
// is claimed by another writes no conflist.
type claims struct {
	rules    CIDRRules
	byNode   map[string][]netip.Prefix // every parsed CIDR, valid or not
	parseErr map[string]error
	invalid  map[claim]error
	shared   map[claim][]string // valid claim -> the other nodes with an overlapping valid claim
	pods     podNets            // every valid claim, to find the ones holding an address
}

func newClaims(nodes []*corev1.Node, rules CIDRRules) *claims {
	c := &claims{rules: rules, byNode: map[string][]netip.Prefix{}, parseErr: map[string]error{}, invalid: map[claim]error{}, shared: map[claim][]string{}, pods: podNets{owners: map[netip.Prefix][]string{}}}
	var valid []claim
	for _, n := range nodes {
		cidrs, err := PodCIDRs(n)
		if err != nil {
			c.parseErr[n.Name] = err
			continue
		}
		cidrs = dedup(cidrs)
		c.byNode[n.Name] = cidrs
		for _, p := range cidrs {
			cl := claim{n.Name, p}
			if err := rules.clusterError(p); err != nil {
				c.invalid[cl] = err
				continue
			}
			valid = append(valid, cl)
			c.pods.add(cl)
		}
	}
	c.findShared(valid)
	return c
}

// podNets indexes pod CIDRs by prefix, so that the ones holding an address are found with one
// map lookup per prefix length in use (a cluster has one or two), not one test per Node.
type podNets struct {
	owners map[netip.Prefix][]string
	bits   [2][]int // the prefix lengths in use: [0] IPv4, [1] IPv6
}

func (p *podNets) add(cl claim) {
	fam := familyIndex(cl.cidr.Addr())
	if !slices.Contains(p.bits[fam], cl.cidr.Bits()) {
		p.bits[fam] = append(p.bits[fam], cl.cidr.Bits())
		slices.Sort(p.bits[fam])
	}
	if !slices.Contains(p.owners[cl.cidr], cl.node) {
		p.owners[cl.cidr] = append(p.owners[cl.cidr], cl.node)
	}
}

// containing returns the pod CIDRs that hold a, widest first.
func (p *podNets) containing(a netip.Addr) []netip.Prefix {
	var out []netip.Prefix
	for _, bits := range p.bits[familyIndex(a)] {
		if pfx, err := a.Prefix(bits); err == nil && len(p.owners[pfx]) > 0 {
			out = append(out, pfx)
		}
	}
	return out
}

func familyIndex(a netip.Addr) int {
	if a.Is4() {
		return 0
	}
	return 1
}

// addressError says why the Node's InternalIPs make it no peer, or nil. An InternalIP inside a
// pod CIDR (the Node's own or another's), or inside a service CIDR, is an address pods may hold
// or a service answers for: a route via it could lead to a pod, and whatever trusts the Node's
// address (the API server reaching its kubelet) would reach that pod. Every InternalIP counts,
// not only the gateways: each is the Node's word about where it is. The pod CIDRs are those that pass the cluster-wide rules, which are the same on
// every node, so every agent refuses the same Nodes; a CIDR refused by them holds no pods, and
// counting it would let one refused claim around the nodes' own network withdraw every route
// of the cluster.
func (c *claims) addressError(n *corev1.Node) error {
	for _, a := range n.Status.Addresses {
		if a.Type != corev1.NodeInternalIP {
			continue
		}
		ip, err := parseNodeIP(a.Address)
		if err != nil {
			return err
		}
		if pods := c.pods.containing(ip); len(pods) > 0 {
			p := pods[0]
			owners := slices.Sorted(slices.Values(c.pods.owners[p]))
			return fmt.Errorf("its InternalIP %s lies inside the pod CIDR %s of node %s: pods may hold that address", quoteIfOther(a.Address, ip), p, strings.Join(owners, ", "))
		}
		if i := slices.IndexFunc(c.rules.Services, func(s netip.Prefix) bool { return s.Contains(ip) }); i >= 0 {
			return fmt.Errorf("its InternalIP %s lies inside the service CIDR %s (--service-cidr): a service may answer for that address", quoteIfOther(a.Address, ip), c.rules.Services[i])
		}
	}
	return nil
}

// parseNodeIP reads an InternalIP as the cluster's other components do: the API server does not
// validate node addresses, and Kubernetes reads IPv4 with leading zeros ("010.244.002.001") as
// decimal, which net/netip refuses. IPv4-mapped IPv6 forms are the IPv4 address; a zone is no
// part of the address. What neither reads is no address the agent can check: refused.
func parseNodeIP(s string) (netip.Addr, error) {
	ip, err := netip.ParseAddr(s)
	if err != nil {
		sloppy, ok := netip.AddrFromSlice(netutils.ParseIPSloppy(s))
		if !ok {
			return netip.Addr{}, fmt.Errorf("its InternalIP %q is not an IP address", s)
		}
		ip = sloppy
	}
	return ip.WithZone("").Unmap(), nil
}

// quoteIfOther shows an address as the Node wrote it, and what that means when it differs.
func quoteIfOther(raw string, ip netip.Addr) string {
	if raw == ip.String() {
		return raw
	}
	return fmt.Sprintf("%q (%s)", raw, ip)
}

// findShared records every pair of overlapping valid claims of different nodes. CIDRs either
// nest or are disjoint, so in address order each claim overlaps exactly the claims still open
// around it (a stack of nested CIDRs): n log n for the sort, then one pass.
func (c *claims) findShared(valid []claim) {
	slices.SortFunc(valid, func(a, b claim) int {
		return cmp.Or(comparePrefix(a.cidr, b.cidr), strings.Compare(a.node, b.node))
	})
	var open []claim
	for _, cl := range valid {
		for len(open) > 0 && !open[len(open)-1].cidr.Overlaps(cl.cidr) {
			open = open[:len(open)-1]
		}
		for _, o := range open {
			if o.node != cl.node {
				c.shared[cl] = append(c.shared[cl], o.node)
				c.shared[o] = append(c.shared[o], cl.node)
			}
		}
		open = append(open, cl)
	}
}

// dedup drops repeated CIDRs, keeping the Node's order.
func dedup(ps []netip.Prefix) []netip.Prefix {
	out := ps[:0:0]
	for _, p := range ps {
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}

// comparePrefix orders IPv4 before IPv6, then by address, then wider first.
func comparePrefix(a, b netip.Prefix) int {
	return cmp.Or(a.Addr().Compare(b.Addr()), cmp.Compare(a.Bits(), b.Bits()))
}

// own returns the pod CIDRs of the node named self that a conflist may be written for: none
// when it has none yet, an error naming every reason when any of them is refused.
func (c *claims) own(self string) ([]netip.Prefix, error) {
	if err := c.parseErr[self]; err != nil {
		return nil, err
	}
	cidrs := c.byNode[self]
	var errs []error
	for _, p := range cidrs {
		if err := cmp.Or(c.ruleError(claim{self, p}), c.sharedError(claim{self, p})); err != nil {
			errs = append(errs, fmt.Errorf("pod CIDR %s of node %s %w", p, self, err))
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return cidrs, nil
}

// ruleError says why the claim breaks a rule, cluster-wide or of this node, or nil.
func (c *claims) ruleError(cl claim) error {
	if err := c.invalid[cl]; err != nil {
		return err
	}
	return c.rules.nodeError(cl.cidr)
}

// sharedError says which other nodes claim addresses of cl too, or nil.
func (c *claims) sharedError(cl claim) error {
	if others := c.shared[cl]; len(others) > 0 {
		return fmt.Errorf("overlaps the pod CIDR of node %s: two nodes claim these addresses, neither is trusted", strings.Join(slices.Compact(slices.Sorted(slices.Values(others))), ", "))
	}
	return nil
}

// PodCIDRs returns a Node's pod CIDRs: spec.podCIDRs, or spec.podCIDR on objects written by
// clients that only know the single-stack field. A CIDR with host bits is refused: it is no
// network, and guessing which one was meant would route addresses nobody assigned.
func PodCIDRs(n *corev1.Node) ([]netip.Prefix, error) {
	raw := n.Spec.PodCIDRs
	if len(raw) == 0 && n.Spec.PodCIDR != "" {
		raw = []string{n.Spec.PodCIDR}
	}
	out := make([]netip.Prefix, 0, len(raw))
	for _, s := range raw {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			return nil, fmt.Errorf("node %s: pod CIDR %q: %w", n.Name, s, err)
		}
		if p.Masked() != p {
			return nil, fmt.Errorf("node %s: pod CIDR %q has host bits set", n.Name, s)
		}
		out = append(out, p)
	}
	return out, nil
}
