package netpol

import (
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	"github.com/kubenet-dev/kubenet/internal/policyrules"
)

// referenceBoxes is the direct construction sweepBoxes must agree with, box for box: cut the
// port axis at every entry's bounds, give each piece the merged union of the address ranges of
// the entries covering it, join neighbouring pieces with equal unions. O(cuts × entries): for
// tests only.
func referenceBoxes(proto uint8, entries []policyrules.Entry) []box {
	cuts := []uint32{}
	for _, e := range entries {
		cuts = append(cuts, uint32(e.Ports.First), uint32(e.Ports.Last)+1)
	}
	slices.Sort(cuts)
	cuts = slices.Compact(cuts)
	type piece struct {
		first, last uint16
		addrs       []policyrules.Range
	}
	var pieces []piece
	for i := 0; i+1 < len(cuts); i++ {
		first, last := uint16(cuts[i]), uint16(cuts[i+1]-1)
		var covering []policyrules.Range
		for _, e := range entries {
			if e.Ports.First <= first && last <= e.Ports.Last {
				covering = append(covering, e.Peer)
			}
		}
		if len(covering) == 0 {
			continue
		}
		addrs := policyrules.MergeRanges(covering)
		if n := len(pieces); n > 0 && pieces[n-1].last+1 == first && slices.Equal(pieces[n-1].addrs, addrs) {
			pieces[n-1].last = last
			continue
		}
		pieces = append(pieces, piece{first, last, addrs})
	}
	var out []box
	for _, p := range pieces {
		for _, r := range p.addrs {
			out = append(out, box{addrs: r, ports: policyrules.Ports{Protocol: proto, First: p.first, Last: p.last}})
		}
	}
	return out
}

// randomEntries draws n port entries of one family from a small space, so that they overlap,
// touch, repeat and reach the ends of both axes.
func randomEntries(rng *rand.Rand, n int, is6 bool) []policyrules.Entry {
	addr := func() netip.Addr {
		v := rng.IntN(40)
		switch {
		case v == 0:
			v = 0 // the family's first address
		case v >= 38:
			v = -1 - rng.IntN(2) // its last addresses
		}
		if is6 {
			var b [16]byte
			if v < 0 {
				b = [16]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, byte(256 + v)}
			} else {
				b[0], b[15] = 0x20, byte(v)
			}
			return netip.AddrFrom16(b)
		}
		if v < 0 {
			return netip.AddrFrom4([4]byte{255, 255, 255, byte(256 + v)})
		}
		return netip.AddrFrom4([4]byte{10, 0, 0, byte(v)})
	}
	port := func() uint16 {
		switch v := rng.IntN(30); v {
		case 0:
			return 0
		case 29:
			return math.MaxUint16 - uint16(rng.IntN(2))
		default:
			return uint16(1000 + v)
		}
	}
	out := make([]policyrules.Entry, 0, n)
	for range n {
		a, b := addr(), addr()
		if b.Less(a) {
			a, b = b, a
		}
		p, q := port(), port()
		if q < p {
			p, q = q, p
		}
		out = append(out, policyrules.Entry{Peer: policyrules.Range{First: a, Last: b}, Ports: &policyrules.Ports{Protocol: policyrules.TCP, First: p, Last: q}})
	}
	return out
}

// TestSweepBoxesAgainstReference: the sweep gives exactly the boxes of the direct construction,
// in the same order, on random entries of both families (so a group's name, its content hash,
// is what it was).
func TestSweepBoxesAgainstReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	for i := range 3000 {
		is6 := i%2 == 1
		entries := randomEntries(rng, 1+rng.IntN(1+i%60), is6)
		want := referenceBoxes(policyrules.TCP, entries)
		got, ok := sweepBoxes(policyrules.TCP, entries, math.MaxInt)
		if !ok || !slices.Equal(got, want) {
			t.Fatalf("case %d, entries %v:\nsweep     %v (%v)\nreference %v", i, entries, got, ok, want)
		}
	}
}

// TestSweepBoxesBudget: a grid of address bars (each on every port) and port bars (every
// address on one port) needs about the product of the two in disjoint boxes; past its budget the
// sweep stops.
func TestSweepBoxesBudget(t *testing.T) {
	var entries []policyrules.Entry
	for i := range 100 {
		a := netip.AddrFrom4([4]byte{10, 0, byte(i), 0})
		entries = append(entries, policyrules.Entry{Peer: policyrules.Range{First: a, Last: a}, Ports: &policyrules.Ports{Protocol: policyrules.TCP, First: 1, Last: 60000}})
		p := uint16(2 + 2*i)
		entries = append(entries, policyrules.Entry{Peer: policyrules.PrefixRange(netip.MustParsePrefix("0.0.0.0/0")), Ports: &policyrules.Ports{Protocol: policyrules.TCP, First: p, Last: p}})
	}
	all, ok := sweepBoxes(policyrules.TCP, entries, math.MaxInt)
	if !ok || len(all) < 100*100 {
		t.Fatalf("grid of 100 × 100 bars: %d boxes (%v), want at least 10000", len(all), ok)
	}
	if !slices.Equal(all, referenceBoxes(policyrules.TCP, entries)) {
		t.Error("grid: sweep and reference differ")
	}
	if got, ok := sweepBoxes(policyrules.TCP, entries, len(all)-1); ok || got != nil {
		t.Errorf("budget one short of %d boxes: %d boxes, ok %v; want refused", len(all), len(got), ok)
	}
	if _, ok := sweepBoxes(policyrules.TCP, entries, len(all)); !ok {
		t.Errorf("budget of exactly %d boxes refused", len(all))
	}
}

// randomAllow draws n entries of both families, with and without ports, on three protocols, from
// small spaces so that they overlap, touch and repeat.
func randomAllow(rng *rand.Rand, n int) []policyrules.Entry {
	addr := func(is6 bool) netip.Addr {
		v := byte(rng.IntN(64))
		if is6 {
			return netip.AddrFrom16([16]byte{0xfd, 0, 14: byte(rng.IntN(3)), 15: v})
		}
		return netip.AddrFrom4([4]byte{10, 0, byte(rng.IntN(3)), v})
	}
	out := make([]policyrules.Entry, 0, n)
	for range n {
		is6 := rng.IntN(3) == 0
		a, b := addr(is6), addr(is6)
		if b.Less(a) {
			a, b = b, a
		}
		e := policyrules.Entry{Peer: policyrules.Range{First: a, Last: b}}
		if rng.IntN(4) != 0 {
			first := uint16(rng.IntN(40))
			e.Ports = &policyrules.Ports{Protocol: []uint8{policyrules.TCP, policyrules.UDP, policyrules.SCTP}[rng.IntN(3)], First: first, Last: first + uint16(rng.IntN(10))}
		}
		out = append(out, e)
	}
	return out
}

// TestGroupNamesUnchanged: a group's name (its content hash) does not change by accident: a node
// whose agent is upgraded keeps its groups. The names were computed by the construction the
// sweep replaced (referenceBoxes), at commit 7861699, and recomputed when the name became a hash
// of a binary form (no fmt) with the slot-named sets, whose first pass replaces every group
// anyway. Three changed when single addresses and address-port points got hash sets of their
// own (those lists hold one that no range covers); a group of ranges alone kept its name.
func TestGroupNamesUnchanged(t *testing.T) {
	want := []string{
		"in-2d10b339e9d93653",
		"in-027e0e310da6f1c2",
		"in-a143937beeb9b499",
		"in-5e73cbf18d3ec763",
		"in-d172343b3e9bbdf3",
		"in-85adaeb94090bd82", // a point of its own since hosts and points have hash sets
		"in-d2ea596d5fe3bddf",
		"in-b1742527a8098e52",
		"in-c1684c9a076c4130",
		"in-60a3e643552636d0",
		"in-a82b36acc81dd906",
		"in-38e1bffe3a3100fb",
		"in-eba8767b63af462a",
		"in-057b07b7b1c3e44d",
		"in-c305c6dfddf15f62",
		"in-618973892e7d0e5c",
		"in-0b924736d9e05a5c",
		"in-9bf6761752832369",
		"in-dd3696e1a76a39dd",
		"in-b3fa5a603e51863a",
		"in-15d0e9c4d85643e6",
		"in-49da7294f3dfc919",
		"in-e80faee205e0ccd1",
		"in-e29a049f756b52f0",
		"in-3a6f2a590859d06d",
		"in-9f01eb976a241ce3",
		"in-71821620c1355296", // likewise
		"in-0cb4529f154c02f0",
		"in-397103f3bb794c30",
		"in-34c1c4b33c787c76",
		"in-7d766c4863ecf7ec", // likewise
		"in-dab6feb7c0dcd188",
		"in-8f780db233c821d8",
		"in-a69b6db822adf172",
		"in-9881b0e15513014f",
		"in-42a3e9083e719168",
		"in-1097f58dfd56ac2f",
		"in-2c220f513111921d",
		"in-b37c44203631cd6d",
		"in-a73b9ef9bf54c24a",
	}
	for seed, name := range want {
		rng := rand.New(rand.NewPCG(uint64(seed), 99))
		allow := randomAllow(rng, 1+rng.IntN(200))
		g, ok := canonical(allow, maxGroupCost)
		if got := g.name(ingressDir); !ok || got != name {
			t.Errorf("seed %d: group %s (%v), want %s; entries %v", seed, got, ok, name, allow)
		}
	}
}

func (b box) String() string { return fmt.Sprintf("%s %s", b.addrs, b.ports) }

// BenchmarkCanonical: the canonical group of n ipBlock-like entries, on two ports (prefixes of
// mixed sizes, one in five IPv6: bigAllow), and on a port range of their own each (which the
// construction before the sweep took in the square of n).
//
//	go test -run '^$' -bench Canonical ./netpol/
func BenchmarkCanonical(b *testing.B) {
	for _, n := range []int{100, 1000, 10000, 50000} {
		twoPorts := bigAllow(netip.MustParseAddr("10.3.0.2"), n).Allow
		ownPorts := slices.Clone(twoPorts)
		for i := range ownPorts {
			first := uint16(1 + i%60000)
			ownPorts[i].Ports = &policyrules.Ports{Protocol: policyrules.TCP, First: first, Last: first}
		}
		for _, shape := range []struct {
			name  string
			allow []policyrules.Entry
		}{{"two ports", twoPorts}, {"own ports", ownPorts}} {
			b.Run(fmt.Sprintf("%s/%d", shape.name, n), func(b *testing.B) {
				for b.Loop() {
					if _, ok := canonical(shape.allow, maxGroupCost); !ok {
						b.Fatal("refused")
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(shape.allow)), "ns/entry")
			})
		}
	}
}
