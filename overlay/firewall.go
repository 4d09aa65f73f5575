package overlay

import (
	"fmt"
	"math/bits"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/kubenet-dev/kubenet/internal/nft"
)

// FirewallTable is the overlay's nftables table. One per node: the node has one overlay device.
// It is inet-family, whatever netfilter backend the network's own rules use: the kernel runs
// nftables and iptables-nft tables side by side.
var FirewallTable = &nftables.Table{Family: nftables.TableFamilyINet, Name: "kubenet-overlay"}

// Names of the firewall's sets: the underlay addresses of the cluster's nodes.
const (
	setNodes4 = "nodes4"
	setNodes6 = "nodes6"
)

// Firewall is what the node lets through to and past its VXLAN port. A VXLAN device decapsulates
// whatever arrives at its port, from anybody, and the inner packet then carries any source
// address it likes: these rules are what makes the overlay no wider than the direct path.
type Firewall struct {
	Port   uint16
	Device string // the overlay device
	Bridge string // the pods' bridge
	// Local is this node's underlay address (the device's local end): the only destination
	// the peers send encapsulated packets to. Invalid: not checked.
	Local netip.Addr
	// Nodes are the InternalIPs of the cluster's Nodes: the only sources whose encapsulated
	// packets are decapsulated.
	Nodes []netip.Addr
	// PodNetworks are the cluster's pod CIDRs. A pod may send to the VXLAN port of another pod,
	// but of nothing else: a frame a pod encapsulated itself would reach a node with the
	// source address of the pod's node (masqueraded), and be decapsulated there as if that node
	// had sent it.
	PodNetworks []netip.Prefix
}

func (f Firewall) chains() (input, forward *nftables.Chain) {
	accept := nftables.ChainPolicyAccept
	// Before any filter chain at priority 0 (kube-proxy's, other tools'): a drop here is final,
	// an accept is not, so the order only matters for what is dropped first.
	prio := nftables.ChainPriorityRef(*nftables.ChainPriorityFilter - 10)
	input = &nftables.Chain{Table: FirewallTable, Name: "input", Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: prio, Policy: &accept}
	forward = &nftables.Chain{Table: FirewallTable, Name: "forward", Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: prio, Policy: &accept}
	return input, forward
}

// rawChain is the prerouting chain that keeps the overlay's packets out of conntrack, and so out
// of every NAT: a hostPort on the overlay's port (DNAT in prerouting, before the input filter and
// the VXLAN socket) would hand the other nodes' encapsulated traffic to a pod.
func (f Firewall) rawChain() (*nftables.Chain, []nft.Rule) {
	accept := nftables.ChainPolicyAccept
	ch := &nftables.Chain{Table: FirewallTable, Name: "prerouting", Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityRaw, Policy: &accept}
	rule := nft.Rule{Comment: "VXLAN to this node is never NATed (no hostPort takes it)",
		Exprs: slices.Concat(f.udpPort(), nft.MatchLocalDestination(false), []expr.Any{&expr.Notrack{}})}
	return ch, []nft.Rule{rule}
}

func (f Firewall) sets() (v4, v6 *nftables.Set, els4, els6 []nftables.SetElement) {
	v4 = &nftables.Set{Table: FirewallTable, Name: setNodes4, KeyType: nftables.TypeIPAddr}
	v6 = &nftables.Set{Table: FirewallTable, Name: setNodes6, KeyType: nftables.TypeIP6Addr}
	seen := map[netip.Addr]bool{}
	for _, a := range f.Nodes {
		a = a.Unmap()
		if !a.IsValid() || seen[a] {
			continue
		}
		seen[a] = true
		if a.Is4() {
			els4 = append(els4, nftables.SetElement{Key: a.AsSlice()})
		} else {
			els6 = append(els6, nftables.SetElement{Key: a.AsSlice()})
		}
	}
	return v4, v6, els4, els6
}

func ifname(key expr.MetaKey, name string) []expr.Any {
	return []expr.Any{&expr.Meta{Key: key, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: nft.IfName(name)}}
}

func (f Firewall) udpPort() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_UDP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(f.Port)},
	}
}

func drop() expr.Any { return &expr.Verdict{Kind: expr.VerdictDrop} }

// rules are the two chains' rules.
func (f Firewall) rules() (input, forward []nft.Rule) {
	zero4, zero6 := netip.IPv4Unspecified(), netip.IPv6Unspecified()
	notFromNode := func(any netip.Addr, set string) []expr.Any {
		off := uint32(12)
		n := uint32(4)
		if any.Is6() {
			off, n = 8, 16
		}
		return slices.Concat(nft.MatchFamily(any), f.udpPort(), []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n},
			&expr.Lookup{SourceRegister: 1, SetName: set, Invert: true},
			drop(),
		})
	}
	input = []nft.Rule{
		{Comment: "pods never send to this node's VXLAN port", Exprs: slices.Concat(ifname(expr.MetaKeyIIFNAME, f.Bridge), f.udpPort(), []expr.Any{drop()})},
		{Comment: "the overlay never carries VXLAN to this node", Exprs: slices.Concat(ifname(expr.MetaKeyIIFNAME, f.Device), f.udpPort(), []expr.Any{drop()})},
		// The device's socket listens on every local address, and this node's own address is
		// a Node's: a process of the node (no capability needed) would get a frame with any
		// inner source decapsulated, and a pod whose traffic is masqueraded could send to a
		// peer's bridge address.
		// The node originates the overlay's packets: one ICMP "fragmentation needed" (or
		// "packet too big") quoting one of them, from a pod, lowers the node's path MTU to a
		// peer for every pod. Pods never have a path MTU to tell the node.
		{Comment: "pods never lower this node's path MTU (IPv4)", Exprs: slices.Concat(ifname(expr.MetaKeyIIFNAME, f.Bridge), []expr.Any{
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_ICMP}},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 2},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{3, 4}}, // destination unreachable, fragmentation needed
			drop(),
		})},
		{Comment: "pods never lower this node's path MTU (IPv6)", Exprs: slices.Concat(ifname(expr.MetaKeyIIFNAME, f.Bridge), []expr.Any{
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_ICMPV6}},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{2}}, // packet too big
			drop(),
		})},
		{Comment: "no VXLAN from this node's own processes", Exprs: slices.Concat(ifname(expr.MetaKeyIIFNAME, "lo"), f.udpPort(), []expr.Any{drop()})},
	}
	if f.Local.IsValid() {
		local := f.Local.Unmap()
		off, n := uint32(16), uint32(4)
		if local.Is6() {
			off, n = 24, 16
		}
		input = append(input, nft.Rule{Comment: "VXLAN only to this node's underlay address", Exprs: slices.Concat(nft.MatchFamily(local), f.udpPort(), []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: local.AsSlice()},
			drop(),
		})})
	}
	input = append(input, []nft.Rule{
		{Comment: "VXLAN only from the cluster's nodes (IPv4)", Exprs: notFromNode(zero4, setNodes4)},
		{Comment: "VXLAN only from the cluster's nodes (IPv6)", Exprs: notFromNode(zero6, setNodes6)},
	}...)
	for _, any := range []netip.Addr{zero4, zero6} {
		exprs := slices.Concat(ifname(expr.MetaKeyIIFNAME, f.Bridge), nft.MatchFamily(any), f.udpPort())
		for _, p := range f.PodNetworks {
			if p.Addr().Is6() == any.Is6() {
				exprs = append(exprs, nft.MatchPrefix(nft.Destination, p, true)...)
			}
		}
		forward = append(forward, nft.Rule{Comment: fmt.Sprintf("pods send VXLAN only to pods (%s)", familyWord(any)), Exprs: append(exprs, drop())})
	}
	forward = append(forward, nft.Rule{Comment: "the overlay carries traffic to this node's pods only",
		Exprs: slices.Concat(ifname(expr.MetaKeyIIFNAME, f.Device), []expr.Any{
			&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: nft.IfName(f.Bridge)},
			drop(),
		})})
	return input, forward
}

func familyWord(a netip.Addr) string {
	if a.Is4() {
		return "IPv4"
	}
	return "IPv6"
}

// Sync makes the firewall table hold exactly f: it reads the chains and sets and writes, in one
// transaction, only when something differs (a write wakes every nftables listener on the node,
// the agent's healer among them). A new table is complete before its first packet: the sets are
// filled in the transaction that creates the chains that use them.
func (f Firewall) Sync() (changed bool, err error) {
	// The whole table is one transaction, one sendmsg: with every Node's addresses (5000
	// dual-stack Nodes, or one Node listing thousands of InternalIPs) it outgrows the default
	// socket buffer ("message too long"), and the overlay would stay down on every node.
	c, err := nftables.New(nftables.WithSockOptions(largeSendBuffer))
	if err != nil {
		return false, fmt.Errorf("overlay firewall: netlink: %w", err)
	}
	input, forward := f.chains()
	inRules, fwdRules := f.rules()
	v4, v6, els4, els6 := f.sets()
	raw, rawRules := f.rawChain()
	same, err := f.inPlace(c, input, forward, inRules, fwdRules, v4, v6, els4, els6)
	if err == nil && same {
		same = nft.CheckChainWith(c, raw, rawRules) == nil && f.hookedAsPlanned(c, raw)
	}
	if err != nil || same {
		return false, err
	}
	c.AddTable(FirewallTable)
	for _, s := range []struct {
		set *nftables.Set
		els []nftables.SetElement
	}{{v4, els4}, {v6, els6}} {
		if err := c.AddSet(s.set, nil); err != nil {
			return false, fmt.Errorf("overlay firewall: set %s: %w", s.set.Name, err)
		}
		c.FlushSet(s.set)
		// One message per chunk (one transaction still): a message's element list is one
		// attribute with a 16-bit length, which wraps past some 2300 IPv6 addresses and makes
		// the kernel keep only what the wrapped length covers (netpol/apply.go does the same).
		for chunk := range slices.Chunk(s.els, 512) {
			if err := c.SetAddElements(s.set, chunk); err != nil {
				return false, fmt.Errorf("overlay firewall: set %s: %w", s.set.Name, err)
			}
		}
	}
	nft.ReplaceChain(c, input, inRules)
	nft.ReplaceChain(c, forward, fwdRules)
	nft.ReplaceChain(c, raw, rawRules)
	if err := c.Flush(); err != nil {
		return false, fmt.Errorf("overlay firewall: write table %s: %w", FirewallTable.Name, err)
	}
	return true, nil
}

// inPlace reports whether the kernel holds the chains and sets as planned.
func (f Firewall) inPlace(c *nftables.Conn, input, forward *nftables.Chain, inRules, fwdRules []nft.Rule,
	v4, v6 *nftables.Set, els4, els6 []nftables.SetElement) (bool, error) {
	tables, err := c.ListTablesOfFamily(FirewallTable.Family)
	if err != nil {
		return false, fmt.Errorf("overlay firewall: list tables: %w", err)
	}
	i := slices.IndexFunc(tables, func(t *nftables.Table) bool { return t.Name == FirewallTable.Name })
	if i < 0 {
		return false, nil
	}
	// A dormant table keeps its chains, rules and sets but filters nothing: its base chains are
	// unhooked. AddTable (flags 0) wakes it.
	if dormant(tables[i]) {
		return false, nil
	}
	for _, ch := range []struct {
		chain *nftables.Chain
		rules []nft.Rule
	}{{input, inRules}, {forward, fwdRules}} {
		err := nft.CheckChainWith(c, ch.chain, ch.rules)
		if err != nil {
			return false, nil
		}
		if !f.hookedAsPlanned(c, ch.chain) {
			return false, nil
		}
	}
	for _, s := range []struct {
		set *nftables.Set
		els []nftables.SetElement
	}{{v4, els4}, {v6, els6}} {
		have, err := c.GetSetElements(s.set)
		if err != nil {
			return false, nil // missing: rewritten
		}
		if !sameElements(have, s.els) {
			return false, nil
		}
	}
	return true, nil
}

// hookedAsPlanned reports whether chain exists as a base chain on its planned hook, priority and
// policy: a chain re-created by somebody else as a regular chain filters nothing.
func (f Firewall) hookedAsPlanned(c *nftables.Conn, chain *nftables.Chain) bool {
	have, err := c.ListChain(FirewallTable, chain.Name)
	if err != nil || have.Hooknum == nil || have.Priority == nil || have.Policy == nil {
		return false
	}
	return *have.Hooknum == *chain.Hooknum && *have.Priority == *chain.Priority && *have.Policy == *chain.Policy
}

func sameElements(have, want []nftables.SetElement) bool {
	if len(have) != len(want) {
		return false
	}
	keys := map[string]bool{}
	for _, e := range want {
		keys[string(e.Key)] = true
	}
	for _, e := range have {
		if !keys[string(e.Key)] {
			return false
		}
	}
	return true
}

// RemoveFirewall deletes the firewall table; absent is fine.
func RemoveFirewall() error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("overlay firewall: netlink: %w", err)
	}
	exists, err := nft.TableExistsWith(c, FirewallTable)
	if err != nil || !exists {
		return err
	}
	c.DelTable(FirewallTable)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("overlay firewall: delete table %s: %w", FirewallTable.Name, err)
	}
	return nil
}

// dormant reports whether t has NFT_TABLE_F_DORMANT. google/nftables v0.3.0 decodes
// NFTA_TABLE_FLAGS in host byte order although the kernel sends it in network order (on a
// little-endian host dormant, 1, reads as 1<<24): both readings count, so a fixed library changes
// nothing (no valid flag has bit 24).
func dormant(t *nftables.Table) bool {
	return (t.Flags|bits.ReverseBytes32(t.Flags))&unix.NFT_TABLE_F_DORMANT != 0
}

// sendBuffer bounds one firewall transaction: some 400,000 addresses, more than a Node object can
// hold (etcd's request limit) times the Nodes of any cluster that would notice.
const sendBuffer = 32 << 20

// largeSendBuffer raises the socket's send buffer past net.core.wmem_max (SO_SNDBUFFORCE, which
// the agent's CAP_NET_ADMIN allows), else as far as wmem_max lets it.
func largeSendBuffer(c *netlink.Conn) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, sendBuffer)
	}); err != nil {
		return err
	}
	if serr != nil {
		return c.SetWriteBuffer(sendBuffer)
	}
	return nil
}
