package agent

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/kubenet-dev/kubenet/agent/routes"
)

// PodCIDRs returns a Node's pod CIDRs: spec.podCIDRs, or spec.podCIDR on objects written by
// clients that only know the single-stack field.
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
		out = append(out, p.Masked())
	}
	return out, nil
}

// internalIP returns the node's first InternalIP of the family of like.
func internalIP(n *corev1.Node, like netip.Addr) (netip.Addr, bool) {
	for _, a := range n.Status.Addresses {
		if a.Type != corev1.NodeInternalIP {
			continue
		}
		ip, err := netip.ParseAddr(a.Address)
		if err == nil && ip.Unmap().Is4() == like.Is4() {
			return ip.Unmap(), true
		}
	}
	return netip.Addr{}, false
}

// Want is the routes the node needs to reach every other node's pods, and the peers' pod CIDRs
// that cannot get one (reported, never guessed at).
type Want struct {
	Routes   []routes.Route
	Unusable []routes.Failure
	Peers    []string // names of the other nodes that have a pod CIDR
}

// DesiredRoutes computes, for the node named self, one route per pod CIDR of every other node
// via that node's InternalIP of the same family. Nodes without a pod CIDR yet are not peers. A
// CIDR that overlaps the node's own, or one another node already claims, gets no route: two
// routes for one destination would send pods to the wrong node.
func DesiredRoutes(self string, nodes []*corev1.Node) Want {
	var w Want
	// Sorted by name, so which of two nodes claiming one CIDR wins does not depend on the
	// informer's order.
	nodes = slices.Clone(nodes)
	slices.SortFunc(nodes, func(a, b *corev1.Node) int { return strings.Compare(a.Name, b.Name) })
	var own []netip.Prefix
	for _, n := range nodes {
		if n.Name == self {
			own, _ = PodCIDRs(n)
		}
	}
	claimed := map[netip.Prefix]string{}
	for _, n := range nodes {
		if n.Name == self {
			continue
		}
		cidrs, err := PodCIDRs(n)
		if err != nil {
			w.Unusable = append(w.Unusable, routes.Failure{Route: routes.Route{Node: n.Name}, Err: err})
			w.Peers = append(w.Peers, n.Name)
			continue
		}
		if len(cidrs) == 0 {
			continue
		}
		w.Peers = append(w.Peers, n.Name)
		for _, c := range cidrs {
			r := routes.Route{Dst: c, Node: n.Name}
			if i := slices.IndexFunc(own, c.Overlaps); i >= 0 {
				w.Unusable = append(w.Unusable, routes.Failure{Route: r, Err: fmt.Errorf("overlaps this node's own pod CIDR %s", own[i])})
				continue
			}
			if other, ok := claimedBy(claimed, c); ok {
				w.Unusable = append(w.Unusable, routes.Failure{Route: r, Err: fmt.Errorf("overlaps the pod CIDR of node %s", other)})
				continue
			}
			gw, ok := internalIP(n, c.Addr())
			if !ok {
				w.Unusable = append(w.Unusable, routes.Failure{Route: r, Err: fmt.Errorf("node has no %s InternalIP in its status", family(c.Addr()))})
				continue
			}
			r.Gw = gw
			claimed[c] = n.Name
			w.Routes = append(w.Routes, r)
		}
	}
	return w
}

func claimedBy(claimed map[netip.Prefix]string, c netip.Prefix) (string, bool) {
	for p, node := range claimed {
		if p.Overlaps(c) {
			return node, true
		}
	}
	return "", false
}

func family(a netip.Addr) string {
	if a.Is4() {
		return "IPv4"
	}
	return "IPv6"
}
