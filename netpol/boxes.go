package netpol

import (
	"cmp"
	"net/netip"
	"slices"

	"github.com/kubenet-dev/kubenet/internal/policyrules"
)

// sweepBoxes turns the port entries of one family and protocol into boxes that do not overlap
// (the kernel's concatenated interval sets refuse overlapping elements): the port axis is cut at
// every entry's bounds, each piece gets the union of the address ranges covering it, and
// neighbouring pieces with equal unions are joined again.
//
// It sweeps the port axis once, keeping the union of the address ranges of the entries that
// cover the current port in a coverage tree, so the work is O(n log n) in the entries plus
// O(log n) per box it returns, however the entries' ports overlap. The boxes themselves can be
// many more than the entries (a grid of address bars and port bars needs about the product of
// the two): past budget boxes it stops and returns false.
func sweepBoxes(proto uint8, entries []policyrules.Entry, budget int) ([]box, bool) {
	if len(entries) == 0 {
		return nil, true
	}
	// The address axis, cut at every entry's first address and just past its last one: slot k
	// is [bounds[k], bounds[k+1]).
	bounds := make([]bound, 0, 2*len(entries))
	for _, e := range entries {
		bounds = append(bounds, boundAt(e.Peer.First), boundPast(e.Peer.Last))
	}
	slices.SortFunc(bounds, bound.compare)
	bounds = slices.Compact(bounds)
	slot := func(b bound) int {
		i, _ := slices.BinarySearchFunc(bounds, b, bound.compare)
		return i
	}
	is6 := entries[0].Peer.First.Is6()
	// The port axis: an entry covers its address slots from its first port to its last.
	type event struct {
		at       uint32 // the port where the entry starts covering, or the one after its last
		from, to int    // its address slots [from, to)
		start    bool
	}
	events := make([]event, 0, 2*len(entries))
	for _, e := range entries {
		from, to := slot(boundAt(e.Peer.First)), slot(boundPast(e.Peer.Last))
		events = append(events, event{uint32(e.Ports.First), from, to, true}, event{uint32(e.Ports.Last) + 1, from, to, false})
	}
	slices.SortFunc(events, func(a, b event) int { return cmp.Compare(a.at, b.at) })

	cov := newCoverage(len(bounds) - 1)
	out := make([]box, 0, len(entries))
	// The open piece: ports [first, last] with the union addrs.
	var open bool
	var first, last uint16
	var addrs []policyrules.Range
	closePiece := func() {
		for _, r := range addrs {
			out = append(out, box{addrs: r, ports: policyrules.Ports{Protocol: proto, First: first, Last: last}})
		}
		open = false
	}
	for i := 0; i < len(events); {
		at := events[i].at
		j := i
		for j < len(events) && events[j].at == at {
			j++
		}
		// Starts first, then ends: an entry ending where an equal one starts changes nothing, and
		// the union changed exactly when the starts grew it or the ends shrank it.
		before := cov.covered[1]
		for _, e := range events[i:j] {
			if e.start {
				cov.add(e.from, e.to, 1)
			}
		}
		grown := cov.covered[1]
		for _, e := range events[i:j] {
			if !e.start {
				cov.add(e.from, e.to, -1)
			}
		}
		changed := grown != before || cov.covered[1] != grown
		i = j
		if cov.covered[1] == 0 {
			// No entry covers the ports up to the next event (or beyond the last one).
			if open {
				closePiece()
			}
			continue
		}
		pieceLast := uint16(events[i].at - 1) // an entry covers [at, …]: its end event follows
		if open && !changed {
			last = pieceLast
			continue
		}
		if open {
			closePiece()
		}
		addrs = cov.ranges(bounds, is6)
		if len(out)+len(addrs) > budget {
			return nil, false
		}
		open, first, last = true, uint16(at), pieceLast
	}
	return out, true
}

// bound is a cut of the address axis: an address as a number, or just past the family's last
// address.
type bound struct {
	at   u128
	past bool
}

func boundAt(a netip.Addr) bound { return bound{at: u128From(a)} }

// boundPast is the cut just after last.
func boundPast(last netip.Addr) bound {
	if next := last.Next(); next.IsValid() {
		return boundAt(next)
	}
	return bound{at: u128From(last), past: true}
}

func (b bound) compare(o bound) int {
	switch {
	case b.past != o.past && b.past:
		return 1
	case b.past != o.past:
		return -1
	case b.at.hi != o.at.hi:
		return cmp.Compare(b.at.hi, o.at.hi)
	}
	return cmp.Compare(b.at.lo, o.at.lo)
}

// first is the cut's address (of a cut that is no past one).
func (b bound) first(is6 bool) netip.Addr { return b.at.addr(is6) }

// before is the last address before the cut.
func (b bound) before(is6 bool) netip.Addr {
	if b.past {
		return b.at.addr(is6)
	}
	return b.at.sub(u128{lo: 1}).addr(is6)
}

// coverage counts, over a line of n slots, how many ranges of slots cover each one, and how many
// slots are covered at all: a segment tree whose node holds the ranges that cover its whole span
// (count) and the slots of its span that some range covers (covered). Adding or removing a range
// costs O(log n); the covered runs come out in O(log n) each.
type coverage struct {
	n       int
	count   []int32
	covered []int32
}

func newCoverage(n int) *coverage {
	return &coverage{n: n, count: make([]int32, 4*max(n, 1)), covered: make([]int32, 4*max(n, 1))}
}

// add adds delta (1 or -1) to the count of the slots [from, to).
func (c *coverage) add(from, to int, delta int32) {
	c.update(1, 0, c.n, from, to, delta)
}

func (c *coverage) update(node, lo, hi, from, to int, delta int32) {
	if to <= lo || hi <= from {
		return
	}
	if from <= lo && hi <= to {
		c.count[node] += delta
	} else {
		mid := (lo + hi) / 2
		c.update(2*node, lo, mid, from, to, delta)
		c.update(2*node+1, mid, hi, from, to, delta)
	}
	switch {
	case c.count[node] > 0:
		c.covered[node] = int32(hi - lo)
	case hi-lo == 1:
		c.covered[node] = 0
	default:
		c.covered[node] = c.covered[2*node] + c.covered[2*node+1]
	}
}

// ranges returns the covered runs of slots as address ranges, in order, joined where they touch.
func (c *coverage) ranges(bounds []bound, is6 bool) []policyrules.Range {
	var runs [][2]int
	var walk func(node, lo, hi int)
	walk = func(node, lo, hi int) {
		switch {
		case c.covered[node] == 0:
			return
		case c.covered[node] == int32(hi-lo):
			if n := len(runs); n > 0 && runs[n-1][1] == lo {
				runs[n-1][1] = hi
			} else {
				runs = append(runs, [2]int{lo, hi})
			}
			return
		}
		mid := (lo + hi) / 2
		walk(2*node, lo, mid)
		walk(2*node+1, mid, hi)
	}
	walk(1, 0, c.n)
	out := make([]policyrules.Range, len(runs))
	for i, r := range runs {
		out[i] = policyrules.Range{First: bounds[r[0]].first(is6), Last: bounds[r[1]].before(is6)}
	}
	return out
}
