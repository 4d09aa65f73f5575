package hostport

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/google/nftables"

	"github.com/kubenet-dev/kubenet/internal/nft"
	"github.com/kubenet-dev/kubenet/internal/safedir"
)

// The node-wide part of host ports: the fixed chains with their rules (Rules) and the maps.
// They exist on every node of the network, whether or not a pod uses host ports, because the
// localnet guard in them protects the node from every pod once route_localnet is on. ADD checks
// them on every call (CheckNode: one dump per chain and one of the table's sets), STATUS reports
// them missing, and EnsureNode puts them back together with the map elements of running pods.

// CheckNode reports how the node-wide host-port state differs from the plan: the rules of each
// chain, compared by comment and expressions, and the maps. Every difference found is returned
// (joined), each a *nft.Difference, so a caller can tell missing objects (nft.Missing) from
// changed ones. It only reads: one dump of the table's rules, and of its maps only when a chain
// is not as planned (the planned rules look every map up by name, and the kernel keeps a map
// that a rule refers to, so planned rules in place mean the maps are there).
func CheckNode(cfg Config) error { return cfg.backend().checkNode(cfg) }

func (nftablesBackend) checkNode(cfg Config) error {
	diffs, err := checkChains(cfg)
	if err != nil || len(diffs) == 0 {
		return err
	}
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("hostport rules: netlink: %w", err)
	}
	missing, err := missingMaps(c, cfg)
	if err != nil {
		return err
	}
	errs := make([]error, 0, len(diffs)+len(missing))
	for _, d := range diffs {
		errs = append(errs, d)
	}
	for _, name := range missing {
		errs = append(errs, &nft.Difference{Table: nft.InetTable(cfg.Network), Object: "map " + name, Missing: true, Detail: "missing"})
	}
	return errors.Join(errs...)
}

// MissingNode returns the node-wide objects that are missing altogether, given the number of
// rules of each chain of the network's inet table (nft.TableRuleCounts): chains without a rule
// where the plan has rules, and, when there is one, the maps that are missing (read then). It
// decodes no rule, for STATUS; changed rules are CheckNode's.
func MissingNode(cfg Config, counts map[string]int) ([]error, error) {
	return cfg.backend().missingNode(cfg, counts)
}

func (nftablesBackend) missingNode(cfg Config, counts map[string]int) ([]error, error) {
	table := nft.InetTable(cfg.Network)
	planned := map[string]int{}
	for _, r := range Rules(cfg.PodCIDRs) {
		planned[r.Chain]++
	}
	var out []error
	for _, ch := range chains(table) {
		if planned[ch.Name] > 0 && counts[ch.Name] == 0 {
			out = append(out, &nft.Difference{Table: table, Object: "chain " + ch.Name, Missing: true, Detail: fmt.Sprintf("missing or empty, want %d rules", planned[ch.Name])})
		}
	}
	if len(out) == 0 {
		return nil, nil
	}
	c, err := nftables.New()
	if err != nil {
		return nil, fmt.Errorf("hostport rules: netlink: %w", err)
	}
	missing, err := missingMaps(c, cfg)
	if err != nil {
		return nil, err
	}
	for _, name := range missing {
		out = append(out, &nft.Difference{Table: table, Object: "map " + name, Missing: true, Detail: "missing"})
	}
	return out, nil
}

// checkChains reads the network's table and returns the difference of every chain that is not
// as planned.
func checkChains(cfg Config) ([]*nft.Difference, error) {
	dump, err := nft.DumpRules(nft.InetTable(cfg.Network))
	if err != nil {
		return nil, fmt.Errorf("hostport chains of network %q: %w", cfg.Network, err)
	}
	v, recognized, err := nft.Recognize(cfg.Known, dump, chainNames(), cfg.planInputs(), func() map[string][]nft.Rule { return plannedChains(cfg) })
	if err != nil || recognized {
		return nil, err
	}
	have, err := dump.Rules()
	if err != nil {
		return nil, fmt.Errorf("hostport chains of network %q: %w", cfg.Network, err)
	}
	diffs := compareChains(cfg, have)
	if len(diffs) == 0 {
		v.Confirmed()
	}
	return diffs, nil
}

// planInputs is what the chains' plan depends on (the pod CIDRs; the rest of cfg does no harm):
// cfg without Known.
func (cfg Config) planInputs() Config {
	cfg.Known = nil
	return cfg
}

// plannedChains is the plan (Rules) by chain name.
func plannedChains(cfg Config) map[string][]nft.Rule {
	want := map[string][]nft.Rule{}
	for _, r := range Rules(cfg.PodCIDRs) {
		want[r.Chain] = append(want[r.Chain], nft.Rule{Comment: r.Comment, Exprs: r.Exprs})
	}
	return want
}

// chainNames names the chains of the package, in order, and then the retired ones (planned
// without rules, so that a dump which still holds theirs is not recognised as the plan).
func chainNames() []string {
	var out []string
	for _, ch := range slices.Concat(chains(nil), retiredChains(nil)) {
		out = append(out, ch.Name)
	}
	return out
}

// compareChains returns the difference of every chain that is not as planned in have; a
// retired chain that still has rules differs (it is deleted by writeNode).
func compareChains(cfg Config, have map[string][]*nftables.Rule) []*nft.Difference {
	want := plannedChains(cfg)
	table := nft.InetTable(cfg.Network)
	var out []*nft.Difference
	for _, ch := range slices.Concat(chains(table), retiredChains(table)) {
		if d := nft.Compare(ch, have[ch.Name], want[ch.Name]); d != nil {
			out = append(out, d)
		}
	}
	return out
}

// plannedMaps are the maps of the network's families.
func plannedMaps(cfg Config) []string {
	var out []string
	for _, is6 := range cfg.families() {
		anyMap, addrMap := mapNames(is6)
		out = append(out, anyMap, addrMap)
	}
	return out
}

// missingMaps returns the planned maps that the kernel does not hold as planned (absent, or
// with other key or value types).
func missingMaps(c *nftables.Conn, cfg Config) ([]string, error) {
	table := nft.InetTable(cfg.Network)
	sets, err := c.GetSets(table)
	if err != nil {
		// google/nftables loses the errno of this dump; a missing table is the usual cause. The
		// table may have been made since (by the same ADD's SNAT step, which runs alongside, or
		// by another ADD): then the maps are read again.
		exists, lerr := nft.TableExistsWith(c, table)
		switch {
		case lerr != nil:
			return nil, fmt.Errorf("hostport maps of network %q: %w", cfg.Network, errors.Join(err, lerr))
		case !exists:
			sets = nil
		default:
			if sets, err = c.GetSets(table); err != nil {
				return nil, fmt.Errorf("hostport maps of network %q: %w", cfg.Network, err)
			}
		}
	}
	var out []string
	for _, name := range plannedMaps(cfg) {
		want := mapSet(table, name)
		ok := slices.ContainsFunc(sets, func(s *nftables.Set) bool {
			return s.Name == name && s.IsMap && s.KeyType.GetNFTMagic() == want.KeyType.GetNFTMagic() && s.DataType.GetNFTMagic() == want.DataType.GetNFTMagic()
		})
		if !ok {
			out = append(out, name)
		}
	}
	for _, is6 := range cfg.families() {
		want := hairpinSetDef(table, is6)
		ok := slices.ContainsFunc(sets, func(s *nftables.Set) bool {
			return s.Name == want.Name && !s.IsMap && s.KeyType.GetNFTMagic() == want.KeyType.GetNFTMagic()
		})
		if !ok {
			out = append(out, want.Name)
		}
	}
	return out, nil
}

// Repair says what EnsureNode changed.
type Repair struct {
	Chains   []string // chains whose rules were rewritten
	Maps     []string // maps created
	Elements int      // map elements put back from the index
}

// Changed tells whether anything was written.
func (r Repair) Changed() bool { return len(r.Chains)+len(r.Maps)+r.Elements > 0 }

func (r Repair) String() string {
	return fmt.Sprintf("chains rewritten %v, maps created %v, elements restored %d", r.Chains, r.Maps, r.Elements)
}

// EnsureNode makes the node-wide host-port state what CheckNode expects, reading first and
// writing only what differs: chains whose rules are not the plan's are replaced, and missing
// maps created, in one transaction. When a map or a chain was missing (the network's first ADD,
// or somebody flushed the ruleset), every reservation of the index is compared with the kernel's
// elements and put back when missing or different, so the host ports of running pods work
// again; with all, that happens in any case (the agent's periodic pass). The comparison reads
// everything the node holds, which a healthy node's ADD does not pay. The caller holds the
// network lock: the index must not change while it is copied into the kernel.
func EnsureNode(cfg Config, all bool) (Repair, error) {
	rep, missing, err := cfg.backend().ensureNode(cfg)
	if err != nil {
		return rep, err
	}
	// Elements are compared when something was missing altogether, not only when a map was:
	// a DEL after a flush creates the maps again (empty) on its way to deleting its own elements.
	if !all && !missing {
		return rep, nil
	}
	rep.Elements, err = restoreElements(cfg)
	return rep, err
}

func (b nftablesBackend) ensureNode(cfg Config) (Repair, bool, error) {
	var rep Repair
	c, err := nftables.New()
	if err != nil {
		return rep, false, fmt.Errorf("hostport rules: netlink: %w", err)
	}
	diffs, err := checkChains(cfg)
	if err != nil || len(diffs) == 0 {
		// The planned rules look every map up by name, and the kernel keeps a map that a rule
		// refers to: rules as planned mean the maps are there.
		return rep, false, err
	}
	missing, err := missingMaps(c, cfg)
	if err != nil {
		return rep, false, err
	}
	if err := b.writeNode(c, cfg, diffs, missing); err != nil {
		return rep, false, err
	}
	for _, d := range diffs {
		rep.Chains = append(rep.Chains, d.Object)
	}
	rep.Maps = missing
	return rep, len(missing) > 0 || slices.ContainsFunc(diffs, func(d *nft.Difference) bool { return d.Missing }), nil
}

// writeNode replaces the chains of diffs and creates the maps, in one transaction. A map that
// exists with other types is deleted first (its rules go with the chains, which are rewritten
// all at once so that none refers to it any more).
func (b nftablesBackend) writeNode(c *nftables.Conn, cfg Config, diffs []*nft.Difference, missing []string) error {
	table := c.AddTable(nft.InetTable(cfg.Network))
	byChain := map[string][]nft.Rule{}
	for _, r := range Rules(cfg.PodCIDRs) {
		byChain[r.Chain] = append(byChain[r.Chain], nft.Rule{Comment: r.Comment, Exprs: r.Exprs})
	}
	rewrite := func(name string) bool {
		return slices.ContainsFunc(diffs, func(d *nft.Difference) bool { return d.Object == "chain "+name })
	}
	retype := false
	sets, _ := c.GetSets(table)
	for _, name := range missing {
		if slices.ContainsFunc(sets, func(s *nftables.Set) bool { return s.Name == name }) {
			retype = true
		}
	}
	existing, err := existingChains(c, table)
	if err != nil {
		return err
	}
	if retype {
		// A map of the wrong type can only go once no rule refers to it: empty every chain,
		// delete the maps, then write everything anew, in this one transaction.
		for _, ch := range chains(table) {
			c.FlushChain(c.AddChain(ch))
		}
		for _, name := range missing {
			if slices.ContainsFunc(sets, func(s *nftables.Set) bool { return s.Name == name }) {
				c.DelSet(&nftables.Set{Table: table, Name: name})
			}
		}
	}
	for _, name := range plannedMaps(cfg) {
		if _, err := addMap(c, table, name); err != nil {
			return err
		}
	}
	for _, is6 := range cfg.families() {
		if err := c.AddSet(hairpinSetDef(table, is6), nil); err != nil {
			return fmt.Errorf("hostport set %s: %w", hairpinSet(is6), err)
		}
	}
	for _, ch := range chains(table) {
		if !retype && !rewrite(ch.Name) {
			continue
		}
		nft.ReplaceChain(c, ch, byChain[ch.Name])
	}
	// A retired chain goes with rules or without (a base chain costs every packet of its hook
	// even empty); only a write, which the check found due, pays the listing above.
	for _, ch := range retiredChains(table) {
		if existing[ch.Name] {
			c.DelChain(ch)
		}
	}
	return b.flush(c, fmt.Sprintf("hostport rules for network %q", cfg.Network))
}

// existingChains names the chains the kernel holds in table.
func existingChains(c *nftables.Conn, table *nftables.Table) (map[string]bool, error) {
	all, err := c.ListChainsOfTableFamily(table.Family)
	if err != nil {
		return nil, fmt.Errorf("hostport chains of table %s: %w", table.Name, err)
	}
	out := map[string]bool{}
	for _, ch := range all {
		if ch.Table.Name == table.Name {
			out[ch.Name] = true
		}
	}
	return out, nil
}

// restoreElements puts every reservation of the index whose kernel entry is missing or
// different into the kernel, and returns how many it wrote. It reads the whole index and every
// entry of the network.
func restoreElements(cfg Config) (int, error) {
	index, err := NewIndex(cfg.Dir).All()
	if err != nil {
		return 0, err
	}
	families := cfg.families()
	index = slices.DeleteFunc(index, func(r Reservation) bool { return !slices.Contains(families, r.Is6()) })
	kernel, err := cfg.backend().list(cfg, nil)
	if err != nil {
		return 0, err
	}
	exact := make(map[Reservation]bool, len(kernel))
	held := make(map[Key]bool, len(kernel))
	for _, k := range kernel {
		exact[k], held[k.Key] = true, true
	}
	var add, replace []Reservation
	for _, r := range index {
		switch {
		case exact[r]:
		case held[r.Key]:
			replace = append(replace, r)
		default:
			add = append(add, r)
		}
	}
	if slices.ContainsFunc(index, func(r Reservation) bool { return !r.Is6() }) {
		// The host ports of 127.0.0.1 need it; a sysctl reset (a reload of sysctl.d) clears it.
		if err := enableRouteLocalnet(cfg.Bridge); err != nil {
			return 0, err
		}
	}
	if len(add)+len(replace) == 0 {
		return 0, nil
	}
	if len(replace) > 0 {
		// What holds a replaced key leads elsewhere: it goes by key, whoever it names.
		var wrong []Reservation
		for _, k := range kernel {
			if slices.ContainsFunc(replace, func(r Reservation) bool { return r.Key == k.Key }) {
				wrong = append(wrong, k)
			}
		}
		if err := cfg.backend().uninstall(cfg, wrong); err != nil {
			return 0, err
		}
	}
	restored := 0
	for _, part := range chunks(append(add, replace...)) {
		if err := cfg.backend().install(cfg, part); err != nil {
			return restored, fmt.Errorf("restore hostports of network %q: %w", cfg.Network, err)
		}
		restored += len(part)
	}
	return restored, nil
}

// InUse tells whether the network's host ports have been used on this node since it booted:
// route_localnet is on on the bridge (the first IPv4 hostPort turned it on) or the index holds a
// reservation. It reads one sysctl and at most one directory entry, for STATUS: a node that never
// had a hostPort pod and was set up by an older kubenet has no host-port chains yet, and that is
// no reason to call the node not ready.
func InUse(cfg Config) (bool, error) {
	b, err := os.ReadFile(filepath.Join("/proc/sys/net/ipv4/conf", cfg.Bridge, "route_localnet"))
	if err == nil && strings.TrimSpace(string(b)) == "1" {
		return true, nil
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false, fmt.Errorf("route_localnet of bridge %q: %w", cfg.Bridge, err)
	}
	d, err := NewIndex(cfg.Dir).open(false)
	if err != nil || d == nil {
		return false, err
	}
	defer d.Close()
	entries, err := d.ReadDir()
	if err != nil {
		return false, fmt.Errorf("hostport index: %w", err)
	}
	return slices.ContainsFunc(entries, func(e fs.DirEntry) bool { return !safedir.IsTemp(e.Name()) }), nil
}
