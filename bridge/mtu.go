package bridge

import (
	"net"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"

	"github.com/kubenet-dev/kubenet/internal/links"
)

// FallbackMTU is used when no link tells us better, as old kubenet did.
const FallbackMTU = 1460

// DetectMTU picks the pod MTU for a node: the smallest MTU of the links that carry the node's
// default routes, since that is the path pod traffic leaves by. Old kubenet took the smallest MTU
// of every up link, so an unrelated small link (docker0, a VPN) shrank every pod's MTU; that rule
// is kept only as the fallback when the node has no default route. The bridge itself and its
// ports are ignored: their MTU is ours to set, not a fact about the network.
//
// Only the default routes' links are looked up: listing every link would cost one entry per
// host veth and ifb, on every ADD of a node that leaves mtu at 0.
func DetectMTU(bridgeName string) int {
	bridgeIndex := -1
	if br, err := links.Find(bridgeName); err == nil && br != nil {
		bridgeIndex = br.Attrs().Index
	}
	ignored := func(l netlink.Link) bool {
		a := l.Attrs()
		return a.Index == bridgeIndex || (bridgeIndex > 0 && a.MasterIndex == bridgeIndex) ||
			a.Flags&net.FlagLoopback != 0 || a.Flags&net.FlagPointToPoint != 0 || a.Flags&net.FlagUp == 0
	}
	best := 0
	consider := func(l netlink.Link) {
		if mtu := l.Attrs().MTU; !ignored(l) && mtu >= 576 && mtu < 999999 && (best == 0 || mtu < best) {
			best = mtu
		}
	}
	seen := map[int]bool{}
	for _, family := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		routes, err := netlinksafe.RouteList(nil, family)
		if err != nil {
			continue
		}
		for _, r := range routes {
			if !isDefault(r) || r.LinkIndex == 0 || seen[r.LinkIndex] {
				continue
			}
			seen[r.LinkIndex] = true
			if l, err := netlink.LinkByIndex(r.LinkIndex); err == nil {
				consider(l)
			}
		}
	}
	if best > 0 {
		return best
	}
	all, err := netlinksafe.LinkList()
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
