package routes

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/kubenet-dev/kubenet/internal/ipnet"
)

// Network is one of the node's own networks: a subnet the node has an address in, or reaches
// directly through a link. A pod CIDR that overlaps one would take the node's own traffic.
type Network struct {
	Prefix netip.Prefix
	Addr   netip.Addr // the node's address in it; invalid for a route
	Source string     // "address 192.168.1.5/24 on eth0", "route 10.9.0.0/16 dev eth1"
}

// Snapshot is one reading of the node: the main table and the node's own networks.
type Snapshot struct {
	Routes   []Existing // every route of the main table, for Diff
	Networks []Network
}

// Read reads the calling thread's namespace: the main table once, for both the routes and the
// connected networks, and the addresses. exclude names the kubenet bridge and the overlay device
// (see nodeNetworks).
func (t Table) Read(exclude ...string) (Snapshot, error) {
	rs, err := mainTable()
	if err != nil {
		return Snapshot{}, err
	}
	networks, err := nodeNetworks(rs, exclude)
	return Snapshot{Routes: existing(rs), Networks: networks}, err
}

// nodeNetworks returns the node's own networks: the network of every address, and every
// directly connected route of the main table (a unicast route out of a link with no gateway,
// whatever its scope: IPv6 reports every route as universe), on every link but the ones named in
// exclude (the kubenet bridge, whose networks are the pod CIDR itself, and the overlay device,
// whose link-local network reaches no node). The CNI plugin's bridge.Preflight applies the same
// rule.
func nodeNetworks(mainRoutes []netlink.Route, exclude []string) ([]Network, error) {
	links, err := netlinksafe.LinkList()
	if err != nil {
		return nil, fmt.Errorf("node networks: list links: %w", err)
	}
	names := make(map[int]string, len(links))
	for _, l := range links {
		names[l.Attrs().Index] = l.Attrs().Name
	}
	addrs, err := netlinksafe.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("node networks: list addresses: %w", err)
	}
	var out []Network
	for _, a := range addrs {
		name := names[a.LinkIndex]
		p, ok := ipnet.ToPrefix(a.IPNet)
		if slices.Contains(exclude, name) || !ok {
			continue
		}
		out = append(out, Network{Prefix: p.Masked(), Addr: p.Addr(), Source: fmt.Sprintf("address %s on %s", p, name)})
	}
	for _, r := range mainRoutes {
		name := names[r.LinkIndex]
		if r.Gw != nil || len(r.MultiPath) > 0 || r.Type != unix.RTN_UNICAST || r.LinkIndex == 0 || slices.Contains(exclude, name) || r.Dst == nil {
			continue
		}
		p, ok := ipnet.ToPrefix(r.Dst)
		if !ok {
			continue
		}
		out = append(out, Network{Prefix: p.Masked(), Source: fmt.Sprintf("route %s dev %s", p, name)})
	}
	return out, nil
}
