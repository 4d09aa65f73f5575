// Package isolation keeps the pods of a bridge from attacking each other and the node through
// the bridge, with bridge-family nftables chains in the network's bridge table that see every
// frame a pod sends before the bridge forwards it, learns its source MAC, or hands it to the
// node's IP stack (br_netfilter's NAT included):
//
//   - the guard (always on): no pod acts as a router or DHCP server for the others or the node.
//     Router advertisements and solicitations, router renumbering, ICMP and ICMPv6 redirects,
//     DHCP and DHCPv6 server replies, loopback sources and destinations and VLAN-tagged frames
//     from pod ports are dropped, in every hairpin mode and for both families (a pod's IPv6
//     link-local stack is up on an IPv4-only network too);
//   - anti-spoofing (on unless the configuration turns it off): a pod sends only from its own
//     MAC and its own addresses (its IPv6 link-local address, derived from its MAC, included;
//     :: only for duplicate address detection and MLD reports; 0.0.0.0 only in ARP probes), and
//     its ARP messages and neighbour advertisements claim only its own addresses and MAC.
//
// The chains are fixed: their rules depend on the configuration, never on the pods. A pod's
// part is a handful of elements keyed by its bridge port (the host veth's name) in five sets,
// so ADD and DEL each add or remove a few elements in one transaction, whatever the number of
// pods. The chains look only at frames from ports in those sets: other bridges on the node, and
// pods attached before kubenet had these chains, are left alone. A port without anti-spoofing
// elements (a pod attached while it was off) is left alone by the anti-spoofing chain, so
// turning it on never cuts off running pods; their CHECK reports the missing elements.
package isolation

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"

	"github.com/google/nftables"

	"github.com/kubenet-dev/kubenet/internal/nft"
)

// Config is what the chains of one network depend on, and Known, which remembers the chains'
// dumps found as planned (nil: compare every dump in full).
type Config struct {
	Network      string // CNI network name: selects the bridge table
	AntiSpoofing bool
	Known        nft.Verified
}

// Port is one pod's bridge port and what the pod may send through it.
type Port struct {
	Name  string           // the host veth, the bridge port the pod's frames enter by
	Owner string           // the attachment ("containerID/ifname"), the elements' comment
	MAC   net.HardwareAddr // the pod interface's MAC
	Addrs []netip.Addr     // the pod's addresses; its IPv6 link-local address is derived from MAC
}

// LinkLocal is the IPv6 link-local address the kernel derives from mac (EUI-64), which the pod
// interface uses (the bridge package sets its address generation mode to EUI-64).
func LinkLocal(mac net.HardwareAddr) netip.Addr {
	var b [16]byte
	b[0], b[1] = 0xfe, 0x80
	if len(mac) == 6 {
		b[8], b[9], b[10], b[11], b[12] = mac[0]^0x02, mac[1], mac[2], 0xff, 0xfe
		b[13], b[14], b[15] = mac[3], mac[4], mac[5]
	}
	return netip.AddrFrom16(b)
}

// Ensure brings the network's chains and sets to Plan(cfg) and adds the elements of ports
// (with anti-spoofing on, all of them; else only the pod-ports ones), in one transaction for a
// pod's ADD. It reads the table's rules first (one dump) and rewrites the chains only when they
// differ from the plan: replacing rules costs the kernel an RCU grace period, adding elements
// does not. Safe from concurrent plugin processes: every write replaces whole chains atomically
// and adding an existing element is a no-op. Many ports (a node re-installing every pod's
// elements) go in several transactions of portsPerBatch, after the first.
//
// The sets are made with the timeout flag where the kernel can end an element by expiry
// (nft.ProbeElementExpiry, run in the table only when a set is made), and their elements added with timeout
// nft.Forever, so that Remove ends them without a deletion. Sets made without the flag (by an
// earlier kubenet, or on a kernel that cannot) keep it: their elements are added without a
// timeout and deleted by Remove, as before.
//
// rebuilt says that the chains were missing altogether (a new node, or another tool flushed the
// ruleset or deleted the table): the sets went with them, so the elements of every running pod but ports are gone,
// and the caller puts them back (Ensure again with all of them).
func Ensure(cfg Config, ports ...Port) (rebuilt bool, err error) {
	table := nft.BridgeTable(cfg.Network)
	// The plan is made only when the dump is not recognised: on a set-up node it is not needed.
	plan := sync.OnceValue(func() []Chain { return Plan(cfg) })
	have, found, err := readChains(cfg, table, plan)
	if err != nil {
		return false, err
	}
	// The guard chain is in every plan: without it the table was flushed or never made. (Chains
	// missing because the configuration just turned anti-spoofing on are no rebuild: pods
	// attached while it was off keep only their pod-ports elements, as documented.)
	rebuilt = found != nil && len(have[ChainGuard]) == 0
	// The rules refer to the sets, so rules as planned mean the sets exist: a pod's ADD on a
	// set-up node sends its elements and nothing else, as to sets with the timeout flag (the
	// kernel refuses the timeouts of sets without it, and then they go again without).
	defs := sets(table, true)
	var rewrite *chainWrite
	if found != nil {
		rewrite = &chainWrite{plan: plan(), have: have}
		var made bool
		if defs, rewrite.mistyped, made, err = setsToWrite(table); err != nil {
			return rebuilt, err
		}
		// A set made now (one a new release plans, or one put in place of somebody else's)
		// lacks the running pods' elements as after a flush: the caller puts them back.
		rebuilt = rebuilt || made
	}
	for _, batch := range batches(ports, portsPerBatch) {
		err := addElements(cfg, table, defs, batch, rewrite)
		if rewrite == nil && nft.IsInvalid(err) {
			defs = sets(table, false)
			err = addElements(cfg, table, defs, batch, nil)
		}
		if err != nil {
			return rebuilt, err
		}
		rewrite = nil // done with the first transaction
	}
	return rebuilt, nil
}

// readChains reads the table's rules (one dump) and tells how the chains differ from the plan
// (compare; nil: as planned), which it makes only when it needs it. A dump that cfg.Known recognises is as planned without decoding
// it, and then have is nil; a dump found as planned in full is remembered.
func readChains(cfg Config, table *nftables.Table, plan func() []Chain) (have map[string][]*nftables.Rule, found error, err error) {
	dump, err := nft.DumpRules(table)
	if err != nil {
		return nil, nil, fmt.Errorf("isolation rules of network %q: %w", cfg.Network, err)
	}
	v, recognized, err := nft.Recognize(cfg.Known, dump, chainNames, cfg.planInputs(), func() map[string][]nft.Rule { return chainsByName(plan()) })
	if err != nil || recognized {
		return nil, nil, err
	}
	if have, err = dump.Rules(); err != nil {
		return nil, nil, fmt.Errorf("isolation rules of network %q: %w", cfg.Network, err)
	}
	if found = compare(table, have, plan()); found == nil {
		v.Confirmed()
	}
	return have, found, nil
}

// planInputs is what Plan depends on: cfg without Known.
func (cfg Config) planInputs() Config {
	cfg.Known = nil
	return cfg
}

// chainsByName is plan by chain name, as nft.Recognize takes it (chainNames names every chain).
func chainsByName(plan []Chain) map[string][]nft.Rule {
	out := make(map[string][]nft.Rule, len(plan))
	for _, c := range plan {
		out[c.Name] = c.Rules
	}
	return out
}

// chainWrite is what a rewrite of the chains needs (writeChains).
type chainWrite struct {
	plan     []Chain
	have     map[string][]*nftables.Rule
	mistyped []string
}

// addElements adds the elements of ports to the sets defs in one transaction, which with a
// rewrite also makes the chains and sets as planned.
func addElements(cfg Config, table *nftables.Table, defs []*nftables.Set, ports []Port, rewrite *chainWrite) error {
	c, err := nft.NewConn()
	if err != nil {
		return fmt.Errorf("isolation rules: netlink: %w", err)
	}
	if rewrite != nil {
		c.AddTable(table)
		if err := writeChains(c, table, rewrite, defs); err != nil {
			return err
		}
	}
	byName := setsByName(defs)
	// One message per set: the kernel acknowledges every message, and hundreds of
	// acknowledgements overflow the socket's receive buffer (ENOBUFS) after the commit.
	for name, els := range elementsOf(ports, cfg.AntiSpoofing) {
		if err := c.SetAddElements(byName[name], els); err != nil {
			return fmt.Errorf("isolation elements of set %s: %w", name, err)
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("isolation rules of network %q: %w", cfg.Network, err)
	}
	return nil
}

func setsByName(defs []*nftables.Set) map[string]*nftables.Set {
	out := map[string]*nftables.Set{}
	for _, s := range defs {
		out[s.Name] = s
	}
	return out
}

// elementsOf gathers the elements of ports by set name.
func elementsOf(ports []Port, antiSpoofing bool) map[string][]nftables.SetElement {
	out := map[string][]nftables.SetElement{}
	for _, p := range ports {
		for name, els := range p.elements(antiSpoofing) {
			out[name] = append(out[name], els...)
		}
	}
	return out
}

// portsPerBatch bounds one transaction's elements: google/nftables sends a transaction in one
// message, which fails (EMSGSIZE) beyond the socket's buffer. 40 ports are at most 360 elements
// (nine for a dual-stack port), about 40 KiB.
const portsPerBatch = 40

// batches splits xs into runs of at most n; none at all is one empty run, so that a caller
// still does its once-per-call work.
func batches[T any](xs []T, n int) [][]T {
	out := [][]T{xs[:min(n, len(xs))]}
	for xs = xs[len(out[0]):]; len(xs) > 0; xs = xs[min(n, len(xs)):] {
		out = append(out, xs[:min(n, len(xs))])
	}
	return out
}

// writeChains queues on c what makes the table's chains and sets of this package exactly as
// planned: every planned chain is created if missing and refilled (each after the chains it goes
// to), chains the plan no longer has (anti-spoofing turned off) are emptied and deleted, and the
// sets setDefs are created, the mistyped ones (somebody else's set under one of our names)
// deleted first.
func writeChains(c *nftables.Conn, table *nftables.Table, w *chainWrite, setDefs []*nftables.Set) error {
	plan := w.plan
	var obsolete []*nftables.Chain
	for _, name := range obsoleteChains(w.have, plan) {
		obsolete = append(obsolete, &nftables.Chain{Name: name, Table: table})
	}
	// Empty everything first, so that no rule still goes to a chain that is refilled or deleted,
	// or refers to a set that is replaced.
	defs := make([]*nftables.Chain, len(plan))
	for i, p := range plan {
		defs[i] = c.AddChain(chainDef(table, p))
		c.FlushChain(defs[i])
	}
	for _, o := range obsolete {
		c.FlushChain(o)
	}
	for _, o := range obsolete {
		c.DelChain(o)
	}
	for _, name := range w.mistyped {
		c.DelSet(&nftables.Set{Table: table, Name: name})
	}
	for _, s := range setDefs {
		if err := c.AddSet(s, nil); err != nil {
			return fmt.Errorf("isolation set %s: %w", s.Name, err)
		}
	}
	for i, p := range plan {
		for _, r := range p.Rules {
			c.AddRule(&nftables.Rule{Table: table, Chain: defs[i], Exprs: r.Exprs, UserData: nft.Comment(r.Comment)})
		}
	}
	return nil
}

// setsToWrite returns the definitions of the sets for a rewrite of the chains, and names the
// sets of the table that carry one of this package's names with another key type (somebody
// else's set): adding the planned set over one fails, so it is replaced. A set of ours keeps its
// flags (the kernel refuses to add a set over one with other flags); a set to be made gets the
// timeout flag where the kernel can end elements by expiry. made says that a set is to be made
// (or made again). Read only when the chains are rewritten anyway (a kubenet set cannot change
// while a rule refers to it).
func setsToWrite(table *nftables.Table) (defs []*nftables.Set, mistyped []string, made bool, err error) {
	c, err := nftables.New()
	if err != nil {
		return nil, nil, false, fmt.Errorf("isolation sets: netlink: %w", err)
	}
	// google/nftables loses the errno of this dump; a missing table (or one a concurrent first
	// ADD is creating) is the usual cause, and then every set is to be made. Should the read
	// have failed otherwise, the transaction that follows fails and says why.
	have, _ := c.GetSets(table)
	var probed *bool
	for _, want := range sets(table, false) {
		i := slices.IndexFunc(have, func(s *nftables.Set) bool { return s.Name == want.Name })
		switch {
		case i >= 0 && !have[i].IsMap && have[i].KeyType.GetNFTMagic() == want.KeyType.GetNFTMagic():
			want.HasTimeout = have[i].HasTimeout
		default:
			made = true
			if i >= 0 {
				mistyped = append(mistyped, want.Name)
			}
			if probed == nil {
				ok := nft.ProbeElementExpiry(table) == nil
				probed = &ok
			}
			want.HasTimeout = *probed
		}
		defs = append(defs, want)
	}
	return defs, mistyped, made, nil
}

// obsoleteChains names the chains of this package that have rules but no place in plan.
func obsoleteChains(have map[string][]*nftables.Rule, plan []Chain) []string {
	var out []string
	for _, name := range chainNames {
		if len(have[name]) > 0 && !slices.ContainsFunc(plan, func(p Chain) bool { return p.Name == name }) {
			out = append(out, name)
		}
	}
	return out
}

// compare returns how the table's rules (by chain) differ from plan, each chain compared by its
// rules' expressions and comments (nft.Compare): one *nft.Difference per chain that differs, or
// nil.
func compare(table *nftables.Table, have map[string][]*nftables.Rule, plan []Chain) error {
	var out []error
	for _, p := range plan {
		if d := nft.Compare(chainDef(table, p), have[p.Name], p.Rules); d != nil {
			out = append(out, d)
		}
	}
	for _, name := range obsoleteChains(have, plan) {
		out = append(out, &nft.Difference{Table: table, Object: "chain " + name, Detail: "exists but the configuration has no use for it"})
	}
	return errors.Join(out...)
}

// CheckNode reports how the network's isolation chains differ from Plan(cfg) (see compare), from
// one dump of the bridge table; nft.Missing tells the chains missing altogether.
func CheckNode(cfg Config) error {
	table := nft.BridgeTable(cfg.Network)
	have, err := nft.TableRules(table)
	if err != nil {
		return fmt.Errorf("isolation rules of network %q: %w", cfg.Network, err)
	}
	return compare(table, have, Plan(cfg))
}

// MissingNode returns the planned chains that have no rules in counts (the rule count per chain
// of the bridge table, nft.TableRuleCounts): what a flushed ruleset leaves. STATUS's cheap read.
func MissingNode(cfg Config, counts map[string]int) []*nft.Difference {
	var out []*nft.Difference
	table := nft.BridgeTable(cfg.Network)
	for _, p := range Plan(cfg) {
		if len(p.Rules) > 0 && counts[p.Name] == 0 {
			out = append(out, &nft.Difference{Table: table, Object: "chain " + p.Name, Missing: true, Detail: fmt.Sprintf("missing or empty, want %d rules", len(p.Rules))})
		}
	}
	return out
}

// Remove ends the elements of ports, whatever the configuration says now (anti-spoofing may
// have been on when they were added). In sets with the timeout flag it gives them timeout
// nft.EndTimeout (no deletion, so no grace period for this or any other process: see there); in sets
// without it (the kernel refuses the timeouts), it adds and then deletes each element in the
// same transaction. Either way the transaction succeeds whether or not the element is still
// there (a repeated DEL, an ADD that crashed before adding it): adding an existing element is a
// no-op or an update, where a bare delete would fail as a whole. Missing sets mean there is
// nothing to remove. It needs neither the pod's netns nor anything read back from the pod.
func Remove(network string, ports ...Port) error {
	var errs []error
	for _, batch := range batches(ports, portsPerBatch) {
		errs = append(errs, removeBatch(network, elementsOf(batch, true)))
	}
	return errors.Join(errs...)
}

// removeBatch removes els (by set name) in one transaction; when a set or the table is missing
// (flushed by someone else, or never made), set by set, so the sets that exist are still cleaned.
func removeBatch(network string, els map[string][]nftables.SetElement) error {
	if len(els) == 0 {
		return nil
	}
	table := nft.BridgeTable(network)
	err := removeElements(table, els)
	if !nft.IsNotExist(err) {
		return err
	}
	var errs []error
	for _, name := range removalOrder(els) {
		if err := removeElements(table, map[string][]nftables.SetElement{name: els[name]}); err != nil && !nft.IsNotExist(err) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// removalOrder names the sets of els in the order of sets, fast sets first: removed in several
// transactions, a fast element never outlives the elements it joins, which would let its frames
// past the checks they fail without it.
func removalOrder[T any](els map[string]T) []string {
	var out []string
	for _, s := range sets(nil, false) {
		if _, ok := els[s.Name]; ok {
			out = append(out, s.Name)
		}
	}
	return out
}

// removeElements ends els by expiry, or where the sets have no timeout flag deletes them.
func removeElements(table *nftables.Table, els map[string][]nftables.SetElement) error {
	err := endElements(setsByName(sets(table, true)), els, false)
	if nft.IsInvalid(err) {
		err = endElements(setsByName(sets(table, false)), els, true)
	}
	return err
}

// endElements sends one transaction that gives els timeout nft.EndTimeout, or with deleting adds and
// deletes them.
func endElements(sets map[string]*nftables.Set, els map[string][]nftables.SetElement, deleting bool) error {
	c, err := nft.NewConn()
	if err != nil {
		return fmt.Errorf("isolation elements: netlink: %w", err)
	}
	for name, e := range els {
		ended := make([]nftables.SetElement, len(e))
		for i, el := range e {
			ended[i] = nftables.SetElement{Key: el.Key, Comment: el.Comment, Timeout: nft.EndTimeout}
		}
		if err := c.SetAddElements(sets[name], ended); err != nil {
			return fmt.Errorf("isolation set %s: %w", name, err)
		}
		if !deleting {
			continue
		}
		if err := c.SetDeleteElements(sets[name], ended); err != nil {
			return fmt.Errorf("isolation set %s: %w", name, err)
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("remove isolation elements: %w", err)
	}
	return nil
}

// GC removes every element that keep rejects, given the element's port and its comment (the
// owner it was added for, "" if none), and returns the ports it removed elements of. It reads
// the whole sets (GC may cost what the node holds; ADD and DEL may not).
func GC(network string, keep func(port, owner string) bool) ([]string, error) {
	c, err := nftables.New()
	if err != nil {
		return nil, fmt.Errorf("anti-spoofing elements: netlink: %w", err)
	}
	table := nft.BridgeTable(network)
	stale := map[string][]nftables.SetElement{}
	var ports []string
	for _, s := range sets(table, false) {
		els, err := listElements(c, s)
		if err != nil {
			return nil, err
		}
		for _, el := range els {
			if port := nameOf(el.Key); !keep(port, el.Comment) {
				stale[s.Name] = append(stale[s.Name], nftables.SetElement{Key: el.Key})
				if !slices.Contains(ports, port) {
					ports = append(ports, port)
				}
			}
		}
	}
	if len(stale) == 0 {
		return nil, nil
	}
	slices.Sort(ports)
	var errs []error
	for _, name := range removalOrder(stale) {
		for _, batch := range batches(stale[name], 6*portsPerBatch) {
			errs = append(errs, removeBatch(network, map[string][]nftables.SetElement{name: batch}))
		}
	}
	return ports, errors.Join(errs...)
}

// listElements returns the elements of s but those ended (Remove) that the kernel still lists
// until its next tick; a missing table or set holds none.
func listElements(c *nftables.Conn, s *nftables.Set) ([]nftables.SetElement, error) {
	if ok, err := setExists(s); err != nil || !ok {
		return nil, err
	}
	els, err := c.GetSetElements(s)
	if err != nil {
		return nil, fmt.Errorf("anti-spoofing set %s of table %s: %w", s.Name, s.Table.Name, err)
	}
	return slices.DeleteFunc(els, nft.IsEnded), nil
}

// Check verifies that the chains are as planned and, with anti-spoofing on, that every element
// of p is in place. It reads the sets whole (CHECK may cost what the node holds) and changes
// nothing.
func Check(cfg Config, p Port) error {
	table := nft.BridgeTable(cfg.Network)
	if err := CheckNode(cfg); err != nil {
		return err
	}
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("isolation elements: netlink: %w", err)
	}
	want := p.elements(cfg.AntiSpoofing)
	// Every difference is named (a pod attached while anti-spoofing was off lacks the elements
	// of several sets).
	var diffs []error
	for _, s := range sets(table, false) {
		els, err := listElements(c, s)
		if err != nil {
			return err
		}
		for _, w := range want[s.Name] {
			if !slices.ContainsFunc(els, func(e nftables.SetElement) bool { return slices.Equal(e.Key, w.Key) }) {
				diffs = append(diffs, fmt.Errorf("isolation of pod %s: no element %s", p.Owner, describe(s.Name, w.Key)))
			}
		}
		// Elements of the port that the pod does not own (an address it no longer has) would
		// let it send from them. Without anti-spoofing they do nothing.
		for _, e := range els {
			if cfg.AntiSpoofing && nameOf(e.Key) == p.Name && !slices.ContainsFunc(want[s.Name], func(w nftables.SetElement) bool { return slices.Equal(e.Key, w.Key) }) {
				diffs = append(diffs, fmt.Errorf("isolation of pod %s: stray element %s", p.Owner, describe(s.Name, e.Key)))
			}
		}
	}
	return errors.Join(diffs...)
}
