package bridge

import (
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/kubenet-dev/kubenet/internal/ipnet"
	"github.com/kubenet-dev/kubenet/internal/nettest"
)

// TestPreflightOverlaps: in a namespace whose uplink has addresses of both families, a connected
// route without an address, networks reached through gateways and an unreachable route, and whose
// bridge already carries a gateway, Preflight refuses exactly the gateways whose subnet overlaps
// another link's address or connected route, names what it overlaps, and tells whether the bridge
// exists.
func TestPreflightOverlaps(t *testing.T) {
	node := nettest.NewNS(t)
	nettest.Do(t, node, func() error {
		up := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "up0"}, PeerName: "up0peer"}
		if err := netlink.LinkAdd(up); err != nil {
			return err
		}
		for _, name := range []string{"up0", "up0peer"} {
			l, err := netlink.LinkByName(name)
			if err == nil {
				err = netlink.LinkSetUp(l)
			}
			if err != nil {
				return err
			}
		}
		for _, a := range []string{"198.18.0.1/24", "2001:db8:e::1/64"} {
			if err := netlink.AddrAdd(up, &netlink.Addr{IPNet: ipnet.FromPrefix(netip.MustParsePrefix(a)), Flags: unix.IFA_F_NODAD}); err != nil {
				return err
			}
		}
		routes := []*netlink.Route{
			{LinkIndex: up.Index, Dst: mustNet("10.99.0.0/24"), Scope: netlink.SCOPE_LINK},
			{LinkIndex: up.Index, Dst: mustNet("10.98.0.0/16"), Gw: net.ParseIP("198.18.0.2")},
			{LinkIndex: up.Index, Dst: mustNet("2001:db8:77::/48"), Gw: net.ParseIP("2001:db8:e::2")},
			{Dst: mustNet("10.97.0.0/24"), Type: unix.RTN_UNREACHABLE},
			{LinkIndex: up.Index, Dst: mustNet("10.96.0.0/24"), Scope: netlink.SCOPE_LINK, Table: 100},
			{LinkIndex: up.Index, Dst: mustNet("10.95.0.0/24"), Scope: netlink.SCOPE_UNIVERSE},
			{LinkIndex: up.Index, Dst: mustNet("2001:db8:99::/64")},
		}
		for _, r := range routes {
			if err := netlink.RouteAdd(r); err != nil {
				return err
			}
		}
		_, err := Ensure(Config{Name: "cbrpf", Gateways: []netip.Prefix{netip.MustParsePrefix("10.244.1.1/24"), netip.MustParsePrefix("fd00:10:244:1::1/64")}})
		return err
	})
	cases := []struct {
		name    string
		bridge  string
		gateway string
		refused []string // what the refusal names; nil: accepted
		other   string   // a gateway of the other family that overlaps nothing, checked too
	}{
		{"the uplink's IPv4 subnet", "cbrnew", "198.18.0.1/25", []string{"198.18.0.0/25", "address 198.18.0.1/24", "up0"}, ""},
		{"around the uplink's IPv4 subnet", "cbrnew", "198.16.0.1/14", []string{"address 198.18.0.1/24"}, ""},
		{"the uplink's IPv6 subnet", "cbrnew", "2001:db8:e::1/64", []string{"address 2001:db8:e::1/64", "up0"}, ""},
		{"inside a connected route without an address", "cbrnew", "10.99.0.129/25", []string{"connected route 10.99.0.0/24", "up0"}, ""},
		{"inside a device route of scope global", "cbrnew", "10.95.0.1/26", []string{"connected route 10.95.0.0/24", "up0"}, ""},
		{"an IPv6 connected route without an address", "cbrnew", "2001:db8:99::1/64", []string{"connected route 2001:db8:99::/64", "up0"}, ""},
		{"a network reached through a gateway", "cbrnew", "10.98.1.1/24", nil, ""},
		{"an IPv6 network reached through a gateway", "cbrnew", "2001:db8:77:1::1/64", nil, ""},
		{"an unreachable route", "cbrnew", "10.97.0.1/24", nil, ""},
		{"a connected route of another table", "cbrnew", "10.96.0.1/24", nil, ""},
		{"the existing bridge's own gateways", "cbrpf", "10.244.1.1/24", nil, ""},
		{"the existing bridge's gateway on a new bridge", "cbrnew", "10.244.1.1/24", []string{"address 10.244.1.1/24", "cbrpf"}, ""},
		{"dual-stack, the IPv6 one overlaps", "cbrnew", "2001:db8:99::1/64", []string{"connected route 2001:db8:99::/64"}, "10.243.0.1/24"},
		{"dual-stack, the IPv4 one overlaps", "cbrnew", "10.99.0.1/24", []string{"connected route 10.99.0.0/24"}, "fd00:10:243::1/64"},
		{"dual-stack, nothing overlaps", "cbrnew", "10.243.0.1/24", nil, "fd00:10:243::1/64"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var exists bool
			var err error
			nettest.Do(t, node, func() error {
				gateways := []netip.Prefix{netip.MustParsePrefix(tc.gateway)}
				if tc.other != "" {
					gateways = append(gateways, netip.MustParsePrefix(tc.other))
				}
				exists, err = Preflight(Config{Name: tc.bridge, Gateways: gateways}, true)
				return nil
			})
			if want := tc.bridge == "cbrpf"; exists != want {
				t.Errorf("exists = %v, want %v", exists, want)
			}
			if tc.refused == nil {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			pe, ok := IsPreflight(err)
			if !ok {
				t.Fatalf("err = %v, want a refusal", err)
			}
			if pe.Key != "gateway" || pe.Value != tc.gateway {
				t.Errorf("refusal names %s %q, want gateway %q", pe.Key, pe.Value, tc.gateway)
			}
			for _, s := range tc.refused {
				if !strings.Contains(pe.Error(), s) {
					t.Errorf("refusal %q does not name %q", pe.Error(), s)
				}
			}
		})
	}
}

func mustNet(s string) *net.IPNet { return ipnet.FromPrefix(netip.MustParsePrefix(s)) }
