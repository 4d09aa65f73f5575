package hairpin

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/kubenet-dev/kubenet/internal/nft"
)

// DedupChain is the bridge-family chain (in the network's bridge table) that drops duplicates.
const DedupChain = "dedup"

// Dedup describes the bridge whose duplicate frames are dropped.
type Dedup struct {
	Network   string
	Bridge    string
	BridgeMAC net.HardwareAddr
	PodCIDRs  []netip.Prefix
	Gateways  []netip.Addr // one per pod CIDR, same order
	// Known remembers the chain's dumps found as planned (nil: compare every dump in full).
	Known nft.Verified
}

// planInputs is what PlanDedup depends on: d without Known.
func (d Dedup) planInputs() Dedup {
	d.Known = nil
	return d
}

// PlanDedup returns the rules for d. A frame that the bridge device itself sends to one of its
// ports, carrying the bridge's MAC but a pod's source address, is a copy of a pod's own frame
// that the promiscuous bridge handed to the host and the host routed back: drop it. Frames from
// the gateway address are the host's own and pass.
func PlanDedup(d Dedup) []nft.Rule {
	var rules []nft.Rule
	for i, cidr := range d.PodCIDRs {
		// The source MAC alone ties the rule to this bridge: the bridge's MAC is pinned and unique
		// (the kernel does not offer the output port's bridge name in the output hook).
		base := []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseLLHeader, Offset: 6, Len: 6},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte(d.BridgeMAC)},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseLLHeader, Offset: 12, Len: 2},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: etherType(cidr.Addr())},
		}
		with := func(more ...expr.Any) []expr.Any { return append(append([]expr.Any{}, base...), more...) }
		gw := d.Gateways[i]
		rules = append(rules,
			nft.Rule{
				Comment: fmt.Sprintf("gateway %s frames pass", gw),
				Exprs: with(append(nft.MatchPrefix(nft.Source, netip.PrefixFrom(gw, gw.BitLen()), false),
					&expr.Verdict{Kind: expr.VerdictAccept})...),
			},
			nft.Rule{
				Comment: fmt.Sprintf("duplicate frames from pods in %s dropped", cidr),
				Exprs:   with(append(nft.MatchPrefix(nft.Source, cidr, false), &expr.Verdict{Kind: expr.VerdictDrop})...),
			})
	}
	return rules
}

func etherType(a netip.Addr) []byte {
	if a.Is6() {
		return []byte{0x86, 0xdd}
	}
	return []byte{0x08, 0x00}
}

func dedupChain(t *nftables.Table) *nftables.Chain {
	return &nftables.Chain{
		Name: DedupChain, Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter,
	}
}

// EnsureDedup installs the dedup rules in promiscuous-bridge mode and removes them in every other
// mode (so switching modes leaves nothing behind). On a node already in the wanted state it only
// reads; every write is one atomic transaction, safe from concurrent plugin processes. The
// network's bridge table holds other packages' chains too (isolation): only the dedup chain is
// touched.
func EnsureDedup(m Mode, d Dedup) error {
	chain := dedupChain(nft.BridgeTable(d.Network))
	if m == PromiscuousBridge {
		if err := nft.SyncChain(d.Known, chain, PlanDedup(d), d.planInputs()); err != nil {
			return fmt.Errorf("dedup rules for bridge %q: %w", d.Bridge, err)
		}
		return nil
	}
	dump, err := nft.DumpChain(chain)
	if err != nil {
		return fmt.Errorf("dedup rules: %w", err)
	}
	counts, err := dump.Counts()
	if err != nil {
		return fmt.Errorf("dedup rules: %w", err)
	}
	if counts[chain.Name] == 0 {
		return nil // no chain, or an empty one, which drops nothing
	}
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("dedup rules: netlink: %w", err)
	}
	// Adding the table and chain before deleting keeps the batch valid if a concurrent process
	// removed the chain in between.
	c.AddTable(chain.Table)
	c.FlushChain(c.AddChain(chain))
	c.DelChain(chain)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("remove dedup rules of bridge %q: %w", d.Bridge, err)
	}
	return nil
}

// CheckDedup verifies that the dedup rules match the mode.
func CheckDedup(m Mode, d Dedup) error {
	want := PlanDedup(d)
	if m != PromiscuousBridge {
		want = nil
	}
	if err := nft.CheckChain(dedupChain(nft.BridgeTable(d.Network)), want); err != nil {
		return fmt.Errorf("dedup rules of bridge %q in hairpin mode %s: %w", d.Bridge, m, err)
	}
	return nil
}
