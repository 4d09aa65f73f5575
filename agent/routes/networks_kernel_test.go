package routes

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/kubenet-dev/kubenet/internal/ipnet"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

// TestNodeNetworks reads a namespace's own networks from the kernel (Table.Read): every address's network
// and every connected route, on every link but the excluded bridge; routes via a gateway are
// not the node's networks.
func TestNodeNetworks(t *testing.T) {
	node, peer := nettest.NewNS(t), nettest.NewNS(t)
	nettest.Link(t,
		nettest.Endpoint{NS: node, IfName: "eth0", Addrs: []netip.Prefix{netip.MustParsePrefix("192.168.1.1/24"), netip.MustParsePrefix("fd00:1::1/64")}},
		nettest.Endpoint{NS: peer, IfName: "eth0", Addrs: []netip.Prefix{netip.MustParsePrefix("192.168.1.2/24")}})
	nettest.AddRoute(t, node, netip.MustParsePrefix("0.0.0.0/0"), netip.MustParseAddr("192.168.1.254"))
	nettest.AddRoute(t, node, netip.MustParsePrefix("10.244.2.0/24"), netip.MustParseAddr("192.168.1.2"))
	nettest.Do(t, node, func() error {
		eth0, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		// A network reached directly through eth0 without an address in it.
		if err := netlink.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Dst: ipnet.FromPrefix(netip.MustParsePrefix("10.50.0.0/16")), Scope: netlink.SCOPE_LINK}); err != nil {
			return err
		}
		// IPv6 has no scope link routes: a connected one is a route without a gateway.
		if err := netlink.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Dst: ipnet.FromPrefix(netip.MustParsePrefix("fd00:50::/64"))}); err != nil {
			return err
		}
		// A blackhole route is no network the node reaches.
		if err := netlink.RouteAdd(&netlink.Route{Dst: ipnet.FromPrefix(netip.MustParsePrefix("10.60.0.0/16")), Type: unix.RTN_BLACKHOLE}); err != nil {
			return err
		}
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "cbr0"}}
		if err := netlink.LinkAdd(br); err != nil {
			return err
		}
		if err := netlink.AddrAdd(br, &netlink.Addr{IPNet: ipnet.FromPrefix(netip.MustParsePrefix("10.244.1.1/24"))}); err != nil {
			return err
		}
		return netlink.LinkSetUp(br)
	})
	var snap Snapshot
	nettest.Do(t, node, func() error {
		var err error
		snap, err = Table{}.Read("cbr0")
		return err
	})
	got := snap.Networks
	if !slices.ContainsFunc(snap.Routes, func(e Existing) bool {
		return e.Dst == netip.MustParsePrefix("10.244.2.0/24") && e.Gw == netip.MustParseAddr("192.168.1.2")
	}) {
		t.Errorf("the snapshot's routes lack 10.244.2.0/24 via 192.168.1.2: %+v", snap.Routes)
	}
	var sources []string
	for _, n := range got {
		sources = append(sources, n.Prefix.String()+" "+n.Source)
		if n.Prefix.Addr().Is4() && n.Prefix.Overlaps(netip.MustParsePrefix("10.244.0.0/16")) {
			t.Errorf("%s: the bridge's and the peers' pod CIDRs are no node networks", n.Source)
		}
	}
	for _, want := range []string{
		"192.168.1.0/24 address 192.168.1.1/24 on eth0",
		"fd00:1::/64 address fd00:1::1/64 on eth0",
		"127.0.0.0/8 address 127.0.0.1/8 on lo",
		"192.168.1.0/24 route 192.168.1.0/24 dev eth0",
		"10.50.0.0/16 route 10.50.0.0/16 dev eth0",
		"fd00:50::/64 route fd00:50::/64 dev eth0",
	} {
		if !slices.Contains(sources, want) {
			t.Errorf("node networks %q lack %q", sources, want)
		}
	}
	if i := slices.IndexFunc(got, func(n Network) bool { return n.Source == "address 192.168.1.1/24 on eth0" }); i < 0 || got[i].Addr != netip.MustParseAddr("192.168.1.1") {
		t.Errorf("the address entry does not carry the node's address: %+v", got)
	}
	if slices.ContainsFunc(got, func(n Network) bool {
		return n.Prefix.Bits() == 0 || n.Prefix == netip.MustParsePrefix("10.60.0.0/16")
	}) {
		t.Errorf("the default route or the blackhole counted as a node network: %q", sources)
	}
}
