package routes

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/kubenet-dev/kubenet/internal/ipnet"
)

// ErrNotOnLink wraps a route the kernel refused because the peer's address is not on a network
// this node is directly connected to: the nodes do not share an L2 segment, and routes via node
// addresses cannot work between them (a cloud route table or an overlay is needed).
var ErrNotOnLink = errors.New("the peer's address is not on a network this node is directly attached to (nodes must share an L2 segment)")

// Table applies plans to the main routing table of the calling thread's network namespace.
type Table struct {
	Protocol int // the agent's mark; DefaultProtocol unless configured
}

// List returns every route of the main table, both families.
func (t Table) List() ([]Existing, error) {
	rs, err := mainTable()
	if err != nil {
		return nil, err
	}
	return existing(rs), nil
}

func mainTable() ([]netlink.Route, error) {
	rs, err := netlinksafe.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("list routes: %w", err)
	}
	return rs, nil
}

func existing(rs []netlink.Route) []Existing {
	out := make([]Existing, 0, len(rs))
	for _, r := range rs {
		e := Existing{Protocol: int(r.Protocol), Priority: r.Priority, Dev: r.LinkIndex}
		if r.Dst != nil {
			e.Dst, _ = ipnet.ToPrefix(r.Dst)
		} else if r.Family == unix.AF_INET6 {
			e.Dst = netip.MustParsePrefix("::/0")
		} else {
			e.Dst = netip.MustParsePrefix("0.0.0.0/0")
		}
		if r.Src != nil {
			src, _ := netip.AddrFromSlice(r.Src)
			e.Src = src.Unmap()
		}
		if len(r.MultiPath) == 0 && r.Gw != nil {
			gw, _ := netip.AddrFromSlice(r.Gw)
			e.Gw = gw.Unmap()
		}
		out = append(out, e)
	}
	return out
}

// Apply carries out p and returns the routes it could not make or remove. Each change is one
// netlink request; one failure does not stop the others.
func (t Table) Apply(p Plan) []Failure {
	var failed []Failure
	for _, e := range p.Delete {
		// The protocol is part of the match, so even a route that changed owner since the
		// listing is not deleted unless it carries the agent's mark.
		r := &netlink.Route{Dst: ipnet.FromPrefix(e.Dst), Protocol: netlink.RouteProtocol(t.Protocol), Priority: e.Priority, Table: unix.RT_TABLE_MAIN}
		if e.Gw.IsValid() {
			r.Gw = e.Gw.AsSlice()
		}
		if err := netlink.RouteDel(r); err != nil && !errors.Is(err, unix.ESRCH) {
			failed = append(failed, Failure{Route: Route{Dst: e.Dst, Gw: e.Gw}, Err: fmt.Errorf("delete: %w", err)})
		}
	}
	for _, w := range p.Replace {
		err := withSourceOrNot(w, func(w Route) error {
			// One request (NLM_F_REPLACE) changes the gateway in place: no moment without a route.
			err := netlink.RouteReplace(t.route(w))
			if err != nil && w.Dev != 0 && errors.Is(err, unix.EINVAL) {
				// IPv6 checks an on-link gateway against the table before replacing, and finds
				// the very route being replaced (the overlay's next hop lies in the peer's CIDR,
				// which the old route sends elsewhere): the old route goes first, for a moment.
				err = t.swap(w)
			}
			return err
		})
		if err != nil {
			failed = append(failed, Failure{Route: w, Err: explain(err)})
		}
	}
	for _, w := range p.Add {
		// RouteAdd (NLM_F_EXCL), never replace: if somebody else's route appeared since the
		// listing it wins and this fails with EEXIST.
		if err := withSourceOrNot(w, func(w Route) error { return netlink.RouteAdd(t.route(w)) }); err != nil {
			failed = append(failed, Failure{Route: w, Err: explain(err)})
		}
	}
	return failed
}

// withSourceOrNot applies w with op and, when the kernel refuses its source address (the bridge
// that holds the pod gateway is not set up yet: a node before its first pod, with the healer
// off), without it: the route is what pods need; the next sync puts the source in once the
// address exists.
func withSourceOrNot(w Route, op func(Route) error) error {
	err := op(w)
	if err != nil && w.Src.IsValid() && errors.Is(err, unix.EINVAL) {
		w.Src = netip.Addr{}
		err = op(w)
	}
	return err
}

// swap deletes the agent's routes to w.Dst and adds w.
func (t Table) swap(w Route) error {
	old := &netlink.Route{Dst: ipnet.FromPrefix(w.Dst), Protocol: netlink.RouteProtocol(t.Protocol), Table: unix.RT_TABLE_MAIN}
	if err := netlink.RouteDel(old); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("delete the old route: %w", err)
	}
	return netlink.RouteAdd(t.route(w))
}

func (t Table) route(w Route) *netlink.Route {
	r := &netlink.Route{
		Dst:      ipnet.FromPrefix(w.Dst),
		Gw:       w.Gw.AsSlice(),
		Protocol: netlink.RouteProtocol(t.Protocol),
		Table:    unix.RT_TABLE_MAIN,
	}
	if w.Dev != 0 {
		// The overlay's next hop is in the peer's pod CIDR, on no network of this node: the
		// device's neighbour entry is what makes it reachable.
		r.LinkIndex = w.Dev
		r.Flags = int(netlink.FLAG_ONLINK)
	}
	if w.Src.IsValid() {
		r.Src = w.Src.AsSlice()
	}
	return r
}

// explain names the usual cause of the kernel's answer when the gateway is not on-link:
// ENETUNREACH (no route to it at all) or EINVAL/EHOSTUNREACH ("Nexthop has invalid gateway",
// reachable only through another router).
func explain(err error) error {
	if errors.Is(err, unix.ENETUNREACH) || errors.Is(err, unix.EHOSTUNREACH) || errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("%w: %w", ErrNotOnLink, err)
	}
	return err
}
