package masq

import (
	"context"
	"fmt"

	"github.com/kubenet-dev/kubenet/internal/ipt"
)

// The iptables backend keeps the same rules as old kubenet's non-masquerade rule, in a chain of
// its own per family in the nat table, reached from POSTROUTING by one jump. The rule count
// depends only on the configuration.

// IPTablesChain is the network's SNAT chain in the nat table of iptables and ip6tables.
func IPTablesChain(network string) string { return "KUBENET-MASQ-" + ipt.ChainSuffix(network) }

// PlanIPTables returns, per IP family of cfg's pod CIDRs, the SNAT chain and its jump from
// POSTROUTING, with the same rules in the same order as Plan. Pure.
func PlanIPTables(cfg Config) map[ipt.Family]ipt.Plan {
	out := map[ipt.Family]ipt.Plan{}
	chain := IPTablesChain(cfg.Network)
	for _, pod := range cfg.PodCIDRs {
		f := ipt.FamilyOf(pod.Addr().Is6())
		p := out[f]
		src := "-s " + pod.String()
		rule := func(more, comment, target string) string {
			r := src
			if more != "" {
				r += " " + more
			}
			return r + " -m comment --comment " + ipt.Quote(comment) + " -j " + target
		}
		if len(p.Chains) == 0 {
			p.Chains = []ipt.Chain{{Name: chain}}
			p.Jumps = []ipt.Jump{{From: "POSTROUTING", Rule: "-m comment --comment " + ipt.Quote("kubenet "+cfg.Network+": pod SNAT") + " -j " + chain}}
		}
		c := &p.Chains[0]
		c.Rules = append(c.Rules, rule("-d "+pod.String(), fmt.Sprintf("pod %s to own pod CIDR: keep source", pod), "RETURN"))
		for _, keep := range cfg.NonMasqueradeCIDRs {
			if keep.Addr().Is4() != pod.Addr().Is4() {
				continue
			}
			c.Rules = append(c.Rules, rule("-d "+keep.Masked().String(), fmt.Sprintf("pod %s to non-masquerade %s: keep source", pod, keep), "RETURN"))
		}
		c.Rules = append(c.Rules,
			rule("-m addrtype --dst-type LOCAL", fmt.Sprintf("pod %s to a node-local address: keep source", pod), "RETURN"),
			rule("", fmt.Sprintf("pod %s to outside: SNAT to the node", pod), "MASQUERADE"))
		out[f] = p
	}
	return out
}

// EnsureIPTables makes the nat tables hold PlanIPTables(cfg), reading each family's table from
// st and writing only when it differs.
func EnsureIPTables(ctx context.Context, st *ipt.State, cfg Config) error {
	for f, p := range PlanIPTables(cfg) {
		if _, err := p.Ensure(ctx, st, f, "nat"); err != nil {
			return fmt.Errorf("masquerade rules for network %q: %w", cfg.Network, err)
		}
	}
	return nil
}

// CheckIPTables reports how the nat tables differ from PlanIPTables(cfg).
func CheckIPTables(ctx context.Context, st *ipt.State, cfg Config) error {
	for f, p := range PlanIPTables(cfg) {
		if err := p.Check(ctx, st, f, "nat"); err != nil {
			return fmt.Errorf("masquerade rules of network %q: %w", cfg.Network, err)
		}
	}
	return nil
}

// IPTablesChains names the network's chains of this package, per table: what removing the
// iptables backend from the node removes.
func IPTablesChains(network string) map[string][]string {
	return map[string][]string{"nat": {IPTablesChain(network)}}
}

// HasIPTablesChain tells whether the network's SNAT chain exists in iptables or ip6tables (the
// tools of st's root): the network's rules are there. False when the tools cannot run. Where the
// kernel has no nat table of a family the tools are not run: a node's first ADD asks this, and
// four execs of them took it several milliseconds, holding the network lock.
func HasIPTablesChain(st *ipt.State, network string) bool {
	for _, f := range []ipt.Family{ipt.IPv4, ipt.IPv6} {
		if !f.MayHaveTable("nat") || st.Available(f) != nil {
			continue
		}
		if t, err := st.Table(context.Background(), f, "nat"); err == nil && t.Has(IPTablesChain(network)) {
			return true
		}
	}
	return false
}
