package netpol

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/google/nftables"

	"github.com/kubenet-dev/kubenet/internal/nft"
	"github.com/kubenet-dev/kubenet/internal/policyrules"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

// pointChainAt rewrites a group chain's rules, as another tool could, to look up the sets of
// slot stem instead of its own (the rules otherwise as Apply writes them for the chain's list).
func (n *bridgedNode) pointChainAt(t *testing.T, chain, stem string) {
	t.Helper()
	ig := n.inspect(t).Groups[chain]
	g, _ := canonical(ig.Entries, maxGroupCost)
	dir := egressDir
	if ig.Ingress {
		dir = ingressDir
	}
	nettest.Do(t, n.node, func() error {
		c, err := nftables.New()
		if err != nil {
			return err
		}
		nft.ReplaceChain(c, &nftables.Chain{Table: BridgeTable(n.network), Name: chain}, groupRules(chain, stem, dir, g, ig.Audit))
		return c.Flush()
	})
}

// applyTwoGroups applies a ruleset of two groups of the same set kinds, b allowing a and c
// allowing x on TCP 8080, and returns it and the two groups' chains.
func (n *bridgedNode) applyTwoGroups(t *testing.T) (rs policyrules.Ruleset, bChain, cChain string) {
	t.Helper()
	a, b, c := n.pods["a"], n.pods["b"], n.pods["c"]
	rs = with(with(n.open(), b.port, allowFrom(tcp8080, a.v4), policyrules.Direction{}), c.port, allowFrom(tcp8080, x4), policyrules.Direction{})
	n.apply(t, rs, Options{})
	d := groupNames(t, n)
	return rs, d[MapIngress][b.port], d[MapIngress][c.port]
}

// expectTwoGroups probes twoGroups' traffic: each of b and c allows its peer, not the other's.
func (n *bridgedNode) expectTwoGroups(t *testing.T, when string) {
	t.Helper()
	a, b, c := n.pods["a"], n.pods["b"], n.pods["c"]
	n.expectTCP(t, when+": a → b", a.ns, b.v4, 8080, true)
	n.expectTCP(t, when+": x → b", n.x, b.v4, 8080, false)
	n.expectTCP(t, when+": x → c", n.x, c.v4, 8080, true)
	n.expectTCP(t, when+": a → c", a.ns, c.v4, 8080, false)
}

// expectUndamaged fails for every group Inspect finds damaged.
func (n *bridgedNode) expectUndamaged(t *testing.T, when string) {
	t.Helper()
	for name, g := range n.inspect(t).Groups {
		if len(g.Damage) > 0 {
			t.Errorf("%s: group %s: %v", when, name, g.Damage)
		}
	}
}

// TestChainLookingUpAnotherGroupsSets: another tool rewrites a group's chain to look up another
// group's sets (two chains then share a slot). The next pass, with or without Verify, gives each
// group its own list again: each pod allows exactly its peers, Inspect sees no damage, and a
// Verify pass after it changes nothing (a pass that rewrote the shared sets with one group's
// list would hand it to the other group's pods, and the next Verify pass back, for ever).
func TestChainLookingUpAnotherGroupsSets(t *testing.T) {
	for _, verify := range []bool{false, true} {
		name := "without Verify"
		if verify {
			name = "with Verify"
		}
		t.Run(name, func(t *testing.T) {
			n := newBridgedNode(t)
			b := n.pods["b"]
			rs, bChain, cChain := n.applyTwoGroups(t)
			cStem, _ := setStem(n.groupSet(t, cChain, "-points-ipv4"))
			n.pointChainAt(t, bChain, cStem)
			n.expectTCP(t, "tampered: x → b (c's peer)", n.x, b.v4, 8080, true)

			res := n.apply(t, rs, Options{Verify: verify})
			n.expectTwoGroups(t, "repaired")
			n.expectUndamaged(t, fmt.Sprintf("after the repair (%+v)", res))
			if again := n.apply(t, rs, Options{Verify: true}); again.Changed() {
				t.Errorf("a Verify pass after the repair changed something: %+v", again)
			}
			n.expectTwoGroups(t, "verified again")
			if left := n.unusedGroupObjects(t); len(left) > 0 {
				t.Errorf("group objects no port uses: %v", left)
			}
		})
	}
}

// recreateSet swaps set s (by its name) of ingress group chain for s, holding els, as another
// tool could: the chain's rules out, the set deleted and made anew, the rules back as Apply
// writes them for the group's list with the sets of stem.
func (n *bridgedNode) recreateSet(t *testing.T, chain, stem string, s *nftables.Set, els []nftables.SetElement) {
	t.Helper()
	ig := n.inspect(t).Groups[chain]
	g, _ := canonical(ig.Entries, maxGroupCost)
	bt := BridgeTable(n.network)
	nettest.Do(t, n.node, func() error {
		c, err := nftables.New()
		if err != nil {
			return err
		}
		ch := &nftables.Chain{Table: bt, Name: chain}
		c.FlushChain(ch)
		c.DelSet(&nftables.Set{Table: bt, Name: s.Name})
		if err := c.Flush(); err != nil {
			return fmt.Errorf("the chain's rules and its set out: %w", err)
		}
		s.Table = bt
		if err := c.AddSet(s, els); err != nil {
			return err
		}
		nft.ReplaceChain(c, ch, groupRules(chain, stem, ingressDir, g, false))
		return c.Flush()
	})
}

// TestRepairOfARecreatedSet: another tool swaps a group's set for one of the same name and key
// but other properties (a hash set instead of an interval one, or an interval set of one
// element at most), holding a peer the group does not allow, and points the chain at it again.
// A Verify pass gives the pods their list back (the kernel refuses to redefine a set's
// properties, so the group cannot be rewritten in those sets): never left with the tool's peer,
// and a pass after it changes nothing.
func TestRepairOfARecreatedSet(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  func(name string) *nftables.Set
		els  func(peers ...netip.Addr) []nftables.SetElement
	}{
		{"hash set", func(name string) *nftables.Set {
			return &nftables.Set{Name: name, Concatenation: true, KeyType: nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetProto, nftables.TypeInetService)}
		}, func(peers ...netip.Addr) []nftables.SetElement {
			var out []nftables.SetElement
			for _, p := range peers {
				out = append(out, nftables.SetElement{Key: portsKey(p, policyrules.TCP, 8080)})
			}
			return out
		}},
		{"interval set of one element", func(name string) *nftables.Set {
			return &nftables.Set{Name: name, Interval: true, Concatenation: true, Size: 1, KeyType: nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetProto, nftables.TypeInetService)}
		}, func(peers ...netip.Addr) []nftables.SetElement {
			var out []nftables.SetElement
			for _, p := range peers {
				out = append(out, nftables.SetElement{Key: portsKey(p, policyrules.TCP, 8080), KeyEnd: portsKey(p, policyrules.TCP, 8080)})
			}
			return out
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newBridgedNode(t)
			a, b, c := n.pods["a"], n.pods["b"], n.pods["c"]
			rs := with(n.open(), b.port, allowFrom(tcp8080, a.v4, c.v4), policyrules.Direction{})
			n.apply(t, rs, Options{})
			chain := groupNames(t, n)[MapIngress][b.port]
			setName := n.groupSet(t, chain, "-points-ipv4")
			stem, _ := setStem(setName)
			n.recreateSet(t, chain, stem, tc.set(setName), tc.els(x4))
			n.expectTCP(t, "tampered: x → b", n.x, b.v4, 8080, true)

			res := n.apply(t, rs, Options{Verify: true})
			n.expectTCP(t, "repaired: x → b", n.x, b.v4, 8080, false)
			n.expectTCP(t, "repaired: a → b", a.ns, b.v4, 8080, true)
			n.expectTCP(t, "repaired: c → b", c.ns, b.v4, 8080, true)
			if len(res.Refused) > 0 || res.RepairedGroups != 1 {
				t.Errorf("repair: %+v, want b's group repaired", res)
			}
			n.expectUndamaged(t, "after the repair")
			if again := n.apply(t, rs, Options{Verify: true}); again.Changed() {
				t.Errorf("a Verify pass after the repair changed something: %+v", again)
			}
			if left := n.unusedGroupObjects(t); len(left) > 0 {
				t.Errorf("group objects no port uses: %v", left)
			}
		})
	}
}

// applyCrashing applies rs with a new Applier, which opt's simulated crash may stop (an agent
// killed after that transaction); crashed tells whether it did.
func (n *bridgedNode) applyCrashing(t *testing.T, rs policyrules.Ruleset, opt Options) (res policyrules.Applied, crashed bool) {
	t.Helper()
	rs.PodCIDRs, rs.NodeAddrs = []netip.Prefix{gw4.Masked(), gw6.Masked()}, []netip.Addr{gw4.Addr(), gw6.Addr()}
	nettest.Do(t, n.node, func() (err error) {
		defer func() {
			if r := recover(); r != nil {
				if _, ok := r.(simulatedCrash); !ok {
					panic(r)
				}
				crashed, err = true, nil
			}
		}()
		a := NewApplier()
		defer a.Close() // the killed agent's socket closes with it
		res, err = a.Apply(n.network, rs, opt)
		return err
	})
	return res, crashed
}

// expectSettled fails unless the tables are as a pass of rs leaves them: no group damaged,
// nothing no port uses, and a Verify pass of rs changes nothing.
func (n *bridgedNode) expectSettled(t *testing.T, when string, rs policyrules.Ruleset) {
	t.Helper()
	n.expectUndamaged(t, when)
	if left := n.unusedGroupObjects(t); len(left) > 0 {
		t.Errorf("%s: group objects no port uses: %v", when, left)
	}
	if again := n.apply(t, rs, Options{Verify: true}); again.Changed() {
		t.Errorf("%s: a Verify pass changed something: %+v", when, again)
	}
}

// TestCrashBetweenTransactions: an agent killed after any transaction of a pass (builds, the
// switch with its edits, the removal) leaves no pod more open than both its old and its new list
// allow, and the first pass of a new Applier (its memo empty), without Verify, ends with exactly
// the new lists: traffic as they say, Inspect without damage, nothing unused left, and a Verify
// pass after it changes nothing.
func TestCrashBetweenTransactions(t *testing.T) {
	type probe struct {
		src, dst string
	}
	var all []probe
	for _, dst := range []string{"a", "b", "c"} {
		for _, src := range []string{"a", "b", "c", "x"} {
			if src != dst {
				all = append(all, probe{src, dst})
			}
		}
	}
	// old: a allows b; b allows a and c's IPv6 address; c allows x.
	// new: a allows b on both families (an edit that makes a set kind); b allows x and c's IPv6 address (an edit); c allows a and
	// more prefixes (built over several transactions of 4 elements).
	oldAllowed := map[probe]bool{{"b", "a"}: true, {"a", "b"}: true, {"x", "c"}: true}
	newAllowed := map[probe]bool{{"b", "a"}: true, {"x", "b"}: true, {"a", "c"}: true}
	rulesets := func(n *bridgedNode) (policyrules.Ruleset, policyrules.Ruleset) {
		a, b, c := n.pods["a"], n.pods["b"], n.pods["c"]
		old := with(with(with(n.open(), a.port, allowFrom(tcp8080, b.v4), policyrules.Direction{}),
			b.port, allowFrom(tcp8080, a.v4, c.v6), policyrules.Direction{}), c.port, allowFrom(tcp8080, x4), policyrules.Direction{})
		next := with(with(with(n.open(), a.port, allowFrom(tcp8080, b.v4, b.v6), policyrules.Direction{}),
			b.port, allowFrom(tcp8080, x4, c.v6), policyrules.Direction{}), c.port, bigAllow(a.v4, 12), policyrules.Direction{})
		return old, next
	}
	opt := Options{transactionElements: 4}
	for crashAfter := 1; ; crashAfter++ {
		done := false
		t.Run(fmt.Sprintf("after transaction %d", crashAfter), func(t *testing.T) {
			n := newBridgedNode(t)
			nsOf := func(name string) ns.NetNS {
				if name == "x" {
					return n.x
				}
				return n.pods[name].ns
			}
			old, next := rulesets(n)
			n.apply(t, old, opt)
			crashing := opt
			crashing.crashAfter = crashAfter
			res, crashed := n.applyCrashing(t, next, crashing)
			if !crashed {
				if done = true; res.EditedGroups != 2 || res.NewGroups != 1 || res.RemovedGroups != 1 {
					t.Errorf("the pass without a crash: %+v, want a's and b's groups edited, c's built", res)
				}
				return
			}
			for _, p := range all {
				if !oldAllowed[p] && !newAllowed[p] {
					n.expectTCP(t, "crashed: "+p.src+" → "+p.dst+" (neither list allows)", nsOf(p.src), n.pods[p.dst].v4, 8080, false)
				}
			}

			res = n.apply(t, next, opt) // a new Applier, its memo empty
			for _, p := range all {
				n.expectTCP(t, "restarted: "+p.src+" → "+p.dst, nsOf(p.src), n.pods[p.dst].v4, 8080, newAllowed[p])
			}
			n.expectSettled(t, fmt.Sprintf("after the restart's pass (%+v)", res), next)
		})
		if done || t.Failed() || crashAfter > 20 {
			if crashAfter < 3 {
				t.Errorf("the pass had %d transactions, want builds, a switch and a removal", crashAfter-1)
			}
			break
		}
	}
}

// TestTraceReadsTheSetsTheChainLooksUp: Inspect decodes a group from the sets its chain's rules
// look up, which is what the kernel judges by. Another tool adds, next to a group's sets, a set
// of the same slot that no rule looks up, holding a peer: the kernel drops that peer, and so
// must trace (the set is reported as damage). Another tool adds to a group's chain a rule that
// looks up another group's set: the kernel lets that group's peer through, and so must trace,
// with the damage.
func TestTraceReadsTheSetsTheChainLooksUp(t *testing.T) {
	n := newBridgedNode(t)
	a, b, c := n.pods["a"], n.pods["b"], n.pods["c"]
	rs := with(with(n.open(), b.port, allowFrom(tcp8080, a.v4), policyrules.Direction{}), c.port, allowFrom(tcp8080, x4), policyrules.Direction{})
	bt := BridgeTable(n.network)
	trace := func(what string, src netip.Addr, from ns.NetNS, srcPort int, to *testPod, wantDamage string) {
		t.Helper()
		in := n.inspect(t)
		v, err := in.Trace(policyrules.Packet{Src: src, Dst: to.v4, Protocol: policyrules.TCP, Port: 8080}, srcPort, to.port)
		if err != nil {
			t.Fatal(err)
		}
		if err := tcpReach(from, to.v4, 8080, v.Allowed); err != nil {
			t.Errorf("%s: traffic disagrees with trace (allowed %v: %+v): %v", what, v.Allowed, v.Steps, err)
		}
		if damage := fmt.Sprint(in.Groups[in.Ports[to.port].Ingress].Damage); !strings.Contains(damage, wantDamage) {
			t.Errorf("%s: damage %s, want it to say %q", what, damage, wantDamage)
		}
	}

	n.apply(t, rs, Options{})
	bChain, cChain := groupNames(t, n)[MapIngress][b.port], groupNames(t, n)[MapIngress][c.port]
	bStem, _ := setStem(n.groupSet(t, bChain, "-points-ipv4"))
	extra := anySetName(bStem, false)
	nettest.Do(t, n.node, func() error {
		c, err := nftables.New()
		if err != nil {
			return err
		}
		s := groupSets(bt, bStem, group{any4: []policyrules.Range{policyrules.Single(x4)}}, true)[0]
		if err := c.AddSet(s.set, s.elements); err != nil {
			return err
		}
		return c.Flush()
	})
	trace("a set of b's slot no rule looks up: x → b", x4, n.x, 0, b, extra)

	n.apply(t, rs, Options{})
	cSet := n.groupSet(t, cChain, "-points-ipv4")
	ig := n.inspect(t).Groups[bChain]
	g, _ := canonical(ig.Entries, maxGroupCost)
	rules := groupRules(bChain, bStem, ingressDir, g, false)
	extraRule := groupRules(bChain, strings.TrimSuffix(cSet, "-points-ipv4"), ingressDir, g, false)
	nettest.Do(t, n.node, func() error {
		c, err := nftables.New()
		if err != nil {
			return err
		}
		// b's rules, and before the last one c's set looked up as b's own.
		nft.ReplaceChain(c, &nftables.Chain{Table: bt, Name: bChain}, slices.Concat(rules[:len(rules)-1], extraRule[len(extraRule)-2:]))
		return c.Flush()
	})
	trace("b's chain looks up c's set too: x → b", x4, n.x, 0, b, "rules")
	trace("b's chain looks up c's set too: a → b", a.v4, a.ns, a.port, b, "rules")
}

// TestSwappedChainNames: another tool swaps the names of two group chains (nft rename chain:
// the kernel lets a chain that map elements go to be renamed, and the elements follow it). The
// traffic is unchanged, but each chain's name now stands for the other's list. The next pass,
// even without Verify, must not move each group's pods to the chain of their group's name,
// whose sets hold the other list: each pod allows exactly its peers throughout.
func TestSwappedChainNames(t *testing.T) {
	n := newBridgedNode(t)
	rs, bChain, cChain := n.applyTwoGroups(t)
	table := TableName(n.network)
	nftIn(t, n.node, "rename", "chain", "bridge", table, bChain, "in-swap")
	nftIn(t, n.node, "rename", "chain", "bridge", table, cChain, bChain)
	nftIn(t, n.node, "rename", "chain", "bridge", table, "in-swap", cChain)
	n.expectTwoGroups(t, "swapped")
	for name, g := range n.inspect(t).Groups {
		if len(g.Damage) == 0 {
			t.Errorf("swapped: group %s shows no damage", name)
		}
	}
	res := n.apply(t, rs, Options{})
	n.expectTwoGroups(t, "applied")
	n.expectUndamaged(t, fmt.Sprintf("after the pass (%+v)", res))
	if again := n.apply(t, rs, Options{Verify: true}); again.Changed() {
		t.Errorf("a Verify pass after it changed something: %+v", again)
	}
}

// TestHashSetRecreatedAsInterval: another tool swaps a group's hash set (hosts, points) for an
// interval set of the same name and key length whose elements are the group's own singles, the
// first opening a range and the last closing it (an element with the interval-end flag). Read
// element by element the set holds the group's list, but the kernel lets every address between
// the two through: c, whose address lies between a's and x's, reaches b. Inspect must see the
// damage (trace would otherwise say c is dropped); a Verify pass must give b its list back, and
// a pass that changes b's list must not edit the group in place (the edit would keep the set).
func TestHashSetRecreatedAsInterval(t *testing.T) {
	for _, tc := range []struct {
		kind  string
		ports *policyrules.Ports
		set   func(name string) *nftables.Set
		key   func(a netip.Addr) []byte
	}{
		{"-hosts-ipv4", nil, func(name string) *nftables.Set {
			return &nftables.Set{Name: name, Interval: true, KeyType: nftables.TypeIPAddr}
		}, func(a netip.Addr) []byte { return a.AsSlice() }},
		{"-points-ipv4", tcp8080, func(name string) *nftables.Set {
			return &nftables.Set{Name: name, Interval: true, KeyType: nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetProto, nftables.TypeInetService)}
		}, func(a netip.Addr) []byte { return portsKey(a, policyrules.TCP, 8080) }},
	} {
		for _, pass := range []struct {
			name   string
			verify bool
			more   []netip.Addr // peers the pass adds to b's list
		}{{"a Verify pass", true, nil}, {"an edit's donor", false, []netip.Addr{netip.MustParseAddr("fd00:3::2")} /* a's IPv6 address */}} {
			t.Run(tc.kind+": "+pass.name, func(t *testing.T) {
				n := newBridgedNode(t)
				a, b, c := n.pods["a"], n.pods["b"], n.pods["c"]
				if a.v4.Compare(c.v4) >= 0 || c.v4.Compare(x4) >= 0 {
					t.Fatalf("c's address %s is not between a's %s and x's %s", c.v4, a.v4, x4)
				}
				rs := with(n.open(), b.port, allowFrom(tc.ports, a.v4, x4), policyrules.Direction{})
				n.apply(t, rs, Options{})
				chain := groupNames(t, n)[MapIngress][b.port]
				setName := n.groupSet(t, chain, tc.kind)
				stem, _ := setStem(setName)
				n.recreateSet(t, chain, stem, tc.set(setName), []nftables.SetElement{{Key: tc.key(a.v4)}, {Key: tc.key(x4), IntervalEnd: true}})
				n.expectTCP(t, "tampered: c → b", c.ns, b.v4, 8080, true)
				if damage := n.inspect(t).Groups[chain].Damage; len(damage) == 0 {
					t.Errorf("tampered: Inspect finds no damage in group %s, whose set %s lets c through", chain, setName)
				}

				rs = with(n.open(), b.port, allowFrom(tc.ports, append([]netip.Addr{a.v4, x4}, pass.more...)...), policyrules.Direction{})
				res := n.apply(t, rs, Options{Verify: pass.verify})
				n.expectTCP(t, "applied: c → b", c.ns, b.v4, 8080, false)
				n.expectTCP(t, "applied: a → b", a.ns, b.v4, 8080, true)
				n.expectTCP(t, "applied: x → b", n.x, b.v4, 8080, true)
				if res.RepairedGroups+res.NewGroups != 1 || res.EditedGroups != 0 {
					t.Errorf("applied: %+v, want b's group built in a new slot", res)
				}
				n.expectSettled(t, "applied", rs)
			})
		}
	}
}
