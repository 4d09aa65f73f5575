package bridge

import (
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/kubenet-dev/kubenet/internal/ipnet"
	"github.com/kubenet-dev/kubenet/test/nettest"
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
		_, err := Ensure(Config{Name: "cbrpf", Gateways: []netip.Prefix{netip.MustParsePrefix("10.244.1.1/24"), netip.MustParsePrefix("fd00:10:244:1::1/64")}}, Seen{})
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
				var seen Seen
				seen, err = Preflight(Config{Name: tc.bridge, Gateways: gateways}, true)
				exists = seen.Exists()
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

// TestPreflightBridgeName: Preflight's lookup of the bridge by name tells whether it exists,
// refuses a link of the name that is not a bridge (naming its kind) and a bridge that another
// network claims while a pod is on it, and lets a claimed bridge without ports change hands.
func TestPreflightBridgeName(t *testing.T) {
	node := nettest.NewNS(t)
	owned := netip.MustParsePrefix("10.244.2.1/24")
	free := netip.MustParsePrefix("10.244.3.1/24")
	nettest.Do(t, node, func() error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "veth0"}, PeerName: "veth0peer"}); err != nil {
			return err
		}
		for _, cfg := range []Config{{Name: "cbrowned", Owner: "neta", Gateways: []netip.Prefix{owned}}, {Name: "cbrfree", Owner: "neta", Gateways: []netip.Prefix{free}}} {
			if _, err := Ensure(cfg, Seen{}); err != nil {
				return err
			}
		}
		br, err := netlink.LinkByName("cbrowned")
		if err != nil {
			return err
		}
		return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "port0", MasterIndex: br.Attrs().Index}, PeerName: "port0peer"})
	})
	cases := []struct {
		name, bridge, owner string
		gateway             netip.Prefix
		exists              bool
		refused             string // what the refusal says; "": accepted
	}{
		{"no link of the name", "cbrnone", "netb", netip.MustParsePrefix("10.244.9.1/24"), false, ""},
		{"a veth of the name", "veth0", "netb", netip.MustParsePrefix("10.244.9.1/24"), false, "is an existing veth link of the node, not a bridge"},
		{"a link without a kind", "lo", "netb", netip.MustParsePrefix("10.244.9.1/24"), false, "is an existing device link of the node, not a bridge"},
		{"the network's own bridge", "cbrowned", "neta", owned, true, ""},
		{"another network's bridge with a pod on it", "cbrowned", "netb", owned, true, `is used by kubenet network "neta" (1 pods on it)`},
		{"another network's bridge without ports", "cbrfree", "netb", free, true, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var exists bool
			var err error
			nettest.Do(t, node, func() error {
				var seen Seen
				seen, err = Preflight(Config{Name: tc.bridge, Owner: tc.owner, Gateways: []netip.Prefix{tc.gateway}}, true)
				exists = seen.Exists()
				return nil
			})
			if exists != tc.exists {
				t.Errorf("exists = %v, want %v", exists, tc.exists)
			}
			if tc.refused == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			pe, ok := IsPreflight(err)
			if !ok || pe.Key != "bridge" || pe.Value != tc.bridge || !strings.Contains(pe.Reason, tc.refused) {
				t.Errorf("err = %v, want a refusal of bridge %q that says %q", err, tc.bridge, tc.refused)
			}
		})
	}
}

func mustNet(s string) *net.IPNet { return ipnet.FromPrefix(netip.MustParsePrefix(s)) }
