package isolation

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/kubenet-dev/kubenet/internal/nft"
)

// Chains this package owns in the network's bridge table (nft.BridgeTable). Nothing else
// touches them, and they touch nothing of anyone else's (the hairpin dedup chain lives in the
// same table).
const (
	// ChainGuard (filter, prerouting) keeps pods from acting as routers or DHCP servers and from
	// sending to or from loopback addresses, whatever the configuration.
	ChainGuard     = "pod-guard"
	ChainGuardIPv4 = "pod-guard-ipv4"
	ChainGuardIPv6 = "pod-guard-ipv6"
	// ChainAntiSpoof (filter, prerouting) lets a pod send only from its own MAC and addresses and
	// claim only its own addresses in ARP and neighbour discovery. Only with anti-spoofing on.
	ChainAntiSpoof            = "anti-spoof"
	ChainAntiSpoofIPv4        = "anti-spoof-ipv4"
	ChainAntiSpoofARP         = "anti-spoof-arp"
	ChainAntiSpoofIPv6        = "anti-spoof-ipv6"
	ChainAntiSpoofUnspecified = "anti-spoof-unspecified"
	ChainAntiSpoofND          = "anti-spoof-nd"
)

// Sets of the pods' ports, keyed by the bridge port's name (the host veth). A pod adds and
// removes elements; no rule changes per pod. The ports sets are also what ties the chains to
// this network's bridge: the bridge's own name (meta ibrname) needs a kernel module that not
// every kernel has (CONFIG_NFT_BRIDGE_META).
const (
	SetPodPorts       = "pod-ports"        // every pod's port
	SetAntiSpoofPorts = "anti-spoof-ports" // ports that have anti-spoofing elements
	SetMAC            = "anti-spoof-mac"   // port . the pod's MAC
	SetIPv4           = "anti-spoof-ipv4"  // port . an IPv4 address of the pod
	SetIPv6           = "anti-spoof-ipv6"  // port . an IPv6 address of the pod, its link-local one included
	// The fast paths' sets: port . the pod's MAC . one of its addresses (IPv6: the link-local
	// one included), what the sets above hold for the port, joined. One lookup lets through a
	// frame the rules with the three lookups above would let through (fastPathIPv4, fastPathIPv6).
	SetFastIPv4 = "anti-spoof-fast-ipv4"
	SetFastIPv6 = "anti-spoof-fast-ipv6"
)

// Hook priorities: both chains run before everything else on the bridge (br_netfilter's hook,
// through which kube-proxy's and the host ports' NAT see bridged traffic, runs at 0), and before
// the bridge learns the frame's source MAC.
var (
	priorityAntiSpoof = nftables.ChainPriorityRef(-201)
	priorityGuard     = nftables.ChainPriorityRef(-200)
)

// Chain is one planned chain: a base chain hooked on the bridge's prerouting, or a regular
// chain that a base chain goes to.
type Chain struct {
	Name  string
	Base  bool
	Rules []nft.Rule
}

// chainNames lists every chain the package may create, for removing the ones a plan drops.
var chainNames = []string{ChainGuard, ChainGuardIPv4, ChainGuardIPv6, ChainAntiSpoof, ChainAntiSpoofIPv4,
	ChainAntiSpoofARP, ChainAntiSpoofIPv6, ChainAntiSpoofUnspecified, ChainAntiSpoofND}

// Registers. nftables has the 128-bit registers 1..4 and, overlaying them, sixteen 32-bit ones
// (8..23). A lookup key is built in consecutive 32-bit registers, each part padded to 4 bytes:
// the 16-byte interface name in the first four (32-bit 8..11), then the address. The kernel dumps
// a 32-bit register that starts a 128-bit one as the 128-bit one (nft.Reg32), so the plan names
// them that way too: CHECK compares the planned expressions with the dump.
const (
	reg     = unix.NFT_REG_1 // single matches
	regPort = unix.NFT_REG_1 // the interface name, first part of every key (32-bit 8..11)
	regAddr = unix.NFT_REG_2 // second part of the key (32-bit 12..)
)

// regMACAddr is where the third part of a port . MAC . address key goes: after the MAC, which
// takes two 32-bit registers (12 and 13, padded), at 32-bit register 14.
var regMACAddr = nft.Reg32(6)

// Plan returns the chains for cfg, each after the chains it goes to, so they can be written in
// this order in one transaction. The rules depend only on the configuration, never on the pods.
// Pure, so the plan is tested without a kernel.
func Plan(cfg Config) []Chain {
	chains := []Chain{
		{Name: ChainGuardIPv4, Rules: guardIPv4()},
		{Name: ChainGuardIPv6, Rules: guardIPv6()},
		{Name: ChainGuard, Base: true, Rules: guard()},
	}
	if cfg.AntiSpoofing {
		chains = append(chains,
			Chain{Name: ChainAntiSpoofIPv4, Rules: antiSpoofIPv4()},
			Chain{Name: ChainAntiSpoofARP, Rules: antiSpoofARP()},
			Chain{Name: ChainAntiSpoofUnspecified, Rules: antiSpoofUnspecified()},
			Chain{Name: ChainAntiSpoofND, Rules: antiSpoofND()},
			Chain{Name: ChainAntiSpoofIPv6, Rules: antiSpoofIPv6()},
			Chain{Name: ChainAntiSpoof, Base: true, Rules: antiSpoof()})
	}
	return chains
}

// Ether types, as the frame carries them and as skb->protocol holds them.
var (
	etherIPv4 = []byte{0x08, 0x00}
	etherIPv6 = []byte{0x86, 0xdd}
	etherARP  = []byte{0x08, 0x06}
	etherVLAN = []byte{0x81, 0x00} // 802.1Q
	etherQinQ = []byte{0x88, 0xa8} // 802.1ad
)

func drop() expr.Any         { return &expr.Verdict{Kind: expr.VerdictDrop} }
func accept() expr.Any       { return &expr.Verdict{Kind: expr.VerdictAccept} }
func ret() expr.Any          { return &expr.Verdict{Kind: expr.VerdictReturn} }
func goTo(c string) expr.Any { return &expr.Verdict{Kind: expr.VerdictGoto, Chain: c} }

func rule(comment string, exprs ...[]expr.Any) nft.Rule {
	var all []expr.Any
	for _, e := range exprs {
		all = append(all, e...)
	}
	return nft.Rule{Comment: comment, Exprs: all}
}

func is(op expr.CmpOp, data []byte) *expr.Cmp { return &expr.Cmp{Op: op, Register: reg, Data: data} }

func load(base expr.PayloadBase, offset, length uint32) *expr.Payload {
	return &expr.Payload{DestRegister: reg, Base: base, Offset: offset, Len: length}
}

// etherType matches the ether type the frame carries after its MAC addresses: a VLAN tag, which
// the kernel takes off into skb metadata before the bridge sees the frame, shows as 0x8100.
func etherType(t []byte) []expr.Any {
	return []expr.Any{load(expr.PayloadBaseLLHeader, 12, 2), is(expr.CmpOpEq, t)}
}

// protocol matches the frame's network protocol (skb->protocol, behind a VLAN tag if any).
func protocol(t []byte) []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyPROTOCOL, Register: reg}, is(expr.CmpOpEq, t)}
}

func l4proto(p byte) []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg}, is(expr.CmpOpEq, []byte{p})}
}

// icmpType matches ICMP (proto 1) or ICMPv6 (proto 58) messages of type t.
func icmpType(proto, t byte) []expr.Any {
	return append(l4proto(proto), load(expr.PayloadBaseTransportHeader, 0, 1), is(expr.CmpOpEq, []byte{t}))
}

// udpPorts matches UDP datagrams from port src to port dst.
func udpPorts(src, dst uint16) []expr.Any {
	return append(l4proto(17), load(expr.PayloadBaseTransportHeader, 0, 4),
		is(expr.CmpOpEq, binary.BigEndian.AppendUint16(binary.BigEndian.AppendUint16(nil, src), dst)))
}

// ndSolicitOrAdvert matches neighbour solicitations and advertisements (ICMPv6 135 and 136).
func ndSolicitOrAdvert() []expr.Any {
	return append(l4proto(58), load(expr.PayloadBaseTransportHeader, 0, 1),
		is(expr.CmpOpGte, []byte{135}), is(expr.CmpOpLte, []byte{136}))
}

// notInPortSet matches frames whose port . field (field: nil for the port alone) is not in set.
func notInPortSet(set string, field *expr.Payload) []expr.Any {
	if field == nil {
		return []expr.Any{
			&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: reg},
			&expr.Lookup{SourceRegister: reg, SetName: set, Invert: true},
		}
	}
	field.DestRegister = regAddr
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: regPort},
		field,
		&expr.Lookup{SourceRegister: regPort, SetName: set, Invert: true},
	}
}

var (
	loopback4 = netip.MustParsePrefix("127.0.0.0/8")
	loopback6 = netip.MustParsePrefix("::1/128")
)

// inPortMACSet matches frames whose port . source MAC . field is in set.
func inPortMACSet(set string, field *expr.Payload) []expr.Any {
	field.DestRegister = regMACAddr
	mac := load(expr.PayloadBaseLLHeader, 6, 6)
	mac.DestRegister = regAddr
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: regPort},
		mac,
		field,
		&expr.Lookup{SourceRegister: regPort, SetName: set},
	}
}

// guard is the always-on base chain: frames from the pods' ports, dispatched by family.
//
// Its first two rules are fast paths for what most pod traffic is, TCP: every check below lets
// an untagged TCP frame without a loopback address through, from any port, so it passes at the
// first rule, without the port lookup and the dozen compares. (The frame's own ether type is
// tested, not skb->protocol: a VLAN tag shows there as 0x8100, and such a frame takes the rules
// below, which drop it.)
func guard() []nft.Rule {
	return []nft.Rule{
		rule("TCP over IPv4 without a loopback address passes (the checks below would let it through)",
			etherType(etherIPv4), l4proto(unix.IPPROTO_TCP),
			nft.MatchPrefix(nft.Source, loopback4, true), nft.MatchPrefix(nft.Destination, loopback4, true), []expr.Any{ret()}),
		rule("TCP over IPv6 without a loopback address passes (the checks below would let it through)",
			etherType(etherIPv6), l4proto(unix.IPPROTO_TCP),
			nft.MatchPrefix(nft.Source, loopback6, true), nft.MatchPrefix(nft.Destination, loopback6, true), []expr.Any{ret()}),
		rule("frames from ports that are not this network's pods pass", notInPortSet(SetPodPorts, nil), []expr.Any{ret()}),
		// A priority tag (VLAN 0) hides a frame from the family checks, yet a receiver without
		// VLANs takes it as untagged.
		rule("802.1Q-tagged frames from pods dropped", etherType(etherVLAN), []expr.Any{drop()}),
		rule("802.1ad-tagged frames from pods dropped", etherType(etherQinQ), []expr.Any{drop()}),
		rule("IPv4 from pods: "+ChainGuardIPv4, protocol(etherIPv4), []expr.Any{goTo(ChainGuardIPv4)}),
		rule("IPv6 from pods: "+ChainGuardIPv6, protocol(etherIPv6), []expr.Any{goTo(ChainGuardIPv6)}),
	}
}

func guardIPv4() []nft.Rule {
	return []nft.Rule{
		rule("loopback source 127.0.0.0/8 from a pod dropped", nft.MatchPrefix(nft.Source, loopback4, false), []expr.Any{drop()}),
		rule("loopback destination 127.0.0.0/8 from a pod dropped", nft.MatchPrefix(nft.Destination, loopback4, false), []expr.Any{drop()}),
		rule("ICMP redirect from a pod dropped", icmpType(1, 5), []expr.Any{drop()}),
		rule("ICMP router advertisement from a pod dropped", icmpType(1, 9), []expr.Any{drop()}),
		rule("DHCP server reply (UDP 67 to 68) from a pod dropped", udpPorts(67, 68), []expr.Any{drop()}),
	}
}

func guardIPv6() []nft.Rule {
	return []nft.Rule{
		rule("loopback source ::1 from a pod dropped", nft.MatchPrefix(nft.Source, loopback6, false), []expr.Any{drop()}),
		rule("loopback destination ::1 from a pod dropped", nft.MatchPrefix(nft.Destination, loopback6, false), []expr.Any{drop()}),
		rule("DHCPv6 server reply (UDP 547 to 546) from a pod dropped", udpPorts(547, 546), []expr.Any{drop()}),
		rule("router solicitation from a pod dropped", icmpType(58, 133), []expr.Any{drop()}),
		rule("router advertisement from a pod dropped", icmpType(58, 134), []expr.Any{drop()}),
		rule("ICMPv6 redirect from a pod dropped", icmpType(58, 137), []expr.Any{drop()}),
		rule("router renumbering from a pod dropped", icmpType(58, 138), []expr.Any{drop()}),
	}
}

// antiSpoof is the base chain of anti-spoofing: the port's MAC, then per family.
//
// Its first two rules are fast paths: a frame whose port . source MAC . source address is a
// pod's, in one lookup, is what the rules after them let through (the port has anti-spoofing
// elements, the MAC is the port's pod's, and for IPv4 the address is; for IPv6 other than ICMPv6,
// whose neighbour discovery the rules below check further, the same), so it passes there. The
// fast sets hold exactly the joins of the other sets' elements of each port, added and ended in
// the same transactions (and where elements go in several, the fast ones go first), so the fast
// paths never let through what the rules below would drop.
func antiSpoof() []nft.Rule {
	return []nft.Rule{
		rule("IPv4 from the port's pod's MAC and address passes (the checks below would let it through)",
			etherType(etherIPv4), inPortMACSet(SetFastIPv4, load(expr.PayloadBaseNetworkHeader, 12, 4)), []expr.Any{ret()}),
		rule("IPv6 other than ICMPv6 from the port's pod's MAC and address passes (the checks below would let it through)",
			etherType(etherIPv6), []expr.Any{&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg}, is(expr.CmpOpNeq, []byte{unix.IPPROTO_ICMPV6})},
			inPortMACSet(SetFastIPv6, load(expr.PayloadBaseNetworkHeader, 8, 16)), []expr.Any{ret()}),
		rule("frames from ports without anti-spoofing elements (other bridges, pods attached while it was off) pass", notInPortSet(SetAntiSpoofPorts, nil), []expr.Any{ret()}),
		rule("source MAC not the port's pod's dropped", notInPortSet(SetMAC, load(expr.PayloadBaseLLHeader, 6, 6)), []expr.Any{drop()}),
		rule("IPv4: "+ChainAntiSpoofIPv4, etherType(etherIPv4), []expr.Any{goTo(ChainAntiSpoofIPv4)}),
		rule("IPv6: "+ChainAntiSpoofIPv6, etherType(etherIPv6), []expr.Any{goTo(ChainAntiSpoofIPv6)}),
		rule("ARP: "+ChainAntiSpoofARP, etherType(etherARP), []expr.Any{goTo(ChainAntiSpoofARP)}),
		rule("other ether types from pods dropped (pods speak IPv4, IPv6 and ARP)", []expr.Any{drop()}),
	}
}

func antiSpoofIPv4() []nft.Rule {
	return []nft.Rule{
		rule("IPv4 source not the port's pod's dropped", notInPortSet(SetIPv4, load(expr.PayloadBaseNetworkHeader, 12, 4)), []expr.Any{drop()}),
	}
}

func antiSpoofARP() []nft.Rule {
	nh := expr.PayloadBaseNetworkHeader
	return []nft.Rule{
		// The offsets below hold only for Ethernet/IPv4 ARP.
		rule("ARP other than Ethernet/IPv4 dropped", []expr.Any{load(nh, 0, 6), is(expr.CmpOpNeq, []byte{0, 1, 0x08, 0x00, 6, 4})}, []expr.Any{drop()}),
		rule("ARP sender MAC not the port's pod's dropped", notInPortSet(SetMAC, load(nh, 8, 6)), []expr.Any{drop()}),
		rule("ARP probe (request from 0.0.0.0) passes", []expr.Any{load(nh, 14, 4), is(expr.CmpOpEq, []byte{0, 0, 0, 0}), load(nh, 6, 2), is(expr.CmpOpEq, []byte{0, 1})}, []expr.Any{accept()}),
		rule("ARP sender address not the port's pod's dropped", notInPortSet(SetIPv4, load(nh, 14, 4)), []expr.Any{drop()}),
	}
}

func antiSpoofIPv6() []nft.Rule {
	return []nft.Rule{
		rule("unspecified source: "+ChainAntiSpoofUnspecified, []expr.Any{load(expr.PayloadBaseNetworkHeader, 8, 16), is(expr.CmpOpEq, make([]byte, 16))}, []expr.Any{goTo(ChainAntiSpoofUnspecified)}),
		rule("IPv6 source not the port's pod's dropped", notInPortSet(SetIPv6, load(expr.PayloadBaseNetworkHeader, 8, 16)), []expr.Any{drop()}),
		rule("ICMPv6: "+ChainAntiSpoofND, l4proto(58), []expr.Any{goTo(ChainAntiSpoofND)}),
	}
}

// antiSpoofUnspecified: a node without an address yet sends only these from ::.
func antiSpoofUnspecified() []nft.Rule {
	return []nft.Rule{
		rule("duplicate address detection (neighbour solicitation from ::) passes", icmpType(58, 135), []expr.Any{accept()}),
		rule("MLDv2 report from :: passes", icmpType(58, 143), []expr.Any{accept()}),
		rule("MLDv1 report from :: passes", icmpType(58, 131), []expr.Any{accept()}),
		rule("anything else from :: dropped", []expr.Any{drop()}),
	}
}

// antiSpoofND checks what neighbour solicitations and advertisements claim. A receiver takes the
// first link-layer address option of a message, wherever it is; these rules accept a message
// only without options or with exactly one link-layer address option, at offset 24 (after the
// target), so the one a receiver reads is the one checked.
func antiSpoofND() []nft.Rule {
	nh, th := expr.PayloadBaseNetworkHeader, expr.PayloadBaseTransportHeader
	return []nft.Rule{
		rule("neighbour advertisement for an address not the port's pod's dropped",
			icmpType(58, 136), notInPortSet(SetIPv6, load(th, 8, 16)), []expr.Any{drop()}),
		rule("neighbour solicitation or advertisement behind extension headers dropped",
			ndSolicitOrAdvert(), []expr.Any{load(nh, 6, 1), is(expr.CmpOpNeq, []byte{58})}, []expr.Any{drop()}),
		rule("neighbour solicitation or advertisement with options other than one link-layer address dropped",
			ndSolicitOrAdvert(), []expr.Any{load(nh, 4, 2), is(expr.CmpOpNeq, []byte{0, 24}), is(expr.CmpOpNeq, []byte{0, 32})}, []expr.Any{drop()}),
		rule("neighbour solicitation or advertisement whose option is not a link-layer address dropped",
			ndSolicitOrAdvert(), []expr.Any{load(th, 24, 2), is(expr.CmpOpNeq, []byte{1, 1}), is(expr.CmpOpNeq, []byte{2, 1})}, []expr.Any{drop()}),
		rule("neighbour solicitation or advertisement with a link-layer address not the port's pod's dropped",
			ndSolicitOrAdvert(), notInPortSet(SetMAC, load(th, 26, 6)), []expr.Any{drop()}),
	}
}

// sets returns the definitions of the port sets; table is the network's bridge table. expiring
// gives them the timeout flag, whose elements are ended by expiry (Remove).
func sets(table *nftables.Table, expiring bool) []*nftables.Set {
	concat := func(name string, t ...nftables.SetDatatype) *nftables.Set {
		return &nftables.Set{Table: table, Name: name, Concatenation: true, HasTimeout: expiring, KeyType: nftables.MustConcatSetType(append([]nftables.SetDatatype{nftables.TypeIFName}, t...)...)}
	}
	// An interface name is a string, which nft shows only from a set marked host byte order.
	// The fast sets come first: removals that take several transactions go in this order, and a
	// fast element must never outlive the elements it joins (see antiSpoof).
	return []*nftables.Set{
		concat(SetFastIPv4, nftables.TypeEtherAddr, nftables.TypeIPAddr),
		concat(SetFastIPv6, nftables.TypeEtherAddr, nftables.TypeIP6Addr),
		{Table: table, Name: SetPodPorts, HasTimeout: expiring, KeyType: nftables.TypeIFName, KeyByteOrder: binaryutil.NativeEndian},
		{Table: table, Name: SetAntiSpoofPorts, HasTimeout: expiring, KeyType: nftables.TypeIFName, KeyByteOrder: binaryutil.NativeEndian},
		concat(SetMAC, nftables.TypeEtherAddr),
		concat(SetIPv4, nftables.TypeIPAddr),
		concat(SetIPv6, nftables.TypeIP6Addr),
	}
}

// chainDef returns the nftables definition of a planned chain.
func chainDef(table *nftables.Table, c Chain) *nftables.Chain {
	if !c.Base {
		return &nftables.Chain{Name: c.Name, Table: table}
	}
	prio := priorityGuard
	if c.Name == ChainAntiSpoof {
		prio = priorityAntiSpoof
	}
	return &nftables.Chain{Name: c.Name, Table: table, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookPrerouting, Priority: prio}
}

// pad4 pads b with zeros to a multiple of 4 bytes, as parts of a concatenated key are.
func pad4(b []byte) []byte {
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

// elements returns p's elements by set name: the pod-ports one, and with antiSpoofing those
// of anti-spoofing.
func (p Port) elements(antiSpoofing bool) map[string][]nftables.SetElement {
	port := nft.IfName(p.Name)
	// The timeout goes only to sets with the timeout flag (google/nftables leaves it out for the
	// others).
	el := func(value []byte) nftables.SetElement {
		return nftables.SetElement{Key: append(append([]byte{}, port...), pad4(value)...), Comment: p.Owner, Timeout: nft.Forever}
	}
	out := map[string][]nftables.SetElement{SetPodPorts: {{Key: port, Comment: p.Owner, Timeout: nft.Forever}}}
	if !antiSpoofing {
		return out
	}
	out[SetAntiSpoofPorts] = []nftables.SetElement{{Key: port, Comment: p.Owner, Timeout: nft.Forever}}
	out[SetMAC] = []nftables.SetElement{el(p.MAC)}
	fast := func(a netip.Addr) nftables.SetElement { return el(append(pad4(slices.Clone(p.MAC)), a.AsSlice()...)) }
	out[SetIPv6] = []nftables.SetElement{el(LinkLocal(p.MAC).AsSlice())}
	out[SetFastIPv6] = []nftables.SetElement{fast(LinkLocal(p.MAC))}
	for _, a := range p.Addrs {
		a = a.Unmap()
		name, fastName := SetIPv4, SetFastIPv4
		if a.Is6() {
			name, fastName = SetIPv6, SetFastIPv6
		}
		out[name] = append(out[name], el(a.AsSlice()))
		out[fastName] = append(out[fastName], fast(a))
	}
	return out
}

// describe names an element for error messages.
func describe(set string, key []byte) string {
	port := nameOf(key)
	if len(key) <= 16 {
		return fmt.Sprintf("port %s in set %s", port, set)
	}
	v := key[16:]
	switch set {
	case SetMAC:
		return fmt.Sprintf("port %s . MAC % x in set %s", port, v[:6], set)
	case SetFastIPv4, SetFastIPv6:
		if len(v) < 8 {
			return fmt.Sprintf("port %s . % x in set %s", port, v, set)
		}
		a, _ := netip.AddrFromSlice(v[8:])
		return fmt.Sprintf("port %s . MAC % x . %s in set %s", port, v[:6], a, set)
	default:
		a, _ := netip.AddrFromSlice(v)
		return fmt.Sprintf("port %s . %s in set %s", port, a, set)
	}
}

// nameOf reads the interface name at the start of a key.
func nameOf(key []byte) string {
	if len(key) > 16 {
		key = key[:16]
	}
	for i, b := range key {
		if b == 0 {
			return string(key[:i])
		}
	}
	return string(key)
}
