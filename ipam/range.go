package ipam

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/kubenet-dev/kubenet/internal/ipnet"
)

// Range is one pool of addresses inside one subnet.
type Range struct {
	Subnet  netip.Prefix // masked network (host bits must be zero)
	Gateway netip.Addr   // never handed out; default = first host address (network+1)
	Start   netip.Addr   // inclusive; default network+1
	End     netip.Addr   // inclusive; default last address, for IPv4 minus the broadcast address
}

// NewRange returns the range covering the whole of subnet, with the defaults filled in.
func NewRange(subnet netip.Prefix) (Range, error) {
	return Range{Subnet: subnet}.Normalize()
}

// Normalize validates r and fills its zero Gateway, Start and End with the defaults. It is
// idempotent, so callers may build a Range by hand and normalize it later.
func (r Range) Normalize() (Range, error) {
	if err := checkSubnet(r.Subnet); err != nil {
		return Range{}, err
	}
	if !r.Gateway.IsValid() {
		r.Gateway = r.Subnet.Addr().Next()
	}
	if !r.Start.IsValid() {
		r.Start = r.Subnet.Addr().Next()
	}
	if !r.End.IsValid() {
		r.End = r.defaultEnd()
	}
	for _, f := range []struct {
		name string
		addr netip.Addr
	}{{"gateway", r.Gateway}, {"range start", r.Start}, {"range end", r.End}} {
		if !r.Subnet.Contains(f.addr) {
			return Range{}, fmt.Errorf("%s %s is outside subnet %s", f.name, f.addr, r.Subnet)
		}
	}
	// The kernel would not route to a gateway on the network or broadcast address.
	if r.isNetworkOrBroadcast(r.Gateway) {
		return Range{}, fmt.Errorf("gateway %s is the network or broadcast address of subnet %s", r.Gateway, r.Subnet)
	}
	if r.Start.Compare(r.End) > 0 {
		return Range{}, fmt.Errorf("range start %s is after range end %s in subnet %s", r.Start, r.End, r.Subnet)
	}
	if r.Size() == 0 {
		return Range{}, fmt.Errorf("range %s-%s of subnet %s holds no address besides gateway, network and broadcast", r.Start, r.End, r.Subnet)
	}
	return r, nil
}

// checkSubnet rejects what host-local rejects, plus forms netip allows but a file name must not
// carry (IPv4-mapped IPv6 would name IPv4 reservations differently from host-local).
func checkSubnet(p netip.Prefix) error {
	switch {
	case !p.IsValid():
		return fmt.Errorf("subnet %q is not a valid prefix", p)
	case p.Addr().Is4In6():
		return fmt.Errorf("subnet %s is IPv4-mapped IPv6; write it as IPv4", p)
	case p != p.Masked():
		return fmt.Errorf("subnet %s has host bits set (network is %s)", p, p.Masked())
	case p.Addr().Is4() && p.Bits() > 30:
		return fmt.Errorf("subnet %s is too small: IPv4 needs /30 or larger", p)
	case p.Addr().Is6() && p.Bits() > 126:
		return fmt.Errorf("subnet %s is too small: IPv6 needs /126 or larger", p)
	}
	return nil
}

// defaultEnd is the last address of the subnet; IPv4 keeps its broadcast address out.
func (r Range) defaultEnd() netip.Addr {
	last := ipnet.Last(r.Subnet)
	if last.Is4() {
		return last.Prev()
	}
	return last
}

func (r Range) isNetworkOrBroadcast(a netip.Addr) bool {
	return a == r.Subnet.Addr() || (a.Is4() && a == ipnet.Last(r.Subnet))
}

// excluded reports whether a lies in the range but must never be handed out.
func (r Range) excluded(a netip.Addr) bool {
	return a == r.Gateway || r.isNetworkOrBroadcast(a)
}

// Contains reports whether a lies within Start..End (gateway, network and broadcast included).
func (r Range) Contains(a netip.Addr) bool {
	return r.Start.IsValid() && a.Zone() == "" && r.Start.Compare(a) <= 0 && a.Compare(r.End) <= 0
}

// Size is the number of addresses Allocate may hand out: Start..End without gateway, network and
// broadcast. It saturates at the largest uint64 (IPv6 ranges may be larger).
func (r Range) Size() uint64 {
	if !r.Start.IsValid() || !r.End.IsValid() || r.Start.Compare(r.End) > 0 {
		return 0
	}
	n := toUint128(r.End).sub(toUint128(r.Start)).addSmall(1)
	never := []netip.Addr{r.Gateway, r.Subnet.Addr()}
	if r.Subnet.Addr().Is4() {
		never = append(never, ipnet.Last(r.Subnet))
	}
	var skip uint64
	for i, a := range never {
		// A hand-built range may name the network address as gateway: count it once.
		if r.Contains(a) && !slices.Contains(never[:i], a) {
			skip++
		}
	}
	return n.sub(uint128{lo: skip}).saturate()
}

// String is the subnet, followed by the pool bounds when they are not the defaults.
func (r Range) String() string {
	if r.Start == r.Subnet.Addr().Next() && r.End == r.defaultEnd() {
		return r.Subnet.String()
	}
	return fmt.Sprintf("%s (%s-%s)", r.Subnet, r.Start, r.End)
}
