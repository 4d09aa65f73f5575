package nft

import (
	"fmt"
	"os"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Probe tells whether the kernel can hold what kubenet programs in nftables, by sending one
// transaction that creates scratch tables with every kind of object kubenet's rules use and
// deletes them again: an inet-family NAT chain (Linux 5.2), a map keyed by a concatenation
// (protocol . port) with an address . port value, set element comments, a rule with fib, a map
// lookup into registers, a mark write and dnat from registers, a masquerade, and a bridge-family
// chain that matches link-layer payload. The kernel checks the whole transaction before it
// commits anything, so a kernel that lacks one feature refuses it and nothing stays behind. It
// costs one transaction (the deletion waits for an RCU grace period, ~15 ms): callers record the
// answer per boot.
func Probe() error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nftables: netlink: %w", err)
	}
	name := fmt.Sprintf("kubenet-probe-%d", os.Getpid())
	inet := c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: name})
	pre := c.AddChain(&nftables.Chain{Name: "pre", Table: inet, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest})
	post := c.AddChain(&nftables.Chain{Name: "post", Table: inet, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
	m := &nftables.Set{Table: inet, Name: "m", IsMap: true,
		KeyType:  nftables.MustConcatSetType(nftables.TypeInetProto, nftables.TypeInetService),
		DataType: nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetService)}
	el := nftables.SetElement{Key: []byte{6, 0, 0, 0, 0, 80, 0, 0}, Val: []byte{10, 0, 0, 1, 0, 80, 0, 0}, Comment: "probe"}
	if err := c.AddSet(m, []nftables.SetElement{el}); err != nil {
		return fmt.Errorf("nftables probe map: %w", err)
	}
	c.AddRule(&nftables.Rule{Table: inet, Chain: pre, Exprs: append(MatchLocalDestination(false),
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: Reg32(0)},
		&expr.Payload{DestRegister: Reg32(1), Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Lookup{SourceRegister: Reg32(0), DestRegister: Reg32(0), IsDestRegSet: true, SetName: m.Name, SetID: m.ID},
		&expr.Meta{Key: expr.MetaKeyMARK, Register: Reg32(8)},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: Reg32(8)},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: Reg32(0), RegProtoMin: Reg32(1), Specified: true},
	)})
	c.AddRule(&nftables.Rule{Table: inet, Chain: post, Exprs: []expr.Any{&expr.Masq{}}})
	bridge := c.AddTable(&nftables.Table{Family: nftables.TableFamilyBridge, Name: name})
	bpre := c.AddChain(&nftables.Chain{Name: "pre", Table: bridge, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityRef(-200)})
	c.AddRule(&nftables.Rule{Table: bridge, Chain: bpre, Exprs: []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseLLHeader, Offset: 12, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{0x86, 0xdd}},
		&expr.Verdict{Kind: expr.VerdictDrop},
	}})
	c.DelTable(inet)
	c.DelTable(bridge)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("the kernel refused kubenet's nftables objects: %w", err)
	}
	return nil
}
