package netpol

import (
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/kubenet-dev/kubenet/internal/nft"
	"github.com/kubenet-dev/kubenet/internal/policyrules"
)

// Inspect reads the network's policy tables back from the kernel of the current network
// namespace. Missing tables read as policyrules.Installed{Tables: false}.
func Inspect(network string) (policyrules.Installed, error) {
	c, err := nftables.New()
	if err != nil {
		return policyrules.Installed{}, fmt.Errorf("policy rules: netlink: %w", err)
	}
	bt := BridgeTable(network)
	st, err := readState(c, bt, true, nil)
	if err != nil {
		return policyrules.Installed{}, err
	}
	return installedOf(bt, st), nil
}

// installedOf decodes what readState read (with verify: every group set's elements). Pure.
func installedOf(bt *nftables.Table, st state) policyrules.Installed {
	in := policyrules.Installed{Tables: st.bridgeExists, Ports: map[int]policyrules.InstalledPort{}, Groups: map[string]policyrules.InstalledGroup{}}
	if !st.bridgeExists {
		return in
	}
	in.Damage = fixedDamage(bt, st)
	for port, chain := range st.maps[MapEgress] {
		p := in.Ports[port]
		p.Egress = chain
		in.Ports[port] = p
	}
	for port, chain := range st.maps[MapIngress] {
		p := in.Ports[port]
		p.Ingress = chain
		in.Ports[port] = p
	}
	for _, set := range []string{SetSourcesIPv4, SetSourcesIPv6} {
		for _, e := range st.sources[set] {
			if port, a, ok := parseSourceKey(e.Key); ok {
				p := in.Ports[port]
				p.Sources = append(p.Sources, a)
				in.Ports[port] = p
			}
		}
	}
	for _, set := range []string{SetLocalPodsIPv4, SetLocalPodsIPv6} {
		in.LocalPods = append(in.LocalPods, intervalRanges(st.localPods[set], set == SetLocalPodsIPv6)...)
	}
	names := map[string]bool{}
	lookedUp := map[string]bool{}
	for name := range st.groupChains {
		names[name] = true
		lookedUp[st.groupStems[name]] = true
	}
	for _, s := range st.sets {
		if stem, ok := setStem(s); ok && !lookedUp[stem] {
			// Sets no chain looks up: shown under their stem, as a group without a chain.
			names[stem] = true
		}
	}
	for _, m := range st.maps {
		for _, chain := range m {
			if chain != ChainAllowEgress && chain != ChainAllowIngress {
				names[chain] = true
			}
		}
	}
	for name := range names {
		in.Groups[name] = decodeGroup(bt, name, st)
	}
	return in
}

// fixedDamage lists the fixed objects that differ from Apply's layout.
func fixedDamage(bt *nftables.Table, st state) []string {
	network := strings.TrimPrefix(bt.Name, TableName(""))
	var out []string
	if !st.inetOK {
		out = append(out, "table inet "+bt.Name+": its chains are missing or differ")
	}
	rules := BridgeRules(network, policyrules.DropLog{})
	for _, ch := range bridgeChains(bt) {
		have, want := st.bridgeRules[ch.Name], rules[ch.Name]
		if ch.Name == ChainDropEgress || ch.Name == ChainDropIngress || ch.Name == ChainAuditEgress || ch.Name == ChainAuditIngress {
			// With --policy-log, two rules between the count and the verdict (rate and log),
			// whose group and rate only the agent knows: they are read off the rules, and the
			// whole chain must then be as Apply writes it with them. Each of the two ends in
			// the chain's verdict, so a tool that changes it there (a drop turned into the
			// audit chain's grant, or the other way round) must show.
			want = BridgeRules(network, installedLog(have))[ch.Name]
		}
		if d := nft.Compare(ch, have, want); d != nil {
			out = append(out, "chain "+ch.Name+": "+d.Error())
		}
	}
	for _, s := range fixedSets(bt) {
		if !slices.Contains(st.sets, s.Name) {
			out = append(out, "set "+s.Name+" is missing")
		}
	}
	return out
}

// installedLog is the drop log a drop or audit chain's rules were written with: the group of
// its log rule, the rate and burst of its rate rule; zero without them. Pure.
func installedLog(rules []*nftables.Rule) policyrules.DropLog {
	var log policyrules.DropLog
	for _, r := range rules {
		for _, e := range r.Exprs {
			switch e := e.(type) {
			case *expr.Log:
				log.Group = e.Group
			case *expr.Limit:
				log.Rate, log.Burst = uint32(min(e.Rate, math.MaxUint32)), e.Burst
			}
		}
	}
	return log
}

// GroupFor is the group Apply makes of an allow list in a direction, enforced or audit (only
// staged policies isolate it): its name and its entries as the kernel will hold them; false when
// the list is over a limit on what one group may cost (Apply refuses it). Pure.
func GroupFor(ingress, audit bool, allow []policyrules.Entry) (string, []policyrules.Entry, bool) {
	if len(allow) > policyrules.MaxAllowEntries {
		return "", nil, false
	}
	g, ok := canonical(allow, maxGroupCost)
	if !ok || g.cost() > maxGroupCost {
		return "", nil, false
	}
	dir := egressDir
	if ingress {
		dir = ingressDir
	}
	if audit {
		dir += auditInfix
	}
	return g.name(dir), g.entries(), true
}

// GroupDirection tells whether name is a group's (a chain or set name prefix of one), and
// whether the group is an ingress one.
func GroupDirection(name string) (ingress, ok bool) {
	switch {
	case strings.HasPrefix(name, ingressDir+"-"):
		return true, true
	case strings.HasPrefix(name, egressDir+"-"):
		return false, true
	}
	return false, false
}

// decodeGroup decodes the sets group name's chain looks up (for a name that is no chain's, the
// sets of that stem) and checks the chain: its name must stand for the sets' content.
func decodeGroup(bt *nftables.Table, name string, st state) policyrules.InstalledGroup {
	ingress, _ := GroupDirection(name)
	g := policyrules.InstalledGroup{Name: name, Ingress: ingress}
	dir := egressDir
	if g.Ingress {
		dir = ingressDir
	}
	g.Audit = strings.HasPrefix(name, dir+auditInfix+"-")
	nameDir := dir
	if g.Audit {
		nameDir = dir + auditInfix
	}
	// The sets the chain's rules look up are what the kernel judges by; a set of its slot that
	// none looks up is no part of the group. A stem without a chain: the sets of the stem.
	stem, sets := name, []string{}
	for _, is6 := range []bool{false, true} {
		for _, set := range groupSetNames(name, is6) {
			if slices.Contains(st.sets, set) {
				sets = append(sets, set)
			}
		}
	}
	if st.groupChains[name] {
		stem, sets = st.groupStems[name], st.groupLookups[name]
		for _, is6 := range []bool{false, true} {
			for _, set := range groupSetNames(stem, is6) {
				if stem != "" && slices.Contains(st.sets, set) && !slices.Contains(sets, set) {
					g.Damage = append(g.Damage, "set "+set+" of its slot is looked up by none of its rules")
				}
			}
		}
	}
	// The group as the sets hold it, each element in the list of its set's kind: what the
	// kernel judges by. Its name is checked below, so an element added, missing or moved to a
	// set of another kind is damage.
	var canon group
	var ranges []policyrules.Entry
	for _, set := range sets {
		g.Sets = append(g.Sets, set)
		kind := setKindOf(set)
		if st.misshapen[set] {
			// Its elements may mean something else to the kernel (an interval set's open a
			// range): the group's list is not what the kernel judges by.
			g.Damage = append(g.Damage, "set "+set+" is not defined as its kind calls for (another tool recreated it)")
		}
		for _, el := range st.setElements[set] {
			e, err := decodeElement(el, strings.HasSuffix(set, "-ipv6"), kind)
			if err != nil {
				g.Damage = append(g.Damage, fmt.Sprintf("set %s: %v", set, err))
				continue
			}
			if kind == kindHosts || kind == kindPoints {
				canon.add(kind, e)
			} else {
				ranges = append(ranges, e)
			}
		}
	}
	// The intervals' elements in canonical's order (the kernel lists them in any), the
	// singles sorted: a single that canonical would have left out (inside a range) is damage,
	// as the name check below finds.
	canon.setRanges(ranges, math.MaxInt)
	canon.sortSingles()
	g.Entries = canon.entries()
	if !st.groupChains[name] {
		if _, ok := GroupDirection(name); ok {
			g.Damage = append(g.Damage, "its chain is missing")
		} else {
			g.Damage = append(g.Damage, "no chain looks its sets up")
		}
		return g
	}
	if canon.name(nameDir) != name {
		g.Damage = append(g.Damage, "its sets do not hold the allow list its name stands for (elements missing or added)")
	}
	if d := nft.Compare(&nftables.Chain{Table: bt, Name: name}, st.bridgeRules[name], groupRules(name, stem, dir, canon, g.Audit)); d != nil {
		g.Damage = append(g.Damage, "its rules are not the ones its sets call for: "+d.Error())
	}
	return g
}

// setKind is the kind of a group set, by its name's suffix.
type setKind int

const (
	kindAny    setKind = iota // peer . protocol 0-255, an interval
	kindPorts                 // peer . protocol . port, an interval
	kindHosts                 // one address
	kindPoints                // one address . protocol . port
)

func setKindOf(set string) setKind {
	switch {
	case strings.Contains(set, "-hosts-"):
		return kindHosts
	case strings.Contains(set, "-points-"):
		return kindPoints
	case strings.Contains(set, "-ports-"):
		return kindPorts
	}
	return kindAny
}

// add puts entry e, a host or a point, in its list.
func (g *group) add(kind setKind, e policyrules.Entry) {
	is6 := e.Peer.First.Is6()
	switch {
	case kind == kindHosts && is6:
		g.hosts6 = append(g.hosts6, e.Peer.First)
	case kind == kindHosts:
		g.hosts4 = append(g.hosts4, e.Peer.First)
	case is6:
		g.points6 = append(g.points6, box{e.Peer, *e.Ports})
	default:
		g.points4 = append(g.points4, box{e.Peer, *e.Ports})
	}
}

// decodeElement turns one element of a group set of kind back into an entry: an "any" element
// is peer . protocol 0-255, a "ports" element peer . protocol . port range (both intervals), a
// "hosts" element one address, a "points" element one address . protocol . port.
func decodeElement(el nftables.SetElement, is6 bool, kind setKind) (policyrules.Entry, error) {
	n := int(addrBytes(is6))
	switch kind {
	case kindHosts:
		a, ok := netip.AddrFromSlice(el.Key)
		if !ok || len(el.Key) != n || len(el.KeyEnd) != 0 {
			return policyrules.Entry{}, fmt.Errorf("an element of %d and %d bytes, want %d and none", len(el.Key), len(el.KeyEnd), n)
		}
		return policyrules.Entry{Peer: policyrules.Range{First: a, Last: a}}, nil
	case kindPoints:
		if len(el.Key) != n+8 || len(el.KeyEnd) != 0 {
			return policyrules.Entry{}, fmt.Errorf("an element of %d and %d bytes, want %d and none", len(el.Key), len(el.KeyEnd), n+8)
		}
		el.KeyEnd = el.Key // one address, one port: decoded as the range from it to itself
	}
	ports := kind == kindPorts || kind == kindPoints
	want := n + 4
	if ports {
		want += 4
	}
	if len(el.Key) != want || len(el.KeyEnd) != want {
		return policyrules.Entry{}, fmt.Errorf("an element of %d and %d bytes, want %d", len(el.Key), len(el.KeyEnd), want)
	}
	// The protocol and the port are padded to 32 bits, zero in a packet's key: a hash set
	// compares every byte, so an element with padding set matches no packet.
	for _, k := range [][]byte{el.Key, el.KeyEnd} {
		pad := k[n+1 : n+4]
		if ports {
			pad = slices.Concat(pad, k[n+6:])
		}
		if slices.ContainsFunc(pad, func(b byte) bool { return b != 0 }) {
			return policyrules.Entry{}, fmt.Errorf("an element with padding bytes set (%x): no packet matches it", k)
		}
	}
	first, _ := netip.AddrFromSlice(el.Key[:n])
	last, _ := netip.AddrFromSlice(el.KeyEnd[:n])
	e := policyrules.Entry{Peer: policyrules.Range{First: first, Last: last}}
	if !e.Peer.Valid() {
		return e, fmt.Errorf("an element with the address range %s", e.Peer)
	}
	protoFirst, protoLast := el.Key[n], el.KeyEnd[n]
	if !ports {
		if protoFirst != 0 || protoLast != 255 {
			return e, fmt.Errorf("element %s with protocols %d-%d, want every protocol", e.Peer, protoFirst, protoLast)
		}
		return e, nil
	}
	if protoFirst != protoLast {
		return e, fmt.Errorf("element %s with protocols %d-%d, want one", e.Peer, protoFirst, protoLast)
	}
	p := &policyrules.Ports{Protocol: protoFirst,
		First: uint16(el.Key[n+4])<<8 | uint16(el.Key[n+5]), Last: uint16(el.KeyEnd[n+4])<<8 | uint16(el.KeyEnd[n+5])}
	if p.First > p.Last {
		return e, fmt.Errorf("element %s with the ports %d-%d", e.Peer, p.First, p.Last)
	}
	e.Ports = p
	return e, nil
}

// entries lists the group's content as allow entries.
func (g group) entries() []policyrules.Entry {
	var out []policyrules.Entry
	for _, rs := range [][]policyrules.Range{g.any4, g.any6} {
		for _, r := range rs {
			out = append(out, policyrules.Entry{Peer: r})
		}
	}
	for _, hs := range [][]netip.Addr{g.hosts4, g.hosts6} {
		for _, a := range hs {
			out = append(out, policyrules.Entry{Peer: policyrules.Range{First: a, Last: a}})
		}
	}
	for _, bs := range [][]box{g.ports4, g.ports6, g.points4, g.points6} {
		for _, b := range bs {
			out = append(out, policyrules.Entry{Peer: b.addrs, Ports: &b.ports})
		}
	}
	return out
}

// intervalRanges decodes the elements of a plain interval set of addresses (start elements and
// IntervalEnd elements one past a range's last address, in any order).
func intervalRanges(els []nftables.SetElement, is6 bool) []policyrules.Range {
	type bound struct {
		at  netip.Addr
		end bool
	}
	var bs []bound
	for _, el := range els {
		if a, ok := netip.AddrFromSlice(el.Key); ok && a.Is6() == is6 {
			bs = append(bs, bound{a, el.IntervalEnd})
		}
	}
	slices.SortFunc(bs, func(a, b bound) int { return a.at.Compare(b.at) })
	var out []policyrules.Range
	var start netip.Addr // valid while a range is open
	for _, b := range bs {
		switch {
		case !b.end && !start.IsValid():
			start = b.at
		case b.end && start.IsValid() && b.at.Compare(start) > 0:
			out = append(out, policyrules.Range{First: start, Last: b.at.Prev()})
			start = netip.Addr{}
		}
	}
	if start.IsValid() {
		out = append(out, policyrules.Range{First: start, Last: maxAddr(is6)})
	}
	return out
}

// maxAddr is the last address of a family.
func maxAddr(is6 bool) netip.Addr {
	if is6 {
		return netip.AddrFrom16([16]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	}
	return netip.AddrFrom4([4]byte{0xff, 0xff, 0xff, 0xff})
}
