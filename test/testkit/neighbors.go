package testkit

import (
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/kubenet-dev/kubenet/core"
	"github.com/kubenet-dev/kubenet/isolation"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

// NeighborMAC returns the link-layer address of ip in the neighbour table of ifname inside n,
// or nil when there is no entry with an address (none, or still unresolved).
func NeighborMAC(t testing.TB, n ns.NetNS, ifname string, ip netip.Addr) net.HardwareAddr {
	t.Helper()
	var mac net.HardwareAddr
	nettest.Do(t, n, func() error {
		l, err := netlink.LinkByName(ifname)
		if err != nil {
			return err
		}
		family := netlink.FAMILY_V4
		if ip.Is6() {
			family = netlink.FAMILY_V6
		}
		entries, err := netlink.NeighList(l.Attrs().Index, family)
		if err != nil {
			return err
		}
		for _, e := range entries {
			if a, _ := netip.AddrFromSlice(e.IP); a.Unmap() == ip.WithZone("") && len(e.HardwareAddr) > 0 {
				mac = e.HardwareAddr
			}
		}
		return nil
	})
	return mac
}

// RouteGateway returns the next hop n uses for dst (invalid when dst is on-link).
func RouteGateway(t testing.TB, n ns.NetNS, dst netip.Addr) netip.Addr {
	t.Helper()
	var gw netip.Addr
	nettest.Do(t, n, func() error {
		routes, err := netlink.RouteGet(dst.AsSlice())
		if err != nil {
			return err
		}
		if len(routes) > 0 {
			gw, _ = netip.AddrFromSlice(routes[0].Gw)
			gw = gw.Unmap()
		}
		return nil
	})
	return gw
}

// Routes lists the routes of one family inside n.
func Routes(t testing.TB, n ns.NetNS, ipv6 bool) []netlink.Route {
	t.Helper()
	family := netlink.FAMILY_V4
	if ipv6 {
		family = netlink.FAMILY_V6
	}
	var out []netlink.Route
	nettest.Do(t, n, func() error {
		var err error
		out, err = netlink.RouteListFiltered(family, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
		return err
	})
	return out
}

// FDBPorts returns the bridge ports on which the bridge inside n has learned mac.
func FDBPorts(t testing.TB, n ns.NetNS, mac net.HardwareAddr) []string {
	t.Helper()
	var out []string
	nettest.Do(t, n, func() error {
		entries, err := netlink.NeighList(0, unix.AF_BRIDGE)
		if err != nil {
			return err
		}
		for _, e := range entries {
			if e.HardwareAddr.String() != mac.String() {
				continue
			}
			l, err := netlink.LinkByIndex(e.LinkIndex)
			if err != nil {
				continue // the port went away
			}
			out = append(out, l.Attrs().Name)
		}
		return nil
	})
	return out
}

// IsolationElement is one permission of the bridge's isolation: an element of one of its sets,
// as the nft tool shows it (Set, Key "port[ . value]", Comment the owner), or on the iptables
// backend what the ebtables rules permit, in the same terms, with the pod chain it was read from
// (Chain; ebtables rules have no comment, so Comment is empty). IsolationMark says which of
// Comment and Chain ties an element to its attachment.
type IsolationElement struct{ Set, Key, Comment, Chain string }

func (e IsolationElement) String() string {
	if e.Chain != "" {
		return fmt.Sprintf("%s: %s [chain %s]", e.Set, e.Key, e.Chain)
	}
	return fmt.Sprintf("%s: %s [%s]", e.Set, e.Key, e.Comment)
}

// IsolationElements lists the isolation of the tests' network that the node's backend holds (see
// NodeBackend): the elements of the isolation sets with the nft tool, or the equivalent of the
// ebtables pod chains with ebtables-save (not with the code under test). Missing sets and chains
// are empty.
func IsolationElements(t testing.TB, node *nettest.Node) []IsolationElement {
	t.Helper()
	var out []IsolationElement
	b := NodeBackend(node)
	if reads(b, core.NetfilterIPTables) {
		out = ebtablesIsolation(t, node)
	}
	if !reads(b, core.NetfilterNFTables) {
		return out
	}
	if _, err := nettest.SettledRuleset(node.NS); err != nil {
		t.Fatal(err)
	}
	for _, set := range []string{isolation.SetPodPorts, isolation.SetAntiSpoofPorts, isolation.SetMAC, isolation.SetIPv4, isolation.SetIPv6, isolation.SetFastIPv4, isolation.SetFastIPv6} {
		for _, raw := range NFTElements(t, node, "bridge", "set", set) {
			var el struct {
				Elem *struct {
					Val     any    `json:"val"`
					Comment string `json:"comment"`
				} `json:"elem"`
			}
			var val any
			if json.Unmarshal(raw, &el) == nil && el.Elem != nil {
				val = el.Elem.Val
			} else if err := json.Unmarshal(raw, &val); err != nil {
				t.Fatalf("element of %s: %v", set, err)
			}
			e := IsolationElement{Set: set, Key: nftValue(val)}
			if el.Elem != nil {
				e.Comment = el.Elem.Comment
			}
			out = append(out, e)
		}
	}
	return out
}

// SortedIsolationElements is IsolationElements rendered and sorted, for comparing the sets'
// contents before and after something (a flush, a heal).
func SortedIsolationElements(t testing.TB, node *nettest.Node) []string {
	t.Helper()
	var out []string
	for _, e := range IsolationElements(t, node) {
		out = append(out, e.String())
	}
	slices.Sort(out)
	return out
}

// nftValue renders a value of nft's JSON output: a string, or a concatenation.
func nftValue(v any) string {
	if m, ok := v.(map[string]any); ok {
		if parts, ok := m["concat"].([]any); ok {
			return joinConcat(parts)
		}
	}
	return fmt.Sprint(v)
}
