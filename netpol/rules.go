package netpol

import (
	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/kubenet-dev/kubenet/internal/nft"
)

// Names of the fixed objects of the policy table.
const (
	ChainForward = "forward" // filter, hook forward: traffic through the node, pod to pod included
	ChainInput   = "input"   // filter, hook input: pods to the node's own addresses (egress only)
	SetPending4  = "pending-ipv4"
	SetPending6  = "pending-ipv6"
	MapIngress4  = "ingress-ipv4" // local pod address → jump to its ingress group
	MapIngress6  = "ingress-ipv6"
	MapEgress4   = "egress-ipv4" // local pod address → jump to its egress group
	MapEgress6   = "egress-ipv6"
	ingressDir   = "in"
	egressDir    = "out"
)

// TableName is the inet table of one network's policies. Every network table of kubenet is
// "kubenet-<network>", so "kubenetpolicy-" can never be one of them.
func TableName(network string) string { return "kubenetpolicy-" + network }

// Table returns the network's policy table.
func Table(network string) *nftables.Table {
	return &nftables.Table{Family: nftables.TableFamilyINet, Name: TableName(network)}
}

// Registers: 1 is the 128-bit register for single matches; a concatenation starts at
// NFT_REG32_00 (8), each component padded to 32 bits.
const (
	reg1   = 1
	regCat = 8
)

func addrBytes(is6 bool) uint32 {
	if is6 {
		return 16
	}
	return 4
}

func addrType(is6 bool) nftables.SetDatatype {
	if is6 {
		return nftables.TypeIP6Addr
	}
	return nftables.TypeIPAddr
}

// fixedSets are the pending sets and the dispatch maps.
func fixedSets(t *nftables.Table) []*nftables.Set {
	var out []*nftables.Set
	for _, is6 := range []bool{false, true} {
		pending, in, eg := SetPending4, MapIngress4, MapEgress4
		if is6 {
			pending, in, eg = SetPending6, MapIngress6, MapEgress6
		}
		out = append(out, &nftables.Set{Table: t, Name: pending, KeyType: addrType(is6)})
		for _, m := range []string{in, eg} {
			out = append(out, &nftables.Set{Table: t, Name: m, IsMap: true, KeyType: addrType(is6), DataType: nftables.TypeVerdict})
		}
	}
	return out
}

func baseChains(t *nftables.Table) []*nftables.Chain {
	accept := nftables.ChainPolicyAccept
	return []*nftables.Chain{
		{Name: ChainForward, Table: t, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept},
		{Name: ChainInput, Table: t, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept},
	}
}

// family matches IPv4 or IPv6 packets.
func family(is6 bool) []expr.Any {
	proto := byte(unix.NFPROTO_IPV4)
	if is6 {
		proto = unix.NFPROTO_IPV6
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{proto}},
	}
}

// loadAddr loads the source or destination address into reg.
func loadAddr(is6 bool, d nft.Direction, reg uint32) *expr.Payload {
	off := map[[2]bool]uint32{{false, false}: 12, {false, true}: 16, {true, false}: 8, {true, true}: 24}[[2]bool{is6, d == nft.Destination}]
	return &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: addrBytes(is6)}
}

// BaseRules returns the rules of the two base chains, in order. Their number is fixed (16): the
// per-pod state lives in the sets and maps.
func BaseRules() map[string][]nft.Rule {
	established := nft.Rule{
		Comment: "packets of connections conntrack knows: replies of allowed connections",
		Exprs: []expr.Any{
			&expr.Ct{Register: reg1, Key: expr.CtKeySTATE},
			&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4,
				Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED), Xor: make([]byte, 4)},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: make([]byte, 4)},
			&expr.Verdict{Kind: expr.VerdictAccept},
		},
	}
	// Router and neighbour solicitations and advertisements, and redirects (ICMPv6 133-137):
	// without them no IPv6 address resolves, whatever the policies allow.
	nd := nft.Rule{
		Comment: "IPv6 neighbour discovery",
		Exprs: append(family(true),
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{unix.IPPROTO_ICMPV6}},
			&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 1},
			&expr.Cmp{Op: expr.CmpOpGte, Register: reg1, Data: []byte{133}},
			&expr.Cmp{Op: expr.CmpOpLte, Register: reg1, Data: []byte{137}},
			&expr.Verdict{Kind: expr.VerdictAccept},
		),
	}
	pending := func(is6 bool, d nft.Direction) nft.Rule {
		set, what := SetPending4, "from"
		if is6 {
			set = SetPending6
		}
		if d == nft.Destination {
			what = "to"
		}
		return nft.Rule{
			Comment: "drop " + what + " pods whose policies are not known yet (" + set + ")",
			Exprs: append(family(is6), loadAddr(is6, d, reg1),
				&expr.Lookup{SourceRegister: reg1, SetName: set},
				&expr.Verdict{Kind: expr.VerdictDrop}),
		}
	}
	dispatch := func(is6 bool, d nft.Direction) nft.Rule {
		m, what := MapEgress4, "egress of local pods, by source"
		switch {
		case is6 && d == nft.Source:
			m = MapEgress6
		case !is6 && d == nft.Destination:
			m, what = MapIngress4, "ingress of local pods, by destination"
		case is6:
			m, what = MapIngress6, "ingress of local pods, by destination"
		}
		return nft.Rule{
			Comment: what + " (" + m + ")",
			Exprs: append(family(is6), loadAddr(is6, d, reg1),
				&expr.Lookup{SourceRegister: reg1, DestRegister: 0, IsDestRegSet: true, SetName: m}),
		}
	}
	forward := []nft.Rule{established, nd}
	input := []nft.Rule{established, nd}
	for _, is6 := range []bool{false, true} {
		forward = append(forward, pending(is6, nft.Source), pending(is6, nft.Destination))
		input = append(input, pending(is6, nft.Source))
	}
	for _, is6 := range []bool{false, true} {
		forward = append(forward, dispatch(is6, nft.Source))
		input = append(input, dispatch(is6, nft.Source))
	}
	for _, is6 := range []bool{false, true} {
		forward = append(forward, dispatch(is6, nft.Destination))
	}
	return map[string][]nft.Rule{ChainForward: forward, ChainInput: input}
}

// Names of a group's sets.
func anySetName(group string, is6 bool) string {
	if is6 {
		return group + "-any-ipv6"
	}
	return group + "-any-ipv4"
}

func portsSetName(group string, is6 bool) string {
	if is6 {
		return group + "-ports-ipv6"
	}
	return group + "-ports-ipv4"
}

// groupSets returns the set definitions of a group: "any" is keyed by peer . protocol (the
// protocol always 0-255: the kernel's concatenated interval sets need two fields), "ports" by
// peer . protocol . port.
func groupSets(t *nftables.Table, name string, g group) []setWithElements {
	var out []setWithElements
	for _, is6 := range []bool{false, true} {
		anyRanges, boxes := g.any4, g.ports4
		if is6 {
			anyRanges, boxes = g.any6, g.ports6
		}
		if len(anyRanges) > 0 {
			s := &nftables.Set{Table: t, Name: anySetName(name, is6), Interval: true, Concatenation: true,
				KeyType: nftables.MustConcatSetType(addrType(is6), nftables.TypeInetProto)}
			var els []nftables.SetElement
			for _, r := range anyRanges {
				els = append(els, nftables.SetElement{
					Key:    append(r.First.AsSlice(), pad4([]byte{0})...),
					KeyEnd: append(r.Last.AsSlice(), pad4([]byte{255})...),
				})
			}
			out = append(out, setWithElements{s, els})
		}
		if len(boxes) > 0 {
			s := &nftables.Set{Table: t, Name: portsSetName(name, is6), Interval: true, Concatenation: true,
				KeyType: nftables.MustConcatSetType(addrType(is6), nftables.TypeInetProto, nftables.TypeInetService)}
			var els []nftables.SetElement
			for _, b := range boxes {
				els = append(els, nftables.SetElement{
					Key:    portsKey(b.addrs.First, b.ports.Protocol, b.ports.First),
					KeyEnd: portsKey(b.addrs.Last, b.ports.Protocol, b.ports.Last),
				})
			}
			out = append(out, setWithElements{s, els})
		}
	}
	return out
}

type setWithElements struct {
	set      *nftables.Set
	elements []nftables.SetElement
}

func portsKey(a interface{ AsSlice() []byte }, proto uint8, port uint16) []byte {
	k := append(a.AsSlice(), pad4([]byte{proto})...)
	return append(k, pad4(binaryutil.BigEndian.PutUint16(port))...)
}

func pad4(b []byte) []byte {
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

// groupRules are the rules of a group's chain: return (the packet is allowed in this direction;
// the base chain goes on with the other direction) on a hit in either set, drop otherwise. The
// peer is the source for ingress and the destination for egress.
func groupRules(name, dir string, g group) []nft.Rule {
	peer := nft.Source
	if dir == egressDir {
		peer = nft.Destination
	}
	ret := &expr.Verdict{Kind: expr.VerdictReturn}
	var rules []nft.Rule
	for _, is6 := range []bool{false, true} {
		anyRanges, boxes := g.any4, g.ports4
		if is6 {
			anyRanges, boxes = g.any6, g.ports6
		}
		if len(anyRanges) > 0 {
			set := anySetName(name, is6)
			rules = append(rules, nft.Rule{
				Comment: "peer allowed on every protocol and port (" + set + ")",
				Exprs: append(family(is6), loadAddr(is6, peer, regCat),
					&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: regCat + addrBytes(is6)/4},
					&expr.Lookup{SourceRegister: regCat, SetName: set}, ret),
			})
		}
		if len(boxes) > 0 {
			set := portsSetName(name, is6)
			r := regCat + addrBytes(is6)/4
			rules = append(rules, nft.Rule{
				Comment: "peer allowed on this protocol and port (" + set + ")",
				Exprs: append(family(is6), loadAddr(is6, peer, regCat),
					&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: r},
					&expr.Payload{DestRegister: r + 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
					&expr.Lookup{SourceRegister: regCat, SetName: set}, ret),
			})
		}
	}
	return append(rules, nft.Rule{Comment: "not allowed by any policy of the pod", Exprs: []expr.Any{&expr.Verdict{Kind: expr.VerdictDrop}}})
}
