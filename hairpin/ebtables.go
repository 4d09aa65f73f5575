package hairpin

import (
	"context"
	"fmt"
	"strings"

	"github.com/kubenet-dev/kubenet/internal/ipt"
)

// The iptables backend drops the promiscuous bridge's duplicate frames with ebtables, as AKS's
// kubenet nodes did: a chain in the filter table's OUTPUT (frames the bridge device itself sends
// to its ports), with the same two rules per pod CIDR as PlanDedup.

// EbtablesDedupChain is the network's dedup chain in ebtables' filter table.
func EbtablesDedupChain(network string) string { return "KUBENET-DEDUP-" + ipt.ChainSuffix(network) }

// PlanDedupEbtables returns the dedup chain and its jump from OUTPUT for d, as promiscuous-bridge
// mode needs them (the other modes have none). Pure.
func PlanDedupEbtables(d Dedup) ipt.Plan {
	chain := ipt.Chain{Name: EbtablesDedupChain(d.Network), Policy: "RETURN"}
	mac := strings.ToLower(d.BridgeMAC.String())
	for i, cidr := range d.PodCIDRs {
		proto, src := "IPv4", "--ip-src"
		if cidr.Addr().Is6() {
			proto, src = "IPv6", "--ip6-src"
		}
		gw := d.Gateways[i]
		chain.Rules = append(chain.Rules,
			fmt.Sprintf("-p %s -s %s %s %s -j ACCEPT", proto, mac, src, gw),
			fmt.Sprintf("-p %s -s %s %s %s -j DROP", proto, mac, src, cidr))
	}
	return ipt.Plan{Chains: []ipt.Chain{chain}, Jumps: []ipt.Jump{{From: "OUTPUT", Rule: "-j " + chain.Name}}}
}

// EnsureDedupEbtables installs the dedup rules in promiscuous-bridge mode and removes them in
// every other mode, reading ebtables' filter table through st and writing only what differs.
func EnsureDedupEbtables(ctx context.Context, st *ipt.State, m Mode, d Dedup) error {
	if m == PromiscuousBridge {
		if _, err := PlanDedupEbtables(d).Ensure(ctx, st, ipt.Bridge, "filter"); err != nil {
			return fmt.Errorf("dedup rules for bridge %q: %w", d.Bridge, err)
		}
		return nil
	}
	t, err := st.Chains(ctx, ipt.Bridge, "filter", "OUTPUT", EbtablesDedupChain(d.Network))
	if err != nil {
		return fmt.Errorf("dedup rules: %w", err)
	}
	lines := ipt.RemoveLines(t, []string{EbtablesDedupChain(d.Network)})
	if len(lines) == 0 {
		return nil
	}
	if err := st.Restore(ctx, ipt.Bridge, "filter", lines); err != nil {
		return fmt.Errorf("remove dedup rules of bridge %q: %w", d.Bridge, err)
	}
	return nil
}

// CheckDedupEbtables verifies that the dedup rules match the mode: present as planned in
// promiscuous-bridge mode, absent otherwise.
func CheckDedupEbtables(ctx context.Context, st *ipt.State, m Mode, d Dedup) error {
	if m == PromiscuousBridge {
		if err := PlanDedupEbtables(d).Check(ctx, st, ipt.Bridge, "filter"); err != nil {
			return fmt.Errorf("dedup rules of bridge %q in hairpin mode %s: %w", d.Bridge, m, err)
		}
		return nil
	}
	t, err := st.Chains(ctx, ipt.Bridge, "filter", EbtablesDedupChain(d.Network))
	if err != nil {
		return err
	}
	if chain := EbtablesDedupChain(d.Network); t.Has(chain) {
		return &ipt.Difference{Family: ipt.Bridge, Table: "filter", Object: "chain " + chain,
			Detail: fmt.Sprintf("present in hairpin mode %s, which has no dedup rules", m)}
	}
	return nil
}

// EbtablesChains names the chains of the network's dedup rules, per ebtables table.
func EbtablesChains(network string) map[string][]string {
	return map[string][]string{"filter": {EbtablesDedupChain(network)}}
}
