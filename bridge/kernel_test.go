package bridge

import (
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/kubenet-dev/kubenet/internal/ipnet"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

// TestEnsure: a new bridge is created as configured; an existing one that drifted (MTU, MAC,
// promiscuous mode, a stale global address, down) is brought back in place (same ifindex), its
// IPv6 link-local address kept, whether Ensure reads the bridge or starts from what Preflight
// read of it (Seen); a link of another type under the name is refused.
func TestEnsure(t *testing.T) {
	node := nettest.NewNS(t)
	cfg := Config{
		Name:     "cbrtest",
		MTU:      1400,
		Gateways: []netip.Prefix{netip.MustParsePrefix("10.244.1.1/24"), netip.MustParsePrefix("fd00:10:244:1::1/64")},
		Promisc:  true,
	}
	var index int
	nettest.Do(t, node, func() error {
		br, err := Ensure(cfg, Seen{})
		if err != nil {
			return err
		}
		index = br.Index
		_, err = CheckBridge(cfg)
		return err
	})

	stale := netip.MustParsePrefix("10.244.7.1/24")
	linkLocal := netip.MustParsePrefix("fe80::1234/64")
	// Ensure reads the bridge itself, or starts from what ADD's Preflight read of it.
	for _, fromPreflight := range []bool{false, true} {
		nettest.Do(t, node, func() error {
			l, err := netlink.LinkByName(cfg.Name)
			if err != nil {
				return err
			}
			mac, _ := net.ParseMAC("02:00:00:00:00:01")
			for _, f := range []func() error{
				func() error { return netlink.LinkSetMTU(l, 1500) },
				func() error { return netlink.LinkSetHardwareAddr(l, mac) },
				func() error { return netlink.SetPromiscOff(l) },
				func() error { return netlink.LinkSetDown(l) },
			} {
				if err := f(); err != nil {
					return err
				}
			}
			// Added while down: taking a link down flushes its IPv6 addresses.
			for _, p := range []netip.Prefix{stale, linkLocal} {
				if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: ipnet.FromPrefix(p)}); err != nil {
					return err
				}
			}
			return nil
		})
		nettest.Do(t, node, func() error {
			seen := Seen{}
			if fromPreflight {
				var err error
				if seen, err = Preflight(cfg, false); err != nil {
					return err
				}
			}
			br, err := Ensure(cfg, seen)
			if err != nil {
				return err
			}
			if br.Index != index {
				t.Errorf("bridge recreated: ifindex %d, was %d", br.Index, index)
			}
			if _, err := CheckBridge(cfg); err != nil {
				t.Errorf("after Ensure on a drifted bridge: %v", err)
			}
			l, err := netlink.LinkByIndex(index)
			if err != nil {
				return err
			}
			if l.Attrs().Flags&net.FlagUp == 0 {
				t.Error("bridge left down")
			}
			have, err := linkAddrs(index)
			if err != nil {
				return err
			}
			want := map[netip.Prefix]bool{cfg.Gateways[0]: true, cfg.Gateways[1]: true, linkLocal: true}
			for _, p := range have {
				if p == stale {
					t.Errorf("stale gateway %s stayed on the bridge", stale)
				}
				delete(want, p)
			}
			if len(want) > 0 {
				t.Errorf("bridge addresses %v lack %v", have, want)
			}
			return nil
		})
	}

	nettest.Do(t, node, func() error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "notbr"}, PeerName: "notbr-peer"}); err != nil {
			return err
		}
		_, err := Ensure(Config{Name: "notbr", Gateways: cfg.Gateways}, Seen{})
		if err == nil || !strings.Contains(err.Error(), "not a bridge") {
			t.Errorf("Ensure over a veth: %v, want a refusal naming the type", err)
		}
		return nil
	})
}

// TestDetectMTUKernel runs detection against a real network namespace: the default route's link
// wins over a smaller unrelated link, the bridge and its port are ignored even when smaller; with
// the default route gone the smallest up link counts, and a link taken down stops counting.
func TestDetectMTUKernel(t *testing.T) {
	node := nettest.NewNS(t)
	detect := func() int {
		var mtu int
		nettest.Do(t, node, func() error { mtu = DetectMTU("cbrmtu"); return nil })
		return mtu
	}
	nettest.Do(t, node, func() error {
		add := func(l netlink.Link, mtu int) error {
			l.Attrs().MTU = mtu
			if err := netlink.LinkAdd(l); err != nil {
				return err
			}
			return netlink.LinkSetUp(l)
		}
		// veth pairs (not dummies: not every test kernel has the module), the peers down so that
		// only the named ends count.
		veth := func(name string) *netlink.Veth {
			return &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "-peer"}
		}
		uplink, brPort := veth("uplink"), veth("brport")
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "cbrmtu"}}
		for _, l := range []struct {
			link netlink.Link
			mtu  int
		}{{uplink, 1400}, {veth("small"), 1300}, {br, 1000}, {brPort, 1000}} {
			if err := add(l.link, l.mtu); err != nil {
				return err
			}
		}
		if err := netlink.LinkSetMaster(brPort, br); err != nil {
			return err
		}
		if err := netlink.AddrAdd(uplink, &netlink.Addr{IPNet: ipnet.FromPrefix(netip.MustParsePrefix("192.0.2.1/24"))}); err != nil {
			return err
		}
		return netlink.RouteAdd(&netlink.Route{LinkIndex: uplink.Index, Gw: net.ParseIP("192.0.2.254")})
	})
	if got := detect(); got != 1400 {
		t.Errorf("with a default route via uplink (1400): %d", got)
	}
	nettest.Do(t, node, func() error {
		l, err := netlink.LinkByName("uplink")
		if err != nil {
			return err
		}
		return netlink.RouteDel(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: net.ParseIP("192.0.2.254")})
	})
	if got := detect(); got != 1300 {
		t.Errorf("without a default route, smallest up link is small (1300): %d", got)
	}
	nettest.Do(t, node, func() error {
		l, err := netlink.LinkByName("small")
		if err != nil {
			return err
		}
		return netlink.LinkSetDown(l)
	})
	if got := detect(); got != 1400 {
		t.Errorf("with small down, smallest up link is uplink (1400): %d", got)
	}
}
