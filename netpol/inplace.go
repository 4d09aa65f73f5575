package netpol

import (
	"bytes"
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
)

// lookedUpSets are the group sets a chain's rules look up, each once, in the order of the rules:
// the sets of one stem for a chain as Apply writes it, none for one that looks none up, maybe
// several stems' for a chain another tool rewrote.
func lookedUpSets(rules []*nftables.Rule) []string {
	var out []string
	for _, r := range rules {
		for _, e := range r.Exprs {
			if l, ok := e.(*expr.Lookup); ok {
				if _, ok := setStem(l.SetName); ok && !slices.Contains(out, l.SetName) {
					out = append(out, l.SetName)
				}
			}
		}
	}
	return out
}

// slots hands out the slots no set of the table has and no group of the pass took.
type slots struct {
	taken map[int]bool
	low   int // no slot below is free
}

func newSlots(sets []string) *slots {
	s := &slots{taken: map[int]bool{}}
	for _, name := range sets {
		if stem, ok := setStem(name); ok {
			if n, ok := slotOf(stem); ok {
				s.taken[n] = true
			}
		}
	}
	return s
}

// next is the stem of the smallest free slot, taken from then on.
func (s *slots) next() string {
	for s.taken[s.low] {
		s.low++
	}
	s.taken[s.low] = true
	return slotStem(s.low)
}

// assignStems gives every planned group the stem of its sets: a group edited in place its
// donor's, a group whose chain alone looks up a slot's sets that slot (repaired there if they
// differ), any other (new, of the older layout, or whose slot another chain looks up too: a
// tool's rewrite) a new slot, the cheapest group first. Two groups never keep one slot: the
// repair of one would hand its list to the other's pods (and buildGroups moves a group whose
// sets differ to a new slot).
func assignStems(want desired, cur state, edits map[string]*inPlaceEdit, free *slots) {
	for _, name := range want.byCost() {
		g := want.groups[name]
		stem := cur.groupStems[name]
		_, slot := slotOf(stem)
		switch e := edits[name]; {
		case e != nil:
			g.stem = e.stem
		case cur.groupChains[name] && slot && cur.stemUsers[stem] == 1:
			g.stem = stem
		default:
			g.stem = free.next()
		}
		want.groups[name] = g
	}
}

// inPlaceEdit turns a group that goes (the donor) into a new one that comes: the donor's sets
// get the new group's elements and the new chain looks them up.
type inPlaceEdit struct {
	donor string
	stem  string
	sets  []setEdit
	cost  int // elements deleted and added
}

// setEdit is what one set of an edited group gets.
type setEdit struct {
	set      *nftables.Set
	del, add []nftables.SetElement
	create   bool // a kind the donor lacked: made in the transaction
	remove   bool // a kind the new group lacks: deleted after the donor's chain
}

// donorCandidates returns, for each planned group that has no chain yet, the groups that could
// give it their sets: groups no port of final uses whose every port moves to it, of the same
// direction and audit-ness, whose sets are a slot's that no other chain looks up (any of its
// sets), whose rules were written for it (not a renamed chain). Sorted. Pure.
func donorCandidates(want desired, cur state, final map[string]map[int]string) map[string][]string {
	used := map[string]bool{}
	for _, m := range final {
		for _, chain := range m {
			used[chain] = true
		}
	}
	target := map[string]string{} // donor → the one group its ports go to; "" when several
	for m, ports := range cur.maps {
		for port, chain := range ports {
			if !cur.groupChains[chain] {
				continue
			}
			to := final[m][port]
			if t, seen := target[chain]; seen && t != to {
				to = ""
			}
			target[chain] = to
		}
	}
	out := map[string][]string{}
	for _, donor := range slices.Sorted(maps.Keys(target)) {
		to := target[donor]
		stem := cur.groupStems[donor]
		_, slot := slotOf(stem)
		_, planned := want.groups[to]
		renamed := writtenFor(cur.bridgeRules[donor]) != donor // its sets may hold any list
		if to == "" || used[donor] || !planned || cur.groupChains[to] || !slot || cur.stemUsers[stem] != 1 || groupKind(donor) != groupKind(to) || renamed || cur.stemMisshapen(stem) {
			continue
		}
		out[to] = append(out[to], donor)
	}
	return out
}

// stemMisshapen tells whether a set of the stem has a definition its kind does not call for: an
// edit would keep it, and its elements would not mean what the new group's name says.
func (st state) stemMisshapen(stem string) bool {
	for _, is6 := range []bool{false, true} {
		for _, set := range groupSetNames(stem, is6) {
			if st.misshapen[set] {
				return true
			}
		}
	}
	return false
}

// groupKind is a group name without its hash: direction and audit-ness ("in", "out-audit").
func groupKind(name string) string {
	if i := strings.LastIndexByte(name, '-'); i >= 0 {
		return name[:i]
	}
	return name
}

// inPlaceEdits chooses the groups to edit in place: for each new group with donors, the donor
// whose sets differ least from it, if editing them costs no more elements than building it;
// the cheapest edits first, as many as one transaction carries (it also carries the switch).
// The edit is a diff against what the donor's sets hold: with Verify, the elements read back;
// without, what its name stands for when known (a group of the last pass: the sets are trusted,
// as those of every group are without Verify; an element they lack makes the kernel refuse the
// edit, and the group is built instead), else the elements read from the kernel.
func (w *writer) inPlaceEdits(bt *nftables.Table, want desired, cur state, final map[string]map[int]string, known func(string) (group, bool)) (map[string]*inPlaceEdit, error) {
	type option struct {
		name string
		e    *inPlaceEdit
	}
	var options []option
	candidates := donorCandidates(want, cur, final)
	for _, name := range slices.Sorted(maps.Keys(candidates)) {
		g := want.groups[name]
		var best *inPlaceEdit
		for _, donor := range candidates[name] {
			e, err := w.editOf(bt, cur, donor, g, known)
			if err != nil {
				return nil, err
			}
			if best == nil || e.cost < best.cost {
				best = e
			}
		}
		if best.cost <= g.group.elements() {
			options = append(options, option{name, best})
		}
	}
	slices.SortStableFunc(options, func(a, b option) int { return cmp.Compare(a.e.cost, b.e.cost) })
	edits := map[string]*inPlaceEdit{}
	total := 0
	for _, o := range options {
		if total+o.e.cost > w.maxPerTransaction {
			continue
		}
		total += o.e.cost
		edits[o.name] = o.e
	}
	return edits, nil
}

// editOf is the edit that turns donor's sets into g's.
func (w *writer) editOf(bt *nftables.Table, cur state, donor string, g plannedGroup, known func(string) (group, bool)) (*inPlaceEdit, error) {
	e := &inPlaceEdit{donor: donor, stem: cur.groupStems[donor]}
	planned := map[string]packedSet{}
	for _, p := range packGroupSets(bt, e.stem, g.group, true) {
		planned[p.set.Name] = p
	}
	held := map[string]packedSet{}
	if dg, ok := known(donor); ok {
		for _, p := range packGroupSets(bt, e.stem, dg, true) {
			held[p.set.Name] = p
		}
	}
	for _, is6 := range []bool{false, true} {
		for _, name := range groupSetNames(e.stem, is6) {
			s, want := planned[name]
			have := slices.Contains(cur.sets, name)
			switch {
			case want && have:
				var del, add []nftables.SetElement
				if els, read := cur.setElements[name]; read {
					del, add = intervalDiff(els, s.elements())
				} else if h, ok := held[name]; ok {
					del, add = packedDiff(h, s)
				} else {
					els, err := w.c.GetSetElements(&nftables.Set{Table: bt, Name: name})
					if err != nil {
						return nil, fmt.Errorf("read set %s: %w", name, err)
					}
					del, add = intervalDiff(els, s.elements())
				}
				e.sets = append(e.sets, setEdit{set: s.set, del: del, add: add})
				e.cost += len(del) + len(add)
			case want:
				e.sets = append(e.sets, setEdit{set: s.set, add: s.elements(), create: true})
				e.cost += s.len()
			case have:
				e.sets = append(e.sets, setEdit{set: &nftables.Set{Table: bt, Name: name}, remove: true})
			}
		}
	}
	return e, nil
}

// packedDiff is intervalDiff of two packings of one set (records of one size): the records are
// sorted by index and merged, so that no element is made but those that change. Pure.
func packedDiff(have, want packedSet) (del, add []nftables.SetElement) {
	h, w := sortedRecords(have), sortedRecords(want)
	for i, j := 0, 0; i < len(h) || j < len(w); {
		c := 0
		switch {
		case j == len(w):
			c = -1
		case i == len(h):
			c = 1
		default:
			c = bytes.Compare(have.rec(h[i]), want.rec(w[j]))
		}
		switch {
		case c < 0:
			del = append(del, have.element(h[i]))
			i++
		case c > 0:
			add = append(add, want.element(w[j]))
			j++
		default:
			i, j = i+1, j+1
		}
	}
	return del, add
}

// sortedRecords are the indexes of p's records in the order of their bytes.
func sortedRecords(p packedSet) []int {
	idx := make([]int, p.len())
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int { return bytes.Compare(p.rec(a), p.rec(b)) })
	return idx
}

// intervalDiff returns the elements of have that want lacks and those of want that have lacks,
// by their bounds (Key and KeyEnd: an interval set's element is its range). Pure.
func intervalDiff(have, want []nftables.SetElement) (del, add []nftables.SetElement) {
	long := func(e nftables.SetElement) bool { return len(e.Key) > maxBounds || len(e.KeyEnd) > maxBounds }
	if slices.ContainsFunc(have, long) || slices.ContainsFunc(want, long) {
		return diffBy(have, want, func(e nftables.SetElement) string { return string(e.Key) + "\x00" + string(e.KeyEnd) })
	}
	return diffBy(have, want, boundsOf)
}

// bounds is an element of a group set by its key and key end, as a map key that costs no
// allocation: a group set's bounds have at most 24 bytes (an IPv6 address, a protocol and a port,
// each padded to 32 bits). intervalDiff takes longer ones (no group set's) by a string.
type bounds struct {
	key, end       [maxBounds]byte
	keyLen, endLen uint8
}

const maxBounds = 24

func boundsOf(e nftables.SetElement) bounds {
	var b bounds
	b.keyLen, b.endLen = uint8(copy(b.key[:], e.Key)), uint8(copy(b.end[:], e.KeyEnd))
	return b
}

// queueEdit queues the set changes of an edit and the new group's chain (in the switch's
// transaction: the donor's ports move to the chain in it, and the donor's chain goes at its end).
func (w *writer) queueEdit(bt *nftables.Table, name string, g plannedGroup, e *inPlaceEdit) error {
	for _, se := range e.sets {
		if se.remove {
			continue
		}
		if se.create {
			if err := w.c.AddSet(se.set, nil); err != nil {
				return fmt.Errorf("policy set %s: %w", se.set.Name, err)
			}
		}
		if err := deleteElements(w.c, se.set, se.del); err != nil {
			return err
		}
		if err := addElements(w.c, se.set, se.add); err != nil {
			return err
		}
		w.queued += len(se.del) + len(se.add)
	}
	w.replaceChain(&nftables.Chain{Table: bt, Name: name}, groupRules(name, g.stem, g.dir, g.group, g.audit))
	return nil
}
