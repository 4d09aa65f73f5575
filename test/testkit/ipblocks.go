package testkit

import (
	"math/rand/v2"
	"net/netip"

	networkingv1 "k8s.io/api/networking/v1"
)

// IPBlockPeers returns n ipBlock peers as a big allow list would have them: prefixes of mixed
// sizes (mostly /16 to /30, a few down to /12; one in five IPv6, /32 to /128), one in ten with
// one to three exceptions inside it. The same n and seed give the same peers. None of them
// touches 10.0.0.0/8, 127.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16 or fd00::/8 (where tests put
// their pods).
func IPBlockPeers(n int, seed uint64) []networkingv1.NetworkPolicyPeer {
	rng := rand.New(rand.NewPCG(seed, uint64(n)))
	out := make([]networkingv1.NetworkPolicyPeer, 0, n)
	for i := range n {
		var p netip.Prefix
		if i%5 == 4 {
			var a [16]byte
			a[0], a[1] = 0x20, 0x01
			for j := 2; j < 16; j++ {
				a[j] = byte(rng.IntN(256))
			}
			p = netip.PrefixFrom(netip.AddrFrom16(a), 32+rng.IntN(97)).Masked()
		} else {
			bits := 16 + rng.IntN(15)
			if rng.IntN(20) == 0 {
				bits = 12 + rng.IntN(4)
			}
			first := byte(20 + rng.IntN(150)) // 20-169: not 10/8, 172.16/12 or 192.168/16
			if first == 127 {
				first = 128
			}
			p = netip.PrefixFrom(netip.AddrFrom4([4]byte{first, byte(rng.IntN(256)), byte(rng.IntN(256)), byte(rng.IntN(256))}), bits).Masked()
		}
		block := &networkingv1.IPBlock{CIDR: p.String()}
		if room := p.Addr().BitLen() - p.Bits(); i%10 == 3 && room >= 2 {
			for range 1 + rng.IntN(3) {
				block.Except = append(block.Except, subPrefix(rng, p, p.Bits()+1+rng.IntN(min(room, 8))).String())
			}
		}
		out = append(out, networkingv1.NetworkPolicyPeer{IPBlock: block})
	}
	return out
}

// subPrefix is a random prefix of length bits inside p.
func subPrefix(rng *rand.Rand, p netip.Prefix, bits int) netip.Prefix {
	a := p.Addr().AsSlice()
	for i := p.Bits(); i < bits; i++ {
		if rng.IntN(2) == 1 {
			a[i/8] |= 0x80 >> (i % 8)
		}
	}
	addr, _ := netip.AddrFromSlice(a)
	return netip.PrefixFrom(addr, bits)
}
