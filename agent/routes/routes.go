// Package routes keeps the node's routes to the other nodes' pod CIDRs: one route per pod CIDR
// via that node's address, in the main table, marked with a route protocol number of the agent's
// own. The mark is how the agent recognises its routes after a restart and why it never changes
// or removes a route somebody else made.
//
// Diff is pure (tested table-driven); Table applies a Plan through netlink. A route that is
// already right is never touched, so a restarted agent converges without a flap; a route whose
// gateway changed is replaced in one netlink request, not deleted and added.
package routes

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
)

// DefaultProtocol marks the agent's routes (rtm_protocol). It is not one of the numbers in
// iproute2's rt_protos (0-18, 42, 99, 186-192); 75 is ASCII 'K'.
const DefaultProtocol = 75

// Route is a route the agent wants: a peer node's pod CIDR via that node's address (a direct
// route), or via the overlay's next hop for that CIDR out of the overlay device (Dev; the next
// hop is on-link there by the overlay's neighbour entries, not by any address).
type Route struct {
	Dst netip.Prefix
	Gw  netip.Addr
	Dev int // the output link; 0: the kernel's choice (a direct route)
	// Src is the source address of the node's own packets on the route (invalid: the kernel's
	// choice). The overlay's routes take the node's pod gateway, so that the peer's pods answer
	// through the overlay, not over the underlay with a pod's address as source (which routers
	// with reverse-path filtering and cloud networks' source checks drop).
	Src  netip.Addr
	Node string // the peer, for reports
}

func (r Route) String() string { return fmt.Sprintf("%s via %s (node %s)", r.Dst, r.Gw, r.Node) }

// is reports whether the kernel's route e is r: same gateway, and same link where r names one.
func (r Route) is(e Existing) bool {
	return e.Gw == r.Gw && (r.Dev == 0 || e.Dev == r.Dev) && (!r.Src.IsValid() || e.Src == r.Src)
}

// Existing is a route found in the kernel's main table.
type Existing struct {
	Dst      netip.Prefix
	Gw       netip.Addr // invalid for routes without a single gateway (device or multipath routes)
	Dev      int        // the output link's index
	Src      netip.Addr // the preferred source; invalid when none
	Protocol int
	Priority int
}

// Failure is a route the agent wants but does not have, and why.
type Failure struct {
	Route Route
	Err   error
}

func (f Failure) Error() string { return fmt.Sprintf("route %s: %v", f.Route, f.Err) }

// Plan is what turns the table into the wanted routes.
type Plan struct {
	Add     []Route
	Replace []Route    // the agent's route to Dst exists with another gateway
	Delete  []Existing // the agent's routes nobody wants any more
	// InPlace are the wanted routes that exist already: the agent's, or somebody else's with
	// the same gateway (a static route an operator made; it does the job, so it is left alone).
	InPlace []Route
	// Conflicts are wanted routes whose destination holds somebody else's route to another
	// gateway. The agent never touches a route it did not make, so these stay unprogrammed.
	Conflicts []Failure
}

// Empty reports whether the plan changes nothing.
func (p Plan) Empty() bool { return len(p.Add)+len(p.Replace)+len(p.Delete) == 0 }

// Diff plans the changes from current (every route of the main table) to want, touching only
// routes of protocol proto. want must hold at most one route per destination.
func Diff(current []Existing, want []Route, proto int) Plan {
	var p Plan
	ours := map[netip.Prefix][]Existing{}
	foreign := map[netip.Prefix][]Existing{}
	for _, e := range current {
		if e.Protocol == proto {
			ours[e.Dst] = append(ours[e.Dst], e)
		} else {
			foreign[e.Dst] = append(foreign[e.Dst], e)
		}
	}
	wanted := map[netip.Prefix]bool{}
	for _, w := range want {
		wanted[w.Dst] = true
		if mine := ours[w.Dst]; len(mine) > 0 {
			// Keep one of the agent's routes to Dst (the one with the right gateway when there
			// is one) and delete any others, e.g. left by an older version with another metric.
			keep := slices.IndexFunc(mine, w.is)
			if keep < 0 {
				keep = 0
				p.Replace = append(p.Replace, w)
			} else {
				p.InPlace = append(p.InPlace, w)
			}
			for i, e := range mine {
				if i != keep {
					p.Delete = append(p.Delete, e)
				}
			}
			continue
		}
		if theirs := foreign[w.Dst]; len(theirs) > 0 {
			if slices.ContainsFunc(theirs, w.is) {
				p.InPlace = append(p.InPlace, w)
				continue
			}
			p.Conflicts = append(p.Conflicts, Failure{Route: w, Err: fmt.Errorf(
				"%s is already routed by another owner (protocol %d%s); kubenet-agent leaves routes it did not make alone",
				w.Dst, theirs[0].Protocol, via(theirs[0].Gw))})
			continue
		}
		p.Add = append(p.Add, w)
	}
	for dst, mine := range ours {
		if !wanted[dst] {
			p.Delete = append(p.Delete, mine...)
		}
	}
	// Map iteration order is random; a stable order makes logs and tests readable.
	slices.SortFunc(p.Delete, func(a, b Existing) int {
		return cmp.Or(a.Dst.Addr().Compare(b.Dst.Addr()), cmp.Compare(a.Dst.Bits(), b.Dst.Bits()), cmp.Compare(a.Priority, b.Priority))
	})
	return p
}

func via(gw netip.Addr) string {
	if !gw.IsValid() {
		return ", no single gateway"
	}
	return ", via " + gw.String()
}
