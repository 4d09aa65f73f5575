package hairpin

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

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
}

// DedupRule is one planned rule.
type DedupRule struct {
	Comment string
	Exprs   []expr.Any
}

// PlanDedup returns the rules for d. A frame that the bridge device itself sends to one of its
// ports, carrying the bridge's MAC but a pod's source address, is a copy of a pod's own frame
// that the promiscuous bridge handed to the host and the host routed back: drop it. Frames from
// the gateway address are the host's own and pass.
func PlanDedup(d Dedup) []DedupRule {
	var rules []DedupRule
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
			DedupRule{
				Comment: fmt.Sprintf("gateway %s frames pass", gw),
				Exprs: with(append(nft.MatchPrefix(nft.Source, netip.PrefixFrom(gw, gw.BitLen()), false),
					&expr.Verdict{Kind: expr.VerdictAccept})...),
			},
			DedupRule{
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
// mode (so switching modes leaves nothing behind). Either way it is one atomic transaction, safe
// to run from concurrent plugin processes.
func EnsureDedup(m Mode, d Dedup) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("dedup rules: netlink: %w", err)
	}
	table := c.AddTable(nft.BridgeTable(d.Network))
	if m != PromiscuousBridge {
		// The bridge table holds only the dedup chain; adding then deleting it in one batch
		// removes it if present and is a no-op otherwise.
		c.DelTable(table)
	} else {
		ch := c.AddChain(dedupChain(table))
		c.FlushChain(ch)
		for _, r := range PlanDedup(d) {
			c.AddRule(&nftables.Rule{Table: table, Chain: ch, Exprs: r.Exprs, UserData: nft.Comment(r.Comment)})
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("dedup rules for bridge %q: %w", d.Bridge, err)
	}
	return nil
}

// CheckDedup verifies that the dedup rules match the mode.
func CheckDedup(m Mode, d Dedup) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("dedup rules: netlink: %w", err)
	}
	table := nft.BridgeTable(d.Network)
	rules, err := c.GetRules(table, dedupChain(table))
	if m != PromiscuousBridge {
		if err == nil && len(rules) > 0 {
			return fmt.Errorf("dedup rules present on bridge %q in hairpin mode %q", d.Bridge, m)
		}
		return nil
	}
	if err != nil && !isNoEnt(err) {
		return fmt.Errorf("dedup chain of bridge %q: %w", d.Bridge, err)
	}
	want := PlanDedup(d)
	if len(rules) != len(want) {
		return fmt.Errorf("dedup chain of bridge %q has %d rules, want %d", d.Bridge, len(rules), len(want))
	}
	return nil
}

func isNoEnt(err error) bool {
	return err != nil && (err == unix.ENOENT || fmt.Sprint(err) == unix.ENOENT.Error())
}
