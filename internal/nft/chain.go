package nft

import (
	"errors"
	"fmt"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Rule is one planned rule: its expressions and a comment that says why it exists. The comment
// names every parameter the rule depends on, so comparing comments tells whether a chain is up
// to date without decoding expressions.
type Rule struct {
	Comment string
	Exprs   []expr.Any
}

// IsNotExist tells whether err says the table or chain does not exist.
func IsNotExist(err error) bool { return errors.Is(err, unix.ENOENT) }

// ChainComments reads the comments of chain's rules, in order. A missing table or chain reads as
// no rules.
func ChainComments(c *nftables.Conn, chain *nftables.Chain) ([]string, error) {
	rules, err := c.GetRules(chain.Table, chain)
	if IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	out := make([]string, len(rules))
	for i, r := range rules {
		out[i] = RuleComment(r)
	}
	return out, nil
}

// SyncChain makes chain hold exactly rules. It reads the chain first (a dump, cheap) and writes
// only when it differs, because every write that removes rules waits for an RCU grace period
// (about 10 ms): a node's rules only change when its configuration does, not per pod. The write
// replaces the chain's content in one transaction, so concurrent callers never leave duplicates.
func SyncChain(chain *nftables.Chain, rules []Rule) error {
	c, have, err := readComments(chain)
	if err != nil {
		return err
	}
	if sameComments(have, rules) {
		return nil
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

// CheckChain reports the first difference between chain and rules.
func CheckChain(chain *nftables.Chain, rules []Rule) error {
	_, have, err := readComments(chain)
	if err != nil {
		return err
	}
	if len(have) != len(rules) {
		return fmt.Errorf("chain %s of table %s has %d rules, want %d", chain.Name, chain.Table.Name, len(have), len(rules))
	}
	for i, r := range rules {
		if have[i] != r.Comment {
			return fmt.Errorf("rule %d of chain %s is %q, want %q", i, chain.Name, have[i], r.Comment)
		}
	}
	return nil
}

// readComments opens a netlink connection and reads chain's comments through it.
func readComments(chain *nftables.Chain) (*nftables.Conn, []string, error) {
	c, err := nftables.New()
	if err != nil {
		return nil, nil, fmt.Errorf("netlink: %w", err)
	}
	have, err := ChainComments(c, chain)
	if err != nil {
		return nil, nil, fmt.Errorf("read chain %s: %w", chain.Name, err)
	}
	return c, have, nil
}

func sameComments(have []string, rules []Rule) bool {
	if len(have) != len(rules) || len(rules) == 0 {
		return false
	}
	for i, r := range rules {
		if have[i] != r.Comment {
			return false
		}
	}
	return true
}
