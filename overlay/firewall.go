package overlay

import (
	"fmt"
	"math/bits"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/kubenet-dev/kubenet/internal/ipnet"
	"github.com/kubenet-dev/kubenet/internal/nft"
)

// FirewallTable is the overlay's nftables table. One per node: the node has one overlay device.
// It is inet-family, whatever netfilter backend the network's own rules use: the kernel runs
// nftables and iptables-nft tables side by side.
var FirewallTable = &nftables.Table{Family: nftables.TableFamilyINet, Name: "kubenet-overlay"}

// Names of the firewall's sets: the underlay addresses of the cluster's nodes, and the pod
// networks (interval sets).
const (
	setNodes4 = "nodes4"
	setNodes6 = "nodes6"
	setPods4  = "pods4"
	setPods6  = "pods6"
)

// maxElementsPerMessage bounds the elements written in one netlink message: a set's element list
// is one attribute, whose length is 16 bits (512 IPv6 elements take about 16 KiB).
const maxElementsPerMessage = 512

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

// firewallSet is one of the firewall's sets with the elements it must hold.
type firewallSet struct {
	set *nftables.Set
	els []nftables.SetElement
}

// sets are the firewall's sets. Every one is constant: once a rule uses it the kernel refuses to
// add or remove an element (a tool that wants to trust one more sender must replace the table,
// which the agent sees as an nftables event and undoes), so the agent replaces the whole table
// when one changes.
func (f Firewall) sets() []firewallSet {
	var els4, els6 []nftables.SetElement
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
	set := func(name string, key nftables.SetDatatype, interval bool) *nftables.Set {
		return &nftables.Set{Table: FirewallTable, Name: name, KeyType: key, Interval: interval, Constant: true}
	}
	return []firewallSet{
		{set(setNodes4, nftables.TypeIPAddr, false), els4},
		{set(setNodes6, nftables.TypeIP6Addr, false), els6},
		{set(setPods4, nftables.TypeIPAddr, true), intervals(f.PodNetworks, false)},
		{set(setPods6, nftables.TypeIP6Addr, true), intervals(f.PodNetworks, true)},
	}
}

// intervals are the interval-set elements of the networks of one family: a network inside
// another adds nothing, and neighbours merge (an interval set holds no overlap), so the cluster
// CIDRs are all that remain of the peers' pod CIDRs inside them.
func intervals(nets []netip.Prefix, is6 bool) []nftables.SetElement {
	var ps []netip.Prefix
	for _, p := range nets {
		if p.IsValid() && p.Addr().Is6() == is6 && !p.Addr().Is4In6() {
			ps = append(ps, p.Masked())
		}
	}
	slices.SortFunc(ps, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	var out []nftables.SetElement
	var first, last netip.Addr
	flush := func() {
		if !first.IsValid() {
			return
		}
		out = append(out, nftables.SetElement{Key: first.AsSlice()})
		if end := last.Next(); end.IsValid() {
			out = append(out, nftables.SetElement{Key: end.AsSlice(), IntervalEnd: true})
		}
	}
	for _, p := range ps {
		pFirst, pLast := p.Addr(), ipnet.Last(p)
		if first.IsValid() && (pFirst.Compare(last) <= 0 || last.Next() == pFirst) {
			if pLast.Compare(last) > 0 {
				last = pLast
			}
			continue
		}
		flush()
		first, last = pFirst, pLast
	}
	flush()
	return out
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
	// lookup matches packets of any's family whose source (or destination) is (invert: is not)
	// in set.
	lookup := func(any netip.Addr, d nft.Direction, set string, invert bool) []expr.Any {
		off, n := uint32(12), uint32(4)
		switch {
		case any.Is6() && d == nft.Source:
			off, n = 8, 16
		case any.Is6():
			off, n = 24, 16
		case d == nft.Destination:
			off = 16
		}
		return slices.Concat(nft.MatchFamily(any), []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n},
			&expr.Lookup{SourceRegister: 1, SetName: set, Invert: invert},
		})
	}
	notFromNode := func(any netip.Addr, set string) []expr.Any {
		return slices.Concat(f.udpPort(), lookup(any, nft.Source, set, true), []expr.Any{drop()})
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
	for _, fam := range []struct {
		any         netip.Addr
		nodes, pods string
	}{{zero4, setNodes4, setPods4}, {zero6, setNodes6, setPods6}} {
		word := familyWord(fam.any)
		// Nothing this node forwards is VXLAN for a Node: the nodes send their own from local
		// sockets. A pod's (or another bridge's container's) would leave masqueraded to this
		// node's address, a Node's, and be decapsulated by the peer as this node's own.
		forward = append(forward,
			nft.Rule{Comment: fmt.Sprintf("nothing forwarded is VXLAN for a Node (%s)", word),
				Exprs: slices.Concat(f.udpPort(), lookup(fam.any, nft.Destination, fam.nodes, false), []expr.Any{drop()})},
			nft.Rule{Comment: fmt.Sprintf("pods send VXLAN only to pods (%s)", word),
				Exprs: slices.Concat(ifname(expr.MetaKeyIIFNAME, f.Bridge), f.udpPort(), lookup(fam.any, nft.Destination, fam.pods, true), []expr.Any{drop()})},
		)
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

// Sync makes the firewall table hold exactly f: it reads the chains and sets and rewrites the
// whole table, in one transaction, only when something differs (a write wakes every nftables listener on the node,
// the agent's healer among them). A new table is complete before its first packet: the sets are
// filled in the transaction that creates the chains that use them.
func (f Firewall) Sync() (changed bool, err error) {
	// The whole table is one transaction, one sendmsg: with every Node's addresses (5000
	// dual-stack Nodes, or one Node listing thousands of InternalIPs) it outgrows the default
	// socket buffer ("message too long"), and the overlay would stay down on every node.
	c, err := nftables.New(nftables.WithSockOptions(nft.SendBuffer(sendBuffer)))
	if err != nil {
		return false, fmt.Errorf("overlay firewall: netlink: %w", err)
	}
	input, forward := f.chains()
	inRules, fwdRules := f.rules()
	raw, rawRules := f.rawChain()
	sets := f.sets()
	chains := []plannedChain{{input, inRules}, {forward, fwdRules}, {raw, rawRules}}
	exists, same, err := f.inPlace(c, chains, sets)
	if err != nil || same {
		return false, err
	}
	if exists {
		// Rebuilt whole, in the same transaction: constant sets cannot change, a base chain's
		// hook or priority cannot be changed in place (a chain somebody re-created
		// differently), and nothing is ever half-written.
		c.DelTable(FirewallTable)
	}
	c.AddTable(FirewallTable)
	for _, s := range sets {
		if err := c.AddSet(s.set, nil); err != nil {
			return false, fmt.Errorf("overlay firewall: set %s: %w", s.set.Name, err)
		}
		// One message per chunk (one transaction still): a message's element list is one
		// attribute with a 16-bit length, which wraps past some 2300 IPv6 addresses and makes
		// the kernel keep only what the wrapped length covers (netpol/apply.go does the same).
		for chunk := range slices.Chunk(s.els, maxElementsPerMessage) {
			if err := c.SetAddElements(s.set, chunk); err != nil {
				return false, fmt.Errorf("overlay firewall: set %s: %w", s.set.Name, err)
			}
		}
	}
	for _, ch := range chains {
		nft.ReplaceChain(c, ch.chain, ch.rules)
	}
	if err := c.Flush(); err != nil {
		return false, fmt.Errorf("overlay firewall: write table %s: %w", FirewallTable.Name, err)
	}
	return true, nil
}

// plannedChain is one of the firewall's base chains with its rules.
type plannedChain struct {
	chain *nftables.Chain
	rules []nft.Rule
}

// inPlace reports whether the table exists, and whether it holds the chains and sets as planned,
// awake.
func (f Firewall) inPlace(c *nftables.Conn, chains []plannedChain, sets []firewallSet) (exists, same bool, err error) {
	tables, err := c.ListTablesOfFamily(FirewallTable.Family)
	if err != nil {
		return false, false, fmt.Errorf("overlay firewall: list tables: %w", err)
	}
	i := slices.IndexFunc(tables, func(t *nftables.Table) bool { return t.Name == FirewallTable.Name })
	if i < 0 {
		return false, false, nil
	}
	// A dormant table keeps its chains, rules and sets but filters nothing: its base chains are
	// unhooked.
	if dormant(tables[i]) {
		return true, false, nil
	}
	for _, ch := range chains {
		if nft.CheckChainWith(c, ch.chain, ch.rules) != nil || !f.hookedAsPlanned(c, ch.chain) {
			return true, false, nil
		}
	}
	for _, s := range sets {
		have, err := c.GetSetElements(s.set)
		if err != nil || !sameElements(have, s.els) {
			return true, false, nil // missing or different: rewritten
		}
	}
	return true, true, nil
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

// sameElements compares elements as keys and interval ends (the kernel lists an interval set's
// elements in its own order, and adds no others).
func sameElements(have, want []nftables.SetElement) bool {
	if len(have) != len(want) {
		return false
	}
	type key struct {
		k   string
		end bool
	}
	keys := map[key]bool{}
	for _, e := range want {
		keys[key{string(e.Key), e.IntervalEnd}] = true
	}
	for _, e := range have {
		if !keys[key{string(e.Key), e.IntervalEnd}] {
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
