package netpol

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/kubenet-dev/kubenet/internal/nft"
	"github.com/kubenet-dev/kubenet/internal/policyrules"
)

// The packet-mark bits of the policy rules. A rule grants a packet passage by setting a bit; the
// guards (guard.go) drop every packet that reaches a guarded place without the bit. No other bit
// of the mark is read or changed (kube-proxy uses 0x4000 and 0x8000, the host ports 0x1000).
const (
	// MarkEgress: the sending pod's egress policies allow the packet (set in the bridge's
	// prerouting hook; the bridge's guard and the forward chain want it).
	MarkEgress uint32 = 0x01000000
	// MarkIngress: the receiving pod may get the packet (set in the bridge's forward and output
	// hooks, and on every packet the node itself sends; the pod's port guard wants it).
	MarkIngress uint32 = 0x02000000
	// MarkConntracked: conntrack knows the packet's connection (established or related), set
	// in the IP prerouting hook, which br_netfilter runs before the bridge's prerouting chains.
	MarkConntracked uint32 = 0x04000000
	// CtMarkCut, in a conntrack entry's mark (not the packet's): the connection is one the
	// policies deny and CutDenied cut; the inet table drops its packets, whichever end sends.
	// Not one of the packet bits above, so that a tool that copies the connection's mark into
	// the packet's grants nothing.
	CtMarkCut uint32 = 0x08000000
)

// Names of the fixed objects of the policy tables.
const (
	// bridge table
	ChainEgress       = "egress"  // hook prerouting: every frame a port receives (from a pod)
	ChainForward      = "forward" // hook forward: frames the bridge passes from port to port
	ChainOutput       = "output"  // hook output: frames the node sends or routes into the bridge
	ChainAllowEgress  = policyrules.AllowEgress
	ChainAllowIngress = policyrules.AllowIngress
	// Where a group sends what none of its entries allows: count it on the pod's port, log it
	// (Options.Log), drop it. Groups are shared by every pod with the same allow list; these sets,
	// keyed by port, make the count per pod.
	ChainDropEgress  = "drop-egress"
	ChainDropIngress = "drop-ingress"
	// Where an audit group (only staged policies isolate its pods) sends what none of its
	// entries allows: count it on the pod's port (the same sets: a direction is enforced or
	// audit, never both, and the element's comment says which), log it as what the staged
	// policies would drop, and pass it.
	ChainAuditEgress  = "audit-egress"
	ChainAuditIngress = "audit-ingress"
	SetDropsEgress    = "drops-egress"  // port (ifindex) of an isolated pod, with a counter and the pod's name
	SetDropsIngress   = "drops-ingress" // the same for ingress
	// CounterLogRateLimited counts the drops not sent to NFLOG because the log's rate was over.
	CounterLogRateLimited = "log-rate-limited"
	MapEgress             = policyrules.MapEgress  // port (ifindex) → the pod's egress group or allow-egress
	MapIngress            = policyrules.MapIngress // port (ifindex) → the pod's ingress group or allow-ingress
	SetOnLink             = "onlink-ipv6"          // source . destination pairs of on-link neighbour discovery
	// Port . address of the port's pod: the addresses a pod's IP packets may come from. The
	// policies judge a peer by its address, so a packet from another address gets no egress.
	SetSourcesIPv4 = policyrules.SetSourcesIPv4
	SetSourcesIPv6 = policyrules.SetSourcesIPv6
	// The node's pod CIDRs but the node's own addresses in them (the bridge's): addresses only
	// the node's pods have. A packet routed into the bridge from one of them must have come
	// through its pod's port (and carry the egress bit); from anywhere else it is forged.
	SetLocalPodsIPv4 = policyrules.SetLocalPodsIPv4
	SetLocalPodsIPv6 = policyrules.SetLocalPodsIPv6
	// inet table
	ChainConntrack = "conntrack"           // hook prerouting: marks packets of connections conntrack knows
	ChainNode      = policyrules.ChainNode // hook output: marks the node's own packets (the node reaches every pod)

	ingressDir = "in"
	egressDir  = "out"
	// auditInfix follows the direction in an audit group's name ("in-audit-<hash>"): the same
	// allow list enforced and staged are two groups, whose last rules differ.
	auditInfix = "-audit"
)

// Hook priorities. The bridge chains run after br_netfilter (bridge priority 0), which has by
// then passed the frame through the IP prerouting hooks: kube-proxy's and the host ports' DNAT
// are done and conntrack has seen the packet. The inet prerouting chain runs after conntrack
// (-200).
var (
	priorityBridge    = nftables.ChainPriorityRef(100)
	priorityConntrack = nftables.ChainPriorityRef(-150)
)

// TableName is the name of one network's policy tables (an inet and a bridge one). Every
// network table of kubenet is "kubenet-<network>", so "kubenetpolicy-" can never be one of them.
func TableName(network string) string { return "kubenetpolicy-" + network }

// BridgeTable returns the network's bridge-family policy table: dispatch, groups, marks.
func BridgeTable(network string) *nftables.Table {
	return &nftables.Table{Family: nftables.TableFamilyBridge, Name: TableName(network)}
}

// InetTable returns the network's inet policy table: the conntrack and node marks.
func InetTable(network string) *nftables.Table {
	return &nftables.Table{Family: nftables.TableFamilyINet, Name: TableName(network)}
}

// reg1 is the 128-bit register for single matches. A concatenation fills 32-bit registers from
// the first one on, each component padded to 32 bits; cat(i) names the i-th of them in the form
// the kernel dumps it back, so a rule reads back exactly as planned.
const reg1 = 1

func cat(i uint32) uint32 { return nft.Reg32(int(i)) }

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

func bridgeChains(t *nftables.Table) []*nftables.Chain {
	accept := nftables.ChainPolicyAccept
	base := func(name string, hook *nftables.ChainHook) *nftables.Chain {
		return &nftables.Chain{Name: name, Table: t, Type: nftables.ChainTypeFilter, Hooknum: hook, Priority: priorityBridge, Policy: &accept}
	}
	return []*nftables.Chain{
		base(ChainEgress, nftables.ChainHookPrerouting),
		base(ChainForward, nftables.ChainHookForward),
		base(ChainOutput, nftables.ChainHookOutput),
		{Name: ChainAllowEgress, Table: t},
		{Name: ChainAllowIngress, Table: t},
		{Name: ChainDropEgress, Table: t},
		{Name: ChainDropIngress, Table: t},
		{Name: ChainAuditEgress, Table: t},
		{Name: ChainAuditIngress, Table: t},
	}
}

func inetChains(t *nftables.Table) []*nftables.Chain {
	accept := nftables.ChainPolicyAccept
	return []*nftables.Chain{
		{Name: ChainConntrack, Table: t, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookPrerouting, Priority: priorityConntrack, Policy: &accept},
		{Name: ChainNode, Table: t, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookOutput, Priority: priorityConntrack, Policy: &accept},
	}
}

func fixedSets(t *nftables.Table) []*nftables.Set {
	return []*nftables.Set{
		{Table: t, Name: MapEgress, IsMap: true, KeyType: nftables.TypeIFIndex, DataType: nftables.TypeVerdict},
		{Table: t, Name: MapIngress, IsMap: true, KeyType: nftables.TypeIFIndex, DataType: nftables.TypeVerdict},
		onLinkSet(t),
		sourcesSet(t, false), sourcesSet(t, true),
		localPodsSet(t, false), localPodsSet(t, true),
		dropsSet(t, egressDir), dropsSet(t, ingressDir),
	}
}

// dropsName is the drop counters' set of a direction.
func dropsName(dir string) string {
	if dir == ingressDir {
		return SetDropsIngress
	}
	return SetDropsEgress
}

// dropsSet holds a counter per port of a pod isolated in the direction: the drop chain's lookup
// counts the packet on its port's element. The element's comment names the pod, so that a port
// index that comes back for another pod gets a new element (and count).
func dropsSet(t *nftables.Table, dir string) *nftables.Set {
	return &nftables.Set{Table: t, Name: dropsName(dir), KeyType: nftables.TypeIFIndex, Counter: true}
}

// maxDropsComment bounds the pod name in a drop counter's comment (libnftnl's bound for
// comments; the kernel's userdata holds 255 bytes).
const maxDropsComment = 128

// auditComment starts the comment of a drop counter that counts what a port's audit group would
// drop: a pod whose direction turns from audit to enforced (or back) gets a new element, so
// the two counts never mix.
const auditComment = "audit "

// isAuditGroup tells an audit group's name ("in-audit-<hash>") from an enforced one's.
func isAuditGroup(name string) bool {
	return strings.HasPrefix(name, ingressDir+auditInfix+"-") || strings.HasPrefix(name, egressDir+auditInfix+"-")
}

// dropsElement is the counter element of a port and its pod.
func dropsElement(port int, pod string) nftables.SetElement {
	if len(pod) > maxDropsComment {
		pod = pod[:maxDropsComment]
	}
	return nftables.SetElement{Key: portKey(port), Comment: pod}
}

// rateLimitedCounter is the named counter of CounterLogRateLimited.
func rateLimitedCounter(t *nftables.Table) *nftables.NamedObj {
	return &nftables.NamedObj{Table: t, Name: CounterLogRateLimited, Type: nftables.ObjTypeCounter, Obj: &expr.Counter{}}
}

// LogSnaplen is how much of a dropped packet is sent: its IP header (IPv6 with a few
// extension headers) and the transport header's ports.
const LogSnaplen = 128

// maxLogPrefix is the longest NFLOG prefix the kernel takes (NF_LOG_PREFIXLEN less the NUL;
// a longer one is refused with ERANGE, and every rule of the transaction with it).
const maxLogPrefix = 127

// LogNetwork is the network's name as the drop log's prefixes hold it (Drop.Network): the name,
// or for one too long to fit next to the rest of the prefix (a network name may have 128 bytes),
// its start, "~" and a hash of the whole. A network name has no "~", so the short form of a long
// name is no other network's name. Pure.
func LogNetwork(network string) string {
	const room = maxLogPrefix - len("kubenet ") - len(" ingress audit") // LogPrefix's longest rest
	if len(network) <= room {
		return network
	}
	sum := sha256.Sum256([]byte(network))
	tag := "~" + hex.EncodeToString(sum[:8])
	return network[:room-len(tag)] + tag
}

// LogPrefix is the NFLOG prefix of the drops of a network in a direction ("egress" or
// "ingress"), and of what audit groups would drop (audit: the prefix ends in " audit"): the
// reader tells the direction, the network (as LogNetwork names it) and the kind by it.
func LogPrefix(network string, ingress, audit bool) string {
	network = LogNetwork(network)
	p := "kubenet " + network + " egress"
	if ingress {
		p = "kubenet " + network + " ingress"
	}
	if audit {
		p += " audit"
	}
	return p
}

// ParseLogPrefix is the inverse of LogPrefix; the network comes back as LogNetwork names it.
func ParseLogPrefix(prefix string) (network string, ingress, audit, ok bool) {
	rest, ok := strings.CutPrefix(prefix, "kubenet ")
	if !ok {
		return "", false, false, false
	}
	rest, audit = strings.CutSuffix(rest, " audit")
	if n, ok := strings.CutSuffix(rest, " ingress"); ok && n != "" {
		return n, true, audit, true
	}
	if n, ok := strings.CutSuffix(rest, " egress"); ok && n != "" {
		return n, false, audit, true
	}
	return "", false, false, false
}

// dropRules are the rules of a direction's drop chain: count the packet on its pod's port
// (SetDropsEgress by the input port, SetDropsIngress by the output port); with logging, send it
// to NFLOG within the rate, count what is over it as lost; drop. Only packets a policy drops get
// here: logging costs allowed traffic nothing.
func dropRules(network, dir string, log policyrules.DropLog) []nft.Rule {
	return counted(network, dir, log, false)
}

// auditRules are the rules of a direction's audit chain: as the drop chain's, but what the
// staged policies would drop is logged as such and passes (the direction's mark, accepted),
// over the log's rate too.
func auditRules(network, dir string, log policyrules.DropLog) []nft.Rule {
	return counted(network, dir, log, true)
}

// counted is the drop chain (audit: the audit chain) of a direction.
func counted(network, dir string, log policyrules.DropLog, audit bool) []nft.Rule {
	key, bit := expr.MetaKeyIIF, MarkEgress
	if dir == ingressDir {
		key, bit = expr.MetaKeyOIF, MarkIngress
	}
	verdict, what, last := []expr.Any{&expr.Verdict{Kind: expr.VerdictDrop}}, "dropped", "not allowed by any policy of the pod"
	if audit {
		verdict, what, last = grant(bit), "passed", "not allowed by the pod's staged policies: they would drop it; passed"
	}
	set := dropsName(dir)
	rules := []nft.Rule{{
		Comment: "count the drop on the pod's port (" + set + ")",
		Exprs:   []expr.Any{&expr.Meta{Key: key, Register: reg1}, &expr.Lookup{SourceRegister: reg1, SetName: set}},
	}}
	if log.Group != 0 {
		rules = append(rules,
			nft.Rule{
				Comment: "over the log's rate: " + what + " unlogged, counted (" + CounterLogRateLimited + ")",
				Exprs: concat([]expr.Any{
					&expr.Limit{Type: expr.LimitTypePkts, Rate: uint64(log.Rate), Over: true, Unit: expr.LimitTimeSecond, Burst: log.Burst},
					&expr.Objref{Type: int(nftables.ObjTypeCounter), Name: CounterLogRateLimited},
				}, verdict),
			},
			nft.Rule{
				Comment: fmt.Sprintf("log to NFLOG group %d", log.Group),
				Exprs: concat([]expr.Any{
					&expr.Log{
						Key:        1<<unix.NFTA_LOG_GROUP | 1<<unix.NFTA_LOG_PREFIX | 1<<unix.NFTA_LOG_SNAPLEN | 1<<unix.NFTA_LOG_QTHRESHOLD,
						Group:      log.Group,
						Snaplen:    LogSnaplen,
						QThreshold: 1, // each drop is sent at once: the rate bounds the messages
						Data:       []byte(LogPrefix(network, dir == ingressDir, audit)),
					},
				}, verdict),
			})
	}
	return append(rules, nft.Rule{Comment: last, Exprs: verdict})
}

func sourcesName(is6 bool) string {
	if is6 {
		return SetSourcesIPv6
	}
	return SetSourcesIPv4
}

// sourcesSet holds port . address of every released pod's addresses of one family.
func sourcesSet(t *nftables.Table, is6 bool) *nftables.Set {
	return &nftables.Set{Table: t, Name: sourcesName(is6), Concatenation: true,
		KeyType: nftables.MustConcatSetType(nftables.TypeIFIndex, addrType(is6))}
}

// sourceKey is the element key of one of a port's pod's addresses.
func sourceKey(port int, a netip.Addr) []byte { return append(portKey(port), a.Unmap().AsSlice()...) }

func localPodsName(is6 bool) string {
	if is6 {
		return SetLocalPodsIPv6
	}
	return SetLocalPodsIPv4
}

func localPodsSet(t *nftables.Table, is6 bool) *nftables.Set {
	return &nftables.Set{Table: t, Name: localPodsName(is6), Interval: true, KeyType: addrType(is6)}
}

// localPodsElements are the interval elements of the node's pod CIDRs of one family without
// the node's own addresses.
func localPodsElements(podCIDRs []netip.Prefix, nodeAddrs []netip.Addr, is6 bool) []nftables.SetElement {
	var ps []netip.Prefix
	for _, p := range podCIDRs {
		if p.Addr().Is6() == is6 && !p.Addr().Is4In6() {
			ps = append(ps, p)
		}
	}
	rs := mergePrefixes(ps)
	for _, a := range nodeAddrs {
		rs = withoutAddr(rs, a.Unmap())
	}
	var out []nftables.SetElement
	for _, r := range rs {
		out = append(out, nftables.SetElement{Key: r.First.AsSlice()})
		if end := r.Last.Next(); end.IsValid() {
			out = append(out, nftables.SetElement{Key: end.AsSlice(), IntervalEnd: true})
		}
	}
	return out
}

func onLinkSet(t *nftables.Table) *nftables.Set {
	return &nftables.Set{Table: t, Name: SetOnLink, Interval: true, Concatenation: true,
		KeyType: nftables.MustConcatSetType(nftables.TypeIP6Addr, nftables.TypeIP6Addr)}
}

// onLinkElements are the source . destination boxes of neighbour discovery that stays on the
// pods' link: from the unspecified address (duplicate address detection), a link-local address
// or an address of the pod CIDRs, to a link-local address, a link-scope multicast group or an
// address of the pod CIDRs. Routed neighbour-discovery messages (another host's, or a pod's to an
// off-link address) have no pair here and are judged by the policies like any other packet.
func onLinkElements(podCIDRs []netip.Prefix) []nftables.SetElement {
	srcs := []netip.Prefix{netip.MustParsePrefix("::/128"), netip.MustParsePrefix("fe80::/10")}
	dsts := []netip.Prefix{netip.MustParsePrefix("fe80::/10"), netip.MustParsePrefix("ff02::/16")}
	for _, p := range podCIDRs {
		if p.Addr().Is6() && !p.Addr().Is4In6() {
			srcs, dsts = append(srcs, p.Masked()), append(dsts, p.Masked())
		}
	}
	var out []nftables.SetElement
	for _, s := range mergePrefixes(srcs) {
		for _, d := range mergePrefixes(dsts) {
			out = append(out, nftables.SetElement{
				Key:    append(s.First.AsSlice(), d.First.AsSlice()...),
				KeyEnd: append(s.Last.AsSlice(), d.Last.AsSlice()...),
			})
		}
	}
	return out
}

func mergePrefixes(ps []netip.Prefix) []policyrules.Range {
	rs := make([]policyrules.Range, 0, len(ps))
	for _, p := range ps {
		rs = append(rs, policyrules.PrefixRange(p))
	}
	return policyrules.MergeRanges(rs)
}

// isFamily matches IPv4 or IPv6 frames by their ether type (the bridge family has no nfproto).
func isFamily(is6 bool) []expr.Any {
	et := uint16(unix.ETH_P_IP)
	if is6 {
		et = unix.ETH_P_IPV6
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyPROTOCOL, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: binaryutil.BigEndian.PutUint16(et)},
	}
}

// carriesFamily matches untagged IPv4 or IPv6 frames by the ether type the frame carries after its
// MAC addresses (a VLAN tag, which the kernel moved into the packet's metadata, shows as 0x8100
// there, where skb->protocol shows what is behind the tag).
func carriesFamily(is6 bool) []expr.Any {
	et := uint16(unix.ETH_P_IP)
	if is6 {
		et = unix.ETH_P_IPV6
	}
	return []expr.Any{
		&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseLLHeader, Offset: 12, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: binaryutil.BigEndian.PutUint16(et)},
	}
}

func isARP() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyPROTOCOL, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: binaryutil.BigEndian.PutUint16(unix.ETH_P_ARP)},
	}
}

// loadAddr loads the source or destination address into reg.
func loadAddr(is6 bool, d nft.Direction, reg uint32) *expr.Payload {
	off := map[[2]bool]uint32{{false, false}: 12, {false, true}: 16, {true, false}: 8, {true, true}: 24}[[2]bool{is6, d == nft.Destination}]
	return &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: addrBytes(is6)}
}

// metaKeyIIFKind is NFT_META_IIFKIND (Linux 5.1): the kind of the input interface ("bridge",
// "veth", ...), which neither google/nftables nor x/sys name.
const metaKeyIIFKind expr.MetaKey = 26

// ifName is a name as the kernel compares interface names and kinds: padded to IFNAMSIZ.
func ifName(s string) []byte {
	b := make([]byte, 16)
	copy(b, s)
	return b
}

func native(v uint32) []byte {
	b := make([]byte, 4)
	binary.NativeEndian.PutUint32(b, v)
	return b
}

// hasMark matches packets whose mark has bit (set true) or lacks it (set false).
func hasMark(bit uint32, set bool) []expr.Any {
	op := expr.CmpOpNeq
	if !set {
		op = expr.CmpOpEq
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: reg1},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4, Mask: native(bit), Xor: native(0)},
		&expr.Cmp{Op: op, Register: reg1, Data: native(0)},
	}
}

// grant sets bit in the packet's mark (keeping every other bit) and accepts it.
func grant(bit uint32) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: reg1},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4, Mask: native(^bit), Xor: native(bit)},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: reg1},
		&expr.Verdict{Kind: expr.VerdictAccept},
	}
}

// clearMark takes bits off the packet's mark, keeping every other bit.
func clearMark(bits uint32) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: reg1},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4, Mask: native(^bits), Xor: native(0)},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: reg1},
	}
}

func concat(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// neighbourDiscovery grants bit to on-link neighbour solicitations and advertisements: ICMPv6
// types 135 and 136 with a hop limit of 255 (no router has forwarded them, RFC 4861 7.1) between
// the on-link address pairs of SetOnLink. Without them no IPv6 address resolves, whatever the
// policies allow; router solicitations and advertisements and redirects from pods are the
// isolation's to drop, and to pods nothing on the bridge sends them.
func neighbourDiscovery(bit uint32) nft.Rule {
	return nft.Rule{
		Comment: "on-link IPv6 neighbour discovery (" + SetOnLink + ")",
		Exprs: concat(isFamily(true), []expr.Any{
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{unix.IPPROTO_ICMPV6}},
			&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 1},
			&expr.Cmp{Op: expr.CmpOpGte, Register: reg1, Data: []byte{135}},
			&expr.Cmp{Op: expr.CmpOpLte, Register: reg1, Data: []byte{136}},
			&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseNetworkHeader, Offset: 7, Len: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{255}},
			loadAddr(true, nft.Source, cat(0)),
			loadAddr(true, nft.Destination, cat(4)),
			&expr.Lookup{SourceRegister: cat(0), SetName: SetOnLink},
		}, grant(bit)),
	}
}

func arpPasses() nft.Rule {
	return nft.Rule{Comment: "ARP: the isolation's to judge", Exprs: concat(isARP(), []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}})}
}

// dispatch jumps (goto) by the frame's input or output port through m. A port without an element
// falls through to the chain's end: accepted here, without the mark, so the port's guard or the
// bridge's drops it. That is what a pod whose policies are not installed gets: nothing.
func dispatch(key expr.MetaKey, m string) nft.Rule {
	what := "egress of the pod on the input port"
	if m == MapIngress {
		what = "ingress of the pod on the output port"
	}
	return nft.Rule{Comment: what + " (" + m + "); no element: no mark, the guard drops it", Exprs: dispatchTo(key, m)}
}

func dispatchTo(key expr.MetaKey, m string) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: key, Register: reg1},
		&expr.Lookup{SourceRegister: reg1, DestRegister: 0, IsDestRegSet: true, SetName: m},
	}
}

// egressDispatch dispatches the untagged IP packets of one family by their input port, when
// their source is one of the port's pod's addresses (SetSourcesIPv4, SetSourcesIPv6). A packet
// from any other address falls through without a mark: the policies of other pods judge their
// peers by the source address, which a pod must not borrow, whatever the node's anti-spoofing
// chains (another table) say or whether they are there at all. So does a VLAN-tagged one (a
// priority tag, VLAN 0, is taken as untagged by receivers): br_netfilter leaves tagged frames out
// of the IP hooks, so kube-proxy's DNAT would come after the policy instead of before it.
func egressDispatch(is6 bool) nft.Rule {
	return nft.Rule{
		Comment: "untagged, from an address of the pod on the input port (" + sourcesName(is6) + "): its egress (" + MapEgress + "); else no mark",
		Exprs: concat(carriesFamily(is6), []expr.Any{
			&expr.Meta{Key: expr.MetaKeyIIF, Register: cat(0)},
			loadAddr(is6, nft.Source, cat(1)),
			&expr.Lookup{SourceRegister: cat(0), SetName: sourcesName(is6)},
		}, dispatchTo(expr.MetaKeyIIF, MapEgress)),
	}
}

// egressOtherDispatch dispatches what is neither IPv4 nor IPv6 by its input port.
func egressOtherDispatch() nft.Rule {
	return nft.Rule{
		Comment: "neither IPv4 nor IPv6: egress of the pod on the input port (" + MapEgress + ")",
		Exprs: concat([]expr.Any{
			&expr.Meta{Key: expr.MetaKeyPROTOCOL, Register: reg1},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: binaryutil.BigEndian.PutUint16(unix.ETH_P_IP)},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: binaryutil.BigEndian.PutUint16(unix.ETH_P_IPV6)},
		}, dispatchTo(expr.MetaKeyIIF, MapEgress)),
	}
}

// forgedLocalSource leaves without a mark what is routed into the bridge with a source address
// of the node's pod CIDRs (not the node's own: kube-proxy masquerades to the bridge's) but
// without the egress bit: a packet of one of the node's pods comes through its port, where its
// egress was judged; one routed in from elsewhere (another host, a tunnel) with such a source is
// forged, and would otherwise get the pod's rights as a peer.
func forgedLocalSource(is6 bool) nft.Rule {
	return nft.Rule{
		Comment: "a source only the node's pods have (" + localPodsName(is6) + ") that did not come through its pod's port: no mark",
		Exprs: concat(isFamily(is6), []expr.Any{
			loadAddr(is6, nft.Source, reg1),
			&expr.Lookup{SourceRegister: reg1, SetName: localPodsName(is6)},
		}, hasMark(MarkEgress, false), []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}}),
	}
}

// heldFromNode takes the ingress bit (which the inet table's node chain gave every packet of the
// node) off what the node sends to a port that has no element: a held pod receives nothing from
// the node either.
func heldFromNode() nft.Rule {
	return nft.Rule{
		Comment: "to a port without an element (" + MapIngress + "): held, not even the node's packets",
		Exprs: concat([]expr.Any{
			&expr.Meta{Key: expr.MetaKeyOIF, Register: reg1},
			&expr.Lookup{SourceRegister: reg1, SetName: MapIngress, Invert: true},
		}, clearMark(MarkIngress), []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}}),
	}
}

// BridgeRules returns the rules of the bridge table's fixed chains, in order. Their number is
// fixed: the per-pod state lives in the maps, the per-policy state in the groups. log says
// whether the drop chains log (the network names the log's prefix).
func BridgeRules(network string, log policyrules.DropLog) map[string][]nft.Rule {
	return map[string][]nft.Rule{
		ChainEgress: {
			arpPasses(),
			neighbourDiscovery(MarkEgress),
			egressDispatch(false),
			egressDispatch(true),
			egressOtherDispatch(),
		},
		ChainForward: {
			arpPasses(),
			{Comment: "frames whose egress was not granted get no ingress either", Exprs: concat(hasMark(MarkEgress, false), []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}})},
			neighbourDiscovery(MarkIngress),
			dispatch(expr.MetaKeyOIF, MapIngress),
		},
		ChainOutput: {
			arpPasses(),
			neighbourDiscovery(MarkIngress),
			heldFromNode(),
			{Comment: "the node's own packets reach every pod", Exprs: concat(hasMark(MarkIngress, true), []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}})},
			forgedLocalSource(false),
			forgedLocalSource(true),
			dispatch(expr.MetaKeyOIF, MapIngress),
		},
		ChainAllowEgress:  {{Comment: "a pod no policy isolates for egress", Exprs: grant(MarkEgress)}},
		ChainAllowIngress: {{Comment: "a pod no policy isolates for ingress", Exprs: grant(MarkIngress)}},
		ChainDropEgress:   dropRules(network, egressDir, log),
		ChainDropIngress:  dropRules(network, ingressDir, log),
		ChainAuditEgress:  auditRules(network, egressDir, log),
		ChainAuditIngress: auditRules(network, ingressDir, log),
	}
}

// InetRules returns the rules of the inet table's chains.
func InetRules() map[string][]nft.Rule {
	// A packet enters the IP stack without any of the bits, whatever it carried before: the
	// packet inside a tunnel the node ends keeps the outer packet's mark, and the outer packet's
	// conntrack bit says nothing about the inner one's connection.
	fresh := nft.Rule{
		Comment: "no policy bit on a packet that enters the IP stack (a decapsulated one keeps the outer mark)",
		Exprs:   clearMark(MarkEgress | MarkIngress | MarkConntracked),
	}
	conntracked := func(state uint32, comment string, from ...expr.Any) nft.Rule {
		return nft.Rule{
			Comment: comment,
			Exprs: concat([]expr.Any{
				&expr.Ct{Register: reg1, Key: expr.CtKeySTATE},
				&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4, Mask: native(state), Xor: native(0)},
				&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: native(0)},
			}, from, []expr.Any{
				&expr.Meta{Key: expr.MetaKeyMARK, Register: reg1},
				&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4, Mask: native(^MarkConntracked), Xor: native(MarkConntracked)},
				&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: reg1},
			}),
		}
	}
	established := conntracked(expr.CtStateBitESTABLISHED, "packets of connections conntrack knows: replies of allowed connections")
	// An ICMP error is "related" to a connection whoever sends it: a pod that no policy lets
	// reach another could otherwise forge errors about the other's connections and have them
	// pass as replies. Errors from pods (their frames enter the IP stack through a bridge) are
	// judged by the policies like any ICMP; those of routers on the way keep passing.
	related := conntracked(expr.CtStateBitRELATED, "ICMP errors about known connections, but from a bridge's ports",
		&expr.Meta{Key: metaKeyIIFKind, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: ifName("bridge")})
	// Dropped before conntrack's mark could grant anything: a cut connection stays cut whichever
	// end sends next (a deleted entry would be picked up again, mid-stream, in the direction of
	// whoever sends first, and judged as that end's connection).
	cut := nft.Rule{
		Comment: "packets of connections the policies deny (cut: conntrack mark bit)",
		Exprs: []expr.Any{
			&expr.Ct{Register: reg1, Key: expr.CtKeyMARK},
			&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4, Mask: native(CtMarkCut), Xor: native(0)},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: native(0)},
			&expr.Verdict{Kind: expr.VerdictDrop},
		},
	}
	node := nft.Rule{
		Comment: "the node's own packets reach every pod",
		Exprs: []expr.Any{
			&expr.Meta{Key: expr.MetaKeyMARK, Register: reg1},
			&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4, Mask: native(^MarkIngress), Xor: native(MarkIngress)},
			&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: reg1},
		},
	}
	return map[string][]nft.Rule{ChainConntrack: {fresh, cut, established, related}, ChainNode: {cut, node}}
}

// A group's sets are named after a slot, not after the group: "g<N>-any-ipv4", "g<N>-any-ipv6",
// "g<N>-ports-ipv4", "g<N>-ports-ipv6", N the smallest number no set of the table has when the
// sets are made. The group's chain (named after its content, group.name) looks them up by
// name. A group whose allow list changes can so become the new list's group by an edit of its
// sets' elements and a new chain that refers to the same sets, in the transaction that moves its
// ports (apply.go, inPlaceEdits); content-addressed sets would have to be built anew. The slot
// says nothing of the content: Inspect finds a group's sets through its chain's rules and checks
// that they hold the list the chain's name stands for. Sets named after their group's chain
// ("in-<hash>-any-ipv4") are those of the layout before slots: Apply replaces them.
const slotPrefix = "g"

// slotStem is the stem of the sets of slot n.
func slotStem(n int) string { return slotPrefix + strconv.Itoa(n) }

// slotOf is the number of a slot's stem; false for any other stem (the older layout's).
func slotOf(stem string) (int, bool) {
	digits, ok := strings.CutPrefix(stem, slotPrefix)
	if !ok || digits == "" || (len(digits) > 1 && digits[0] == '0') {
		return 0, false
	}
	n, err := strconv.Atoi(digits)
	return n, err == nil && n >= 0
}

// setKinds are the suffixes of a group's sets, after their stem.
var setKinds = []string{"-any-ipv4", "-any-ipv6", "-ports-ipv4", "-ports-ipv6", "-hosts-ipv4", "-hosts-ipv6", "-points-ipv4", "-points-ipv6"}

// groupSetNames are the names of every set a group of the stem may have in one family: the
// hash sets first (hosts, points), then the interval ones (any, ports), the order of their rules.
func groupSetNames(stem string, is6 bool) []string {
	return []string{hostsSetName(stem, is6), pointsSetName(stem, is6), anySetName(stem, is6), portsSetName(stem, is6)}
}

// setStem returns the stem of a group set ("g3-any-ipv4" → "g3"; the older layout's
// "in-<hash>-any-ipv4" → "in-<hash>"); false for any other set.
func setStem(set string) (string, bool) {
	for _, suffix := range setKinds {
		stem, ok := strings.CutSuffix(set, suffix)
		if !ok {
			continue
		}
		if _, slot := slotOf(stem); slot {
			return stem, true
		}
		if _, group := GroupDirection(stem); group {
			return stem, true
		}
	}
	return "", false
}

// Names of a group's sets, by their stem: stem-kind-ipv4 or -ipv6.
func groupSetName(stem, kind string, is6 bool) string {
	if is6 {
		return stem + "-" + kind + "-ipv6"
	}
	return stem + "-" + kind + "-ipv4"
}

// setShape is what a group set's definition must say for its elements to mean what their
// kind's decoding reads: a hash set's element is one key, an interval set's a range; a set of
// the same key length with other flags (an element that opens or ends a range) or another length
// is another tool's.
type setShape struct {
	interval, concat bool
	keyLen           uint32
}

// groupSetShape is the shape of the group set of that name, by its kind; false for any other set.
func groupSetShape(set string) (setShape, bool) {
	if _, ok := setStem(set); !ok {
		return setShape{}, false
	}
	n := addrBytes(strings.HasSuffix(set, "-ipv6"))
	switch setKindOf(set) {
	case kindHosts:
		return setShape{keyLen: n}, true
	case kindPoints:
		return setShape{concat: true, keyLen: n + 8}, true
	case kindAny:
		return setShape{interval: true, concat: true, keyLen: n + 4}, true
	}
	return setShape{interval: true, concat: true, keyLen: n + 8}, true
}

// same tells whether the kernel's set s has the shape.
func (sh setShape) same(s *nftables.Set) bool {
	return s.Interval == sh.interval && s.Concatenation == sh.concat && s.KeyType.Bytes == sh.keyLen && !s.IsMap && !s.HasTimeout
}

func hostsSetName(stem string, is6 bool) string  { return groupSetName(stem, "hosts", is6) }
func pointsSetName(stem string, is6 bool) string { return groupSetName(stem, "points", is6) }
func anySetName(stem string, is6 bool) string    { return groupSetName(stem, "any", is6) }
func portsSetName(stem string, is6 bool) string  { return groupSetName(stem, "ports", is6) }

// groupSets returns the set definitions of a group whose sets have the stem, with their elements when withElements: "any"
// is keyed by peer . protocol (the protocol always 0-255: the kernel's concatenated interval sets
// need two fields), "ports" by peer . protocol . port.
func groupSets(t *nftables.Table, stem string, g group, withElements bool) []setWithElements {
	packed := packGroupSets(t, stem, g, withElements)
	out := make([]setWithElements, len(packed))
	for i, p := range packed {
		out[i] = setWithElements{set: p.set}
		if withElements {
			out[i].elements = p.elements()
		}
	}
	return out
}

// packedSet is a group set's definition and its elements as records of one size (the key, then
// the key end of an interval set) in one buffer: a pass encodes every element of every group it
// edits or builds, and a key allocated apiece was most of its garbage.
type packedSet struct {
	set            *nftables.Set
	keyLen, endLen int
	recs           []byte
}

func (p packedSet) len() int { return len(p.recs) / (p.keyLen + p.endLen) }

func (p packedSet) rec(i int) []byte {
	n := p.keyLen + p.endLen
	return p.recs[i*n : (i+1)*n : (i+1)*n]
}

// element is record i as a set element (its key and key end share the buffer).
func (p packedSet) element(i int) nftables.SetElement {
	r := p.rec(i)
	e := nftables.SetElement{Key: r[:p.keyLen:p.keyLen]}
	if p.endLen > 0 {
		e.KeyEnd = r[p.keyLen:]
	}
	return e
}

func (p packedSet) elements() []nftables.SetElement {
	out := make([]nftables.SetElement, p.len())
	for i := range out {
		out[i] = p.element(i)
	}
	return out
}

// packGroupSets is groupSets with the elements packed (none without withElements).
func packGroupSets(t *nftables.Table, stem string, g group, withElements bool) []packedSet {
	var out []packedSet
	for _, is6 := range []bool{false, true} {
		anyRanges, boxes, hosts, points := g.any4, g.ports4, g.hosts4, g.points4
		if is6 {
			anyRanges, boxes, hosts, points = g.any6, g.ports6, g.hosts6, g.points6
		}
		n := int(addrBytes(is6))
		pack := func(set *nftables.Set, keyLen, endLen, count int, put func(rec []byte, i int)) {
			p := packedSet{set: set, keyLen: keyLen, endLen: endLen}
			if withElements {
				size := keyLen + endLen
				p.recs = make([]byte, count*size)
				for i := range count {
					put(p.recs[i*size:(i+1)*size], i)
				}
			}
			out = append(out, p)
		}
		if len(hosts) > 0 {
			pack(&nftables.Set{Table: t, Name: hostsSetName(stem, is6), KeyType: addrType(is6)}, n, 0, len(hosts),
				func(rec []byte, i int) { putAddr(rec, hosts[i]) })
		}
		if len(points) > 0 {
			pack(&nftables.Set{Table: t, Name: pointsSetName(stem, is6), Concatenation: true,
				KeyType: nftables.MustConcatSetType(addrType(is6), nftables.TypeInetProto, nftables.TypeInetService)}, n+8, 0, len(points),
				func(rec []byte, i int) {
					putPortsKey(rec, points[i].addrs.First, points[i].ports.Protocol, points[i].ports.First)
				})
		}
		if len(anyRanges) > 0 {
			pack(&nftables.Set{Table: t, Name: anySetName(stem, is6), Interval: true, Concatenation: true,
				KeyType: nftables.MustConcatSetType(addrType(is6), nftables.TypeInetProto)}, n+4, n+4, len(anyRanges),
				func(rec []byte, i int) {
					putAnyKey(rec[:n+4], anyRanges[i].First, 0)
					putAnyKey(rec[n+4:], anyRanges[i].Last, 255)
				})
		}
		if len(boxes) > 0 {
			pack(&nftables.Set{Table: t, Name: portsSetName(stem, is6), Interval: true, Concatenation: true,
				KeyType: nftables.MustConcatSetType(addrType(is6), nftables.TypeInetProto, nftables.TypeInetService)}, n+8, n+8, len(boxes),
				func(rec []byte, i int) {
					b := boxes[i]
					putPortsKey(rec[:n+8], b.addrs.First, b.ports.Protocol, b.ports.First)
					putPortsKey(rec[n+8:], b.addrs.Last, b.ports.Protocol, b.ports.Last)
				})
		}
	}
	return out
}

type setWithElements struct {
	set      *nftables.Set
	elements []nftables.SetElement
}

// putAnyKey writes a bound of an "any" element into k, which has its length and is zero: the
// address, the protocol padded to 32 bits.
func putAnyKey(k []byte, a netip.Addr, proto uint8) {
	putAddr(k, a)
	k[addrBytes(a.Is6())] = proto
}

// portsKey is a bound of a "ports" element: the address, the protocol and the port, each
// padded to 32 bits.
func portsKey(a netip.Addr, proto uint8, port uint16) []byte {
	k := make([]byte, addrBytes(a.Is6())+8)
	putPortsKey(k, a, proto, port)
	return k
}

// putPortsKey writes portsKey(a, proto, port) into k, which has its length and is zero.
func putPortsKey(k []byte, a netip.Addr, proto uint8, port uint16) {
	n := addrBytes(a.Is6())
	putAddr(k, a)
	k[n] = proto
	binary.BigEndian.PutUint16(k[n+4:], port)
}

// putAddr writes a's bytes (4 or 16) at the start of k.
func putAddr(k []byte, a netip.Addr) {
	if a.Is4() {
		b := a.As4()
		copy(k, b[:])
		return
	}
	b := a.As16()
	copy(k, b[:])
}

func pad4(b []byte) []byte {
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

// laterFragments grants the fragments after a datagram's first. A datagram routed to a pod is
// reassembled for conntrack and cut again after the IP hooks, so the bridge's output hook sees
// its fragments: only the first carries the ports the policy judges, and without it the pod's
// stack cannot reassemble the rest, which therefore carries nothing the policy did not allow.
// (Bridged frames reach the bridge's hooks whole: br_netfilter reassembles them before and
// fragments them after.)
func laterFragments(bit uint32) []nft.Rule {
	return []nft.Rule{
		{
			Comment: "IPv4 fragments after the first (the first is judged)",
			Exprs: concat(isFamily(false), []expr.Any{
				&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseNetworkHeader, Offset: 6, Len: 2},
				&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 2, Mask: []byte{0x1f, 0xff}, Xor: []byte{0, 0}},
				&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: []byte{0, 0}},
			}, grant(bit)),
		},
		{
			Comment: "IPv6 fragments after the first (the first is judged)",
			Exprs: concat(isFamily(true), []expr.Any{
				&expr.Exthdr{Op: expr.ExthdrOpIpv6, Type: unix.IPPROTO_FRAGMENT, Offset: 2, Len: 2, DestRegister: reg1},
				&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 2, Mask: []byte{0xff, 0xf8}, Xor: []byte{0, 0}},
				&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: []byte{0, 0}},
			}, grant(bit)),
		},
	}
}

// groupRules are the rules of group name's chain: grant the direction's mark to packets of
// connections conntrack knows (replies) and to packets whose peer, protocol and port one of the
// sets holds; drop the rest. The peer is the source for ingress and the destination for egress.
// An audit group (only staged policies isolate its pods) grants the rest too: its last rule
// marks what the staged policies would drop, and changes no verdict. The first rule's comment
// names the group (writtenFor): the kernel lets a chain be renamed, map elements and all, and a
// chain renamed to another group's name must not pass for that group.
func groupRules(name, stem, dir string, g group, audit bool) []nft.Rule {
	peer, bit, drop, pass := nft.Source, MarkIngress, ChainDropIngress, ChainAuditIngress
	if dir == egressDir {
		peer, bit, drop, pass = nft.Destination, MarkEgress, ChainDropEgress, ChainAuditEgress
	}
	rules := []nft.Rule{{
		Comment: groupCommentPrefix + name + ": packets of connections conntrack knows (the inet table's mark)",
		Exprs:   concat(hasMark(MarkConntracked, true), grant(bit)),
	}}
	if dir == ingressDir {
		rules = append(rules, laterFragments(bit)...)
	}
	for _, is6 := range []bool{false, true} {
		anyRanges, boxes, hosts, points := g.any4, g.ports4, g.hosts4, g.points4
		if is6 {
			anyRanges, boxes, hosts, points = g.any6, g.ports6, g.hosts6, g.points6
		}
		// The hash sets first: a pod peer, the usual one, is found by one hash lookup.
		for _, l := range []struct {
			set   string
			ports bool // address . protocol . port, else address (. protocol, for an interval set)
			proto bool
			used  bool
		}{
			{hostsSetName(stem, is6), false, false, len(hosts) > 0},
			{pointsSetName(stem, is6), true, true, len(points) > 0},
			{anySetName(stem, is6), false, true, len(anyRanges) > 0},
			{portsSetName(stem, is6), true, true, len(boxes) > 0},
		} {
			if !l.used {
				continue
			}
			comment := "peer allowed on every protocol and port (" + l.set + ")"
			match := []expr.Any{loadAddr(is6, peer, cat(0))}
			proto := addrBytes(is6) / 4
			if l.proto {
				match = append(match, &expr.Meta{Key: expr.MetaKeyL4PROTO, Register: cat(proto)})
			}
			if l.ports {
				comment = "peer allowed on this protocol and port (" + l.set + ")"
				match = append(match, &expr.Payload{DestRegister: cat(proto + 1), Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2})
			}
			match = append(match, &expr.Lookup{SourceRegister: cat(0), SetName: l.set})
			rules = append(rules, nft.Rule{Comment: comment, Exprs: concat(isFamily(is6), match, grant(bit))})
		}
	}
	if audit {
		return append(rules, nft.Rule{Comment: "not allowed by the pod's staged policies: counted, logged if logging is on, passed (" + pass + ")",
			Exprs: []expr.Any{&expr.Verdict{Kind: expr.VerdictGoto, Chain: pass}}})
	}
	return append(rules, nft.Rule{Comment: "not allowed by any policy of the pod: counted, logged if logging is on, dropped (" + drop + ")",
		Exprs: []expr.Any{&expr.Verdict{Kind: expr.VerdictGoto, Chain: drop}}})
}

// groupCommentPrefix starts the comment of a group chain's first rule, followed by the group's
// name.
const groupCommentPrefix = "group "

// writtenFor is the group a chain's rules were written for (groupRules), by its first rule's
// comment; "" when it names none.
func writtenFor(rules []*nftables.Rule) string {
	if len(rules) == 0 {
		return ""
	}
	rest, ok := strings.CutPrefix(nft.RuleComment(rules[0]), groupCommentPrefix)
	if !ok {
		return ""
	}
	name, _, ok := strings.Cut(rest, ":")
	if !ok {
		return ""
	}
	return name
}

// IsPodState tells whether an object of the policy tables, by name, holds per-pod or per-policy
// state (the maps' elements, the groups' chains and sets), as opposed to the fixed chains and
// the on-link set, which stay whatever the node's pods: the residue audit's question.
func IsPodState(name string) bool {
	switch name {
	case ChainEgress, ChainForward, ChainOutput, ChainAllowEgress, ChainAllowIngress, ChainDropEgress, ChainDropIngress, ChainAuditEgress, ChainAuditIngress,
		ChainConntrack, ChainNode, SetOnLink, SetLocalPodsIPv4, SetLocalPodsIPv6, CounterLogRateLimited:
		return false
	}
	return true
}
