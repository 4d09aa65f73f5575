package bridge

import (
	"net"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"

	"github.com/kubenet-dev/kubenet/internal/links"
)

// FallbackMTU is used when no link tells us better, as old kubenet did.
const FallbackMTU = 1460

// The MTUs a link may report and still be believed: below IPv4's minimum datagram size a link is
// misconfigured, and old kubenet treated 999999 and more as "unset".
const (
	minPlausibleMTU = 576
	maxPlausibleMTU = 999999
)

// DetectMTU picks the pod MTU for a node: the smallest MTU of the links that carry the node's
// default routes, since that is the path pod traffic leaves by. Old kubenet took the smallest MTU
// of every up link, so an unrelated small link (docker0, a VPN) shrank every pod's MTU; that rule
// is kept only as the fallback when the node has no default route. The bridge itself and its
// ports are ignored: their MTU is ours to set, not a fact about the network.
//
// Only the default routes' links are looked up: listing every link would cost one entry per
// host veth and ifb, on every ADD of a node that leaves mtu at 0.
func DetectMTU(bridgeName string) int { return detectMTU(kernelLinks{}, bridgeName) }

// nodeLinks is what MTU detection reads of the node. kernelLinks reads the calling thread's
// network namespace over netlink; tests pass a table of links and routes.
type nodeLinks interface {
	// Find returns the link called name, or nil when there is none.
	Find(name string) (netlink.Link, error)
	Routes(family int) ([]netlink.Route, error)
	ByIndex(index int) (netlink.Link, error)
	All() ([]netlink.Link, error)
}

type kernelLinks struct{}

func (kernelLinks) Find(name string) (netlink.Link, error) { return links.Find(name) }
func (kernelLinks) Routes(family int) ([]netlink.Route, error) {
	return netlinksafe.RouteList(nil, family)
}
func (kernelLinks) ByIndex(index int) (netlink.Link, error) { return netlink.LinkByIndex(index) }
func (kernelLinks) All() ([]netlink.Link, error)            { return netlinksafe.LinkList() }

func detectMTU(node nodeLinks, bridgeName string) int {
	bridgeIndex := -1
	if br, err := node.Find(bridgeName); err == nil && br != nil {
		bridgeIndex = br.Attrs().Index
	}
	ignored := func(l netlink.Link) bool {
		a := l.Attrs()
		return a.Index == bridgeIndex || (bridgeIndex > 0 && a.MasterIndex == bridgeIndex) ||
			a.Flags&net.FlagLoopback != 0 || a.Flags&net.FlagPointToPoint != 0 || a.Flags&net.FlagUp == 0
	}
	best := 0
	consider := func(l netlink.Link) {
		if mtu := l.Attrs().MTU; !ignored(l) && mtu >= minPlausibleMTU && mtu < maxPlausibleMTU && (best == 0 || mtu < best) {
			best = mtu
		}
	}
	seen := map[int]bool{}
	for _, family := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		routes, err := node.Routes(family)
		if err != nil {
			continue
		}
		for _, r := range routes {
			if !isDefault(r) {
				continue
			}
			for _, index := range routeLinks(r) {
				if seen[index] {
					continue
				}
				seen[index] = true
				if l, err := node.ByIndex(index); err == nil {
					consider(l)
				}
			}
		}
	}
	if best > 0 {
		return best
	}
	all, err := node.All()
	if err != nil {
		return FallbackMTU
	}
	for _, l := range all {
		consider(l)
	}
	if best > 0 {
		return best
	}
	return FallbackMTU
}

func isDefault(r netlink.Route) bool {
	if r.Dst == nil {
		return true
	}
	ones, _ := r.Dst.Mask.Size()
	return ones == 0
}

// routeLinks are the links a route leaves by: its own, or each next hop's of a multipath (ECMP)
// route, which has none of its own.
func routeLinks(r netlink.Route) []int {
	var out []int
	if r.LinkIndex > 0 {
		out = append(out, r.LinkIndex)
	}
	for _, nh := range r.MultiPath {
		if nh != nil && nh.LinkIndex > 0 {
			out = append(out, nh.LinkIndex)
		}
	}
	return out
}
