package netpol

import (
	"fmt"
	"maps"

	"github.com/google/nftables"

	"github.com/kubenet-dev/kubenet/internal/nft"
)

// Reading the rules of every chain of the policy tables is most of what a pass reads (a dump of
// a hundred group chains, decoded), and a pass that follows another of the same Applier would
// only find what that pass left. The kernel counts every transaction it commits in a network
// namespace (the nftables generation, whoever sends it), so an Applier can know the rules
// without reading them: it follows its own commits, and checks around each one and at the
// start of the next pass that the generation moved by its commits alone. Anybody else's commit
// in between (another tool, a CNI verb, an operator's nft) makes the next pass read everything.
// A Verify pass always reads. One case reads as the Applier's own: a transaction of its that
// changed nothing (the kernel does not count it) and another's committed in the same instant,
// between the two reads around it. The agent's healer, which reads every commit's notification,
// asks for a Verify pass when another's touched the policy tables.

// ruleCache is what the policy tables' chains hold (chain → rules, as a dump returns them) at
// nftables generation gen.
type ruleCache struct {
	gen uint32
	// table is the policy tables' name (the network's): an Applier serves one network, and what
	// it knows of one's chains never stands for another's.
	table        string
	bridge, inet map[string][]*nftables.Rule
}

// ruleTrail follows the chains' rules through one pass's commits: it starts from what the pass
// read, takes each change a committed transaction made, and, if the generation moved by those
// commits alone, leaves a ruleCache for the next pass. A nil trail follows nothing.
type ruleTrail struct {
	table   string // the policy tables' name
	gens    generations
	gen     uint32 // the generation the rules are of
	trusted bool   // nobody else committed since the rules were read
	rules   map[nftables.TableFamily]map[string][]*nftables.Rule
	pending []chainChange // queued since the last commit
}

// generations reads the network namespace's nftables generation (nft.Generations).
type generations interface{ Read() (uint32, error) }

// chainChange is one queued change of a chain's rules: rules replace them, gone deletes the
// chain (table: the whole table's).
type chainChange struct {
	family      nftables.TableFamily
	chain       string
	rules       []*nftables.Rule
	gone, table bool
}

// readTrusted reads the tables as readState does, with the chains' rules of known when the
// generation is still known's and verify is off, and returns the trail that follows them
// through the pass.
func readTrusted(c *nftables.Conn, gens *nft.Generations, bt *nftables.Table, verify bool, known *ruleCache) (*ruleTrail, state, error) {
	if gens == nil {
		st, err := readState(c, bt, verify, nil)
		return nil, st, err
	}
	start, err := gens.Read()
	trusted := err == nil
	if !trusted || verify || known == nil || known.gen != start || known.table != bt.Name {
		known = nil
	}
	st, err := readState(c, bt, verify, known)
	if err != nil {
		return nil, st, err
	}
	// google/nftables reads neither a set's counter back nor every flag: the definitions the
	// kernel compares when a set is added again are read here (a fixed set taken as planned is
	// not added again, and another tool's drops set without counters would count nothing).
	defs, err := gens.SetDefinitions(bt)
	if err != nil {
		return nil, st, fmt.Errorf("read policy table bridge %s: %w", bt.Name, err)
	}
	for _, s := range fixedSets(bt) {
		if d, ok := defs[s.Name]; !ok || !d.Same(nft.PlannedDefinition(s)) {
			delete(st.fixedAsPlanned, s.Name)
		}
	}
	if known == nil && trusted {
		// The dump is of one generation only if none came between its start and its end.
		end, err := gens.Read()
		trusted = err == nil && end == start
	}
	t := &ruleTrail{table: bt.Name, gens: gens, gen: start, trusted: trusted, rules: map[nftables.TableFamily]map[string][]*nftables.Rule{
		nftables.TableFamilyBridge: cloneRules(st.bridgeRules),
		nftables.TableFamilyINet:   cloneRules(st.inetRules),
	}}
	return t, st, nil
}

// cloneRules is a map of the same chains whose changes leave m as it is (the rule lists are
// replaced, never changed).
func cloneRules(m map[string][]*nftables.Rule) map[string][]*nftables.Rule {
	if m == nil {
		return map[string][]*nftables.Rule{}
	}
	return maps.Clone(m)
}

// beforeCommit checks that nobody committed since the trail's generation.
func (t *ruleTrail) beforeCommit() {
	if t == nil || !t.trusted {
		return
	}
	gen, err := t.gens.Read()
	t.trusted = err == nil && gen == t.gen
}

// afterCommit takes what the transaction changed, if it was committed (ok), and checks that
// the generation moved by that transaction alone: by one, or not at all when it changed nothing
// (the kernel does not count a transaction with nothing to commit).
func (t *ruleTrail) afterCommit(ok bool) {
	if t == nil {
		return
	}
	pending := t.pending
	t.pending = nil
	if !ok || !t.trusted {
		t.trusted = false
		return
	}
	gen, err := t.gens.Read()
	if err != nil || (gen != t.gen && gen != t.gen+1) {
		t.trusted = false
		return
	}
	t.gen = gen
	for _, ch := range pending {
		rules := t.rules[ch.family]
		switch {
		case ch.table:
			clear(rules)
		case ch.gone || len(ch.rules) == 0:
			delete(rules, ch.chain) // a dump has no chain without rules
		default:
			rules[ch.chain] = ch.rules
		}
	}
}

// left is the rules the pass left, for the next pass of the Applier; nil when the trail does not
// know them.
func (t *ruleTrail) left() *ruleCache {
	if t == nil || !t.trusted || len(t.pending) > 0 {
		return nil
	}
	return &ruleCache{gen: t.gen, table: t.table, bridge: t.rules[nftables.TableFamilyBridge], inet: t.rules[nftables.TableFamilyINet]}
}

func (t *ruleTrail) queue(ch chainChange) {
	if t != nil {
		t.pending = append(t.pending, ch)
	}
}

// replaceChain queues what makes chain (created if missing) hold exactly rules.
func (w *writer) replaceChain(chain *nftables.Chain, rules []nft.Rule) {
	nft.ReplaceChain(w.c, chain, rules)
	w.dirty = true
	dumped := make([]*nftables.Rule, len(rules))
	for i, r := range rules {
		// As a dump returns it: the planned encoding is exactly what the kernel dumps back
		// (nft.Compare).
		dumped[i] = &nftables.Rule{Table: chain.Table, Chain: chain, Exprs: r.Exprs, UserData: nft.Comment(r.Comment)}
	}
	w.trail.queue(chainChange{family: chain.Table.Family, chain: chain.Name, rules: dumped})
}

// delChain queues the deletion of chain.
func (w *writer) delChain(chain *nftables.Chain) {
	w.c.DelChain(chain)
	w.dirty = true
	w.trail.queue(chainChange{family: chain.Table.Family, chain: chain.Name, gone: true})
}

// delTable queues the deletion of table.
func (w *writer) delTable(table *nftables.Table) {
	w.c.DelTable(table)
	w.dirty = true
	w.trail.queue(chainChange{family: table.Family, table: true})
}
