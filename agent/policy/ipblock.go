package policy

import (
	"net"
	"net/netip"
	"slices"

	networkingv1 "k8s.io/api/networking/v1"
	netutils "k8s.io/utils/net"

	"github.com/kubenet-dev/kubenet/internal/policyrules"
)

// mappedIPv4 are the IPv4-mapped IPv6 addresses. Kubernetes parses addresses into Go's net.IP,
// where ::ffff:a.b.c.d IS the IPv4 address a.b.c.d: net.IPNet.Contains (the API server's own
// except-inside-cidr check) never finds one of them in an IPv6 network, so no IPv6 ipBlock
// covers them.
var mappedIPv4 = policyrules.PrefixRange(netip.MustParsePrefix("::ffff:0:0/96"))

// blockCIDR is one value of ipBlock.cidr or ipBlock.except: the network the API server checks
// it as, and the range of addresses it means.
type blockCIDR struct {
	network *net.IPNet   // as k8s.io/utils/net.ParseCIDRSloppy (the API server's parser) returns it
	meaning netip.Prefix // IPv4 for IPv4 and IPv4-mapped values, masked
}

// parseBlockCIDR reads a value as the API server reads it: with ParseCIDRSloppy, the parser
// its validation uses while the StrictIPCIDRValidation gate is off (its default), which takes
// leading zeros in IPv4 octets and in the prefix length as decimal, IPv6 groups of more than
// four hex digits, IPv4-mapped IPv6 and bits set beyond the prefix. What the value means is
// what Go's net.IPNet makes of the result: the network with those bits cleared, and for an
// IPv4-mapped network (::ffff:a.b.c.d/n, n ≥ 96) the IPv4 network a.b.c.d/(n-96), since
// IPNet.Contains matches IPv4 addresses against the mask's last 32 bits. false for anything
// else: the caller fails closed.
func parseBlockCIDR(s string) (blockCIDR, bool) {
	_, network, err := netutils.ParseCIDRSloppy(s)
	if err != nil {
		return blockCIDR{}, false
	}
	ones, bits := network.Mask.Size()
	var addr netip.Addr
	if v4 := network.IP.To4(); v4 != nil {
		addr = netip.AddrFrom4([4]byte(v4))
		if bits == 8*net.IPv6len {
			ones -= 8 * (net.IPv6len - net.IPv4len)
		}
	} else if a, ok := netip.AddrFromSlice(network.IP); ok && a.Is6() {
		addr = a
	}
	if !addr.IsValid() || ones < 0 || (bits != 8*net.IPv4len && bits != 8*net.IPv6len) {
		return blockCIDR{}, false
	}
	p := netip.PrefixFrom(addr, ones)
	if !p.IsValid() {
		return blockCIDR{}, false
	}
	return blockCIDR{network: network, meaning: p.Masked()}, true
}

// strictlyInside is the API server's test of an except (v) against its cidr (ValidateIPBlock in
// pkg/apis/networking/validation): the cidr network contains the except's network address and
// has the shorter mask, lengths compared as written (so an IPv4 cidr takes an IPv4-mapped
// except, never the other way round).
func (v blockCIDR) strictlyInside(cidr blockCIDR) bool {
	cidrLen, _ := cidr.network.Mask.Size()
	exLen, _ := v.network.Mask.Size()
	return cidr.network.Contains(v.network.IP) && cidrLen < exLen
}

// ranges are the addresses the value means.
func (v blockCIDR) ranges() []policyrules.Range {
	rs := []policyrules.Range{policyrules.PrefixRange(v.meaning)}
	if v.meaning.Addr().Is6() {
		rs = subtract(rs, []policyrules.Range{mappedIPv4})
	}
	return rs
}

// blockRanges is an ipBlock's cidr minus its excepts, as ranges, meaning what the API server
// means by them (parseBlockCIDR). A block the API server would refuse allows nothing: a cidr or
// an except it cannot parse, or an except not strictly inside the cidr by its rules (of the
// other family, say). Such values reach the node only past the API server's validation (an etcd
// written around it, a stored object it would no longer take), and an except that is not
// understood must never leave its range allowed.
func blockRanges(b *networkingv1.IPBlock) []policyrules.Range {
	cidr, ok := parseBlockCIDR(b.CIDR)
	if !ok {
		return nil
	}
	cuts := make([]policyrules.Range, 0, len(b.Except))
	for _, e := range b.Except {
		ex, ok := parseBlockCIDR(e)
		if !ok || !ex.strictlyInside(cidr) {
			return nil
		}
		cuts = append(cuts, policyrules.PrefixRange(ex.meaning))
	}
	return subtract(cidr.ranges(), cuts)
}

// subtract removes every cut from rs (sorted, disjoint ranges) in one sweep over the cuts in
// order, so that the time grows as n log n in the number of cuts: a pass over the remaining
// ranges per cut grows as n², and the API takes a policy of tens of thousands of excepts (that
// way 10 000 took 21 s, 50 000 over ten minutes; this way 50 000 take well under a second).
// Cuts of the other family remove nothing: netip orders every IPv4 address before every IPv6
// one.
func subtract(rs, cuts []policyrules.Range) []policyrules.Range {
	cuts = slices.Clone(cuts)
	slices.SortFunc(cuts, func(a, b policyrules.Range) int { return a.First.Compare(b.First) })
	var out []policyrules.Range
	for _, r := range rs {
		next, covered := r.First, false // next: the first address of r no cut has removed yet
		for _, c := range cuts {
			if c.Last.Less(next) {
				continue
			}
			if r.Last.Less(c.First) {
				break
			}
			if next.Less(c.First) {
				out = append(out, policyrules.Range{First: next, Last: c.First.Prev()})
			}
			if !c.Last.Less(r.Last) {
				covered = true
				break
			}
			next = c.Last.Next()
		}
		if !covered {
			out = append(out, policyrules.Range{First: next, Last: r.Last})
		}
	}
	return out
}
