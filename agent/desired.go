package agent

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/kubenet-dev/kubenet/agent/routes"
	"github.com/kubenet-dev/kubenet/core"
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
	// Paths says how each route reaches its peer, and why (by Route.Dst).
	Paths map[netip.Prefix]Path
	// Overlay are the peers reached through the overlay, with the CIDRs routed to each; their
	// routes (Path.Via == ViaVXLAN) get the overlay device once it exists.
	Overlay []core.OverlayPeer
}

// Routing is how the agent reaches other nodes' pods (--routing).
type Routing string

// The routing modes.
const (
	// RoutingAuto is direct where the peer's InternalIP is on one of this node's networks,
	// the overlay everywhere else.
	RoutingAuto Routing = "auto"
	// RoutingDirect routes every pod CIDR via its node's InternalIP: every node must be on-link.
	RoutingDirect Routing = "direct"
	// RoutingVXLAN carries every peer's pod traffic through the overlay.
	RoutingVXLAN Routing = "vxlan"
)

// ParseRouting reads a --routing value.
func ParseRouting(s string) (Routing, error) {
	switch r := Routing(s); r {
	case RoutingAuto, RoutingDirect, RoutingVXLAN:
		return r, nil
	}
	return "", fmt.Errorf("routing %q: must be auto, direct or vxlan", s)
}

// How a route reaches its peer (Path.Via).
const (
	ViaDirect = "direct"
	ViaVXLAN  = "vxlan"
)

// Path is how this node reaches one pod CIDR of a peer, and why.
type Path struct {
	Node     string       `json:"node"`
	PodCIDR  netip.Prefix `json:"podCIDR"`
	Via      string       `json:"via"`               // ViaDirect or ViaVXLAN; "" when there is none
	NextHop  netip.Addr   `json:"nextHop,omitzero"`  // the route's gateway
	Underlay netip.Addr   `json:"underlay,omitzero"` // the peer's InternalIP the overlay sends to
	Reason   string       `json:"reason"`            // why this path
	Error    string       `json:"error,omitempty"`   // why it is not programmed
}

// pathRules decide, per peer pod CIDR, the path to it.
type pathRules struct {
	mode Routing
	// underlay is this node's address on the underlay (its first InternalIP): the overlay's
	// local end; every peer is sent to at its InternalIP of this family. Invalid: none.
	underlay netip.Addr
}

// DesiredRoutes computes, for the node named self, one route per pod CIDR of every other node
// via that node's InternalIP of the same family, under rules, as --routing=direct does. Nodes
// without a pod CIDR yet are not peers. A CIDR the rules refuse, one that overlaps the node's own,
// every CIDR two nodes claim, and every CIDR of a Node with an InternalIP inside a pod or service
// CIDR (claims.addressError), gets no route but a report: a wrong route sends pods' traffic to the
// wrong node.
func DesiredRoutes(self string, nodes []*corev1.Node, rules CIDRRules) Want {
	return newClaims(nodes, rules).routes(self, nodes, pathRules{mode: RoutingDirect})
}

// OwnPodCIDRs returns the pod CIDRs of the node named self the conflist may be written for
// (none before the node has one), or why they are refused.
func OwnPodCIDRs(self string, nodes []*corev1.Node, rules CIDRRules) ([]netip.Prefix, error) {
	return newClaims(nodes, rules).own(self)
}

// underlayOf is the node's overlay address: its first InternalIP.
func underlayOf(n *corev1.Node) netip.Addr {
	if n == nil {
		return netip.Addr{}
	}
	for _, a := range n.Status.Addresses {
		if a.Type != corev1.NodeInternalIP {
			continue
		}
		if ip, err := netip.ParseAddr(a.Address); err == nil && ip.Zone() == "" {
			return ip.Unmap()
		}
	}
	return netip.Addr{}
}

func (c *claims) routes(self string, nodes []*corev1.Node, pr pathRules) Want {
	w := Want{Paths: map[netip.Prefix]Path{}}
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
		var overlayCIDRs []netip.Prefix
		var underlay netip.Addr
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
			path, err := c.path(n, p, pr)
			if err != nil {
				w.Unusable = append(w.Unusable, routes.Failure{Route: r, Err: err})
				continue
			}
			r.Gw = path.NextHop
			w.Routes = append(w.Routes, r)
			w.Paths[p] = path
			if path.Via == ViaVXLAN {
				overlayCIDRs = append(overlayCIDRs, p)
				underlay = path.Underlay
			}
		}
		if len(overlayCIDRs) > 0 {
			w.Overlay = append(w.Overlay, core.OverlayPeer{Node: n.Name, Underlay: underlay, PodCIDRs: overlayCIDRs})
		}
	}
	return w
}

// path chooses how pod CIDR p of node n is reached, or says why it cannot be.
func (c *claims) path(n *corev1.Node, p netip.Prefix, pr pathRules) (Path, error) {
	gw, hasGw := internalIP(n, p.Addr())
	var gwErr error
	if !hasGw {
		gwErr = fmt.Errorf("node has no %s InternalIP in its status", family(p.Addr()))
	} else {
		gwErr = c.rules.gatewayError(gw)
	}
	switch pr.mode {
	case RoutingDirect:
		if gwErr != nil {
			return Path{}, gwErr
		}
		return Path{Node: n.Name, PodCIDR: p, Via: ViaDirect, NextHop: gw, Reason: "--routing=direct"}, nil
	case RoutingAuto:
		if gwErr == nil {
			if net, ok := c.rules.onLink(gw); ok {
				return Path{Node: n.Name, PodCIDR: p, Via: ViaDirect, NextHop: gw,
					Reason: fmt.Sprintf("its InternalIP %s is on this node's network %s (%s)", gw, net.Prefix, net.Source)}, nil
			}
		}
	}
	reason := "--routing=vxlan"
	if pr.mode == RoutingAuto {
		if hasGw && gwErr == nil {
			reason = fmt.Sprintf("its InternalIP %s is on none of this node's networks", gw)
		} else {
			reason = fmt.Sprintf("no direct path: %v", gwErr)
		}
	}
	if !pr.underlay.IsValid() {
		return Path{}, fmt.Errorf("%s, and this node has no InternalIP to carry the overlay", reason)
	}
	under, ok := internalIP(n, pr.underlay)
	if !ok {
		return Path{}, fmt.Errorf("%s, and the node has no %s InternalIP to reach it through the overlay (this node's underlay is %s)",
			reason, family(pr.underlay), family(pr.underlay))
	}
	if err := c.rules.gatewayError(under); err != nil {
		return Path{}, err
	}
	if vtep := underlayOf(n); vtep != under {
		// The peer's device has its first InternalIP as local address and MAC: sent
		// anywhere else, every frame is dropped at the peer.
		return Path{}, fmt.Errorf("%s, and the node's VTEP is its first InternalIP %s, not of this node's underlay family (%s)",
			reason, vtep, family(pr.underlay))
	}
	return Path{Node: n.Name, PodCIDR: p, Via: ViaVXLAN, NextHop: core.OverlayNextHop(p), Underlay: under, Reason: reason}, nil
}

func family(a netip.Addr) string {
	if a.Is4() {
		return "IPv4"
	}
	return "IPv6"
}
