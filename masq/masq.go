// Package masq programs the node-wide SNAT of one kubenet network: traffic from the node's pod
// CIDRs to destinations that are neither in the non-masquerade CIDRs, nor in the node's own pod
// CIDRs, nor local to the node leaves with the node's address. The rule count depends only on
// the configuration (per family: 3 + the non-masquerade CIDRs of that family), never on the number
// of pods, so ADD and DEL cost the same on a full node as on an empty one.
package masq

import (
	"fmt"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/kubenet-dev/kubenet/internal/nft"
)

// ChainName is the nat/postrouting chain this package owns in the network's inet table.
const ChainName = "pod-masquerade"

// Config is what the SNAT rules depend on, and Known, which remembers the chain's dumps found
// as planned (nil: compare every dump in full).
type Config struct {
	Network            string
	PodCIDRs           []netip.Prefix
	NonMasqueradeCIDRs []netip.Prefix
	Known              nft.Verified
}

// planInputs is what Plan depends on: cfg without Known.
func (cfg Config) planInputs() Config {
	cfg.Known = nil
	return cfg
}

// Plan returns the rules for cfg in evaluation order. It is pure so the plan can be tested
// without a kernel.
func Plan(cfg Config) []nft.Rule {
	var rules []nft.Rule
	ret := &expr.Verdict{Kind: expr.VerdictReturn}
	for _, pod := range cfg.PodCIDRs {
		base := append(nft.MatchFamily(pod.Addr()), nft.MatchPrefix(nft.Source, pod, false)...)
		with := func(more ...expr.Any) []expr.Any {
			return append(append([]expr.Any{}, base...), more...)
		}
		rules = append(rules, nft.Rule{
			Comment: fmt.Sprintf("pod %s to own pod CIDR: keep source", pod),
			Exprs:   with(append(nft.MatchPrefix(nft.Destination, pod, false), ret)...),
		})
		for _, keep := range cfg.NonMasqueradeCIDRs {
			if keep.Addr().Is4() != pod.Addr().Is4() {
				continue
			}
			rules = append(rules, nft.Rule{
				Comment: fmt.Sprintf("pod %s to non-masquerade %s: keep source", pod, keep),
				Exprs:   with(append(nft.MatchPrefix(nft.Destination, keep, false), ret)...),
			})
		}
		rules = append(rules,
			nft.Rule{
				Comment: fmt.Sprintf("pod %s to a node-local address: keep source", pod),
				Exprs:   with(append(nft.MatchLocalDestination(false), ret)...),
			},
			nft.Rule{
				Comment: fmt.Sprintf("pod %s to outside: SNAT to the node", pod),
				Exprs:   with(&expr.Masq{}),
			})
	}
	return rules
}

func chain(table *nftables.Table) *nftables.Chain {
	return &nftables.Chain{
		Name:     ChainName,
		Table:    table,
		Type:     nftables.ChainTypeNAT,
		Hooknum:  nftables.ChainHookPostrouting,
		Priority: nftables.ChainPriorityNATSource,
	}
}

// Ensure makes the network's SNAT chain hold exactly Plan(cfg). It is idempotent, safe to run
// from many plugin processes at once, and on a configured node it only reads.
func Ensure(cfg Config) error {
	if err := nft.SyncChain(cfg.Known, chain(nft.InetTable(cfg.Network)), Plan(cfg), cfg.planInputs()); err != nil {
		return fmt.Errorf("masquerade rules for network %q: %w", cfg.Network, err)
	}
	return nil
}

// Check reports the first difference between the chain and the plan.
func Check(cfg Config) error {
	if err := nft.CheckChain(chain(nft.InetTable(cfg.Network)), Plan(cfg)); err != nil {
		return fmt.Errorf("masquerade rules of network %q: %w", cfg.Network, err)
	}
	return nil
}
