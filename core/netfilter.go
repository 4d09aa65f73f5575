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
	"github.com/kubenet-dev/kubenet/ipam"
	"github.com/kubenet-dev/kubenet/isolation"
	"github.com/kubenet-dev/kubenet/masq"
	"github.com/kubenet-dev/kubenet/netpol"
)

// packetFilter is the node's netfilter backend as the verbs see it: everything kubenet keeps in
// the kernel's packet filter for one network (SNAT, the promiscuous bridge's dedup rules, pod
// isolation, host ports). nftablesFilter and iptablesFilter implement it with the same behaviour;
// the verbs call only this, so they do not know which one runs. backend.go chooses one per node.
type packetFilter interface {
	backend() NetfilterBackend
	ensureMasquerade(masq.Config) error
	// ensureDedup installs the dedup rules in promiscuous-bridge mode and removes them in the
	// others; settingsChanged says that the node's settings were just written (a mode left
	// behind shows only then), so a backend whose reads are dear may skip the removal otherwise.
	ensureDedup(m hairpin.Mode, d hairpin.Dedup, settingsChanged bool) error
	// ensureIsolation brings the bridge's isolation chains up to date and adds ports; rebuilt
	// says that the chains were missing (every running pod's part went with them).
	ensureIsolation(cfg isolation.Config, ports ...isolation.Port) (rebuilt bool, err error)
	removeIsolation(network string, ports ...isolation.Port) error
	checkIsolation(isolation.Config, isolation.Port) error
	// gcIsolation removes the isolation of every port keep rejects; owner is "" where the
	// backend records none (ebtables).
	gcIsolation(network string, keep func(port, owner string) bool) error
	hostPorts() hostport.Backend
	// checkNode reports how every node-wide rule differs from the plan (CHECK, the agent).
	checkNode(cfg *Config) error
	// missingNode reports node-wide rules that are missing altogether (STATUS), reading as
	// little as it can: hostPortsUsed says whether the host-port chains count, asked only when
	// the answer matters.
	missingNode(cfg *Config, hostPortsUsed func() (bool, error)) error
	// removeAll removes everything of the network from this backend: the node switches to the
	// other one.
	removeAll(network string) error
}

// filterFor returns the implementation of b for the network of store. Each call gets its own:
// the iptables one reads each table once per operation, and writes node-wide rules under the
// network's netfilter lock (nftables transactions need none: each replaces whole chains).
func filterFor(cfg *Config, b NetfilterBackend, store *ipam.Store) packetFilter {
	if b == NetfilterIPTables {
		return &iptablesFilter{st: &ipt.State{Root: cfg.ToolRoot, Serialize: func(f func() error) error {
			unlock, err := store.LockNetfilter()
			if err != nil {
				return err
			}
			return errors.Join(f(), unlock())
		}}}
	}
	return nftablesFilter{}
}

type nftablesFilter struct{}

func (nftablesFilter) backend() NetfilterBackend            { return NetfilterNFTables }
func (nftablesFilter) ensureMasquerade(c masq.Config) error { return masq.Ensure(c) }
func (nftablesFilter) ensureDedup(m hairpin.Mode, d hairpin.Dedup, _ bool) error {
	return hairpin.EnsureDedup(m, d) // one netlink dump: looked for on every call
}
func (nftablesFilter) ensureIsolation(c isolation.Config, ports ...isolation.Port) (bool, error) {
	return isolation.Ensure(c, ports...)
}
func (nftablesFilter) removeIsolation(network string, ports ...isolation.Port) error {
	return isolation.Remove(network, ports...)
}
func (nftablesFilter) checkIsolation(c isolation.Config, p isolation.Port) error {
	return isolation.Check(c, p)
}
func (nftablesFilter) gcIsolation(network string, keep func(port, owner string) bool) error {
	_, err := isolation.GC(network, keep)
	return err
}
func (nftablesFilter) hostPorts() hostport.Backend { return hostport.NFTables() }

func (nftablesFilter) checkNode(cfg *Config) error {
	return errors.Join(
		masq.Check(masqConfig(cfg)),
		hairpin.CheckDedup(cfg.Hairpin, dedupFor(cfg)),
		isolation.CheckNode(isolationConfig(cfg)),
		hostport.CheckNode(hostportConfigWith(cfg, hostport.NFTables(), "")), // reads no index: no data dir needed
	)
}

// missingNode counts the rules of each chain of the network's inet table from one dump, without
// decoding them.
//
// The isolation chains are not counted: a node upgraded from a kubenet without them would answer
// NotReady, and kubelet would start no pod whose ADD could set them up. A flushed ruleset is
// told by the SNAT chain (and, once used, the host-port chains); ADD and the agent put the
// isolation chains and elements back.
func (f nftablesFilter) missingNode(cfg *Config, hostPortsUsed func() (bool, error)) error {
	table := nft.InetTable(cfg.Network)
	counts, err := nft.TableRuleCounts(table)
	if err != nil {
		return err
	}
	var out []error
	if n := len(masq.Plan(masqConfig(cfg))); n > 0 && counts[masq.ChainName] == 0 {
		out = append(out, &nft.Difference{Table: table, Object: "chain " + masq.ChainName, Missing: true, Detail: fmt.Sprintf("missing or empty, want %d rules", n)})
	}
	// The host-port chains are told from the same counts; whether host ports were used is
	// asked only when one is missing (a node without them is the exception).
	missing, err := hostport.MissingNode(hostportConfigWith(cfg, f.hostPorts(), ""), counts)
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
	if cfg.Hairpin == hairpin.PromiscuousBridge {
		// In the other modes the dedup rules are absent by plan: nothing of theirs can be missing.
		err := hairpin.CheckDedup(cfg.Hairpin, dedupFor(cfg))
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

// removeAll deletes the network's two tables in one transaction; the NetworkPolicy table goes
// too (policies are enforced with nftables only).
func (nftablesFilter) removeAll(network string) error {
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

// iptablesFilter is the iptables backend: iptables and ip6tables for SNAT and host ports,
// ebtables for the dedup rules and pod isolation. st reads each table once per operation.
type iptablesFilter struct{ st *ipt.State }

func (f *iptablesFilter) backend() NetfilterBackend { return NetfilterIPTables }
func (f *iptablesFilter) ensureMasquerade(c masq.Config) error {
	return masq.EnsureIPTables(context.Background(), f.st, c)
}

// ensureDedup looks for dedup rules to remove only when the settings changed: ebtables reads
// cost a process each, and only a change of hairpin mode leaves such rules behind (the agent's
// healing looks on every pass).
func (f *iptablesFilter) ensureDedup(m hairpin.Mode, d hairpin.Dedup, settingsChanged bool) error {
	if m != hairpin.PromiscuousBridge && !settingsChanged {
		return nil
	}
	return hairpin.EnsureDedupEbtables(context.Background(), f.st, m, d)
}
func (f *iptablesFilter) ensureIsolation(c isolation.Config, ports ...isolation.Port) (bool, error) {
	return isolation.EnsureEbtables(context.Background(), f.st, c, ports...)
}
func (f *iptablesFilter) removeIsolation(network string, ports ...isolation.Port) error {
	return isolation.RemoveEbtables(context.Background(), f.st, network, ports...)
}
func (f *iptablesFilter) checkIsolation(c isolation.Config, p isolation.Port) error {
	return isolation.CheckEbtables(context.Background(), f.st, c, p)
}
func (f *iptablesFilter) gcIsolation(network string, keep func(port, owner string) bool) error {
	_, err := isolation.GCEbtables(context.Background(), f.st, network, keep)
	return err
}
func (f *iptablesFilter) hostPorts() hostport.Backend { return hostport.IPTables(f.st) }

func (f *iptablesFilter) checkNode(cfg *Config) error {
	ctx := context.Background()
	return errors.Join(
		masq.CheckIPTables(ctx, f.st, masqConfig(cfg)),
		hairpin.CheckDedupEbtables(ctx, f.st, cfg.Hairpin, dedupFor(cfg)),
		isolation.CheckNodeEbtables(ctx, f.st, isolationConfig(cfg)),
		hostport.CheckNode(hostportConfigWith(cfg, f.hostPorts(), "")),
	)
}

// missingNode lists kubenet's fixed chains by name and looks for missing or emptied ones
// (ipt.State.Sentinels: what a reload leaves; the chains of pods are never read, so STATUS costs
// the same on a full node), and ebtables' dedup chain in promiscuous-bridge mode. As with
// nftables, the isolation chains do not count.
func (f *iptablesFilter) missingNode(cfg *Config, hostPortsUsed func() (bool, error)) error {
	// Asked first here: the host-port check is a process of its own.
	used, err := hostPortsUsed()
	if err != nil {
		return err
	}
	ctx := context.Background()
	f.st.Sentinels = true
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
	checks := []func(){func() { missing(masq.CheckIPTables(ctx, f.st, masqConfig(cfg))) }}
	if used {
		checks = append(checks, func() {
			m, err := hostport.MissingNode(hostportConfigWith(cfg, f.hostPorts(), ""), nil)
			missing(errors.Join(append(m, err)...))
		})
	}
	if cfg.Hairpin == hairpin.PromiscuousBridge {
		checks = append(checks, func() { missing(hairpin.CheckDedupEbtables(ctx, f.st, cfg.Hairpin, dedupFor(cfg))) })
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

// removeAll removes the network's chains and the jumps to them from every table of the three
// tools, one restore per table.
func (f *iptablesFilter) removeAll(network string) error {
	if f.st.Serialize == nil {
		return removeIPTables(f.st.Root, network)
	}
	return f.st.Serialize(func() error { return removeIPTables(f.st.Root, network) })
}

// removeIPTables is removeAll from reads taken now (under the netfilter lock).
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
