package agent

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/kubenet-dev/kubenet/agent/routes"
)

// internalIP returns the node's first InternalIP of the family of like.
func internalIP(n *corev1.Node, like netip.Addr) (netip.Addr, bool) {
	for _, a := range n.Status.Addresses {
		if a.Type != corev1.NodeInternalIP {
			continue
		}
		ip, err := netip.ParseAddr(a.Address)
		if err == nil && ip.Zone() == "" && ip.Unmap().Is4() == like.Is4() {
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
// via that node's InternalIP of the same family, under rules. Nodes without a pod CIDR yet are
// not peers. A CIDR the rules refuse, one that overlaps the node's own, every CIDR two nodes
// claim, and every CIDR of a Node with an InternalIP inside a pod or service CIDR
// (claims.addressError), gets no route but a report: a wrong route sends pods' traffic to the wrong node.
func DesiredRoutes(self string, nodes []*corev1.Node, rules CIDRRules) Want {
	return newClaims(nodes, rules).routes(self, nodes)
}

// OwnPodCIDRs returns the pod CIDRs of the node named self the conflist may be written for
// (none before the node has one), or why they are refused.
func OwnPodCIDRs(self string, nodes []*corev1.Node, rules CIDRRules) ([]netip.Prefix, error) {
	return newClaims(nodes, rules).own(self)
}

func (c *claims) routes(self string, nodes []*corev1.Node) Want {
	var w Want
	// Sorted by name, so that reports come in a stable order.
	nodes = slices.SortedFunc(slices.Values(nodes), func(a, b *corev1.Node) int { return strings.Compare(a.Name, b.Name) })
	own := c.byNode[self]
	for _, n := range nodes {
		if n.Name == self {
			continue
		}
		if err := c.parseErr[n.Name]; err != nil {
			w.Unusable = append(w.Unusable, routes.Failure{Route: routes.Route{Node: n.Name}, Err: err})
			w.Peers = append(w.Peers, n.Name)
			continue
		}
		cidrs := c.byNode[n.Name]
		if len(cidrs) == 0 {
			continue
		}
		w.Peers = append(w.Peers, n.Name)
		if err := c.addressError(n); err != nil {
			for _, p := range cidrs {
				w.Unusable = append(w.Unusable, routes.Failure{Route: routes.Route{Dst: p, Node: n.Name}, Err: err})
			}
			continue
		}
		for _, p := range cidrs {
			r := routes.Route{Dst: p, Node: n.Name}
			cl := claim{n.Name, p}
			if err := c.ruleError(cl); err != nil {
				w.Unusable = append(w.Unusable, routes.Failure{Route: r, Err: err})
				continue
			}
			if i := slices.IndexFunc(own, p.Overlaps); i >= 0 {
				w.Unusable = append(w.Unusable, routes.Failure{Route: r, Err: fmt.Errorf("overlaps this node's own pod CIDR %s", own[i])})
				continue
			}
			if err := c.sharedError(cl); err != nil {
				w.Unusable = append(w.Unusable, routes.Failure{Route: r, Err: err})
				continue
			}
			gw, ok := internalIP(n, p.Addr())
			if !ok {
				w.Unusable = append(w.Unusable, routes.Failure{Route: r, Err: fmt.Errorf("node has no %s InternalIP in its status", family(p.Addr()))})
				continue
			}
			if err := c.rules.gatewayError(gw); err != nil {
				w.Unusable = append(w.Unusable, routes.Failure{Route: r, Err: err})
				continue
			}
			r.Gw = gw
			w.Routes = append(w.Routes, r)
		}
	}
	return w
}

func family(a netip.Addr) string {
	if a.Is4() {
		return "IPv4"
	}
	return "IPv6"
}
