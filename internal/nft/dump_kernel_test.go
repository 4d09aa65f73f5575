package nft

import (
	"maps"
	"net/netip"
	"slices"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/kubenet-dev/kubenet/test/nettest"
)

// TestTableRules: one dump returns every chain's rules as GetRules returns them chain by chain,
// and a missing table reads as no rules.
func TestTableRules(t *testing.T) {
	n := nettest.NewNS(t)
	table := InetTable("dump")
	nettest.Do(t, n, func() error {
		got, err := TableRules(table)
		if err != nil || len(got) != 0 {
			t.Errorf("TableRules of a missing table = %v, %v; want nothing", got, err)
		}
		c, err := nftables.New()
		if err != nil {
			return err
		}
		c.AddTable(table)
		a := &nftables.Chain{Name: "a", Table: table}
		b := &nftables.Chain{Name: "b", Table: table, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter}
		ReplaceChain(c, a, planned())
		ReplaceChain(c, b, planned()[:1])
		c.AddChain(&nftables.Chain{Name: "empty", Table: table})
		manyChain := c.AddChain(&nftables.Chain{Name: "many", Table: table})
		if err := c.Flush(); err != nil {
			return err
		}
		// Enough rules that the dump spans several of the kernel's messages; added 100 per
		// transaction (one message and one acknowledgement per rule).
		for i := range 300 {
			c.AddRule(&nftables.Rule{Table: table, Chain: manyChain, UserData: Comment("many"),
				Exprs: append(MatchPrefix(Source, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)}), 32), false), &expr.Verdict{Kind: expr.VerdictAccept})})
			if i%100 == 99 {
				if err := c.Flush(); err != nil {
					return err
				}
			}
		}
		got, err = TableRules(table)
		if err != nil {
			return err
		}
		for _, ch := range []*nftables.Chain{a, b, {Name: "many", Table: table}} {
			want, err := c.GetRules(table, ch)
			if err != nil {
				return err
			}
			if len(got[ch.Name]) != len(want) {
				t.Errorf("chain %s: %d rules, GetRules has %d", ch.Name, len(got[ch.Name]), len(want))
				continue
			}
			for i := range want {
				if got[ch.Name][i].Handle != want[i].Handle || !slices.Equal(got[ch.Name][i].UserData, want[i].UserData) || !sameExprs(byte(table.Family), got[ch.Name][i].Exprs, want[i].Exprs) {
					t.Errorf("chain %s rule %d differs from GetRules's", ch.Name, i)
				}
			}
		}
		if len(got["empty"]) != 0 || len(got) != 3 {
			t.Errorf("TableRules returned chains %v, want a, b and many", keys(got))
		}
		if d := Compare(a, got["a"], planned()); d != nil {
			t.Errorf("chain a read back: %v", d)
		}
		counts, err := TableRuleCounts(table)
		if err != nil {
			return err
		}
		if want := map[string]int{"a": 3, "b": 1, "many": 300}; !maps.Equal(counts, want) {
			t.Errorf("TableRuleCounts = %v, want %v", counts, want)
		}
		return nil
	})
}

// TestChainRuleCount: the count of one chain comes from a dump of that chain alone (not the
// table's other chains, a long one among them, nor a chain whose name it prefixes), an empty
// chain exists with no rules, and a missing chain or table does not exist.
func TestChainRuleCount(t *testing.T) {
	n := nettest.NewNS(t)
	table := &nftables.Table{Name: "nat", Family: nftables.TableFamilyIPv4}
	nettest.Do(t, n, func() error {
		if got, exists, err := ChainRuleCount(&nftables.Chain{Name: "a", Table: table}); got != 0 || exists || err != nil {
			t.Errorf("chain of a missing table: %d, %v, %v", got, exists, err)
		}
		c, err := nftables.New()
		if err != nil {
			return err
		}
		c.AddTable(table)
		a := c.AddChain(&nftables.Chain{Name: "a", Table: table})
		c.AddChain(&nftables.Chain{Name: "ab", Table: table})
		many := c.AddChain(&nftables.Chain{Name: "many", Table: table})
		for range 3 {
			c.AddRule(&nftables.Rule{Table: table, Chain: a, Exprs: []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}}})
		}
		for i := range 300 {
			c.AddRule(&nftables.Rule{Table: table, Chain: many, Exprs: append(MatchPrefix(Source, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)}), 32), false), &expr.Verdict{Kind: expr.VerdictAccept})})
			if i%100 == 99 {
				if err := c.Flush(); err != nil {
					return err
				}
			}
		}
		for _, w := range []struct {
			name   string
			n      int
			exists bool
		}{{"a", 3, true}, {"ab", 0, true}, {"many", 300, true}, {"m", 0, false}} {
			got, exists, err := ChainRuleCount(&nftables.Chain{Name: w.name, Table: table})
			if got != w.n || exists != w.exists || err != nil {
				t.Errorf("chain %s: %d rules, exists %v, %v; want %d, %v", w.name, got, exists, err, w.n, w.exists)
			}
		}
		d, err := DumpChain(&nftables.Chain{Name: "a", Table: table})
		if err != nil {
			return err
		}
		if counts, err := d.Counts(); err != nil || !maps.Equal(counts, map[string]int{"a": 3}) {
			t.Errorf("the dump of chain a holds %v, %v; want a's 3 rules alone", counts, err)
		}
		return nil
	})
}
