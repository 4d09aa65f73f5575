package nft

import (
	"bytes"
	"errors"
	"fmt"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Rule is one planned rule: its expressions and a comment that says why it exists. A rule in
// the kernel is the planned one only when both are equal: the comment tells a reader what the
// rule is for, the expressions are what the kernel does, and a rule edited in place (by a
// person, or written by another kubenet release) keeps its comment but not its expressions.
type Rule struct {
	Comment string
	Exprs   []expr.Any
}

// IsNotExist tells whether err says the table or chain does not exist.
func IsNotExist(err error) bool { return errors.Is(err, unix.ENOENT) }

// Difference is how an object of kubenet's (a chain, a map) in the kernel differs from its
// plan. Missing says that the object, or every rule of a chain, is absent (the table or chain
// is gone, or the chain is empty), which is what a flushed ruleset leaves; otherwise the object
// is there but not as planned (rules changed, added or removed).
type Difference struct {
	Table   *nftables.Table
	Object  string // "chain <name>", "map <name>"
	Missing bool
	Detail  string
}

func (d *Difference) Error() string {
	return fmt.Sprintf("nftables %s of table %s %s: %s", d.Object, FamilyName(d.Table.Family), d.Table.Name, d.Detail)
}

// Missing returns the differences in err (which may join several) that are missing rules.
func Missing(err error) []*Difference {
	var out []*Difference
	var walk func(error)
	walk = func(err error) {
		switch e := err.(type) {
		case nil:
		case *Difference:
			if e.Missing {
				out = append(out, e)
			}
		case interface{ Unwrap() []error }:
			for _, inner := range e.Unwrap() {
				walk(inner)
			}
		case interface{ Unwrap() error }:
			walk(e.Unwrap())
		}
	}
	walk(err)
	return out
}

// FamilyName is the name nft gives family: "inet", "bridge", "ip", "ip6".
func FamilyName(f nftables.TableFamily) string {
	switch f {
	case nftables.TableFamilyINet:
		return "inet"
	case nftables.TableFamilyBridge:
		return "bridge"
	case nftables.TableFamilyIPv4:
		return "ip"
	case nftables.TableFamilyIPv6:
		return "ip6"
	}
	return fmt.Sprintf("family %d", f)
}

// ReadChain reads chain's rules through c. A missing table or chain reads as no rules (the
// kernel's dump does not tell them apart).
func ReadChain(c *nftables.Conn, chain *nftables.Chain) ([]*nftables.Rule, error) {
	rules, err := c.GetRules(chain.Table, chain)
	if IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read chain %s: %w", chain.Name, err)
	}
	return rules, nil
}

// Compare returns the first difference between a chain's rules as read from the kernel (have)
// and the plan, or nil when they are equal. Rules are compared by comment and by their
// expressions' netlink encoding, which for a planned rule is exactly what the kernel dumps back
// (see Reg32). Pure, so it is tested without a kernel.
func Compare(chain *nftables.Chain, have []*nftables.Rule, want []Rule) *Difference {
	diff := func(missing bool, format string, args ...any) *Difference {
		return &Difference{Table: chain.Table, Object: "chain " + chain.Name, Missing: missing, Detail: fmt.Sprintf(format, args...)}
	}
	switch {
	case len(want) == 0 && len(have) == 0:
		return nil
	case len(have) == 0:
		return diff(true, "missing or empty, want %d rules", len(want))
	case len(have) != len(want):
		return diff(false, "has %d rules, want %d", len(have), len(want))
	}
	fam := byte(chain.Table.Family)
	for i, w := range want {
		if got := RuleComment(have[i]); got != w.Comment {
			return diff(false, "rule %d is %q, want %q", i, got, w.Comment)
		}
		if !sameExprs(fam, have[i].Exprs, w.Exprs) {
			return diff(false, "rule %d (%q) does not match what kubenet plans: it was changed in place", i, w.Comment)
		}
	}
	return nil
}

// sameExprs compares two expression lists by their netlink encoding for family fam.
func sameExprs(fam byte, have, want []expr.Any) bool {
	if len(have) != len(want) {
		return false
	}
	for i := range want {
		a, errA := expr.Marshal(fam, have[i])
		b, errB := expr.Marshal(fam, want[i])
		if errA != nil || errB != nil || !bytes.Equal(a, b) {
			return false
		}
	}
	return true
}

// CheckChainWith reads chain through c and returns nil when it holds exactly rules, else a
// *Difference (or the read's error).
func CheckChainWith(c *nftables.Conn, chain *nftables.Chain, rules []Rule) error {
	have, err := ReadChain(c, chain)
	if err != nil {
		return err
	}
	if d := Compare(chain, have, rules); d != nil {
		return d
	}
	return nil
}

// SyncChain makes chain hold exactly rules. It reads the chain first (one dump, cheap) and writes
// only when it differs, because every write that removes rules waits for an RCU grace period
// (about 10 ms): a node's rules only change when its configuration does (or someone else
// changed them), not per pod. A dump known recognises for planOf (see Recognize) is not decoded.
// The write replaces the chain's content in one transaction, so concurrent callers never leave
// duplicates.
func SyncChain(known Verified, chain *nftables.Chain, rules []Rule, planOf any) error {
	names := []string{chain.Name}
	plan := func() map[string][]Rule { return map[string][]Rule{chain.Name: rules} }
	compare := func(have map[string][]*nftables.Rule) error {
		if d := Compare(chain, have[chain.Name], rules); d != nil {
			return d
		}
		return nil
	}
	dump, err := DumpChain(chain)
	if err != nil {
		return err
	}
	v, recognized, err := Recognize(known, dump, names, planOf, plan)
	if err != nil || recognized {
		return err
	}
	have, err := dump.Rules()
	if err != nil {
		return err
	}
	if compare(have) == nil {
		v.Confirmed()
		return nil
	}
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("netlink: %w", err)
	}
	c.AddTable(chain.Table)
	ReplaceChain(c, chain, rules)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("write chain %s: %w", chain.Name, err)
	}
	return nil
}

// ReplaceChain queues on c what makes chain (created if missing) hold exactly rules, for a caller
// that sends it in a transaction of its own together with other changes.
func ReplaceChain(c *nftables.Conn, chain *nftables.Chain, rules []Rule) {
	ch := c.AddChain(chain)
	c.FlushChain(ch)
	for _, r := range rules {
		c.AddRule(&nftables.Rule{Table: chain.Table, Chain: ch, Exprs: r.Exprs, UserData: Comment(r.Comment)})
	}
}

// CheckChain reports the first difference between chain and rules (a *Difference), or nil.
func CheckChain(chain *nftables.Chain, rules []Rule) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("netlink: %w", err)
	}
	return CheckChainWith(c, chain, rules)
}

// TableExists tells whether the kernel holds table; false when nftables cannot be asked.
func TableExists(table *nftables.Table) bool {
	c, err := nftables.New()
	if err != nil {
		return false
	}
	ok, err := TableExistsWith(c, table)
	return err == nil && ok
}

// TableExistsWith tells whether the kernel holds table, asking through c (one list of the
// family's tables: the library does not let a missing table's error be told from others).
func TableExistsWith(c *nftables.Conn, table *nftables.Table) (bool, error) {
	tables, err := c.ListTablesOfFamily(table.Family)
	if err != nil {
		return false, fmt.Errorf("list tables: %w", err)
	}
	return slices.ContainsFunc(tables, func(t *nftables.Table) bool { return t.Name == table.Name }), nil
}
