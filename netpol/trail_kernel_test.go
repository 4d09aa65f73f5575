package netpol

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/google/nftables"

	"github.com/kubenet-dev/kubenet/internal/nft"
	"github.com/kubenet-dev/kubenet/internal/policyrules"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

// applyWith is n.apply through a, which keeps what it knows from pass to pass.
func (n *bridgedNode) applyWith(t *testing.T, a *Applier, rs policyrules.Ruleset, opt Options) policyrules.Applied {
	t.Helper()
	var res policyrules.Applied
	rs.PodCIDRs, rs.NodeAddrs = []netip.Prefix{gw4.Masked(), gw6.Masked()}, []netip.Addr{gw4.Addr(), gw6.Addr()}
	nettest.Do(t, n.node, func() (err error) { res, err = a.Apply(n.network, rs, opt); return err })
	return res
}

// flushChain empties a chain of the bridge table as another tool could. Called in the node's
// namespace.
func (n *bridgedNode) flushChain(chain string) error {
	c, err := nft.NewConn()
	if err != nil {
		return err
	}
	c.FlushChain(&nftables.Chain{Table: BridgeTable(n.network), Name: chain})
	return c.Flush()
}

// trusts tells whether a's next pass in node would take the chains' rules from what it knows:
// it knows them at the generation the kernel is at.
func trusts(t *testing.T, node ns.NetNS, a *Applier) bool {
	t.Helper()
	var gen uint32
	nettest.Do(t, node, func() (err error) { gen, err = a.gens.Read(); return err })
	return a.rules != nil && a.rules.gen == gen
}

func (n *bridgedNode) trusts(t *testing.T, a *Applier) bool { return trusts(t, n.node, a) }

// expectKnownRules fails unless what a knows of network's chains in node, if it trusts it, is
// what the kernel holds.
func expectKnownRules(t *testing.T, node ns.NetNS, network string, a *Applier, when string) {
	t.Helper()
	if !trusts(t, node, a) {
		return
	}
	nettest.Do(t, node, func() error {
		for _, table := range []*nftables.Table{BridgeTable(network), InetTable(network)} {
			have, err := nft.TableRules(table)
			if err != nil {
				return err
			}
			known := a.rules.bridge
			if table.Family == nftables.TableFamilyINet {
				known = a.rules.inet
			}
			if err := sameChains(table, have, known); err != nil {
				t.Errorf("%s: the Applier's rules of table %s: %v", when, table.Name, err)
			}
		}
		return nil
	})
}

func (n *bridgedNode) expectTrailOfKernel(t *testing.T, a *Applier, when string) {
	t.Helper()
	expectKnownRules(t, n.node, n.network, a, when)
}

// sameChains compares two chain → rules maps, the rules by comment and encoding (nft.Compare).
func sameChains(table *nftables.Table, kernel, known map[string][]*nftables.Rule) error {
	for chain, rules := range kernel {
		if _, ok := known[chain]; !ok {
			return fmt.Errorf("chain %s (%d rules) unknown", chain, len(rules))
		}
	}
	for chain, rules := range known {
		want := make([]nft.Rule, len(rules))
		for i, r := range rules {
			want[i] = nft.Rule{Comment: nft.RuleComment(r), Exprs: r.Exprs}
		}
		if d := nft.Compare(&nftables.Chain{Table: table, Name: chain}, kernel[chain], want); d != nil {
			return d
		}
	}
	return nil
}

// TestTrailSeesOtherCommits: an Applier trusts the rules its last pass left only while nobody
// else commits. Another tool empties group b's chain between two passes, right before one of a
// pass's transactions, and right after one (TestTrailTrustsOnlyItsOwnCommits tells the two
// checks around a transaction apart); the Applier trusts nothing afterwards, and the next pass
// without Verify puts the rules back: b and c each allow exactly their peer again.
func TestTrailSeesOtherCommits(t *testing.T) {
	for _, when := range []string{"between passes", "before a commit", "after a commit"} {
		t.Run(when, func(t *testing.T) {
			n := newBridgedNode(t)
			a := NewApplier()
			defer a.Close()
			b, c := n.pods["b"], n.pods["c"]
			rs := with(with(n.open(), b.port, allowFrom(tcp8080, n.pods["a"].v4), policyrules.Direction{}), c.port, allowFrom(tcp8080, x4), policyrules.Direction{})
			n.applyWith(t, a, rs, Options{})
			bChain := groupNames(t, n)[MapIngress][b.port]
			if !n.trusts(t, a) {
				t.Fatal("the Applier trusts nothing after a pass nobody else wrote into")
			}
			n.expectTrailOfKernel(t, a, "after the first pass")
			tampered := false
			tamper := func() {
				if !tampered {
					tampered = true
					if err := n.flushChain(bChain); err != nil {
						t.Errorf("flush %s: %v", bChain, err)
					}
				}
			}
			switch when {
			case "between passes":
				nettest.Do(t, n.node, func() error { tamper(); return nil })
			case "before a commit":
				// c's list changes, so that the pass sends a transaction (one that would
				// change nothing is not sent).
				rs = with(rs, c.port, allowFrom(tcp8080, x4, n.pods["b"].v4), policyrules.Direction{})
				n.applyWith(t, a, rs, Options{aroundCommit: func(after bool) {
					if !after {
						tamper()
					}
				}})
			case "after a commit":
				// c's list changes, so that the pass's transactions change something.
				rs = with(rs, c.port, allowFrom(tcp8080, x4, n.pods["b"].v4), policyrules.Direction{})
				n.applyWith(t, a, rs, Options{aroundCommit: func(after bool) {
					if after {
						tamper()
					}
				}})
			}
			if !tampered {
				t.Fatal("the pass committed nothing: the tool never wrote")
			}
			if n.trusts(t, a) {
				t.Fatal("the Applier trusts what it knows of the rules after another tool wrote")
			}
			res := n.applyWith(t, a, rs, Options{})
			if res.RepairedGroups == 0 {
				t.Errorf("the pass after the tool emptied %s repaired nothing: %+v", bChain, res)
			}
			if !n.trusts(t, a) {
				t.Error("the Applier trusts nothing after the repair")
			}
			n.expectTrailOfKernel(t, a, "after the repair")
			n.expectTCP(t, "a → b", n.pods["a"].ns, b.v4, 8080, true)
			n.expectTCP(t, "x → b", n.x, b.v4, 8080, false)
			n.expectTCP(t, "x → c", n.x, c.v4, 8080, true)
			n.expectTCP(t, "a → c", n.pods["a"].ns, c.v4, 8080, false)
		})
	}
}

// TestUnchangedPassCommitsNothing: a pass that finds everything as planned, with or without
// Verify, commits no transaction: the generation stays where it was, and nobody watching the
// node's commits (the agent's healer, kube-proxy's) is woken by it. The kernel counts a
// transaction that re-adds an existing set or chain as a change.
func TestUnchangedPassCommitsNothing(t *testing.T) {
	n := newBridgedNode(t)
	a := NewApplier()
	defer a.Close()
	b, c := n.pods["b"], n.pods["c"]
	rs := with(with(n.open(), b.port, allowFrom(tcp8080, n.pods["a"].v4), allowFrom(tcp8080, x4)), c.port, policyrules.Direction{}, allowFrom(tcp8080, b.v4))
	n.applyWith(t, a, rs, Options{})
	for _, verify := range []bool{false, true, false} {
		var before, after uint32
		nettest.Do(t, n.node, func() (err error) { before, err = a.gens.Read(); return err })
		res := n.applyWith(t, a, rs, Options{Verify: verify})
		nettest.Do(t, n.node, func() (err error) { after, err = a.gens.Read(); return err })
		if res.Changed() || after != before {
			t.Errorf("a pass (verify %v) of an unchanged ruleset moved the generation %d → %d: %+v", verify, before, after, res)
		}
	}
}

// TestTrailSeesOtherCommitAfterUnchangedPass: a pass that finds everything as planned sends a
// transaction the kernel does not count (TestUnchangedPassCommitsNothing); another tool that
// empties group b's chain right after it, before the writer reads the generation, moves the
// generation by one, as a counted transaction of the Applier's would. The Applier must not take
// that commit for its own: the next pass puts b's rules back, and b allows exactly its peer.
func TestTrailSeesOtherCommitAfterUnchangedPass(t *testing.T) {
	n := newBridgedNode(t)
	a := NewApplier()
	defer a.Close()
	b := n.pods["b"]
	rs := with(n.open(), b.port, allowFrom(tcp8080, n.pods["a"].v4), policyrules.Direction{})
	n.applyWith(t, a, rs, Options{})
	bChain := groupNames(t, n)[MapIngress][b.port]
	tampered := false
	n.applyWith(t, a, rs, Options{aroundCommit: func(after bool) {
		if after && !tampered {
			tampered = true
			if err := n.flushChain(bChain); err != nil {
				t.Errorf("flush %s: %v", bChain, err)
			}
		}
	}})
	// Whether or not the unchanged pass sent a transaction, the chain is empty now (the tool
	// empties it between passes when the pass sent none).
	if !tampered {
		nettest.Do(t, n.node, func() error { return n.flushChain(bChain) })
	}
	if n.trusts(t, a) {
		t.Error("the Applier trusts what it knows of the rules after another tool emptied " + bChain)
	}
	res := n.applyWith(t, a, rs, Options{})
	if res.RepairedGroups == 0 {
		t.Errorf("the pass after the tool emptied %s repaired nothing: %+v", bChain, res)
	}
	n.expectTrailOfKernel(t, a, "after the repair")
	n.expectTCP(t, "a → b", n.pods["a"].ns, b.v4, 8080, true)
	n.expectTCP(t, "x → b", n.x, b.v4, 8080, false)
}

// TestFixedSetRedefined: another tool deletes the bridge table and makes the drop counters'
// sets anew, egress's without counters, ingress's dynamic. google/nftables reads neither a
// set's counter nor that flag back; a pass must not take these sets for its own (since 700fa1e
// it does not add them again): after it every fixed set is defined as planned, and a packet c's
// egress denies is dropped and counted on c's port.
func TestFixedSetRedefined(t *testing.T) {
	n := newBridgedNode(t)
	a := NewApplier()
	defer a.Close()
	b, c := n.pods["b"], n.pods["c"]
	rs := n.dropsRuleset()
	n.applyWith(t, a, rs, Options{})
	table := BridgeTable(n.network).Name
	nftIn(t, n.node, "delete", "table", "bridge", table)
	nftIn(t, n.node, "add", "table", "bridge", table)
	nftIn(t, n.node, "add", "set", "bridge", table, SetDropsEgress, "{ type iface_index; }")
	nftIn(t, n.node, "add", "set", "bridge", table, SetDropsIngress, "{ type iface_index; flags dynamic; counter; }")
	var applyErr error
	nettest.Do(t, n.node, func() error {
		rs := rs
		rs.PodCIDRs, rs.NodeAddrs = []netip.Prefix{gw4.Masked(), gw6.Masked()}, []netip.Addr{gw4.Addr(), gw6.Addr()}
		_, applyErr = a.Apply(n.network, rs, Options{})
		return nil
	})
	if applyErr != nil {
		// Refused is not wrong (nothing is half done), but the pass after must converge.
		t.Logf("the pass after the tool: %v", applyErr)
	}
	n.applyWith(t, a, rs, Options{})
	var defs map[string]nft.SetDefinition
	nettest.Do(t, n.node, func() (err error) { defs, err = a.gens.SetDefinitions(BridgeTable(n.network)); return err })
	for _, s := range fixedSets(BridgeTable(n.network)) {
		if have, want := defs[s.Name], nft.PlannedDefinition(s); !have.Same(want) {
			t.Errorf("set %s is defined %+v, want %+v", s.Name, have, want)
		}
	}
	before, _ := n.dropCounts(t)
	key := dropKey{c.port, false}
	if _, ok := before[key]; !ok {
		t.Fatalf("no drop counter of c's egress: %v", before)
	}
	n.expectUDP(t, "c → b, c's egress denies", c.ns, b.v4, b, false)
	if err := nettest.Eventually(2*time.Second, func() error {
		if after, _ := n.dropCounts(t); after[key].Packets == before[key].Packets {
			return fmt.Errorf("c's egress drops: %d before, %d after", before[key].Packets, after[key].Packets)
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
}

// TestTrailOfAnotherNetwork: an Applier serves one network, but nothing stops a caller from
// applying another's ruleset through it. What it knows of one network's chains must not stand
// for another's: a pass for a second network right after the first's (nobody committed in
// between) makes both of its tables, the inet one with its planned chains.
func TestTrailOfAnotherNetwork(t *testing.T) {
	node := nettest.NewNS(t)
	a := NewApplier()
	defer a.Close()
	rs := policyrules.Ruleset{PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.9.0.0/24")}}
	nettest.Do(t, node, func() error {
		if _, err := a.Apply("one", rs, Options{}); err != nil {
			return err
		}
		if _, err := a.Apply("two", rs, Options{}); err != nil {
			return err
		}
		have, err := nft.TableRules(InetTable("two"))
		if err != nil {
			return fmt.Errorf("inet table of network two: %w", err)
		}
		it := InetTable("two")
		want := InetRules()
		for _, ch := range inetChains(it) {
			if d := nft.Compare(ch, have[ch.Name], want[ch.Name]); d != nil {
				t.Errorf("network two: %v", d)
			}
		}
		return nil
	})
}
