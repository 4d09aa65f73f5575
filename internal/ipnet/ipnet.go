// Package ipnet converts between net/netip prefixes and the net.IPNet that netlink speaks, and
// holds the little prefix arithmetic the mechanisms share.
package ipnet

import (
	"net"
	"net/netip"
)

// FromPrefix converts p to a net.IPNet, keeping the host bits of the address.
func FromPrefix(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// ToPrefix converts n back to a netip.Prefix (IPv4 unmapped); false for nil or a bad address.
func ToPrefix(n *net.IPNet) (netip.Prefix, bool) {
	if n == nil {
		return netip.Prefix{}, false
	}
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(a.Unmap(), ones), true
}

// Last returns the highest address of p (all host bits set).
func Last(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}
