// Package netpol is the kernel side of NetworkPolicy on a kubenet node. It knows nothing of
// Kubernetes objects: its input is, per local pod, the addresses, protocols and ports each
// direction allows (policyrules.Ruleset, the compiled form the agent hands over), and it never
// reads the API.
//
// Enforcement grants, guards deny. Two tc guards (guard.go) drop every frame that reaches them
// without a packet-mark bit: one on each pod's port towards the pod (MarkIngress), one where the
// bridge hands frames up to the node (MarkEgress); bridged frames between ports must carry
// MarkEgress to get MarkIngress. Only the policy rules set the bits, so anything that removes
// rules — `nft flush ruleset`, a deleted table, a damaged chain, a missing br_netfilter — leaves
// the pods with guards denied, never open; and a pod is denied from the moment ADD gave it its
// guard until its policies are installed, with nothing for ADD to write into the tables.
//
// Layout (see rules.go for the names):
//
//   - table bridge kubenetpolicy-<network>: base chains on the prerouting (frames from pods),
//     forward (port to port) and output (node to pod) hooks, after br_netfilter, dispatching by
//     the frame's input or output port through verdict maps to the pod's group chain, or to the
//     allow chains for a pod that is not isolated in that direction. A port with no element gets
//     no mark. One chain per distinct "allow list" (a group: pods with the same allowed peers
//     and ports share it, whatever the number of policies behind it) grants packets of known
//     connections and looks the peer address, protocol and port up in its sets (hash sets for
//     single peers, concatenated interval sets for ranges); it drops the rest;
//   - table inet kubenetpolicy-<network>: marks packets of connections conntrack knows (in IP
//     prerouting, which br_netfilter runs before the bridge chains) and every packet the node
//     sends (the node reaches every pod).
//
// The agent owns everything in the tables; the plugin only gives a new port its guard and drops
// a deleted port's map elements. Nothing is removed when the agent stops: a node whose agent is
// down keeps its last rules, and pods that start meanwhile stay denied.
package netpol

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"math/bits"
	"net/netip"
	"slices"
	"strings"

	"github.com/kubenet-dev/kubenet/internal/policyrules"
)

// box is a disjoint element of a ports set: addresses × one protocol × a port range.
type box struct {
	addrs policyrules.Range
	ports policyrules.Ports
}

// group is the canonical form of one direction's allow list, per family: the single addresses
// allowed on every port (hosts) and the single address-protocol-port triples (points), each
// sorted without repeats, kept apart from the ranges (any: address ranges on every port; ports:
// disjoint boxes of the other entries). Pods are the usual peers, and a pod's entry is a host or
// a point: those go into hash sets, where a peer that leaves is removed at a constant cost; the
// kernel's concatenated interval sets (pipapo) take time in proportion to the whole set to
// remove one element (about 0.8 ms from a set of 167 on the test machine), which every pod
// change that leaves a group's peers paid per group. A host or point also inside a range stays
// in both: the lists are a union. Equal allow lists give equal groups, whatever the order or the
// overlaps in which the compiler produced them.
type group struct {
	any4, any6       []policyrules.Range
	ports4, ports6   []box
	hosts4, hosts6   []netip.Addr
	points4, points6 []box // each of one address and one port
}

// canonical builds the group of allow; false when its ports sets would need more than budget
// elements (overlapping port ranges of many peers multiply).
func canonical(allow []policyrules.Entry, budget int) (group, bool) {
	var g group
	var ranges []policyrules.Entry
	g.presize(allow)
	for _, e := range allow {
		if !e.Peer.Valid() || (e.Ports != nil && e.Ports.First > e.Ports.Last) {
			continue
		}
		single := e.Peer.First == e.Peer.Last
		switch {
		case e.Ports == nil && single:
			g.add(kindHosts, e)
		case e.Ports != nil && single && e.Ports.First == e.Ports.Last:
			g.add(kindPoints, e)
		default:
			ranges = append(ranges, e)
		}
	}
	if !g.setRanges(ranges, budget) {
		return group{}, false
	}
	g.sortSingles()
	g.dropCovered()
	return g, true
}

// presize gives the group's lists of hosts and points room for those of allow: a list of a
// few hundred pods grown one append at a time was most of what canonical allocated.
func (g *group) presize(allow []policyrules.Entry) {
	var hosts4, hosts6, points4, points6 int
	for _, e := range allow {
		if e.Peer.First != e.Peer.Last || (e.Ports != nil && e.Ports.First != e.Ports.Last) {
			continue
		}
		is6 := e.Peer.First.Is6()
		switch {
		case e.Ports == nil && is6:
			hosts6++
		case e.Ports == nil:
			hosts4++
		case is6:
			points6++
		default:
			points4++
		}
	}
	g.hosts4, g.hosts6 = room[netip.Addr](hosts4), room[netip.Addr](hosts6)
	g.points4, g.points6 = room[box](points4), room[box](points6)
}

// room is an empty list with room for n, nil for none (as a list nothing was added to).
func room[T any](n int) []T {
	if n == 0 {
		return nil
	}
	return make([]T, 0, n)
}

// setRanges makes the group's any and ports lists of entries: the address ranges allowed on
// every port merged, the others cut into disjoint boxes per family and protocol, in the order a
// group's name is computed over (a group read back from the kernel, whose sets list their
// elements in any order, is put in it by the same call). false when the boxes would be more
// than budget.
func (g *group) setRanges(entries []policyrules.Entry, budget int) bool {
	var any4, any6 []policyrules.Range
	type portsKey struct {
		is6   bool
		proto uint8
	}
	byProto := map[portsKey][]policyrules.Entry{}
	for _, e := range entries {
		is6 := e.Peer.First.Is6()
		switch {
		case e.Ports == nil && is6:
			any6 = append(any6, e.Peer)
		case e.Ports == nil:
			any4 = append(any4, e.Peer)
		default:
			k := portsKey{is6, e.Ports.Protocol}
			byProto[k] = append(byProto[k], e)
		}
	}
	g.any4, g.any6 = policyrules.MergeRanges(any4), policyrules.MergeRanges(any6)
	keys := make([]portsKey, 0, len(byProto))
	for k := range byProto {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b portsKey) int { return cmp.Compare(a.proto, b.proto) })
	g.ports4, g.ports6 = nil, nil
	for _, k := range keys {
		boxes, ok := sweepBoxes(k.proto, byProto[k], budget-len(g.ports4)-len(g.ports6))
		if !ok {
			return false
		}
		if k.is6 {
			g.ports6 = append(g.ports6, boxes...)
		} else {
			g.ports4 = append(g.ports4, boxes...)
		}
	}
	return true
}

// sortSingles sorts the hosts and points and drops their repeats: their canonical order, which
// a group read back from the kernel (in any order) is put in too.
func (g *group) sortSingles() {
	for _, hs := range []*[]netip.Addr{&g.hosts4, &g.hosts6} {
		slices.SortFunc(*hs, netip.Addr.Compare)
		*hs = slices.Compact(*hs)
	}
	for _, ps := range []*[]box{&g.points4, &g.points6} {
		slices.SortFunc(*ps, comparePoints)
		*ps = slices.Compact(*ps)
	}
}

// comparePoints orders points by address, protocol and port.
func comparePoints(a, b box) int {
	return cmp.Or(a.addrs.First.Compare(b.addrs.First), cmp.Compare(a.ports.Protocol, b.ports.Protocol), cmp.Compare(a.ports.First, b.ports.First))
}

// withoutAddr cuts a out of the ranges that hold it.
func withoutAddr(rs []policyrules.Range, a netip.Addr) []policyrules.Range {
	var out []policyrules.Range
	for _, r := range rs {
		if a.Is4() != r.First.Is4() || a.Compare(r.First) < 0 || a.Compare(r.Last) > 0 {
			out = append(out, r)
			continue
		}
		if a != r.First {
			out = append(out, policyrules.Range{First: r.First, Last: a.Prev()})
		}
		if a != r.Last {
			out = append(out, policyrules.Range{First: a.Next(), Last: r.Last})
		}
	}
	return out
}

// Limits on what one pod's allow list may cost the node. The kernel's concatenated interval
// sets (pipapo) store an element as the prefixes its address range splits into, and an IPv6
// prefix costs about four times an IPv4 one (32 lookup groups of 4 bits against 8); adding an
// element costs time in proportion to what the set already holds, so a set's build time grows
// with the square of its size: about 1 s at the group limit on a 2-core machine. A direction
// whose allow list is over a limit is refused (Refusal): its pods keep what they had.
const (
	// maxGroupCost bounds one group's sets, in IPv4 prefixes (groupCost).
	maxGroupCost = 1 << 18
	// maxNodeCost bounds all the groups of the node together; past it the costliest groups are
	// refused first, so the small allow lists of every other namespace always fit.
	maxNodeCost = 4 * maxGroupCost
)

// cost is what the group's sets cost the kernel, in IPv4 prefixes: every interval element's
// address range in prefixes, an IPv6 prefix four times an IPv4 one; a hash set's element (a
// host, a point) one, whatever its family: it is one key, split into no prefixes, and a set's
// build takes time in proportion to its size (a policy that lets every pod of a dual-stack
// cluster in is two hosts a pod, which neighbouring pods no longer merge into ranges).
func (g group) cost() int {
	n := 0
	for _, rs := range [][]policyrules.Range{g.any4, g.any6} {
		for _, r := range rs {
			n += rangeCost(r)
		}
	}
	for _, bs := range [][]box{g.ports4, g.ports6} {
		for _, b := range bs {
			n += rangeCost(b.addrs)
		}
	}
	return n + len(g.hosts4) + len(g.points4) + len(g.hosts6) + len(g.points6)
}

// elements counts the group's set elements.
func (g group) elements() int {
	return len(g.any4) + len(g.any6) + len(g.ports4) + len(g.ports6) + len(g.hosts4) + len(g.hosts6) + len(g.points4) + len(g.points6)
}

func rangeCost(r policyrules.Range) int {
	if r.First.Is4() {
		return prefixCount(r)
	}
	return 4 * prefixCount(r)
}

// prefixCount is the number of prefixes r splits into (the fewest: what the kernel makes of it).
func prefixCount(r policyrules.Range) int {
	width := 128
	if r.First.Is4() {
		width = 32
	}
	x, y := u128From(r.First), u128From(r.Last)
	n := 0
	for {
		// The biggest block that starts at x, is aligned on its size and ends by y.
		k := min(x.trailingZeros(width), y.sub(x).add1Len())
		n++
		end := x.or(lowBits(k))
		if end == y {
			return n
		}
		x = end.add1()
	}
}

// u128 is an address as a number.
type u128 struct{ hi, lo uint64 }

func u128From(a netip.Addr) u128 {
	if a.Is4() {
		b := a.As4()
		return u128{lo: uint64(binary.BigEndian.Uint32(b[:]))}
	}
	b := a.As16()
	return u128{binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])}
}

// addr is x as an address of the family.
func (x u128) addr(is6 bool) netip.Addr {
	if !is6 {
		var b [4]byte
		binary.BigEndian.PutUint32(b[:], uint32(x.lo))
		return netip.AddrFrom4(b)
	}
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], x.hi)
	binary.BigEndian.PutUint64(b[8:], x.lo)
	return netip.AddrFrom16(b)
}

func (x u128) trailingZeros(width int) int {
	switch {
	case x.lo != 0:
		return bits.TrailingZeros64(x.lo)
	case x.hi != 0:
		return 64 + bits.TrailingZeros64(x.hi)
	}
	return width
}

func (x u128) sub(y u128) u128 {
	lo, borrow := bits.Sub64(x.lo, y.lo, 0)
	hi, _ := bits.Sub64(x.hi, y.hi, borrow)
	return u128{hi, lo}
}

func (x u128) add1() u128 {
	lo, carry := bits.Add64(x.lo, 1, 0)
	return u128{x.hi + carry, lo}
}

// add1Len is the exponent of the biggest power of two not above x + 1 (x + 1 may be 2^128).
func (x u128) add1Len() int {
	y := x.add1()
	switch {
	case y.hi == 0 && y.lo == 0:
		return 128
	case y.hi != 0:
		return 64 + bits.Len64(y.hi) - 1
	}
	return bits.Len64(y.lo) - 1
}

func (x u128) or(y u128) u128 { return u128{x.hi | y.hi, x.lo | y.lo} }

// lowBits has the k lowest bits set.
func lowBits(k int) u128 {
	switch {
	case k >= 128:
		return u128{^uint64(0), ^uint64(0)}
	case k >= 64:
		return u128{1<<(k-64) - 1, ^uint64(0)}
	}
	return u128{0, 1<<k - 1}
}

// name is the content address of the group: a group's chain is named after it, so equal allow
// lists share it and a changed list is a new chain, swapped in atomically (its sets are named by
// a slot, stemOf: see apply.go). The hash is over a fixed binary form of the canonical elements:
// the lists' lengths, then each element's family-sized bounds, protocol and ports.
func (g group) name(dir string) string {
	buf := make([]byte, 0, 16+g.elements()*38)
	// The lengths first: the encoding of one list never reads as that of another.
	for _, n := range []int{len(g.any4), len(g.any6), len(g.ports4), len(g.ports6)} {
		buf = binary.BigEndian.AppendUint32(buf, uint32(n))
	}
	for _, rs := range [][]policyrules.Range{g.any4, g.any6} {
		for _, r := range rs {
			buf = append(buf, 'a')
			buf = append(buf, r.First.AsSlice()...)
			buf = append(buf, r.Last.AsSlice()...)
		}
	}
	for _, bs := range [][]box{g.ports4, g.ports6} {
		for _, x := range bs {
			buf = append(buf, 'p')
			buf = append(buf, x.addrs.First.AsSlice()...)
			buf = append(buf, x.addrs.Last.AsSlice()...)
			buf = append(buf, x.ports.Protocol)
			buf = binary.BigEndian.AppendUint16(buf, x.ports.First)
			buf = binary.BigEndian.AppendUint16(buf, x.ports.Last)
		}
	}
	// The hosts and points after the ranges, only when there are some: a group of ranges alone
	// keeps the name it had before they had sets of their own. The four lengths above fix how
	// long the ranges' part is, so no group's encoding is the start of another's.
	if n := len(g.hosts4) + len(g.hosts6) + len(g.points4) + len(g.points6); n > 0 {
		buf = append(buf, 's')
		for _, n := range []int{len(g.hosts4), len(g.hosts6), len(g.points4), len(g.points6)} {
			buf = binary.BigEndian.AppendUint32(buf, uint32(n))
		}
		for _, hs := range [][]netip.Addr{g.hosts4, g.hosts6} {
			for _, a := range hs {
				buf = append(buf, a.AsSlice()...)
			}
		}
		for _, ps := range [][]box{g.points4, g.points6} {
			for _, x := range ps {
				buf = append(buf, x.addrs.First.AsSlice()...)
				buf = append(buf, x.ports.Protocol)
				buf = binary.BigEndian.AppendUint16(buf, x.ports.First)
			}
		}
	}
	sum := sha256.Sum256(buf)
	var out [64]byte
	n := copy(out[:], dir)
	out[n] = '-'
	hex.Encode(out[n+1:], sum[:8])
	return string(out[:n+1+16])
}

// String describes the group for logs and tests.
func (g group) String() string {
	var parts []string
	for _, rs := range [][]policyrules.Range{g.any4, g.any6} {
		for _, r := range rs {
			parts = append(parts, r.String())
		}
	}
	for _, hs := range [][]netip.Addr{g.hosts4, g.hosts6} {
		for _, a := range hs {
			parts = append(parts, a.String())
		}
	}
	for _, bs := range [][]box{g.ports4, g.ports6, g.points4, g.points6} {
		for _, x := range bs {
			parts = append(parts, x.addrs.String()+" "+x.ports.String())
		}
	}
	if len(parts) == 0 {
		return "nothing"
	}
	return strings.Join(parts, ", ")
}

// dropCovered drops the hosts a range of any holds and the points a host, a range of any or a
// box holds: equal in meaning, lists that differ only by such an entry share their group. The
// singles must be sorted.
func (g *group) dropCovered() {
	inRanges := func(rs []policyrules.Range, a netip.Addr) bool {
		i, _ := slices.BinarySearchFunc(rs, a, func(r policyrules.Range, a netip.Addr) int { return r.First.Compare(a) })
		if i < len(rs) && rs[i].First == a {
			return true
		}
		return i > 0 && rs[i-1].Last.Compare(a) >= 0 // disjoint and sorted: only the one before can hold a
	}
	for _, f := range []struct {
		any    []policyrules.Range
		hosts  *[]netip.Addr
		points *[]box
		boxes  []box
	}{{g.any4, &g.hosts4, &g.points4, g.ports4}, {g.any6, &g.hosts6, &g.points6, g.ports6}} {
		*f.hosts = slices.DeleteFunc(*f.hosts, func(a netip.Addr) bool { return inRanges(f.any, a) })
		covered := make([]bool, len(*f.points))
		for _, b := range f.boxes {
			// The points of the box's addresses (sorted by address first), then its protocol and ports.
			i, _ := slices.BinarySearchFunc(*f.points, b.addrs.First, func(p box, a netip.Addr) int { return p.addrs.First.Compare(a) })
			for ; i < len(*f.points) && (*f.points)[i].addrs.First.Compare(b.addrs.Last) <= 0; i++ {
				p := (*f.points)[i].ports
				covered[i] = covered[i] || (p.Protocol == b.ports.Protocol && p.First >= b.ports.First && p.First <= b.ports.Last)
			}
		}
		kept := (*f.points)[:0]
		for i, p := range *f.points {
			_, host := slices.BinarySearchFunc(*f.hosts, p.addrs.First, netip.Addr.Compare)
			if !covered[i] && !host && !inRanges(f.any, p.addrs.First) {
				kept = append(kept, p)
			}
		}
		*f.points = kept
	}
}
