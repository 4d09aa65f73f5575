package routes

import (
	"errors"
	"net/netip"
	"slices"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/kubenet-dev/kubenet/internal/ipnet"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

// TestTableAgainstKernel applies plans to a real routing table in a namespace: the agent's routes
// appear with its mark, change in place and go; other owners' routes never move; gateways that
// are not on-link are reported as such for both families.
func TestTableAgainstKernel(t *testing.T) {
	node, peer := nettest.NewNS(t), nettest.NewNS(t)
	nettest.Link(t,
		nettest.Endpoint{NS: node, IfName: "eth0", Addrs: []netip.Prefix{netip.MustParsePrefix("192.168.1.1/24"), netip.MustParsePrefix("fd00:1::1/64")}},
		nettest.Endpoint{NS: peer, IfName: "eth0", Addrs: []netip.Prefix{netip.MustParsePrefix("192.168.1.2/24"), netip.MustParsePrefix("fd00:1::2/64")}})
	// A default route through a router: a gateway beyond it is reachable, but not on-link.
	nettest.AddRoute(t, node, netip.MustParsePrefix("0.0.0.0/0"), netip.MustParseAddr("192.168.1.254"))
	foreign := netip.MustParsePrefix("10.99.0.0/24")
	nettest.Do(t, node, func() error {
		return netlink.RouteAdd(&netlink.Route{Dst: ipnet.FromPrefix(foreign), Gw: netip.MustParseAddr("192.168.1.250").AsSlice(), Protocol: unix.RTPROT_STATIC})
	})
	table := Table{Protocol: DefaultProtocol}
	r := func(dst, gw string) Route {
		return Route{Dst: netip.MustParsePrefix(dst), Gw: netip.MustParseAddr(gw), Node: "n"}
	}
	steps := []struct {
		name      string
		want      []Route
		before    func() error // runs after the listing, before Apply (a race with another owner)
		have      []string     // the agent's routes afterwards, "dst via gw"
		notOnLink []string     // destinations reported as not on-link
		failed    []string     // other failures, by destination
	}{
		{
			name: "add both families",
			want: []Route{r("10.244.2.0/24", "192.168.1.2"), r("fd00:10:244:2::/64", "fd00:1::2")},
			have: []string{"10.244.2.0/24 via 192.168.1.2", "fd00:10:244:2::/64 via fd00:1::2"},
		},
		{
			name: "change a gateway in place",
			want: []Route{r("10.244.2.0/24", "192.168.1.3"), r("fd00:10:244:2::/64", "fd00:1::3")},
			have: []string{"10.244.2.0/24 via 192.168.1.3", "fd00:10:244:2::/64 via fd00:1::3"},
		},
		{
			name:      "gateways that are not on-link: behind a router (IPv4) and without any route (IPv6)",
			want:      []Route{r("10.244.2.0/24", "192.168.1.3"), r("10.244.9.0/24", "10.50.0.2"), r("fd00:10:244:9::/64", "fd00:99::2")},
			have:      []string{"10.244.2.0/24 via 192.168.1.3"},
			notOnLink: []string{"10.244.9.0/24", "fd00:10:244:9::/64"},
		},
		{
			name: "another owner takes the destination between listing and adding: it keeps it",
			want: []Route{r("10.244.2.0/24", "192.168.1.3"), r("10.244.5.0/24", "192.168.1.5")},
			before: func() error {
				return netlink.RouteAdd(&netlink.Route{Dst: ipnet.FromPrefix(netip.MustParsePrefix("10.244.5.0/24")), Gw: netip.MustParseAddr("192.168.1.6").AsSlice(), Protocol: unix.RTPROT_STATIC})
			},
			have:   []string{"10.244.2.0/24 via 192.168.1.3"},
			failed: []string{"10.244.5.0/24"},
		},
		{
			name: "nothing wanted: only the agent's routes go",
			want: nil,
			have: nil,
		},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			var failures []Failure
			nettest.Do(t, node, func() error {
				current, err := table.List()
				if err != nil {
					return err
				}
				if s.before != nil {
					if err := s.before(); err != nil {
						return err
					}
				}
				failures = table.Apply(Diff(current, s.want, table.Protocol))
				return nil
			})
			var notOnLink, failed []string
			for _, f := range failures {
				if errors.Is(f.Err, ErrNotOnLink) {
					notOnLink = append(notOnLink, f.Route.Dst.String())
				} else {
					failed = append(failed, f.Route.Dst.String())
				}
			}
			if !slices.Equal(notOnLink, s.notOnLink) || !slices.Equal(failed, s.failed) {
				t.Fatalf("not on-link %v, other failures %v (%v); want %v and %v", notOnLink, failed, failures, s.notOnLink, s.failed)
			}
			if got := markedRoutes(t, node); !slices.Equal(got, s.have) {
				t.Fatalf("the agent's routes: %q, want %q", got, s.have)
			}
			for _, dst := range []string{foreign.String(), "0.0.0.0/0"} {
				if !hasForeign(t, node, dst) {
					t.Fatalf("route %s of another owner is gone", dst)
				}
			}
		})
	}
}

// tableIn lists the main table of n.
func tableIn(t *testing.T, n ns.NetNS) []Existing {
	t.Helper()
	var out []Existing
	nettest.Do(t, n, func() error {
		var err error
		out, err = Table{}.List()
		return err
	})
	return out
}

func markedRoutes(t *testing.T, n ns.NetNS) []string {
	t.Helper()
	var out []string
	for _, e := range tableIn(t, n) {
		if e.Protocol == DefaultProtocol {
			out = append(out, e.Dst.String()+" via "+e.Gw.String())
		}
	}
	slices.Sort(out)
	return out
}

func hasForeign(t *testing.T, n ns.NetNS, dst string) bool {
	t.Helper()
	return slices.ContainsFunc(tableIn(t, n), func(e Existing) bool { return e.Dst.String() == dst && e.Protocol != DefaultProtocol })
}

// TestSourceComesWhenTheAddressDoes: an onlink route whose source address the node does not have
// yet (the bridge with the pod gateway comes with the first pod or the healer) is made without the
// source, and the source is put in once the address exists.
func TestSourceComesWhenTheAddressDoes(t *testing.T) {
	node, peer := nettest.NewNS(t), nettest.NewNS(t)
	nettest.Link(t,
		nettest.Endpoint{NS: node, IfName: "eth0", Addrs: []netip.Prefix{netip.MustParsePrefix("192.168.1.1/24")}},
		nettest.Endpoint{NS: peer, IfName: "eth0", Addrs: []netip.Prefix{netip.MustParsePrefix("192.168.1.2/24")}})
	tbl := Table{Protocol: DefaultProtocol}
	var dev int
	nettest.Do(t, node, func() error {
		l, err := netlink.LinkByName("eth0")
		dev = l.Attrs().Index
		return err
	})
	w := Route{Dst: netip.MustParsePrefix("10.244.3.0/24"), Gw: netip.MustParseAddr("10.244.3.0"), Dev: dev, Src: netip.MustParseAddr("10.244.1.1"), Node: "n3"}
	srcOf := func() netip.Addr {
		var src netip.Addr
		nettest.Do(t, node, func() error {
			cur, err := tbl.List()
			for _, e := range cur {
				if e.Dst == w.Dst && e.Protocol == DefaultProtocol {
					src = e.Src
				}
			}
			return err
		})
		return src
	}
	nettest.Do(t, node, func() error {
		if f := tbl.Apply(Plan{Add: []Route{w}}); len(f) != 0 {
			t.Errorf("route with a source the node lacks: %v, want it made without", f)
		}
		return nil
	})
	if src := srcOf(); src.IsValid() {
		t.Fatalf("route made with source %s the node does not have", src)
	}
	nettest.Run(t, node, "ip", "addr", "add", "10.244.1.1/32", "dev", "eth0")
	nettest.Do(t, node, func() error {
		cur, err := tbl.List()
		if err != nil {
			return err
		}
		p := Diff(cur, []Route{w}, DefaultProtocol)
		if len(p.Replace) != 1 {
			t.Errorf("a route without its source is not replaced: %+v", p)
		}
		if f := tbl.Apply(p); len(f) != 0 {
			t.Errorf("replace: %v", f)
		}
		return nil
	})
	if src := srcOf(); src != w.Src {
		t.Fatalf("route source %s once the address exists, want %s", src, w.Src)
	}
}
