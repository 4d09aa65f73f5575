package bridge

import (
	"errors"
	"net"
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/kubenet-dev/kubenet/internal/ipnet"
)

// fakeNode is a node's links and routes as MTU detection reads them.
type fakeNode struct {
	links     []netlink.Link
	routes    map[int][]netlink.Route // by family
	findErr   error
	routesErr map[int]error
	byIndex   map[int]error // lookups that fail
	allErr    error
	lookups   map[int]int // ByIndex calls per index
}

func (f *fakeNode) Find(name string) (netlink.Link, error) {
	if f.findErr != nil {
		return nil, f.findErr
	}
	for _, l := range f.links {
		if l.Attrs().Name == name {
			return l, nil
		}
	}
	return nil, nil
}

func (f *fakeNode) Routes(family int) ([]netlink.Route, error) {
	return f.routes[family], f.routesErr[family]
}

func (f *fakeNode) ByIndex(index int) (netlink.Link, error) {
	if f.lookups == nil {
		f.lookups = map[int]int{}
	}
	f.lookups[index]++
	if err := f.byIndex[index]; err != nil {
		return nil, err
	}
	for _, l := range f.links {
		if l.Attrs().Index == index {
			return l, nil
		}
	}
	return nil, netlink.LinkNotFoundError{}
}

func (f *fakeNode) All() ([]netlink.Link, error) { return f.links, f.allErr }

const up = net.FlagUp

func dummy(index int, name string, mtu int, flags net.Flags) netlink.Link {
	return &netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Index: index, Name: name, MTU: mtu, Flags: flags}}
}

func port(index int, name string, mtu, master int) netlink.Link {
	return &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Index: index, Name: name, MTU: mtu, Flags: up, MasterIndex: master}}
}

func bridgeLink(index, mtu int) netlink.Link {
	return &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Index: index, Name: "cbr0", MTU: mtu, Flags: up}}
}

func defaultVia(index int) netlink.Route { return netlink.Route{LinkIndex: index} }

func routeTo(cidr string, index int) netlink.Route {
	return netlink.Route{Dst: ipnet.FromPrefix(netip.MustParsePrefix(cidr)), LinkIndex: index}
}

func v4(rs ...netlink.Route) map[int][]netlink.Route {
	return map[int][]netlink.Route{netlink.FAMILY_V4: rs}
}

// TestDetectMTU covers every branch of MTU detection against a table of links and routes.
func TestDetectMTU(t *testing.T) {
	boom := errors.New("netlink: boom")
	cases := []struct {
		name        string
		node        fakeNode
		want        int
		wantLookups map[int]int // nil: not checked
	}{
		{
			name: "smallest default-route link wins, across families; a small unrelated link does not count",
			node: fakeNode{
				links: []netlink.Link{dummy(2, "eth0", 1500, up), dummy(3, "eth1", 1450, up), dummy(4, "wg0", 1280, up)},
				routes: map[int][]netlink.Route{
					netlink.FAMILY_V4: {defaultVia(2)},
					netlink.FAMILY_V6: {defaultVia(3)},
				},
			},
			want: 1450,
		},
		{
			name: "a route that is not a default route is ignored",
			node: fakeNode{
				links:  []netlink.Link{dummy(2, "eth0", 1500, up), dummy(3, "tun", 1300, up)},
				routes: v4(routeTo("10.0.0.0/8", 3), defaultVia(2)),
			},
			want: 1500,
		},
		{
			name: "an explicit 0.0.0.0/0 destination is a default route",
			node: fakeNode{
				links:  []netlink.Link{dummy(2, "eth0", 1500, up), dummy(3, "eth1", 9000, up)},
				routes: v4(routeTo("0.0.0.0/0", 3)),
			},
			want: 9000,
		},
		{
			name: "a multipath default route counts every next hop's link",
			node: fakeNode{
				links:  []netlink.Link{dummy(2, "eth0", 1500, up), dummy(3, "eth1", 1400, up)},
				routes: v4(netlink.Route{MultiPath: []*netlink.NexthopInfo{{LinkIndex: 2}, nil, {LinkIndex: 3}}}),
			},
			want: 1400,
		},
		{
			name: "a default route without a link (blackhole) falls back to every up link",
			node: fakeNode{
				links:  []netlink.Link{dummy(2, "eth0", 1500, up), dummy(3, "eth1", 1400, up)},
				routes: v4(defaultVia(0)),
			},
			want: 1400,
		},
		{
			name: "a link carrying several default routes is looked up once",
			node: fakeNode{
				links: []netlink.Link{dummy(2, "eth0", 1500, up)},
				routes: map[int][]netlink.Route{
					netlink.FAMILY_V4: {defaultVia(2), defaultVia(2)},
					netlink.FAMILY_V6: {defaultVia(2)},
				},
			},
			want:        1500,
			wantLookups: map[int]int{2: 1},
		},
		{
			name: "a failed link lookup skips that route",
			node: fakeNode{
				links:   []netlink.Link{dummy(2, "eth0", 1500, up), dummy(3, "eth1", 1400, up)},
				routes:  v4(defaultVia(3), defaultVia(2)),
				byIndex: map[int]error{3: boom},
			},
			want: 1500,
		},
		{
			name: "a family whose routes cannot be listed is skipped, the other still counts",
			node: fakeNode{
				links: []netlink.Link{dummy(2, "eth0", 1500, up), dummy(3, "eth1", 1400, up)},
				routes: map[int][]netlink.Route{
					netlink.FAMILY_V4: {defaultVia(3)},
					netlink.FAMILY_V6: {defaultVia(2)},
				},
				routesErr: map[int]error{netlink.FAMILY_V4: boom},
			},
			want: 1500,
		},
		{
			name: "the bridge's own default route does not count, nor does the bridge in the fallback",
			node: fakeNode{
				links:  []netlink.Link{bridgeLink(5, 1000), dummy(2, "eth0", 1500, up)},
				routes: v4(defaultVia(5)),
			},
			want: 1500,
		},
		{
			name: "the bridge's ports do not count",
			node: fakeNode{
				links:  []netlink.Link{bridgeLink(5, 1500), port(6, "veth1", 1000, 5), dummy(2, "eth0", 1500, up)},
				routes: v4(defaultVia(6)),
			},
			want: 1500,
		},
		{
			name: "without the bridge (lookup failed), a port of some other bridge counts",
			node: fakeNode{
				links:   []netlink.Link{port(6, "veth1", 1400, 9), dummy(2, "eth0", 1500, up)},
				routes:  v4(defaultVia(6), defaultVia(2)),
				findErr: boom,
			},
			want: 1400,
		},
		{
			name: "loopback, point-to-point and down links do not count",
			node: fakeNode{
				links: []netlink.Link{
					dummy(1, "lo", 1000, up|net.FlagLoopback), dummy(3, "ppp0", 1000, up|net.FlagPointToPoint),
					dummy(4, "eth1", 1000, 0), dummy(2, "eth0", 1500, up),
				},
				routes: v4(defaultVia(1), defaultVia(3), defaultVia(4)),
			},
			want: 1500,
		},
		{
			name: "implausible MTUs do not count; the bounds do",
			node: fakeNode{
				links:  []netlink.Link{dummy(2, "a", 575, up), dummy(3, "b", 999999, up), dummy(4, "c", 999998, up)},
				routes: v4(defaultVia(2), defaultVia(3), defaultVia(4)),
			},
			want: 999998,
		},
		{
			name: "the lower bound 576 counts",
			node: fakeNode{
				links:  []netlink.Link{dummy(2, "a", 576, up), dummy(3, "b", 1500, up)},
				routes: v4(defaultVia(2), defaultVia(3)),
			},
			want: 576,
		},
		{
			name: "no default route: the smallest up link (old kubenet's rule)",
			node: fakeNode{
				links: []netlink.Link{dummy(2, "eth0", 1500, up), dummy(3, "docker0", 1400, up), dummy(4, "down0", 1300, 0)},
			},
			want: 1400,
		},
		{
			name: "no default route and the links cannot be listed: the fallback",
			node: fakeNode{links: []netlink.Link{dummy(2, "eth0", 1400, up)}, allErr: boom},
			want: FallbackMTU,
		},
		{
			name: "no usable link at all: the fallback",
			node: fakeNode{links: []netlink.Link{dummy(1, "lo", 65536, up|net.FlagLoopback), dummy(2, "eth0", 1400, 0)}},
			want: FallbackMTU,
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			node := c.node
			if got := detectMTU(&node, "cbr0"); got != c.want {
				t.Errorf("MTU %d, want %d", got, c.want)
			}
			for index, n := range c.wantLookups {
				if node.lookups[index] != n {
					t.Errorf("link %d looked up %d times, want %d", index, node.lookups[index], n)
				}
			}
		})
	}
}
