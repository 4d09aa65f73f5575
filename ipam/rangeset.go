package ipam

import (
	"fmt"
	"net/netip"
	"strings"
)

// RangeSet is the pool of one allocation: one address is allocated per set, and the ranges of a set
// are tried in order. kubenet uses one Range per pod CIDR, so one set per family.
type RangeSet []Range

// String joins the ranges, for error messages such as "no IP addresses available in range set …".
func (s RangeSet) String() string {
	parts := make([]string, len(s))
	for i, r := range s {
		parts[i] = r.String()
	}
	return strings.Join(parts, ", ")
}

// normalize returns a copy with every range normalized, and rejects sets whose ranges mix families
// or overlap: an address in two ranges would be visited twice per cycle and its range ambiguous.
func (s RangeSet) normalize() (RangeSet, error) {
	if len(s) == 0 {
		return nil, fmt.Errorf("empty range set")
	}
	out := make(RangeSet, len(s))
	for i, r := range s {
		n, err := r.Normalize()
		if err != nil {
			return nil, fmt.Errorf("range set %s: %w", s, err)
		}
		for _, prev := range out[:i] {
			if prev.Subnet.Addr().Is4() != n.Subnet.Addr().Is4() {
				return nil, fmt.Errorf("range set %s mixes IPv4 and IPv6", s)
			}
			if prev.Start.Compare(n.End) <= 0 && n.Start.Compare(prev.End) <= 0 {
				return nil, fmt.Errorf("range set %s: ranges %s and %s overlap", s, prev, n)
			}
		}
		out[i] = n
	}
	return out, nil
}

// indexOf returns the index of the range holding a, or -1.
func (s RangeSet) indexOf(a netip.Addr) int {
	for i, r := range s {
		if r.Contains(a) {
			return i
		}
	}
	return -1
}

// position is one step of the round-robin walk over a set: an address and the range it is in.
type position struct {
	i    int
	addr netip.Addr
}

// next steps to the following address, moving to the next range (and from the last back to the
// first) at the end of a range.
func (s RangeSet) next(p position) position {
	if p.addr == s[p.i].End {
		i := (p.i + 1) % len(s)
		return position{i, s[i].Start}
	}
	return position{p.i, p.addr.Next()}
}

// after is where the round-robin walk starts: just after the cursor if it is still inside the set
// (host-local's rule), else at the start of the first range.
func (s RangeSet) after(cursor netip.Addr) position {
	if i := s.indexOf(cursor); i >= 0 {
		return s.next(position{i, cursor})
	}
	return position{0, s[0].Start}
}
