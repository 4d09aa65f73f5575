package ipam

import (
	"math"
	"math/bits"
	"net/netip"
)

// uint128 is just enough 128-bit arithmetic to count IPv6 addresses without overflow.
type uint128 struct{ hi, lo uint64 }

func toUint128(a netip.Addr) uint128 {
	if a.Is4() {
		b := a.As4()
		return uint128{lo: uint64(b[0])<<24 | uint64(b[1])<<16 | uint64(b[2])<<8 | uint64(b[3])}
	}
	b := a.As16()
	var u uint128
	for i := 0; i < 8; i++ {
		u.hi = u.hi<<8 | uint64(b[i])
		u.lo = u.lo<<8 | uint64(b[i+8])
	}
	return u
}

func (u uint128) sub(v uint128) uint128 {
	lo, borrow := bits.Sub64(u.lo, v.lo, 0)
	hi, _ := bits.Sub64(u.hi, v.hi, borrow)
	return uint128{hi, lo}
}

func (u uint128) addSmall(n uint64) uint128 {
	lo, carry := bits.Add64(u.lo, n, 0)
	return uint128{u.hi + carry, lo}
}

// saturate returns u as a uint64, or the largest uint64 if it does not fit.
func (u uint128) saturate() uint64 {
	if u.hi != 0 {
		return math.MaxUint64
	}
	return u.lo
}
