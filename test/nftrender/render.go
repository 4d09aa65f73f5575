// Package nftrender turns planned nftables rules into text close to what `nft list` prints, so
// that a plan can be read, reviewed and compared as text (the mechanisms' golden tests) without
// a kernel. Unlike nft it leaves no expression out: the family and protocol matches nft hides as
// implicit dependencies are printed, because a rule without them matches other packets. A load
// it cannot name is printed raw (`@nh,96,32`, `reg32 5`), never dropped: every field of every
// expression shows in the text, so two plans that differ render differently.
//
// Only tests use it, so it lives under test/ rather than in internal/nft: product code carries
// none of it.
package nftrender

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/kubenet-dev/kubenet/internal/ipnet"
	"github.com/kubenet-dev/kubenet/internal/nft"
)

// Chain is a chain and its planned rules, for Table.
type Chain struct {
	Chain *nftables.Chain
	Rules []nft.Rule
}

// Set is a set or map and its planned elements, for Table.
type Set struct {
	Set      *nftables.Set
	Elements []nftables.SetElement
}

// Table renders a table the way `nft list table` lays it out: the sets, then the chains in
// the given order. A regular chain reached only by jumps and gotos from rules that matched the
// network or transport protocol (a dispatch chain) is rendered in that protocol's terms.
func Table(t *nftables.Table, sets []Set, chains []Chain) string {
	defs := map[string]*nftables.Set{}
	for _, s := range sets {
		defs[s.Set.Name] = s.Set
	}
	entry := entryContexts(t.Family, defs, sets, chains)
	var b strings.Builder
	fmt.Fprintf(&b, "table %s %s {\n", nft.FamilyName(t.Family), t.Name)
	for _, s := range sets {
		b.WriteString(renderSet(s))
		b.WriteString("\n")
	}
	for i, c := range chains {
		if i > 0 {
			b.WriteString("\n")
		}
		fmt.Fprintf(&b, "\tchain %s {\n", c.Chain.Name)
		if h := chainHeader(t.Family, c.Chain); h != "" {
			fmt.Fprintf(&b, "\t\t%s\n", h)
		}
		for _, r := range c.Rules {
			fmt.Fprintf(&b, "\t\t%s\n", renderRule(t.Family, defs, entry[c.Chain.Name], r))
		}
		b.WriteString("\t}\n")
	}
	b.WriteString("}\n")
	return b.String()
}

// Rule renders one rule of a table of family, its comment last as nft prints it.
func Rule(family nftables.TableFamily, r nft.Rule) string {
	return renderRule(family, nil, protoContext{}, r)
}

func renderRule(family nftables.TableFamily, sets map[string]*nftables.Set, entry protoContext, r nft.Rule) string {
	s := newRenderer(family, sets, entry).rule(r.Exprs)
	if r.Comment != "" {
		s += fmt.Sprintf(" comment %q", r.Comment)
	}
	return s
}

// protoContext is what the rule so far has established about the packet: its network protocol
// ("ip", "ip6", "arp") and transport protocol ("tcp", "udp", "sctp", "icmp", "icmpv6"), which
// name the header fields a payload load reads.
type protoContext struct{ nh, th string }

// entryContexts finds the protocol context each regular chain is entered with: the one every
// jump and goto to it has, when they agree and no map sends packets to it.
func entryContexts(family nftables.TableFamily, defs map[string]*nftables.Set, sets []Set, chains []Chain) map[string]protoContext {
	unknown := protoContext{nh: "?"}
	inMaps := map[string]bool{}
	for _, s := range sets {
		for _, e := range s.Elements {
			if e.VerdictData != nil {
				inMaps[e.VerdictData.Chain] = true
			}
		}
	}
	entry := map[string]protoContext{}
	for range chains { // enough passes for any chain of gotos
		refs := map[string][]protoContext{}
		for _, c := range chains {
			for _, r := range c.Rules {
				rr := newRenderer(family, defs, entry[c.Chain.Name])
				rr.rule(r.Exprs)
				for target, ctx := range rr.targets {
					refs[target] = append(refs[target], ctx...)
				}
			}
		}
		next := map[string]protoContext{}
		for _, c := range chains {
			name := c.Chain.Name
			ctx := refs[name]
			if c.Chain.Hooknum != nil || inMaps[name] || len(ctx) == 0 {
				continue
			}
			agreed := ctx[0]
			for _, o := range ctx[1:] {
				if o != agreed {
					agreed = unknown
				}
			}
			if agreed != unknown {
				next[name] = agreed
			}
		}
		if fmt.Sprint(next) == fmt.Sprint(entry) {
			break
		}
		entry = next
	}
	return entry
}

func chainHeader(family nftables.TableFamily, c *nftables.Chain) string {
	if c.Hooknum == nil {
		return ""
	}
	hooks := map[nftables.ChainHook]string{
		*nftables.ChainHookPrerouting: "prerouting", *nftables.ChainHookInput: "input", *nftables.ChainHookForward: "forward",
		*nftables.ChainHookOutput: "output", *nftables.ChainHookPostrouting: "postrouting",
	}
	hook, ok := hooks[*c.Hooknum]
	switch {
	case family == nftables.TableFamilyINet && *c.Hooknum == *nft.ChainHookInetIngress:
		hook = fmt.Sprintf("ingress device %q", c.Device)
	case !ok || family == nftables.TableFamilyNetdev:
		hook = fmt.Sprintf("%d", *c.Hooknum)
	}
	s := fmt.Sprintf("type %s hook %s", c.Type, hook)
	if c.Priority != nil {
		s += fmt.Sprintf(" priority %d", *c.Priority)
	}
	s += ";"
	if c.Policy != nil {
		policy := "accept"
		if *c.Policy == nftables.ChainPolicyDrop {
			policy = "drop"
		}
		s += " policy " + policy + ";"
	}
	return s
}

// kind says how the bytes of a field are printed.
type kind int

const (
	kindHex kind = iota
	kindAddr
	kindEther
	kindIfname
	kindNFProto
	kindL4Proto
	kindEtherType
	kindUint     // big-endian unsigned (ports, lengths)
	kindICMP     // ICMP type
	kindICMPv6   // ICMPv6 type
	kindMark     // host-order 32 bits, hex
	kindCtState  // host-order bit mask
	kindCtStatus // host-order bit mask, printed in hex
	kindCtDir    // one byte: original or reply
	kindAddrType // host-order route type (fib)
	kindIfindex  // host-order 32 bits, decimal
)

// field is a named part of a load: its name and length in bytes.
type field struct {
	name string
	len  uint32
	kind kind
}

// load is what a register holds: the value of fields (several for a load that spans adjacent
// header fields, or a concatenation), possibly masked and xored by bitwise.
type load struct {
	text      string // the expression as written
	fields    []field
	len       uint32
	mask, xor []byte
}

type renderer struct {
	family  nftables.TableFamily
	sets    map[string]*nftables.Set
	ctx     protoContext
	regs    [16]*load // by 32-bit register: the load that starts or continues there
	starts  [16]bool
	out     []string
	targets map[string][]protoContext // chains jumped or gone to, with the context at the verdict
}

func newRenderer(family nftables.TableFamily, sets map[string]*nftables.Set, entry protoContext) *renderer {
	r := &renderer{family: family, sets: sets, ctx: entry, targets: map[string][]protoContext{}}
	switch family {
	case nftables.TableFamilyIPv4:
		r.ctx.nh = "ip"
	case nftables.TableFamilyIPv6:
		r.ctx.nh = "ip6"
	}
	return r
}

// reg32 returns the 32-bit register index (0-15) of a register number, in either form.
func reg32(reg uint32) (int, bool) {
	switch {
	case reg >= unix.NFT_REG_1 && reg <= unix.NFT_REG_4:
		return int(reg-unix.NFT_REG_1) * 4, true
	case reg >= unix.NFT_REG32_00 && reg <= unix.NFT_REG32_15:
		return int(reg - unix.NFT_REG32_00), true
	}
	return 0, false
}

// store puts l into reg, and forgets every load it overwrites.
func (r *renderer) store(reg uint32, l *load) {
	i, ok := reg32(reg)
	if !ok {
		r.out = append(r.out, fmt.Sprintf("<load into register %d: %s>", reg, l.text))
		return
	}
	n := int(max(1, (l.len+3)/4))
	for j := i; j < min(16, i+n); j++ {
		if old := r.regs[j]; old != nil {
			for k := range r.regs {
				if r.regs[k] == old {
					r.regs[k], r.starts[k] = nil, false
				}
			}
		}
	}
	for j := i; j < min(16, i+n); j++ {
		r.regs[j] = l
	}
	r.starts[i] = true
}

// at returns the load that starts at reg, or a placeholder that shows the register.
func (r *renderer) at(reg uint32) *load {
	i, ok := reg32(reg)
	switch {
	case !ok:
		return &load{text: fmt.Sprintf("register %d", reg)}
	case r.regs[i] == nil:
		return &load{text: fmt.Sprintf("reg32 %d (nothing loaded)", i)}
	case !r.starts[i]:
		return &load{text: fmt.Sprintf("reg32 %d (inside %s)", i, r.regs[i].text)}
	}
	return r.regs[i]
}

// key gathers the concatenation that starts at reg: consecutive loads, up to size bytes when
// the set is known (0: as long as loads follow one another).
func (r *renderer) key(reg uint32, size uint32) *load {
	i, ok := reg32(reg)
	if !ok || r.regs[i] == nil || !r.starts[i] {
		return r.at(reg)
	}
	var parts []string
	var fields []field
	var total uint32
	for i < 16 && r.regs[i] != nil && r.starts[i] && (size == 0 || total < size) {
		l := r.regs[i]
		parts = append(parts, l.text)
		fields = append(fields, l.fields...)
		padded := (l.len + 3) &^ 3
		total += padded
		i += int(padded / 4)
	}
	text := strings.Join(parts, " . ")
	if size != 0 && total != size {
		text += fmt.Sprintf(" <key of %d bytes, set wants %d>", total, size)
	}
	return &load{text: text, fields: fields, len: total}
}

func (r *renderer) rule(exprs []expr.Any) string {
	for _, e := range exprs {
		r.expr(e)
	}
	return strings.Join(r.out, " ")
}

func (r *renderer) emit(format string, args ...any) {
	r.out = append(r.out, fmt.Sprintf(format, args...))
}

func (r *renderer) expr(e expr.Any) {
	switch e := e.(type) {
	case *expr.Meta:
		r.meta(e)
	case *expr.Payload:
		if e.OperationType != expr.PayloadLoad {
			r.emit("<payload write %+v>", *e)
			return
		}
		r.store(e.DestRegister, r.payload(e.Base, e.Offset, e.Len))
	case *expr.Cmp:
		r.cmp(e)
	case *expr.Bitwise:
		src := r.at(e.SourceRegister)
		l := *src
		l.text, l.len = src.text, e.Len
		switch {
		case l.mask == nil && l.xor == nil:
			l.mask, l.xor = e.Mask, e.Xor
		default: // a second bitwise: nothing to fold, show both
			l.text = "(" + bitwiseText(src) + ")"
			l.mask, l.xor = e.Mask, e.Xor
		}
		r.store(e.DestRegister, &l)
	case *expr.Lookup:
		r.lookup(e)
	case *expr.Verdict:
		r.verdict(e)
	case *expr.Fib:
		r.store(e.Register, fibLoad(e))
	case *expr.Ct:
		if e.SourceRegister {
			r.emit("ct %s set %s", ctKeyName(e.Key), bitwiseText(r.at(e.Register)))
			return
		}
		k, n := kindHex, uint32(4)
		switch e.Key {
		case expr.CtKeySTATE:
			k = kindCtState
		case expr.CtKeySTATUS:
			k = kindCtStatus
		case expr.CtKeyDIRECTION:
			k, n = kindCtDir, 1
		case expr.CtKeyMARK:
			k = kindMark // host order, as the packet's
		}
		text := "ct " + ctKeyName(e.Key)
		if e.Direction != 0 {
			text += fmt.Sprintf(" direction %d", e.Direction)
		}
		r.store(e.Register, &load{text: text, len: n, fields: []field{{text, n, k}}})
	case *expr.Exthdr:
		if e.SourceRegister != 0 || e.Op != expr.ExthdrOpIpv6 {
			r.emit("<exthdr %+v>", *e)
			return
		}
		text := fmt.Sprintf("exthdr %s @%d,%d", exthdrName(e.Type), e.Offset, e.Len)
		if e.Flags != 0 {
			text += fmt.Sprintf(" flags %#x", e.Flags)
		}
		r.store(e.DestRegister, &load{text: text, len: e.Len, fields: []field{{text, e.Len, kindHex}}})
	case *expr.Masq:
		s := "masquerade"
		if e.ToPorts {
			s += " to :" + r.at(e.RegProtoMin).text
			if e.RegProtoMax != e.RegProtoMin && e.RegProtoMax != 0 {
				s += "-" + r.at(e.RegProtoMax).text
			}
		}
		r.emit("%s%s", s, natFlags(e.Random, e.FullyRandom, e.Persistent))
	case *expr.NAT:
		r.nat(e)
	case *expr.Notrack:
		r.emit("notrack")
	case *expr.Counter:
		r.emit("counter")
	case *expr.Limit:
		r.emit("%s", limitText(e))
	case *expr.Log:
		r.emit("%s", logText(e))
	case *expr.Objref:
		r.emit("%s name %q", map[int]string{1: "counter", 2: "quota", 4: "limit"}[e.Type], e.Name)
	default:
		r.emit("<%T %+v>", e, e)
	}
}

func (r *renderer) meta(e *expr.Meta) {
	name, k, n := metaKey(e.Key)
	if e.SourceRegister {
		r.emit("meta %s set %s", name, bitwiseText(r.at(e.Register)))
		return
	}
	text := "meta " + name
	if e.Key == expr.MetaKeyIIFNAME || e.Key == expr.MetaKeyOIFNAME || e.Key == expr.MetaKeyIIF || e.Key == expr.MetaKeyOIF {
		text = name // nft prints these without "meta"
	}
	r.store(e.Register, &load{text: text, len: n, fields: []field{{text, n, k}}})
}

// metaKeys name the meta keys the mechanisms load, with how their values print and their length.
var metaKeys = map[expr.MetaKey]struct {
	name string
	kind kind
	len  uint32
}{
	expr.MetaKeyNFPROTO: {"nfproto", kindNFProto, 1}, expr.MetaKeyL4PROTO: {"l4proto", kindL4Proto, 1},
	expr.MetaKeyPROTOCOL: {"protocol", kindEtherType, 2}, expr.MetaKeyMARK: {"mark", kindMark, 4},
	expr.MetaKeyIIFNAME: {"iifname", kindIfname, unix.IFNAMSIZ}, expr.MetaKeyOIFNAME: {"oifname", kindIfname, unix.IFNAMSIZ},
	expr.MetaKeyIIF: {"iif", kindIfindex, 4}, expr.MetaKeyOIF: {"oif", kindIfindex, 4},
	expr.MetaKeyBRIIIFNAME: {"ibrname", kindIfname, unix.IFNAMSIZ}, expr.MetaKeyBRIOIFNAME: {"obrname", kindIfname, unix.IFNAMSIZ},
	26: {"iifkind", kindIfname, unix.IFNAMSIZ}, // NFT_META_IIFKIND
	27: {"oifkind", kindIfname, unix.IFNAMSIZ}, // NFT_META_OIFKIND
}

// metaKey names a meta key and says how its value prints.
func metaKey(key expr.MetaKey) (string, kind, uint32) {
	if m, ok := metaKeys[key]; ok {
		return m.name, m.kind, m.len
	}
	return fmt.Sprintf("key %d", key), kindHex, 4
}

func ctKeyName(k expr.CtKey) string {
	switch k {
	case expr.CtKeySTATE:
		return "state"
	case expr.CtKeyMARK:
		return "mark"
	case expr.CtKeySTATUS:
		return "status"
	case expr.CtKeyDIRECTION:
		return "direction"
	}
	return fmt.Sprintf("key %d", k)
}

func exthdrName(t uint8) string {
	switch t {
	case unix.IPPROTO_FRAGMENT:
		return "frag"
	case unix.IPPROTO_HOPOPTS:
		return "hbh"
	case unix.IPPROTO_ROUTING:
		return "rt"
	case unix.IPPROTO_DSTOPTS:
		return "dst"
	}
	return fmt.Sprintf("type %d", t)
}

func fibLoad(e *expr.Fib) *load {
	var flags []string
	for _, f := range []struct {
		on   bool
		name string
	}{{e.FlagSADDR, "saddr"}, {e.FlagDADDR, "daddr"}, {e.FlagMARK, "mark"}, {e.FlagIIF, "iif"}, {e.FlagOIF, "oif"}} {
		if f.on {
			flags = append(flags, f.name)
		}
	}
	result, k, n := "?", kindHex, uint32(4)
	switch {
	case e.ResultADDRTYPE:
		result, k = "type", kindAddrType
	case e.ResultOIF:
		result, k = "oif", kindIfindex
	case e.ResultOIFNAME:
		result, k, n = "oifname", kindIfname, unix.IFNAMSIZ
	}
	text := "fib " + strings.Join(flags, " . ") + " " + result
	if e.FlagPRESENT {
		text += " present"
	}
	return &load{text: text, len: n, fields: []field{{text, n, k}}}
}

// headerFields are the named fields of each header, by protocol, as nft names them.
var headerFields = map[string][]struct {
	offset uint32
	field
}{
	"ether": {{0, field{"ether daddr", 6, kindEther}}, {6, field{"ether saddr", 6, kindEther}}, {12, field{"ether type", 2, kindEtherType}}},
	"ip": {{2, field{"ip length", 2, kindUint}}, {4, field{"ip id", 2, kindUint}}, {6, field{"ip frag-off", 2, kindHex}},
		{8, field{"ip ttl", 1, kindUint}}, {9, field{"ip protocol", 1, kindL4Proto}}, {12, field{"ip saddr", 4, kindAddr}}, {16, field{"ip daddr", 4, kindAddr}}},
	"ip6": {{4, field{"ip6 length", 2, kindUint}}, {6, field{"ip6 nexthdr", 1, kindL4Proto}}, {7, field{"ip6 hoplimit", 1, kindUint}},
		{8, field{"ip6 saddr", 16, kindAddr}}, {24, field{"ip6 daddr", 16, kindAddr}}},
	"arp": {{0, field{"arp htype", 2, kindUint}}, {2, field{"arp ptype", 2, kindEtherType}}, {4, field{"arp hlen", 1, kindUint}},
		{5, field{"arp plen", 1, kindUint}}, {6, field{"arp operation", 2, kindUint}}, {8, field{"arp saddr ether", 6, kindEther}},
		{14, field{"arp saddr ip", 4, kindAddr}}, {18, field{"arp daddr ether", 6, kindEther}}, {24, field{"arp daddr ip", 4, kindAddr}}},
	"tcp":    {{0, field{"tcp sport", 2, kindUint}}, {2, field{"tcp dport", 2, kindUint}}},
	"udp":    {{0, field{"udp sport", 2, kindUint}}, {2, field{"udp dport", 2, kindUint}}},
	"sctp":   {{0, field{"sctp sport", 2, kindUint}}, {2, field{"sctp dport", 2, kindUint}}},
	"th":     {{0, field{"th sport", 2, kindUint}}, {2, field{"th dport", 2, kindUint}}},
	"icmp":   {{0, field{"icmp type", 1, kindICMP}}, {1, field{"icmp code", 1, kindUint}}},
	"icmpv6": {{0, field{"icmpv6 type", 1, kindICMPv6}}, {1, field{"icmpv6 code", 1, kindUint}}, {8, field{"icmpv6 taddr", 16, kindAddr}}},
}

// payload names a load from a header: the run of named fields it covers exactly, else the raw
// form nft uses (`@nh,<bit offset>,<bit length>`).
func (r *renderer) payload(base expr.PayloadBase, offset, length uint32) *load {
	proto, raw := "", ""
	switch base {
	case expr.PayloadBaseLLHeader:
		proto, raw = "ether", "ll"
	case expr.PayloadBaseNetworkHeader:
		proto, raw = r.ctx.nh, "nh"
	case expr.PayloadBaseTransportHeader:
		proto, raw = r.ctx.th, "th"
		if proto == "" {
			proto = "th"
		}
	}
	var names []string
	var fields []field
	at := offset
	for at < offset+length {
		i := slices.IndexFunc(headerFields[proto], func(f struct {
			offset uint32
			field
		}) bool {
			return f.offset == at
		})
		if i < 0 || at+headerFields[proto][i].len > offset+length {
			names = nil
			break
		}
		f := headerFields[proto][i].field
		names, fields = append(names, f.name), append(fields, f)
		at += f.len
	}
	if names == nil {
		text := fmt.Sprintf("@%s,%d,%d", raw, offset*8, length*8)
		return &load{text: text, len: length, fields: []field{{text, length, kindHex}}}
	}
	return &load{text: strings.Join(names, " . "), len: length, fields: fields}
}

func (r *renderer) cmp(e *expr.Cmp) {
	l := r.at(e.Register)
	op := map[expr.CmpOp]string{expr.CmpOpEq: "", expr.CmpOpNeq: "!= ", expr.CmpOpLt: "< ", expr.CmpOpLte: "<= ", expr.CmpOpGt: "> ", expr.CmpOpGte: ">= "}[e.Op]
	if _, prefix := prefixBits(l); op == "" && !prefix && (l.mask != nil || l.xor != nil) {
		op = "== " // after "& mask" a bare value would read as another operand
	}
	r.emit("%s %s%s", maskedText(l), op, value(l, e.Data))
	if e.Op == expr.CmpOpEq && len(l.fields) == 1 && l.mask == nil {
		r.learn(l.fields[0], e.Data)
	}
}

// learn records the protocol a match established.
func (r *renderer) learn(f field, data []byte) {
	switch f.kind {
	case kindNFProto:
		switch {
		case len(data) == 1 && data[0] == unix.NFPROTO_IPV4:
			r.ctx.nh = "ip"
		case len(data) == 1 && data[0] == unix.NFPROTO_IPV6:
			r.ctx.nh = "ip6"
		}
	case kindEtherType:
		if name := etherTypeName(data); name == "ip" || name == "ip6" || name == "arp" {
			r.ctx.nh = name
		}
	case kindL4Proto:
		if len(data) == 1 {
			if name := l4Name(data[0]); name != "" {
				r.ctx.th = name
				if name == "ipv6-icmp" {
					r.ctx.th = "icmpv6"
				}
			}
		}
	}
}

func (r *renderer) lookup(e *expr.Lookup) {
	var size uint32
	set := r.sets[e.SetName]
	if set != nil {
		size = set.KeyType.Bytes
	}
	k := r.key(e.SourceRegister, size)
	neg := ""
	if e.Invert {
		neg = "!= "
	}
	switch {
	case !e.IsDestRegSet:
		r.emit("%s %s@%s", k.text, neg, e.SetName)
	case e.DestRegister == 0:
		r.emit("%s %svmap @%s", k.text, neg, e.SetName)
	default:
		n := uint32(16)
		if set != nil {
			n = set.DataType.Bytes
		}
		// Shown where it happens (a miss ends the rule there), its value named after the map
		// where a later expression uses it.
		r.emit("%s %smap @%s", k.text, neg, e.SetName)
		text := fmt.Sprintf("@%s value", e.SetName)
		r.store(e.DestRegister, &load{text: text, len: n, fields: []field{{text, n, kindHex}}})
	}
}

func (r *renderer) verdict(e *expr.Verdict) {
	switch e.Kind {
	case expr.VerdictAccept:
		r.emit("accept")
	case expr.VerdictDrop:
		r.emit("drop")
	case expr.VerdictReturn:
		r.emit("return")
	case expr.VerdictContinue:
		r.emit("continue")
	case expr.VerdictJump:
		r.emit("jump %s", e.Chain)
		r.targets[e.Chain] = append(r.targets[e.Chain], r.ctx)
	case expr.VerdictGoto:
		r.emit("goto %s", e.Chain)
		r.targets[e.Chain] = append(r.targets[e.Chain], r.ctx)
	default:
		r.emit("<verdict %d %s>", e.Kind, e.Chain)
	}
}

// nat renders a NAT statement. A map lookup that yields address . port and fills both of the
// statement's registers prints as nft prints it (`dnat ip to <key> map @m`); anything else shows
// which registers the address and the port come from.
func (r *renderer) nat(e *expr.NAT) {
	typ := "snat"
	if e.Type == expr.NATTypeDestNAT {
		typ = "dnat"
	}
	fam := map[uint32]string{unix.NFPROTO_IPV4: "ip ", unix.NFPROTO_IPV6: "ip6 "}[e.Family]
	addrLen := uint32(4)
	if e.Family == unix.NFPROTO_IPV6 {
		addrLen = 16
	}
	s := typ + " " + fam + "to "
	ai, aok := reg32(e.RegAddrMin)
	pi, pok := reg32(e.RegProtoMin)
	switch {
	case aok && pok && r.starts[ai] && r.regs[ai] != nil && r.regs[ai].len == addrLen+4 && pi == ai+int(addrLen/4) &&
		r.regs[pi] == r.regs[ai] && e.RegAddrMax == e.RegAddrMin && e.RegProtoMax == e.RegProtoMin:
		s += r.regs[ai].text
	default:
		if e.RegAddrMin != 0 {
			s += r.natPart(e.RegAddrMin)
			if e.RegAddrMax != e.RegAddrMin {
				s += "-" + r.natPart(e.RegAddrMax)
			}
		}
		if e.RegProtoMin != 0 {
			s += " port " + r.natPart(e.RegProtoMin)
			if e.RegProtoMax != e.RegProtoMin {
				s += "-" + r.natPart(e.RegProtoMax)
			}
		}
	}
	if e.Prefix {
		s += " prefix"
	}
	if !e.Specified && e.RegProtoMin != 0 {
		s += " <proto range not specified>"
	}
	r.emit("%s%s", s, natFlags(e.Random, e.FullyRandom, e.Persistent))
}

func (r *renderer) natPart(reg uint32) string {
	i, ok := reg32(reg)
	if !ok {
		return fmt.Sprintf("register %d", reg)
	}
	return fmt.Sprintf("reg32 %d (%s)", i, r.at(reg).text)
}

func natFlags(random, fullyRandom, persistent bool) string {
	var f []string
	for _, x := range []struct {
		on   bool
		name string
	}{{random, "random"}, {fullyRandom, "fully-random"}, {persistent, "persistent"}} {
		if x.on {
			f = append(f, x.name)
		}
	}
	if len(f) == 0 {
		return ""
	}
	return " " + strings.Join(f, ",")
}

// maskedText is a load as a match reads it: an address under a prefix mask prints as the bare
// field (the prefix goes with the value), any other mask and xor explicitly.
func maskedText(l *load) string {
	if _, ok := prefixBits(l); ok {
		return l.text
	}
	return bitwiseText(l)
}

func bitwiseText(l *load) string {
	s := l.text
	if l.mask != nil && l.xor != nil && len(l.mask) == len(l.xor) && !allZero(l.xor) && allOnes(orBytes(l.mask, l.xor)) && allZero(andBytes(l.mask, l.xor)) {
		return s + " | " + hexValue(l, l.xor) // (x & ^bits) ^ bits sets bits
	}
	if l.mask != nil && !allOnes(l.mask) {
		s += " & " + hexValue(l, l.mask)
	}
	if l.xor != nil && !allZero(l.xor) {
		s += " ^ " + hexValue(l, l.xor)
	}
	return s
}

// prefixBits tells whether l is one address under a contiguous prefix mask and no xor.
func prefixBits(l *load) (int, bool) {
	if len(l.fields) != 1 || l.fields[0].kind != kindAddr || l.mask == nil || !allZero(l.xor) {
		return 0, false
	}
	ones, bits := net.IPMask(l.mask).Size()
	if bits == 0 || bits != int(l.len)*8 {
		return 0, false
	}
	return ones, true
}

func hexValue(l *load, b []byte) string {
	if len(l.fields) == 1 && l.fields[0].kind == kindCtState && len(b) == 4 {
		return ctStateName(binary.NativeEndian.Uint32(b))
	}
	if len(l.fields) == 1 && (l.fields[0].kind == kindMark || l.fields[0].kind == kindCtStatus) && len(b) == 4 {
		return fmt.Sprintf("0x%08x", binary.NativeEndian.Uint32(b))
	}
	return fmt.Sprintf("0x%x", b)
}

// value prints data as the load's fields, split at their (padded, in a concatenation) lengths.
func value(l *load, data []byte) string {
	if bits, ok := prefixBits(l); ok {
		a, _ := netip.AddrFromSlice(data)
		return netip.PrefixFrom(a, bits).String()
	}
	if l.mask != nil || l.xor != nil {
		return hexValue(l, data)
	}
	parts, ok := splitFields(l.fields, data, len(l.fields) > 1 && l.len > sumLen(l.fields))
	if !ok {
		return fmt.Sprintf("0x%x <%d bytes for %d>", data, len(data), l.len)
	}
	return strings.Join(parts, " . ")
}

func sumLen(fs []field) uint32 {
	var n uint32
	for _, f := range fs {
		n += f.len
	}
	return n
}

// splitFields prints data field by field; padded: each field takes a multiple of 4 bytes (a
// concatenation in registers).
func splitFields(fs []field, data []byte, padded bool) ([]string, bool) {
	var out []string
	for _, f := range fs {
		n := f.len
		if padded {
			n = (f.len + 3) &^ 3
		}
		if uint32(len(data)) < f.len {
			return nil, false
		}
		out = append(out, formatField(f.kind, data[:f.len]))
		data = data[min(uint32(len(data)), n):]
	}
	return out, len(data) == 0
}

// formatField prints the bytes of one field of kind k.
func formatField(k kind, b []byte) string {
	switch k {
	case kindAddr:
		if a, ok := netip.AddrFromSlice(b); ok {
			return a.String()
		}
	case kindEther:
		if len(b) == 6 {
			return net.HardwareAddr(b).String()
		}
	case kindIfname:
		return fmt.Sprintf("%q", strings.TrimRight(string(b), "\x00"))
	case kindNFProto:
		if len(b) == 1 {
			switch b[0] {
			case unix.NFPROTO_IPV4:
				return "ipv4"
			case unix.NFPROTO_IPV6:
				return "ipv6"
			}
		}
	case kindL4Proto:
		if len(b) == 1 {
			if n := l4Name(b[0]); n != "" {
				return n
			}
			return fmt.Sprint(b[0])
		}
	case kindEtherType:
		if n := etherTypeName(b); n != "" {
			return n
		}
	case kindUint:
		var v uint64
		for _, x := range b {
			v = v<<8 | uint64(x)
		}
		return fmt.Sprint(v)
	case kindICMP, kindICMPv6:
		if len(b) == 1 {
			if n := icmpTypeName(k == kindICMPv6, b[0]); n != "" {
				return n
			}
			return fmt.Sprint(b[0])
		}
	case kindMark:
		if len(b) == 4 {
			return fmt.Sprintf("0x%08x", binary.NativeEndian.Uint32(b))
		}
	case kindCtState:
		if len(b) == 4 {
			return ctStateName(binary.NativeEndian.Uint32(b))
		}
	case kindCtStatus:
		if len(b) == 4 {
			return fmt.Sprintf("0x%08x", binary.NativeEndian.Uint32(b))
		}
	case kindCtDir:
		if len(b) == 1 && b[0] <= 1 {
			return []string{"original", "reply"}[b[0]]
		}
	case kindAddrType:
		if len(b) == 4 {
			if v := binary.NativeEndian.Uint32(b); v == unix.RTN_LOCAL {
				return "local"
			} else {
				return fmt.Sprintf("route type %d", v)
			}
		}
	case kindIfindex:
		if len(b) == 4 {
			return fmt.Sprint(binary.NativeEndian.Uint32(b))
		}
	}
	return fmt.Sprintf("0x%x", b)
}

func l4Name(p byte) string {
	return map[byte]string{unix.IPPROTO_ICMP: "icmp", unix.IPPROTO_TCP: "tcp", unix.IPPROTO_UDP: "udp",
		unix.IPPROTO_ICMPV6: "ipv6-icmp", unix.IPPROTO_SCTP: "sctp"}[p]
}

func etherTypeName(b []byte) string {
	if len(b) != 2 {
		return ""
	}
	return map[uint16]string{unix.ETH_P_IP: "ip", unix.ETH_P_IPV6: "ip6", unix.ETH_P_ARP: "arp",
		unix.ETH_P_8021Q: "8021q", unix.ETH_P_8021AD: "8021ad"}[binary.BigEndian.Uint16(b)]
}

func icmpTypeName(v6 bool, t byte) string {
	if v6 {
		return map[byte]string{1: "destination-unreachable", 2: "packet-too-big", 3: "time-exceeded", 4: "parameter-problem",
			128: "echo-request", 129: "echo-reply", 130: "mld-listener-query", 131: "mld-listener-report", 132: "mld-listener-done",
			133: "nd-router-solicit", 134: "nd-router-advert", 135: "nd-neighbor-solicit", 136: "nd-neighbor-advert",
			137: "nd-redirect", 138: "router-renumbering", 143: "mld2-listener-report"}[t]
	}
	return map[byte]string{0: "echo-reply", 3: "destination-unreachable", 4: "source-quench", 5: "redirect", 8: "echo-request",
		9: "router-advertisement", 10: "router-solicitation", 11: "time-exceeded", 12: "parameter-problem"}[t]
}

func ctStateName(v uint32) string {
	var names []string
	for _, s := range []struct {
		bit  uint32
		name string
	}{{expr.CtStateBitINVALID, "invalid"}, {expr.CtStateBitESTABLISHED, "established"}, {expr.CtStateBitRELATED, "related"},
		{expr.CtStateBitNEW, "new"}, {expr.CtStateBitUNTRACKED, "untracked"}} {
		if v&s.bit != 0 {
			names = append(names, s.name)
			v &^= s.bit
		}
	}
	if v != 0 || len(names) == 0 {
		names = append(names, fmt.Sprintf("0x%x", v))
	}
	return strings.Join(names, ",")
}

func orBytes(a, b []byte) []byte {
	out := slices.Clone(a)
	for i := range out {
		out[i] |= b[i]
	}
	return out
}

func andBytes(a, b []byte) []byte {
	out := slices.Clone(a)
	for i := range out {
		out[i] &= b[i]
	}
	return out
}

func allOnes(b []byte) bool { return !slices.ContainsFunc(b, func(x byte) bool { return x != 0xff }) }
func allZero(b []byte) bool { return !slices.ContainsFunc(b, func(x byte) bool { return x != 0 }) }

// renderSet renders a set's definition and elements, one element a line.
func renderSet(s Set) string {
	set := s.Set
	var b strings.Builder
	word := "set"
	if set.IsMap {
		word = "map"
	}
	fmt.Fprintf(&b, "\t%s %s {\n", word, set.Name)
	typ := set.KeyType.Name
	if set.IsMap {
		typ += " : " + set.DataType.Name
	}
	fmt.Fprintf(&b, "\t\ttype %s\n", typ)
	var flags []string
	for _, f := range []struct {
		on   bool
		name string
	}{{set.Constant, "constant"}, {set.Interval, "interval"}, {set.HasTimeout, "timeout"}, {set.Dynamic, "dynamic"}} {
		if f.on {
			flags = append(flags, f.name)
		}
	}
	if len(flags) > 0 {
		fmt.Fprintf(&b, "\t\tflags %s\n", strings.Join(flags, ","))
	}
	if set.Counter {
		b.WriteString("\t\tcounter\n")
	}
	if len(s.Elements) > 0 {
		b.WriteString("\t\telements = {\n")
		for _, e := range elementTexts(set, s.Elements) {
			fmt.Fprintf(&b, "\t\t\t%s,\n", e)
		}
		b.WriteString("\t\t}\n")
	}
	b.WriteString("\t}\n")
	return b.String()
}

// limitText renders a limit as nft prints it.
func limitText(e *expr.Limit) string {
	unit := map[expr.LimitTime]string{expr.LimitTimeSecond: "second", expr.LimitTimeMinute: "minute", expr.LimitTimeHour: "hour", expr.LimitTimeDay: "day", expr.LimitTimeWeek: "week"}[e.Unit]
	s := "limit rate "
	if e.Over {
		s += "over "
	}
	s += fmt.Sprintf("%d", e.Rate)
	if e.Type == expr.LimitTypePktBytes {
		s += " bytes"
	}
	s += "/" + unit
	if e.Burst != 0 {
		s += fmt.Sprintf(" burst %d packets", e.Burst)
	}
	return s
}

// logText renders a log statement as nft prints it (the attributes its Key names).
func logText(e *expr.Log) string {
	s := "log"
	has := func(attr int) bool { return e.Key&(1<<attr) != 0 }
	if has(unix.NFTA_LOG_PREFIX) {
		s += fmt.Sprintf(" prefix %q", string(e.Data))
	}
	if has(unix.NFTA_LOG_GROUP) {
		s += fmt.Sprintf(" group %d", e.Group)
	}
	if has(unix.NFTA_LOG_SNAPLEN) {
		s += fmt.Sprintf(" snaplen %d", e.Snaplen)
	}
	if has(unix.NFTA_LOG_QTHRESHOLD) {
		s += fmt.Sprintf(" queue-threshold %d", e.QThreshold)
	}
	if has(unix.NFTA_LOG_LEVEL) {
		s += fmt.Sprintf(" level %d", e.Level)
	}
	return s
}

// typeFields are the fields of a set's key or data type, one per concatenated type.
func typeFields(t nftables.SetDatatype) []field {
	var out []field
	for _, st := range nftables.ConcatSetTypeElements(t) {
		k := map[string]kind{"ipv4_addr": kindAddr, "ipv6_addr": kindAddr, "ether_addr": kindEther, "ifname": kindIfname,
			"inet_proto": kindL4Proto, "inet_service": kindUint, "iface_index": kindIfindex, "mark": kindMark}[st.Name]
		out = append(out, field{st.Name, st.Bytes, k})
	}
	return out
}

func elementTexts(set *nftables.Set, els []nftables.SetElement) []string {
	keys := typeFields(set.KeyType)
	concat := len(keys) > 1
	key := func(b []byte) []string {
		parts, ok := splitFields(keys, b, concat)
		if !ok {
			return []string{fmt.Sprintf("0x%x <not a %s>", b, set.KeyType.Name)}
		}
		return parts
	}
	var out []string
	for i := 0; i < len(els); i++ {
		e := els[i]
		var s string
		switch {
		case e.KeyEnd != nil: // a concatenation of ranges
			first, last := key(e.Key), key(e.KeyEnd)
			var parts []string
			for j := range first {
				if j < len(last) && last[j] != first[j] {
					parts = append(parts, rangeText(keys, j, first[j], last[j]))
				} else {
					parts = append(parts, first[j])
				}
			}
			s = strings.Join(parts, " . ")
		case set.Interval && !e.IntervalEnd: // start; the next element, if an end, closes it
			start, _ := netip.AddrFromSlice(e.Key)
			if i+1 < len(els) && els[i+1].IntervalEnd {
				end, _ := netip.AddrFromSlice(els[i+1].Key)
				s = addrRange(start, end.Prev())
				i++
			} else {
				s = addrRange(start, lastAddr(start))
			}
		case e.IntervalEnd:
			s = "<interval end without start> " + strings.Join(key(e.Key), " . ")
		default:
			s = strings.Join(key(e.Key), " . ")
		}
		if set.IsMap {
			switch {
			case e.VerdictData != nil:
				s += " : " + newRenderer(set.Table.Family, nil, protoContext{}).rule([]expr.Any{e.VerdictData})
			default:
				parts, ok := splitFields(typeFields(set.DataType), e.Val, len(typeFields(set.DataType)) > 1)
				if !ok {
					parts = []string{fmt.Sprintf("0x%x", e.Val)}
				}
				s += " : " + strings.Join(parts, " . ")
			}
		}
		if e.Timeout != 0 {
			s += fmt.Sprintf(" timeout %s", e.Timeout)
		}
		if e.Comment != "" {
			s += fmt.Sprintf(" comment %q", e.Comment)
		}
		out = append(out, s)
	}
	return out
}

// rangeText prints a range of one field of a concatenation: an address range that is a prefix
// as the prefix.
func rangeText(keys []field, j int, first, last string) string {
	if j < len(keys) && keys[j].kind == kindAddr {
		a, errA := netip.ParseAddr(first)
		z, errZ := netip.ParseAddr(last)
		if errA == nil && errZ == nil {
			return addrRange(a, z)
		}
	}
	return first + "-" + last
}

// addrRange prints first-last, or the prefix they span exactly.
func addrRange(first, last netip.Addr) string {
	for bits := 0; bits <= first.BitLen(); bits++ {
		p := netip.PrefixFrom(first, bits)
		if p.Masked().Addr() != first || ipnet.Last(p) != last {
			continue
		}
		if bits == first.BitLen() {
			return first.String()
		}
		return p.String()
	}
	return first.String() + "-" + last.String()
}

func lastAddr(a netip.Addr) netip.Addr { return ipnet.Last(netip.PrefixFrom(a, 0)) }
