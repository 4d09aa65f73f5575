package core

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/google/nftables"

	"github.com/kubenet-dev/kubenet/hairpin"
	"github.com/kubenet-dev/kubenet/hostport"
	"github.com/kubenet-dev/kubenet/internal/ipt"
	"github.com/kubenet-dev/kubenet/internal/nft"
	"github.com/kubenet-dev/kubenet/isolation"
	"github.com/kubenet-dev/kubenet/masq"
	"github.com/kubenet-dev/kubenet/netpol"
)

// NetfilterBackend is a value of the netfilterBackend key, and (nftables, iptables) the backend
// that holds a network's rules on a node.
type NetfilterBackend string

const (
	// NetfilterAuto, the default, is nftables where the kernel holds everything kubenet uses
	// in nftables (nft.Probe), else iptables.
	NetfilterAuto     NetfilterBackend = "auto"
	NetfilterNFTables NetfilterBackend = "nftables"
	NetfilterIPTables NetfilterBackend = "iptables"
)

// NetfilterBackends lists the values of the netfilterBackend key.
func NetfilterBackends() []NetfilterBackend {
	return []NetfilterBackend{NetfilterAuto, NetfilterNFTables, NetfilterIPTables}
}

func parseNetfilterBackend(s string) (NetfilterBackend, error) {
	if s == "" {
		return NetfilterAuto, nil
	}
	for _, b := range NetfilterBackends() {
		if NetfilterBackend(s) == b {
			return b, nil
		}
	}
	return "", configError("netfilterBackend", s, "valid values are %q, %q and %q", NetfilterAuto, NetfilterNFTables, NetfilterIPTables)
}

// nodeRules are the plans of one network's node-wide rules in the mechanisms' terms (the
// handle makes them from its Config: network.nodeRules).
type nodeRules struct {
	network   string
	masq      masq.Config
	hairpin   hairpin.Mode
	dedup     hairpin.Dedup
	isolation isolation.Config
	// hostPorts reads no index (Dir is empty): the node-wide chains and maps only.
	hostPorts hostport.Config
}

// netfilter is one backend of the node's packet filter: everything kubenet keeps there for one
// network (SNAT, the promiscuous bridge's dedup rules, pod isolation, host ports), each field
// that backend's way of doing one job. nftablesRules and iptablesRules fill it with the same
// behaviour; a verb's handle holds the one chosen when it opened, so the verbs call these
// without knowing which backend runs, and a verb without a handle has no backend to call.
type netfilter struct {
	backend          NetfilterBackend
	ensureMasquerade func(masq.Config) error
	checkMasquerade  func(masq.Config) error
	// ensureDedup installs the dedup rules in promiscuous-bridge mode and removes them in the
	// others; settingsChanged says that the node's settings were just written (a mode left
	// behind shows only then), so a backend whose reads are dear may skip the removal otherwise.
	ensureDedup func(m hairpin.Mode, d hairpin.Dedup, settingsChanged bool) error
	checkDedup  func(hairpin.Mode, hairpin.Dedup) error
	// ensureIsolation brings the bridge's isolation chains up to date and adds ports; rebuilt
	// says that the chains were missing (every running pod's part went with them).
	ensureIsolation    func(cfg isolation.Config, ports ...isolation.Port) (rebuilt bool, err error)
	removeIsolation    func(network string, ports ...isolation.Port) error
	checkIsolation     func(isolation.Config, isolation.Port) error
	checkIsolationNode func(isolation.Config) error
	// gcIsolation removes the isolation of every port keep rejects; owner is "" where the
	// backend records none (ebtables).
	gcIsolation func(network string, keep func(port, owner string) bool) ([]string, error)
	hostPorts   hostport.Backend
	// missingNode reports node-wide rules that are missing altogether (STATUS), reading as
	// little as it can: hostPortsUsed says whether the host-port chains count, asked only when
	// the answer matters.
	missingNode func(r nodeRules, hostPortsUsed func() (bool, error)) error
	// removeAll removes everything of the network from this backend: the node switches to the
	// other one.
	removeAll func(network string) error
}

// checkNode reports how every node-wide rule differs from the plan (CHECK, the agent).
func (nf netfilter) checkNode(r nodeRules) error {
	return errors.Join(
		nf.checkMasquerade(r.masq),
		nf.checkDedup(r.hairpin, r.dedup),
		nf.checkIsolationNode(r.isolation),
		hostport.CheckNode(r.hostPorts),
	)
}

// nftablesRules is the nftables backend: the mechanisms' own functions.
func nftablesRules() netfilter {
	return netfilter{
		backend:          NetfilterNFTables,
		ensureMasquerade: masq.Ensure,
		checkMasquerade:  masq.Check,
		ensureDedup: func(m hairpin.Mode, d hairpin.Dedup, _ bool) error {
			return hairpin.EnsureDedup(m, d) // one netlink dump: looked for on every call
		},
		checkDedup:         hairpin.CheckDedup,
		ensureIsolation:    isolation.Ensure,
		removeIsolation:    isolation.Remove,
		checkIsolation:     isolation.Check,
		checkIsolationNode: isolation.CheckNode,
		gcIsolation:        isolation.GC,
		hostPorts:          hostport.NFTables(),
		missingNode:        missingNFTables,
		removeAll:          removeNFTables,
	}
}

// iptablesRules is the iptables backend: iptables and ip6tables for SNAT and host ports,
// ebtables for the dedup rules and pod isolation, the tools found in root. One ipt.State reads
// each table once per verb; serialize runs the writes of node-wide rules under the network's
// netfilter lock (nftables transactions need none: each replaces whole chains).
func iptablesRules(root string, serialize func(func() error) error) netfilter {
	ctx := context.Background()
	st := &ipt.State{Root: root, Serialize: serialize}
	return netfilter{
		backend:          NetfilterIPTables,
		ensureMasquerade: func(c masq.Config) error { return masq.EnsureIPTables(ctx, st, c) },
		checkMasquerade:  func(c masq.Config) error { return masq.CheckIPTables(ctx, st, c) },
		// Dedup rules are looked for to remove only when the settings changed: ebtables reads
		// cost a process each, and only a change of hairpin mode leaves such rules behind (the
		// agent's healing looks on every pass).
		ensureDedup: func(m hairpin.Mode, d hairpin.Dedup, settingsChanged bool) error {
			if m != hairpin.PromiscuousBridge && !settingsChanged {
				return nil
			}
			return hairpin.EnsureDedupEbtables(ctx, st, m, d)
		},
		checkDedup: func(m hairpin.Mode, d hairpin.Dedup) error { return hairpin.CheckDedupEbtables(ctx, st, m, d) },
		ensureIsolation: func(c isolation.Config, ports ...isolation.Port) (bool, error) {
			return isolation.EnsureEbtables(ctx, st, c, ports...)
		},
		removeIsolation: func(network string, ports ...isolation.Port) error {
			return isolation.RemoveEbtables(ctx, st, network, ports...)
		},
		checkIsolation:     func(c isolation.Config, p isolation.Port) error { return isolation.CheckEbtables(ctx, st, c, p) },
		checkIsolationNode: func(c isolation.Config) error { return isolation.CheckNodeEbtables(ctx, st, c) },
		gcIsolation: func(network string, keep func(port, owner string) bool) ([]string, error) {
			return isolation.GCEbtables(ctx, st, network, keep)
		},
		hostPorts: hostport.IPTables(st),
		missingNode: func(r nodeRules, hostPortsUsed func() (bool, error)) error {
			// A State of its own: sentinel reads are a mode of the reads, not of the verb.
			return missingIPTables(&ipt.State{Root: root, Serialize: serialize, Sentinels: true}, r, hostPortsUsed)
		},
		removeAll: func(network string) error {
			if serialize == nil {
				return removeIPTables(root, network)
			}
			return serialize(func() error { return removeIPTables(root, network) })
		},
	}
}

// missingNFTables counts the rules of each chain of the network's inet table from one dump,
// without decoding them.
//
// The isolation chains are not counted: a node upgraded from a kubenet without them would answer
// NotReady, and kubelet would start no pod whose ADD could set them up. A flushed ruleset is
// told by the SNAT chain (and, once used, the host-port chains); ADD and the agent put the
// isolation chains and elements back.
func missingNFTables(r nodeRules, hostPortsUsed func() (bool, error)) error {
	table := nft.InetTable(r.network)
	counts, err := nft.TableRuleCounts(table)
	if err != nil {
		return err
	}
	var out []error
	if n := len(masq.Plan(r.masq)); n > 0 && counts[masq.ChainName] == 0 {
		out = append(out, &nft.Difference{Table: table, Object: "chain " + masq.ChainName, Missing: true, Detail: fmt.Sprintf("missing or empty, want %d rules", n)})
	}
	// The host-port chains are told from the same counts; whether host ports were used is
	// asked only when one is missing (a node without them is the exception).
	missing, err := hostport.MissingNode(r.hostPorts, counts)
	if err != nil {
		return err
	}
	if len(missing) > 0 {
		used, err := hostPortsUsed()
		if err != nil {
			return err
		}
		if used {
			out = append(out, missing...)
		}
	}
	if r.hairpin == hairpin.PromiscuousBridge {
		// In the other modes the dedup rules are absent by plan: nothing of theirs can be missing.
		err := hairpin.CheckDedup(r.hairpin, r.dedup)
		var d *nft.Difference
		if err != nil && !errors.As(err, &d) {
			return err // a failed read: STATUS cannot vouch for the rules
		}
		for _, m := range nft.Missing(err) {
			out = append(out, m)
		}
	}
	return errors.Join(out...)
}

// removeNFTables deletes the network's two tables in one transaction; the NetworkPolicy table
// goes too (policies are enforced with nftables only).
func removeNFTables(network string) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nftables: netlink: %w", err)
	}
	tables := []*nftables.Table{nft.InetTable(network), nft.BridgeTable(network), {Name: netpol.TableName(network), Family: nftables.TableFamilyINet}}
	var existing []*nftables.Table
	for _, t := range tables {
		ok, err := nft.TableExistsWith(c, t)
		if err != nil {
			return fmt.Errorf("nftables tables: %w", err)
		}
		if ok {
			existing = append(existing, t)
		}
	}
	if len(existing) == 0 {
		return nil
	}
	for _, t := range existing {
		c.DelTable(t)
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("remove the nftables tables of network %q: %w", network, err)
	}
	return nil
}

// missingIPTables lists kubenet's fixed chains by name and looks for missing or emptied ones
// (st reads sentinels: what a reload leaves; the chains of pods are never read, so STATUS costs
// the same on a full node), and ebtables' dedup chain in promiscuous-bridge mode. As with
// nftables, the isolation chains do not count.
func missingIPTables(st *ipt.State, r nodeRules, hostPortsUsed func() (bool, error)) error {
	// Asked first here: the host-port check is a process of its own.
	used, err := hostPortsUsed()
	if err != nil {
		return err
	}
	ctx := context.Background()
	// The mechanisms' listings run at once: STATUS then waits for the slowest, not for the sum
	// (each is a process that reads a table the size of the node).
	var (
		mu      sync.Mutex
		out     []error
		readErr []error
	)
	missing := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		var d *ipt.Difference
		for _, e := range flatten(err) {
			switch {
			case !errors.As(e, &d):
				// A failed read, told with the mechanism's context: STATUS cannot vouch for
				// the rules.
				readErr = append(readErr, err)
				return
			case d.Missing:
				out = append(out, d)
			}
		}
	}
	checks := []func(){func() { missing(masq.CheckIPTables(ctx, st, r.masq)) }}
	if used {
		hp := r.hostPorts
		hp.Backend = hostport.IPTables(st)
		checks = append(checks, func() {
			m, err := hostport.MissingNode(hp, nil)
			missing(errors.Join(append(m, err)...))
		})
	}
	if r.hairpin == hairpin.PromiscuousBridge {
		checks = append(checks, func() { missing(hairpin.CheckDedupEbtables(ctx, st, r.hairpin, r.dedup)) })
	}
	if err := ipt.InCallerNS(checks...); err != nil {
		return err
	}
	if len(readErr) > 0 {
		return readErr[0]
	}
	return errors.Join(out...)
}

// flatten returns the errors joined or wrapped in err, innermost first where wrapped.
func flatten(err error) []error {
	switch e := err.(type) {
	case nil:
		return nil
	case interface{ Unwrap() []error }:
		var out []error
		for _, inner := range e.Unwrap() {
			out = append(out, flatten(inner)...)
		}
		return out
	case interface{ Unwrap() error }:
		if inner := flatten(e.Unwrap()); len(inner) > 0 {
			return inner
		}
	}
	return []error{err}
}

// removeIPTables removes the network's chains and the jumps to them from every table of the
// three tools, one restore per table, from reads taken now (under the netfilter lock).
func removeIPTables(root, network string) error {
	ctx := context.Background()
	st := &ipt.State{Root: root}
	type target struct {
		fam   ipt.Family
		table string
	}
	chains := map[target][]string{}
	for _, fam := range []ipt.Family{ipt.IPv4, ipt.IPv6} {
		for table, names := range masq.IPTablesChains(network) {
			chains[target{fam, table}] = append(chains[target{fam, table}], names...)
		}
		for table, names := range hostport.IPTablesChains(network) {
			chains[target{fam, table}] = append(chains[target{fam, table}], names...)
		}
	}
	for table, names := range hairpin.EbtablesChains(network) {
		chains[target{ipt.Bridge, table}] = append(chains[target{ipt.Bridge, table}], names...)
	}
	var errs []error
	iso := target{ipt.Bridge, isolation.EbtablesTable()}
	if t, err := st.Table(ctx, iso.fam, iso.table); err == nil {
		chains[iso] = append(chains[iso], isolation.EbtablesChains(t, network)...)
	} else {
		errs = append(errs, err)
	}
	for tg, names := range chains {
		t, err := st.Table(ctx, tg.fam, tg.table)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		errs = append(errs, st.Restore(ctx, tg.fam, tg.table, ipt.RemoveLines(t, names)))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("remove the iptables rules of network %q: %w", network, err)
	}
	return nil
}
