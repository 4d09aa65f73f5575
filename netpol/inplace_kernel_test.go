package netpol

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/kubenet-dev/kubenet/internal/nft"
	"github.com/kubenet-dev/kubenet/internal/policyrules"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

// TestSetEditInOneTransaction: what an edit in place asks of this kernel. In one transaction, an
// interval set (rbtree: one address field) and a concatenated interval set (pipapo: address .
// protocol, as the groups' sets) take the deletion of ranges and the addition of a range that
// overlaps them (a range that grows, shrinks or moves) or merges two of them, in IPv4 and IPv6:
// the transaction is accepted and the set holds exactly the new ranges.
func TestSetEditInOneTransaction(t *testing.T) {
	n := nettest.NewNS(t)
	type rng struct{ first, last string }
	for _, tc := range []struct {
		name      string
		have, del []rng
		add       []rng
	}{
		{"v4 range grows over the one deleted", []rng{{"10.0.0.0", "10.0.0.255"}, {"10.0.9.1", "10.0.9.1"}}, []rng{{"10.0.0.0", "10.0.0.255"}}, []rng{{"10.0.0.0", "10.0.1.255"}}},
		{"v4 range shrinks", []rng{{"10.0.0.0", "10.0.1.255"}}, []rng{{"10.0.0.0", "10.0.1.255"}}, []rng{{"10.0.0.128", "10.0.0.200"}}},
		{"v4 range moves over the one deleted", []rng{{"10.0.0.0", "10.0.0.255"}}, []rng{{"10.0.0.0", "10.0.0.255"}}, []rng{{"10.0.0.128", "10.0.1.127"}}},
		{"v4 two ranges merged", []rng{{"10.0.0.0", "10.0.0.9"}, {"10.0.0.20", "10.0.0.29"}, {"10.0.0.40", "10.0.0.40"}}, []rng{{"10.0.0.0", "10.0.0.9"}, {"10.0.0.20", "10.0.0.29"}}, []rng{{"10.0.0.0", "10.0.0.35"}}},
		{"v6 range grows over the one deleted", []rng{{"fd00::", "fd00::ff"}, {"fd00:9::1", "fd00:9::1"}}, []rng{{"fd00::", "fd00::ff"}}, []rng{{"fd00::", "fd00::1:ffff"}}},
		{"v6 range moves over the one deleted", []rng{{"fd00::100", "fd00::1ff"}}, []rng{{"fd00::100", "fd00::1ff"}}, []rng{{"fd00::180", "fd00::27f"}}},
		{"v6 two ranges merged", []rng{{"fd00::", "fd00::9"}, {"fd00::20", "fd00::29"}}, []rng{{"fd00::", "fd00::9"}, {"fd00::20", "fd00::29"}}, []rng{{"fd00::", "fd00::2f"}}},
	} {
		for _, concat := range []bool{false, true} {
			kind := "rbtree"
			if concat {
				kind = "pipapo"
			}
			t.Run(kind+" "+tc.name, func(t *testing.T) {
				is6 := strings.Contains(tc.have[0].first, ":")
				toRanges := func(rs []rng) []policyrules.Range {
					var out []policyrules.Range
					for _, r := range rs {
						out = append(out, policyrules.Range{First: netip.MustParseAddr(r.first), Last: netip.MustParseAddr(r.last)})
					}
					return out
				}
				bt := &nftables.Table{Family: nftables.TableFamilyBridge, Name: "edit-test"}
				set := &nftables.Set{Table: bt, Name: "s", Interval: true, KeyType: addrType(is6)}
				elements := func(rs []policyrules.Range) []nftables.SetElement {
					var out []nftables.SetElement
					for _, r := range rs {
						if concat {
							out = append(out, nftables.SetElement{Key: append(r.First.AsSlice(), pad4([]byte{0})...), KeyEnd: append(r.Last.AsSlice(), pad4([]byte{255})...)})
							continue
						}
						out = append(out, nftables.SetElement{Key: r.First.AsSlice()}, nftables.SetElement{Key: r.Last.Next().AsSlice(), IntervalEnd: true})
					}
					return out
				}
				if concat {
					set = &nftables.Set{Table: bt, Name: "s", Interval: true, Concatenation: true, KeyType: nftables.MustConcatSetType(addrType(is6), nftables.TypeInetProto)}
				}
				var got []policyrules.Range
				nettest.Do(t, n, func() error {
					c, err := nftables.New()
					if err != nil {
						return err
					}
					c.DelTable(bt)
					_ = c.Flush() // none the first time
					c.AddTable(bt)
					if err := c.AddSet(set, elements(toRanges(tc.have))); err != nil {
						return err
					}
					if err := c.Flush(); err != nil {
						return fmt.Errorf("the set before: %w", err)
					}
					// The edit: deletions then additions, one transaction.
					if err := c.SetDeleteElements(set, elements(toRanges(tc.del))); err != nil {
						return err
					}
					if err := c.SetAddElements(set, elements(toRanges(tc.add))); err != nil {
						return err
					}
					if err := c.Flush(); err != nil {
						return fmt.Errorf("the edit's transaction: %w", err)
					}
					els, err := c.GetSetElements(set)
					if err != nil {
						return err
					}
					if concat {
						for _, el := range els {
							e, err := decodeElement(el, is6, kindAny)
							if err != nil {
								return err
							}
							got = append(got, e.Peer)
						}
					} else {
						got = intervalRanges(els, is6)
					}
					return nil
				})
				want := toRanges(tc.add)
				for _, r := range toRanges(tc.have) {
					if !slices.Contains(toRanges(tc.del), r) {
						want = append(want, r)
					}
				}
				slices.SortFunc(got, func(a, b policyrules.Range) int { return a.First.Compare(b.First) })
				slices.SortFunc(want, func(a, b policyrules.Range) int { return a.First.Compare(b.First) })
				if !slices.Equal(got, want) {
					t.Errorf("after the edit the set holds %v, want %v", got, want)
				}
			})
		}
	}
}

// keptGroup is what the kernel holds of a port's ingress group: its chain, the sets it looks up
// and their elements.
type keptGroup struct {
	chain    string
	sets     []string
	elements map[string][]nftables.SetElement
}

func (n *bridgedNode) ingressGroup(t *testing.T, port int) keptGroup {
	t.Helper()
	in := n.inspect(t)
	g := keptGroup{chain: in.Ports[port].Ingress, elements: map[string][]nftables.SetElement{}}
	if d := in.Groups[g.chain].Damage; len(d) > 0 {
		t.Errorf("group %s: damage %v", g.chain, d)
	}
	g.sets = in.Groups[g.chain].Sets
	nettest.Do(t, n.node, func() error {
		c, err := nftables.New()
		if err != nil {
			return err
		}
		for _, s := range g.sets {
			if g.elements[s], err = c.GetSetElements(&nftables.Set{Table: BridgeTable(n.network), Name: s}); err != nil {
				return err
			}
		}
		return nil
	})
	return g
}

// TestInPlaceEdit: a pod's changed allow list takes its old group's sets over when nobody else
// has the old group (the same set names, the elements diffed, a new chain), and then allows
// exactly the new list's peers; a set kind the new list needs is made and one it does not is
// deleted in the same transaction; a group another pod keeps is not edited, and that pod keeps
// its rules; of several groups that go, the one whose sets differ least is the donor, and the
// others go; an edit bigger than a transaction is not made, the group is built.
func TestInPlaceEdit(t *testing.T) {
	n := newBridgedNode(t)
	a, b, c := n.pods["a"], n.pods["b"], n.pods["c"]
	any := func(peers ...netip.Addr) []policyrules.Entry {
		var out []policyrules.Entry
		for _, p := range peers {
			out = append(out, policyrules.Entry{Peer: policyrules.Single(p)})
		}
		return out
	}
	ingress := func(entries ...[]policyrules.Entry) policyrules.Direction {
		return policyrules.Direction{Isolated: true, Allow: slices.Concat(entries...)}
	}

	// b allows a on 8080, both families.
	rs := with(n.open(), b.port, allowFrom(tcp8080, a.v4, a.v6), policyrules.Direction{})
	n.apply(t, rs, Options{})
	before := n.ingressGroup(t, b.port)

	// b's list: c instead of a's IPv4 address.
	rs = with(rs, b.port, allowFrom(tcp8080, c.v4, a.v6), policyrules.Direction{})
	res := n.apply(t, rs, Options{})
	after := n.ingressGroup(t, b.port)
	if res.EditedGroups != 1 || res.NewGroups != 0 || res.RemovedGroups != 0 {
		t.Errorf("b's list changed: %+v, want its group edited in place", res)
	}
	if after.chain == before.chain || !slices.Equal(after.sets, before.sets) {
		t.Errorf("b's group: chain %s sets %v before, chain %s sets %v after: want a new chain on the same sets", before.chain, before.sets, after.chain, after.sets)
	}
	v4 := pointsSetName(strings.TrimSuffix(before.sets[0], "-points-ipv4"), false)
	del, add := intervalDiff(before.elements[v4], after.elements[v4])
	v6 := pointsSetName(strings.TrimSuffix(v4, "-points-ipv4"), true)
	if len(del) != 1 || len(add) != 1 || len(after.elements[v6]) != 1 || !sameElements(after.elements[v6], before.elements[v6]) {
		t.Errorf("elements of %s: %d deleted and %d added, want a's address replaced by c's; the IPv6 set unchanged", v4, len(del), len(add))
	}
	if objs := n.groupObjects(t); slices.Contains(objs, before.chain) {
		t.Errorf("the old chain %s is still there: %v", before.chain, objs)
	}
	n.expectTCP(t, "edited: c → b (new peer)", c.ns, b.v4, 8080, true)
	n.expectTCP(t, "edited: a → b v4 (removed peer)", a.ns, b.v4, 8080, false)
	n.expectTCP(t, "edited: a → b v6 (kept peer)", a.ns, b.v6, 8080, true)
	n.expectTCP(t, "edited: x → b (never a peer)", n.x, b.v4, 8080, false)

	// b's list: c on 8080 and a's IPv6 address on every port: points-ipv6 goes, hosts-ipv6 comes.
	before = after
	rs = with(rs, b.port, ingress(allowFrom(tcp8080, c.v4).Allow, any(a.v6)), policyrules.Direction{})
	res = n.apply(t, rs, Options{})
	after = n.ingressGroup(t, b.port)
	stem := strings.TrimSuffix(before.sets[0], "-points-ipv4")
	if res.EditedGroups != 1 || res.NewGroups != 0 || !slices.Equal(after.sets, []string{pointsSetName(stem, false), hostsSetName(stem, true)}) {
		t.Errorf("b's list with a set kind more and one less: %+v, sets %v, want the group edited, the sets of slot %s", res, after.sets, stem)
	}
	if objs := n.groupObjects(t); slices.Contains(objs, pointsSetName(stem, true)) {
		t.Errorf("the set kind b's list no longer needs is still there: %v", objs)
	}
	n.expectTCP(t, "kinds: a → b v6 on 8080", a.ns, b.v6, 8080, true)
	n.expectTCP(t, "kinds: c → b", c.ns, b.v4, 8080, true)
	n.expectTCP(t, "kinds: a → b v4", a.ns, b.v4, 8080, false)

	// b and c share a list; then only b's changes: their group stays for c, untouched.
	shared := allowFrom(tcp8080, a.v4, x4)
	rs = with(with(rs, b.port, shared, policyrules.Direction{}), c.port, shared, policyrules.Direction{})
	n.apply(t, rs, Options{})
	cBefore := n.ingressGroup(t, c.port)
	rs = with(rs, b.port, allowFrom(tcp8080, a.v6), policyrules.Direction{})
	res = n.apply(t, rs, Options{})
	cAfter := n.ingressGroup(t, c.port)
	if res.EditedGroups != 0 || res.NewGroups != 1 || res.RemovedGroups != 0 {
		t.Errorf("one of two pods of a group moves: %+v, want a new group and none edited", res)
	}
	if cAfter.chain != cBefore.chain || !slices.Equal(cAfter.sets, cBefore.sets) || fmt.Sprint(cAfter.elements) != fmt.Sprint(cBefore.elements) {
		t.Errorf("c's group changed: %+v before, %+v after", cBefore, cAfter)
	}
	if n.ingressGroup(t, b.port).chain == cAfter.chain {
		t.Errorf("b is still in c's group")
	}
	n.expectTCP(t, "shared: a → c", a.ns, c.v4, 8080, true)
	n.expectTCP(t, "shared: x → c", n.x, c.v4, 8080, true)
	n.expectTCP(t, "shared: b → c", b.ns, c.v4, 8080, false)
	n.expectTCP(t, "moved: a → b v6", a.ns, b.v6, 8080, true)
	n.expectTCP(t, "moved: a → b v4", a.ns, b.v4, 8080, false)

	// Two groups go to one new list: b's differs from it by a set kind, c's by every element.
	rs = with(with(rs, b.port, allowFrom(tcp8080, a.v4, x4, a.v6), policyrules.Direction{}), c.port, allowFrom(tcp8080, b.v4, b.v6), policyrules.Direction{})
	n.apply(t, rs, Options{})
	bBefore, cBefore := n.ingressGroup(t, b.port), n.ingressGroup(t, c.port)
	rs = with(with(rs, b.port, allowFrom(tcp8080, a.v4, x4), policyrules.Direction{}), c.port, allowFrom(tcp8080, a.v4, x4), policyrules.Direction{})
	res = n.apply(t, rs, Options{})
	bAfter, cAfter := n.ingressGroup(t, b.port), n.ingressGroup(t, c.port)
	bStem := strings.TrimSuffix(bBefore.sets[0], "-points-ipv4")
	if res.EditedGroups != 1 || res.NewGroups != 0 || res.RemovedGroups != 1 || bAfter.chain != cAfter.chain || !slices.Equal(bAfter.sets, []string{pointsSetName(bStem, false)}) {
		t.Errorf("two donors: %+v, the new group's sets %v, want b's old group (sets %v) edited, c's (sets %v) removed", res, bAfter.sets, bBefore.sets, cBefore.sets)
	}
	objs := n.groupObjects(t)
	for _, o := range append([]string{cBefore.chain, bBefore.chain, pointsSetName(bStem, true)}, cBefore.sets...) {
		if slices.Contains(objs, o) {
			t.Errorf("%s is still there: %v", o, objs)
		}
	}
	n.expectTCP(t, "donors: a → c", a.ns, c.v4, 8080, true)
	n.expectTCP(t, "donors: b → c", b.ns, c.v4, 8080, false)
	n.expectTCP(t, "donors: a → b", a.ns, b.v4, 8080, true)
	n.expectTCP(t, "donors: a → b v6", a.ns, b.v6, 8080, false)
	if left := n.unusedGroupObjects(t); len(left) > 0 {
		t.Errorf("group objects no port uses: %v", left)
	}

	// An edit bigger than a transaction (here capped at one element; this one deletes one and
	// adds one): the group is built instead.
	rs = with(with(rs, b.port, allowFrom(tcp8080, a.v4, c.v4), policyrules.Direction{}), c.port, policyrules.Direction{}, policyrules.Direction{})
	n.apply(t, rs, Options{})
	bBefore = n.ingressGroup(t, b.port)
	rs = with(rs, b.port, allowFrom(tcp8080, a.v4, x4), policyrules.Direction{})
	res = n.apply(t, rs, Options{transactionElements: 1})
	if bAfter = n.ingressGroup(t, b.port); res.EditedGroups != 0 || res.NewGroups != 1 || res.RemovedGroups != 1 || slices.Equal(bAfter.sets, bBefore.sets) {
		t.Errorf("an edit over the transaction's size: %+v, sets %v before and %v after, want the group built in a slot of its own", res, bBefore.sets, bAfter.sets)
	}
	n.expectTCP(t, "built: x → b", n.x, b.v4, 8080, true)
	n.expectTCP(t, "built: c → b", c.ns, b.v4, 8080, false)
}

// oldLayoutName is the name the layout before slots gave a group (a hash of its elements'
// text), whose sets were named after it.
func oldLayoutName(g group, prefix string) string {
	var b strings.Builder
	for _, rs := range [][]policyrules.Range{g.any4, g.any6} {
		for _, r := range rs {
			fmt.Fprintf(&b, "a%s;", r)
		}
	}
	for _, bs := range [][]box{g.ports4, g.ports6} {
		for _, x := range bs {
			fmt.Fprintf(&b, "p%s:%s;", x.addrs, x.ports)
		}
	}
	sum := sha256.Sum256([]byte(b.String()))
	return prefix + "-" + hex.EncodeToString(sum[:8])
}

// rewriteGroups rewrites the network's groups in one transaction, as an older layout wrote
// them: as gives each group (in name order) its chain's name, the stem of its sets and what they
// hold; the map elements go to the new chains, the groups' chains and sets go.
func (n *bridgedNode) rewriteGroups(t *testing.T, as func(i int, name string, ig policyrules.InstalledGroup) (chain, stem string, g group)) {
	t.Helper()
	in := n.inspect(t)
	nettest.Do(t, n.node, func() error {
		c, err := nftables.New()
		if err != nil {
			return err
		}
		bt := BridgeTable(n.network)
		renamed := map[string]string{}
		for i, name := range slices.Sorted(maps.Keys(in.Groups)) {
			ig := in.Groups[name]
			dir := egressDir
			if ig.Ingress {
				dir = ingressDir
			}
			o, stem, g := as(i, name, ig)
			renamed[name] = o
			for _, s := range groupSets(bt, stem, g, true) {
				if err := c.AddSet(s.set, s.elements); err != nil {
					return err
				}
			}
			nft.ReplaceChain(c, &nftables.Chain{Table: bt, Name: o}, groupRules(o, stem, dir, g, ig.Audit))
		}
		for _, m := range []string{MapEgress, MapIngress} {
			set := &nftables.Set{Table: bt, Name: m, IsMap: true, KeyType: nftables.TypeIFIndex, DataType: nftables.TypeVerdict}
			for port, p := range in.Ports {
				chain := p.Ingress
				if m == MapEgress {
					chain = p.Egress
				}
				if o, ok := renamed[chain]; ok {
					if err := c.SetDeleteElements(set, []nftables.SetElement{{Key: portKey(port)}}); err != nil {
						return err
					}
					if err := c.SetAddElements(set, []nftables.SetElement{{Key: portKey(port), VerdictData: &expr.Verdict{Kind: expr.VerdictGoto, Chain: o}}}); err != nil {
						return err
					}
				}
			}
		}
		for name, ig := range in.Groups {
			c.DelChain(&nftables.Chain{Table: bt, Name: name})
			for _, s := range ig.Sets {
				c.DelSet(&nftables.Set{Table: bt, Name: s})
			}
		}
		return c.Flush()
	})
}

// toOldLayout rewrites the network's groups as the layout before slots had them, in one
// transaction: each group's chain and sets named after the old hash of its elements, the map
// elements going there. It returns the old groups' names.
func (n *bridgedNode) toOldLayout(t *testing.T) []string {
	t.Helper()
	var old []string
	n.rewriteGroups(t, func(_ int, name string, ig policyrules.InstalledGroup) (string, string, group) {
		g, _ := canonical(ig.Entries, maxGroupCost)
		o := oldLayoutName(g, groupKind(name))
		old = append(old, o)
		return o, o, g
	})
	slices.Sort(old)
	return old
}

// TestUpgradeFromHashNamedSets: tables written by the layout before slots (sets named after
// their group's hash) are taken over by the first Apply: every old group replaced by a new one
// built aside (none edited: the old sets never change under a chain that is in use), nothing of
// the old layout left, every pod's traffic as its policies say before and after.
func TestUpgradeFromHashNamedSets(t *testing.T) {
	n := newBridgedNode(t)
	a, b, c := n.pods["a"], n.pods["b"], n.pods["c"]
	rs := n.inspectRuleset()
	n.apply(t, rs, Options{})
	probe := func(when string) {
		n.expectTCP(t, when+": a → b 8080", a.ns, b.v4, 8080, true)
		n.expectTCP(t, when+": c → b 8080", c.ns, b.v4, 8080, false)
		n.expectTCP(t, when+": x → b 8080", n.x, b.v4, 8080, true)
		n.expectTCP(t, when+": a → c 8080 (a's egress)", a.ns, c.v4, 8080, false)
	}
	old := n.toOldLayout(t)
	objs := n.groupObjects(t)
	for _, o := range old {
		if !slices.Contains(objs, o) {
			t.Fatalf("old layout: chain %s missing from %v", o, objs)
		}
	}
	for _, o := range objs {
		if stem, ok := setStem(o); ok && !slices.Contains(old, stem) {
			t.Fatalf("old layout: set %s is not named after its group", o)
		}
	}
	probe("old layout")

	res := n.apply(t, rs, Options{})
	if res.NewGroups != len(old) || res.RemovedGroups != len(old) || res.EditedGroups != 0 {
		t.Errorf("first Apply on the old layout: %+v, want its %d groups replaced by new ones", res, len(old))
	}
	objs = n.groupObjects(t)
	for _, o := range objs {
		if slices.ContainsFunc(old, func(name string) bool { return strings.HasPrefix(o, name) }) {
			t.Errorf("%s of the old layout is still there: %v", o, objs)
		}
		if stem, ok := setStem(o); ok {
			if _, slot := slotOf(stem); !slot {
				t.Errorf("set %s is not a slot's", o)
			}
		}
	}
	if left := n.unusedGroupObjects(t); len(left) > 0 {
		t.Errorf("group objects no port uses: %v", left)
	}
	in := n.inspect(t)
	for name, g := range in.Groups {
		if len(g.Damage) > 0 {
			t.Errorf("group %s after the upgrade: %v", name, g.Damage)
		}
	}
	probe("upgraded")
	if again := n.apply(t, rs, Options{Verify: true}); again.Changed() {
		t.Errorf("Apply after the upgrade changed something: %+v", again)
	}
}

// TestInPlaceEditOfDamagedDonor: an Applier that knows a donor's list from its last pass trusts
// its sets without Verify. An element deleted behind its back that the edit deletes too makes
// the kernel refuse the edit: the group is built instead, in the same pass, and the pods get
// their new list. One the edit keeps stays missing until a Verify pass, which puts it back.
func TestInPlaceEditOfDamagedDonor(t *testing.T) {
	n := newBridgedNode(t)
	a, b, c := n.pods["a"], n.pods["b"], n.pods["c"]
	applier := NewApplier()
	apply := func(rs policyrules.Ruleset, opt Options) policyrules.Applied {
		t.Helper()
		var res policyrules.Applied
		rs.PodCIDRs, rs.NodeAddrs = []netip.Prefix{gw4.Masked(), gw6.Masked()}, []netip.Addr{gw4.Addr(), gw6.Addr()}
		nettest.Do(t, n.node, func() (err error) { res, err = applier.Apply(n.network, rs, opt); return err })
		return res
	}
	deleteElement := func(port int, peer netip.Addr) {
		t.Helper()
		set := n.groupSet(t, n.ingressGroup(t, port).chain, "-points-ipv4")
		nftIn(t, n.node, "delete", "element", "bridge", TableName(n.network), set, fmt.Sprintf("{ %s . tcp . 8080 }", peer))
	}

	rs := with(n.open(), b.port, allowFrom(tcp8080, a.v4, c.v4, x4), policyrules.Direction{})
	apply(rs, Options{})
	deleteElement(b.port, a.v4)
	rs = with(rs, b.port, allowFrom(tcp8080, c.v4, x4), policyrules.Direction{}) // the edit deletes a
	if res := apply(rs, Options{}); res.EditedGroups != 0 || res.NewGroups != 1 || res.RemovedGroups != 1 || res.MapChanges != 2 {
		t.Errorf("edit of a donor that lacks an element the edit deletes: %+v, want the group built instead (b's map element replaced once)", res)
	}
	if g := n.inspect(t).Groups[n.ingressGroup(t, b.port).chain]; len(g.Damage) > 0 {
		t.Errorf("the group built instead: %v", g.Damage)
	}
	n.expectTCP(t, "built instead: c → b", c.ns, b.v4, 8080, true)
	n.expectTCP(t, "built instead: a → b", a.ns, b.v4, 8080, false)

	deleteElement(b.port, c.v4)
	rs = with(rs, b.port, allowFrom(tcp8080, c.v4, x4, a.v6), policyrules.Direction{}) // the edit keeps c
	if res := apply(rs, Options{}); res.EditedGroups != 1 {
		t.Errorf("edit of a donor that lacks an element the edit keeps: %+v, want the group edited", res)
	}
	n.expectTCP(t, "edited, c still missing: c → b", c.ns, b.v4, 8080, false)
	if res := apply(rs, Options{Verify: true}); res.RepairedGroups != 1 {
		t.Errorf("Verify after it: %+v, want the group repaired", res)
	}
	n.expectTCP(t, "repaired: c → b", c.ns, b.v4, 8080, true)
	n.expectTCP(t, "repaired: a → b v6", a.ns, b.v6, 8080, true)
}
