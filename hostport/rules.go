package hostport

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/kubenet-dev/kubenet/internal/nft"
)

// Objects this package owns in the network's inet table (nft.InetTable). Nothing else touches
// them, and they touch nothing of anyone else's (no KUBE-MARK-MASQ, no shared chain).
const (
	// ChainPrerouting (nat, prerouting, dstnat) and ChainOutput (nat, output, dstnat) send
	// packets addressed to a local address of the node to ChainDNAT; nothing else reaches it.
	ChainPrerouting = "hostport-prerouting"
	ChainOutput     = "hostport-output"
	// ChainDNAT (regular chain) looks the packet up in the maps and DNATs it to the pod.
	ChainDNAT = "hostport-dnat"
	// ChainMasquerade (nat, postrouting, srcnat-10) masquerades what ChainDNAT marked.
	ChainMasquerade = "hostport-masquerade"
	// The localnet guard: route_localnet on the bridge (localhost hostPorts need it) would let a
	// pod reach the node's 127.0.0.0/8, so 127.0.0.0/8 from or to a pod is dropped in the two
	// places it could pass, neither of which a packet bridged from pod to pod runs through (with
	// bridge netfilter on, every bridged packet runs the IP prerouting hook's base chains: a
	// filter chain there cost every pod-to-pod packet about 2 µs of kernel CPU, docs/bench.md).
	//
	// ChainLocalnetInput (filter, input, every device but lo) sees what the bridge hands up and
	// the node's IP stack delivers to itself, where route_localnet applies, however the frame
	// was framed, and no frame the bridge forwards between pods (bridged packets run prerouting,
	// forward and postrouting, never input). Every device's, not only the bridge's: kube-proxy
	// turns route_localnet on for all of them (localhost NodePorts), the uplink included.
	ChainLocalnetInput = "hostport-localnet-input"
	// ChainLocalnetNAT (nat, prerouting, mangle: ahead of every dstnat chain) sees the first
	// packet of each connection, before anything translates it: a pod's 127.0.0.0/8 connection
	// that a dstnat rule would send back over the bridge to a pod (127.0.0.1:hostPort) never
	// reaches the node's input, and is dropped here.
	ChainLocalnetNAT = "hostport-localnet-nat"
	// chainLocalnetRetired is the guard's chain of kubenet releases before the two above
	// (filter, prerouting, mangle): it is deleted where it is found.
	chainLocalnetRetired = "hostport-localnet"
	// chainLocalnetIngressRetired is ChainLocalnetInput's predecessor (filter, the bridge
	// device's ingress), deleted where it is found: a frame under two VLAN-0 tags is still a
	// VLAN frame at that hook (the inet ingress hook passes every frame that is not IP), and the
	// kernel strips it to IPv4 only after the hook ran; it saw nothing but the bridge either.
	chainLocalnetIngressRetired = "hostport-localnet-bridge"

	// The maps, one pair per family: "<map>" is keyed by protocol . port (any local address of
	// the family), "<map>-addr" by hostIP . protocol . port; both give pod address . port.
	MapIPv4     = "hostports-ipv4"
	MapIPv4Addr = "hostports-ipv4-addr"
	MapIPv6     = "hostports-ipv6"
	MapIPv6Addr = "hostports-ipv6-addr"

	// The hairpin sets, one per family, hold "pod address . pod address" for every pod with a
	// mapping: a translated connection whose source is its own destination (a pod reaching its
	// own hostPort) must be masqueraded, or the pod would get a packet from itself. Any other
	// pod keeps its own address as the source: with bridge netfilter on, the reply crosses the
	// node's hooks on the bridge and is translated back there.
	SetHairpinIPv4 = "hostports-hairpin-ipv4"
	SetHairpinIPv6 = "hostports-hairpin-ipv6"
)

// Mark is the one packet-mark bit this package uses. ChainDNAT ORs it into the mark of the
// first packet of a hostPort connection that may need SNAT (from a pod of the node, or from
// 127.0.0.0/8); ChainMasquerade masquerades those from localhost and those whose pod reached
// its own hostPort (the hairpin sets), and clears the bit again. No other bit of the mark is read or changed. 0x1000 is clear
// of kube-proxy (0x4000, 0x8000), the portmap plugin (0x2000), Calico (0xffff0000) and Cilium
// (0x0f00).
const Mark uint32 = 0x1000

// Where "localhost access" comes from. Only IPv4's is translated (see Rules).
var (
	loopback4 = netip.MustParsePrefix("127.0.0.0/8")
	loopback6 = netip.MustParsePrefix("::1/128")
)

// Rule is one planned rule of one chain, with a comment that says why it exists.
type Rule struct {
	Chain   string
	Comment string
	Exprs   []expr.Any
}

// What conntrack's expressions read (uapi nf_conntrack_common.h): the direction of a reply
// (IP_CT_DIR_REPLY) and the status bit of a connection whose source is translated (IPS_SRC_NAT).
const (
	ctDirectionReply = 1
	ctStatusSrcNAT   = 1 << 4
)

// Registers. nftables has 16 32-bit registers (the first four overlaying the 128-bit register
// 1); a concatenation takes consecutive ones, each component padded to 32 bits. They are
// numbered here by 32-bit index and encoded with nft.Reg32, which writes them the way the kernel
// dumps them, so the rules read back compare equal to the plan.
const (
	reg1    = 1 // 128-bit register 1, for single matches
	keyReg  = 0 // 32-bit register 0: start of the lookup key and of the looked-up data
	markReg = 8 // 32-bit register 8 (= 128-bit register 3): free of an IPv6 key or data
)

func addrLen(is6 bool) uint32 {
	if is6 {
		return 16
	}
	return 4
}

// mapNames returns the (any address, specific address) maps of a family.
func mapNames(is6 bool) (anyAddr, addr string) {
	if is6 {
		return MapIPv6, MapIPv6Addr
	}
	return MapIPv4, MapIPv4Addr
}

// mapName returns the map that holds k.
func mapName(k Key) string {
	anyAddr, addr := mapNames(k.Is6())
	if k.Any() {
		return anyAddr
	}
	return addr
}

func addrType(is6 bool) nftables.SetDatatype {
	if is6 {
		return nftables.TypeIP6Addr
	}
	return nftables.TypeIPAddr
}

// mapSet returns the definition of a map; table is the network's inet table.
func mapSet(table *nftables.Table, name string) *nftables.Set {
	is6 := name == MapIPv6 || name == MapIPv6Addr
	key := []nftables.SetDatatype{nftables.TypeInetProto, nftables.TypeInetService}
	if name == MapIPv4Addr || name == MapIPv6Addr {
		key = append([]nftables.SetDatatype{addrType(is6)}, key...)
	}
	return &nftables.Set{
		Table:    table,
		Name:     name,
		IsMap:    true,
		KeyType:  nftables.MustConcatSetType(key...),
		DataType: nftables.MustConcatSetType(addrType(is6), nftables.TypeInetService),
	}
}

// pad4 pads b with zeros to a multiple of 4 bytes, as concatenation components are.
func pad4(b []byte) []byte {
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

// elementKey encodes k as its map's key: [hostIP .] protocol . port.
func elementKey(k Key) []byte {
	proto, _ := protoNumber(k.Protocol)
	var b []byte
	if !k.Any() {
		b = append(b, k.HostIP.AsSlice()...)
	}
	b = append(b, pad4([]byte{proto})...)
	return append(b, pad4(binaryutil.BigEndian.PutUint16(k.HostPort))...)
}

// elementValue encodes the destination: pod address . container port.
func elementValue(e Entry) []byte {
	return append(e.PodIP.AsSlice(), pad4(binaryutil.BigEndian.PutUint16(e.ContainerPort))...)
}

// element is the map element of a reservation; its comment names the owner, so the kernel
// state alone says whose an element is (nft list shows it; GC reads it).
func element(r Reservation) nftables.SetElement {
	return nftables.SetElement{Key: elementKey(r.Key), Val: elementValue(r.Entry), Comment: r.Owner.String()}
}

// decodeElement is the inverse of element for one map.
func decodeElement(mapName string, el nftables.SetElement) (Entry, bool) {
	is6 := mapName == MapIPv6 || mapName == MapIPv6Addr
	n := int(addrLen(is6))
	k := el.Key
	hostIP := unspecified(is6)
	if mapName == MapIPv4Addr || mapName == MapIPv6Addr {
		if len(k) < n {
			return Entry{}, false
		}
		hostIP, _ = netip.AddrFromSlice(k[:n])
		k = k[n:]
	}
	if len(k) != 8 || len(el.Val) != n+4 {
		return Entry{}, false
	}
	var protocol string
	for _, p := range Protocols() {
		if num, _ := protoNumber(p); num == k[0] {
			protocol = p
		}
	}
	podIP, _ := netip.AddrFromSlice(el.Val[:n])
	return Entry{
		Key:           Key{Protocol: protocol, HostPort: binaryutil.BigEndian.Uint16(k[4:6]), HostIP: hostIP},
		PodIP:         podIP,
		ContainerPort: binaryutil.BigEndian.Uint16(el.Val[n : n+2]),
	}, protocol != ""
}

// chains returns the definitions of the chains; table is the network's inet table.
func chains(table *nftables.Table) []*nftables.Chain {
	mangle := nftables.ChainPriorityMangle
	srcnat := *nftables.ChainPriorityNATSource - 10 // ahead of other srcnat chains, as portmap puts its MASQ first
	return []*nftables.Chain{
		{Name: ChainDNAT, Table: table},
		{Name: ChainPrerouting, Table: table, Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest},
		{Name: ChainOutput, Table: table, Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityNATDest},
		{Name: ChainMasquerade, Table: table, Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookPostrouting, Priority: &srcnat},
		{Name: ChainLocalnetNAT, Table: table, Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookPrerouting, Priority: mangle},
		{Name: ChainLocalnetInput, Table: table, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter},
	}
}

// retiredChains are chains of earlier releases that the plan no longer has: each is checked
// for having no rules and deleted where found (a base chain costs every packet of its hook).
func retiredChains(table *nftables.Table) []*nftables.Chain {
	return []*nftables.Chain{{Name: chainLocalnetRetired, Table: table}, {Name: chainLocalnetIngressRetired, Table: table}}
}

// Rules returns the fixed rules of every chain for the node's pod CIDRs, in order. Their number
// depends only on the configuration (at most 24), never on pods or ports: mappings live in the
// maps. Each comment names everything its rule depends on, so comparing comments tells whether
// the kernel's rules are current. Pure, so the plan is tested without a kernel.
func Rules(podCIDRs []netip.Prefix) []Rule {
	jump := &expr.Verdict{Kind: expr.VerdictJump, Chain: ChainDNAT}
	rules := []Rule{
		{Chain: ChainPrerouting, Comment: "hostPorts: only traffic to a local address of the node", Exprs: append(nft.MatchLocalDestination(false), jump)},
		{Chain: ChainOutput, Comment: "hostPorts: only traffic to a local address of the node", Exprs: append(nft.MatchLocalDestination(false), jump)},
	}
	hasV4 := false
	for _, pod := range podCIDRs {
		is6 := pod.Addr().Is6()
		hasV4 = hasV4 || !is6
		sources := []struct {
			name string
			from *netip.Prefix
			mark bool
		}{
			{"from pods of this node, " + pod.String() + " (marked: SNAT only for a pod reaching itself)", &pod, true},
			{"from localhost (SNAT: 127.0.0.0/8 cannot leave the node)", &loopback4, true},
			{"from anywhere else (client address kept)", nil, false},
		}
		if is6 {
			// IPv6 has no route_localnet: neither ::1 nor its replies cross a non-loopback
			// device, so a translated connection from ::1 could only hang. Left alone, it
			// is refused at once (or reaches a listener of the node's own).
			rules = append(rules, Rule{
				Chain:   ChainDNAT,
				Comment: "hostPorts: ::1 is not translated (IPv6 cannot route it off lo)",
				Exprs:   append(nft.MatchFamily(pod.Addr()), append(nft.MatchPrefix(nft.Source, loopback6, false), &expr.Verdict{Kind: expr.VerdictReturn})...),
			})
		}
		anyMap, addrMap := mapNames(is6)
		for _, m := range []struct {
			name     string
			specific bool
		}{{addrMap, true}, {anyMap, false}} {
			for _, s := range sources {
				if s.from == &loopback4 && is6 {
					continue // see the ::1 rule above
				}
				rules = append(rules, Rule{
					Chain:   ChainDNAT,
					Comment: fmt.Sprintf("hostPorts in %s %s", m.name, s.name),
					Exprs:   dnatExprs(pod.Addr(), m.name, m.specific, s.from, s.mark),
				})
			}
		}
	}
	rules = append(rules, masqueradeRules(podCIDRs, hasV4)...)
	rules = append(rules, localnetRules(podCIDRs)...)
	return rules
}

// localnetRules are the localnet guard's rules for the families of podCIDRs.
//
// The NAT chain covers both families: a dstnat rule would translate a pod's connection to
// 127.0.0.1 or ::1 (both local addresses) and the bridge would forward it to a pod without the
// node's IP stack, which drops ::1 from any device but lo, ever seeing it. The input chain is
// IPv4's: route_localnet has no IPv6 counterpart, and ::1 from any device but lo is dropped by
// the kernel itself.
func localnetRules(podCIDRs []netip.Prefix) []Rule {
	const why = "(route_localnet is on for localhost hostPorts)"
	notFromLo := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: nft.IfName("lo")},
	}
	drop := &expr.Verdict{Kind: expr.VerdictDrop}
	var rules []Rule
	hasV4 := false
	for _, pod := range podCIDRs {
		is6 := pod.Addr().Is6()
		hasV4 = hasV4 || !is6
		lo, reason := loopback4, why
		if is6 {
			lo, reason = loopback6, "(a hostPort would translate it)"
		}
		fam := nft.MatchFamily(lo.Addr())
		for _, d := range []struct {
			dir  nft.Direction
			name string
		}{{nft.Source, "from"}, {nft.Destination, "to"}} {
			rules = append(rules, Rule{Chain: ChainLocalnetNAT,
				Comment: fmt.Sprintf("drop connections %s %s that did not arrive on lo, before any dstnat %s", d.name, lo, reason),
				Exprs:   slices.Concat(fam, notFromLo, nft.MatchPrefix(d.dir, lo, false), []expr.Any{drop})})
		}
	}
	if !hasV4 {
		return rules
	}
	// A reply of a connection from localhost to a hostPort (masqueraded to the bridge's address
	// on its way to the pod) has its destination translated back to 127.0.0.1 by the input hook:
	// prerouting (bridge netfilter's when the frame entered the bridge, or the IP stack's) ran
	// conntrack's NAT. Only a masqueraded connection's replies are translated back, and the
	// prerouting hook has seen their unchanged destination (the node's address, not 127/8).
	reply := []expr.Any{
		&expr.Ct{Key: expr.CtKeyDIRECTION, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{ctDirectionReply}},
		&expr.Ct{Key: expr.CtKeySTATUS, Register: reg1},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4, Mask: native(ctStatusSrcNAT), Xor: native(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: native(0)},
	}
	v4 := slices.Concat(nft.MatchFamily(loopback4.Addr()), notFromLo)
	from, to := nft.MatchPrefix(nft.Source, loopback4, false), nft.MatchPrefix(nft.Destination, loopback4, false)
	return append(rules,
		Rule{Chain: ChainLocalnetInput, Comment: "drop packets from 127.0.0.0/8 that the node receives on a device other than lo " + why,
			Exprs: slices.Concat(v4, from, []expr.Any{drop})},
		Rule{Chain: ChainLocalnetInput, Comment: "accept replies translated back to 127.0.0.0/8 of masqueraded connections (localhost to a hostPort)",
			Exprs: slices.Concat(v4, to, reply, []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}})},
		Rule{Chain: ChainLocalnetInput, Comment: "drop packets to 127.0.0.0/8 that the node receives on a device other than lo " + why,
			Exprs: slices.Concat(v4, to, []expr.Any{drop})},
	)
}

// masqueradeRules are ChainMasquerade's rules: marked connections of a pod to itself (per family
// of the pod CIDRs) and from localhost (IPv4) are masqueraded; every marked packet has the bit
// cleared; other marked connections keep the client's address.
func masqueradeRules(podCIDRs []netip.Prefix, hasV4 bool) []Rule {
	marked := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: reg1},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4, Mask: native(Mark), Xor: native(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: native(0)},
	}
	clear := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: reg1},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4, Mask: native(^Mark), Xor: native(0)},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: reg1},
	}
	rule := func(comment string, match []expr.Any, masq bool) Rule {
		exprs := slices.Concat(marked, match, clear)
		if masq {
			exprs = append(exprs, &expr.Masq{})
		}
		return Rule{Chain: ChainMasquerade, Comment: comment, Exprs: exprs}
	}
	var rules []Rule
	for _, pod := range podCIDRs {
		is6 := pod.Addr().Is6()
		set := hairpinSet(is6)
		n := addrLen(is6)
		saddr, daddr := uint32(12), uint32(16)
		if is6 {
			saddr, daddr = 8, 24
		}
		match := append(nft.MatchFamily(pod.Addr()),
			&expr.Payload{DestRegister: nft.Reg32(keyReg), Base: expr.PayloadBaseNetworkHeader, Offset: saddr, Len: n},
			&expr.Payload{DestRegister: nft.Reg32(keyReg + int(n/4)), Base: expr.PayloadBaseNetworkHeader, Offset: daddr, Len: n},
			&expr.Lookup{SourceRegister: nft.Reg32(keyReg), SetName: set})
		rules = append(rules, rule(fmt.Sprintf("hostPort connections marked 0x%x of a pod to itself (%s): clear the bit and masquerade", Mark, set), match, true))
	}
	if hasV4 {
		rules = append(rules, rule(fmt.Sprintf("hostPort connections marked 0x%x from localhost: clear the bit and masquerade", Mark),
			append(nft.MatchFamily(loopback4.Addr()), nft.MatchPrefix(nft.Source, loopback4, false)...), true))
	}
	return append(rules, rule(fmt.Sprintf("other hostPort connections marked 0x%x: clear the bit, keep the client's address", Mark), nil, false))
}

// hairpinSet is the hairpin set of a family.
func hairpinSet(is6 bool) string {
	if is6 {
		return SetHairpinIPv6
	}
	return SetHairpinIPv4
}

// hairpinSetDef is the definition of a family's hairpin set.
func hairpinSetDef(table *nftables.Table, is6 bool) *nftables.Set {
	return &nftables.Set{Table: table, Name: hairpinSet(is6), Concatenation: true,
		KeyType: nftables.MustConcatSetType(addrType(is6), addrType(is6))}
}

// hairpinElement is the hairpin element of a reservation (comment: its owner, as in the maps).
func hairpinElement(r Reservation) nftables.SetElement {
	a := r.PodIP.AsSlice()
	return nftables.SetElement{Key: append(slices.Clone(a), a...), Comment: r.Owner.String()}
}

// dnatExprs builds: [family] [saddr in from] key-lookup in mapName into the data registers,
// [mark |= Mark], dnat to the looked-up address and port. A lookup miss ends the rule before
// the mark is touched, so only translated connections are marked.
func dnatExprs(family netip.Addr, mapName string, specific bool, from *netip.Prefix, mark bool) []expr.Any {
	is6 := family.Is6()
	exprs := nft.MatchFamily(family)
	if from != nil {
		exprs = append(exprs, nft.MatchPrefix(nft.Source, *from, false)...)
	}
	reg := keyReg
	if specific {
		off := uint32(16)
		if is6 {
			off = 24
		}
		exprs = append(exprs, &expr.Payload{DestRegister: nft.Reg32(reg), Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: addrLen(is6)})
		reg += int(addrLen(is6) / 4)
	}
	exprs = append(exprs,
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: nft.Reg32(reg)},
		&expr.Payload{DestRegister: nft.Reg32(reg + 1), Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Lookup{SourceRegister: nft.Reg32(keyReg), DestRegister: nft.Reg32(keyReg), IsDestRegSet: true, SetName: mapName},
	)
	if mark {
		exprs = append(exprs,
			&expr.Meta{Key: expr.MetaKeyMARK, Register: nft.Reg32(markReg)},
			&expr.Bitwise{SourceRegister: nft.Reg32(markReg), DestRegister: nft.Reg32(markReg), Len: 4, Mask: native(^Mark), Xor: native(Mark)},
			&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: nft.Reg32(markReg)},
		)
	}
	nfproto := uint32(unix.NFPROTO_IPV4)
	if is6 {
		nfproto = unix.NFPROTO_IPV6
	}
	return append(exprs, &expr.NAT{
		Type:        expr.NATTypeDestNAT,
		Family:      nfproto,
		RegAddrMin:  nft.Reg32(keyReg),
		RegAddrMax:  nft.Reg32(keyReg),
		RegProtoMin: nft.Reg32(keyReg + int(addrLen(is6)/4)),
		RegProtoMax: nft.Reg32(keyReg + int(addrLen(is6)/4)),
		Specified:   true,
	})
}

// native encodes v in host byte order, the order of the packet mark in a register.
func native(v uint32) []byte { return binaryutil.NativeEndian.PutUint32(v) }
