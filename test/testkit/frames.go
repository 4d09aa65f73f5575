package testkit

import (
	"encoding/binary"
	"net"
	"net/netip"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
)

// Frames a hostile pod writes on its interface. A pod with CAP_NET_RAW (containerd grants it by
// default) can put any bytes on its veth; these builders spell out the ones the hostile-pod tests
// send, with correct checksums so that a receiver that gets them acts on them.

// Ether types.
const (
	EtherTypeIPv4 = 0x0800
	EtherTypeARP  = 0x0806
	EtherTypeIPv6 = 0x86dd
	EtherTypeVLAN = 0x8100
)

// Broadcast is the Ethernet broadcast address.
var Broadcast = net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// Ethernet frames payload with the given header.
func Ethernet(dst, src net.HardwareAddr, etherType uint16, payload []byte) []byte {
	b := make([]byte, 0, 14+len(payload))
	b = append(b, dst...)
	b = append(b, src...)
	b = binary.BigEndian.AppendUint16(b, etherType)
	return append(b, payload...)
}

// PriorityTagged puts an 802.1Q tag with VLAN ID 0 in front of frame's ether type: receivers
// without VLANs treat such a frame as untagged.
func PriorityTagged(frame []byte) []byte {
	out := append([]byte{}, frame[:12]...)
	out = binary.BigEndian.AppendUint16(out, EtherTypeVLAN)
	out = binary.BigEndian.AppendUint16(out, 0) // priority 0, VLAN 0
	return append(out, frame[12:]...)
}

// WithHopByHop puts an empty hop-by-hop options header (one PadN option) between an IPv6
// packet's header and its payload, which a receiver processes and skips: what follows (an
// ICMPv6 message, say) is handled as without it. The payload's checksum stays valid (the
// pseudo-header names the upper layer and its length, which do not change).
func WithHopByHop(packet []byte) []byte {
	out := append([]byte{}, packet[:40]...)
	binary.BigEndian.PutUint16(out[4:], binary.BigEndian.Uint16(packet[4:])+8)
	out[6] = 0 // next header: hop-by-hop options
	out = append(out, packet[6], 0, 1, 4, 0, 0, 0, 0)
	return append(out, packet[40:]...)
}

// IPFrame frames an IPv4 or IPv6 packet.
func IPFrame(dst, src net.HardwareAddr, packet []byte) []byte {
	if packet[0]>>4 == 6 {
		return Ethernet(dst, src, EtherTypeIPv6, packet)
	}
	return Ethernet(dst, src, EtherTypeIPv4, packet)
}

// IPPacket wraps payload (of IP protocol proto) in an IPv4 or IPv6 header from src to dst.
// hopLimit 0 means 64.
func IPPacket(src, dst netip.Addr, proto int, hopLimit int, payload []byte) []byte {
	if hopLimit == 0 {
		hopLimit = 64
	}
	if src.Is6() {
		h := make([]byte, 40)
		h[0] = 6 << 4
		binary.BigEndian.PutUint16(h[4:], uint16(len(payload)))
		h[6] = byte(proto)
		h[7] = byte(hopLimit)
		copy(h[8:24], src.AsSlice())
		copy(h[24:40], dst.AsSlice())
		return append(h, payload...)
	}
	h := make([]byte, 20)
	h[0] = 4<<4 | 5
	binary.BigEndian.PutUint16(h[2:], uint16(20+len(payload)))
	h[8] = byte(hopLimit)
	h[9] = byte(proto)
	copy(h[12:16], src.AsSlice())
	copy(h[16:20], dst.AsSlice())
	binary.BigEndian.PutUint16(h[10:], checksum(h, 0))
	return append(h, payload...)
}

// UDPPacket is an IP packet carrying one UDP datagram.
func UDPPacket(src, dst netip.Addr, srcPort, dstPort uint16, payload []byte) []byte {
	u := make([]byte, 8, 8+len(payload))
	binary.BigEndian.PutUint16(u[0:], srcPort)
	binary.BigEndian.PutUint16(u[2:], dstPort)
	binary.BigEndian.PutUint16(u[4:], uint16(8+len(payload)))
	u = append(u, payload...)
	sum := checksum(u, pseudoHeaderSum(src, dst, 17, len(u)))
	if sum == 0 {
		sum = 0xffff
	}
	binary.BigEndian.PutUint16(u[6:], sum)
	return IPPacket(src, dst, 17, 0, u)
}

// TCPPacket is an IP packet carrying one TCP segment with flags (TCPSyn, TCPAck, ...) and
// payload, sequence and acknowledgement numbers zero, no options.
func TCPPacket(src, dst netip.Addr, srcPort, dstPort uint16, flags byte, payload []byte) []byte {
	h := make([]byte, 20, 20+len(payload))
	binary.BigEndian.PutUint16(h[0:], srcPort)
	binary.BigEndian.PutUint16(h[2:], dstPort)
	h[12] = 5 << 4 // data offset: five 32-bit words
	h[13] = flags
	binary.BigEndian.PutUint16(h[14:], 65535) // window
	h = append(h, payload...)
	binary.BigEndian.PutUint16(h[16:], checksum(h, pseudoHeaderSum(src, dst, 6, len(h))))
	return IPPacket(src, dst, 6, 0, h)
}

// TCP flags, for TCPPacket.
const (
	TCPSyn = 0x02
	TCPPsh = 0x08
	TCPAck = 0x10
)

// ICMPPacket is an IP packet carrying one ICMP (IPv4) or ICMPv6 message of type typ with the
// message body (everything after the 4-byte ICMP header). ICMPv6 gets hop limit 255, which
// neighbour discovery requires.
func ICMPPacket(src, dst netip.Addr, typ, code int, body []byte) []byte {
	m := icmp.Message{Code: code, Body: &icmp.RawBody{Data: body}}
	var psh []byte
	if src.Is6() {
		m.Type = ipv6.ICMPType(typ)
		psh = icmp.IPv6PseudoHeader(src.AsSlice(), dst.AsSlice())
	} else {
		m.Type = ipv4.ICMPType(typ)
	}
	b, err := m.Marshal(psh)
	if err != nil {
		panic(err) // only for malformed bodies, which these builders never make
	}
	if src.Is6() {
		return IPPacket(src, dst, 58, 255, b)
	}
	return IPPacket(src, dst, 1, 0, b)
}

// ARPPacket is an Ethernet/IPv4 ARP message (op 1 request, 2 reply).
func ARPPacket(op uint16, sha net.HardwareAddr, spa netip.Addr, tha net.HardwareAddr, tpa netip.Addr) []byte {
	b := []byte{0, 1, 0x08, 0x00, 6, 4}
	b = binary.BigEndian.AppendUint16(b, op)
	b = append(b, sha...)
	b = append(b, spa.AsSlice()...)
	b = append(b, tha...)
	return append(b, tpa.AsSlice()...)
}

// ICMPv6 types of neighbour discovery and ICMP (IPv4) types the tests use.
const (
	ICMPv6RouterSolicitation    = 133
	ICMPv6RouterAdvertisement   = 134
	ICMPv6NeighborSolicitation  = 135
	ICMPv6NeighborAdvertisement = 136
	ICMPv6Redirect              = 137
	ICMPRedirect                = 5
	ICMPRouterAdvertisement     = 9
)

// ndOption is a neighbour discovery option: type, length in units of 8 bytes, data.
func ndOption(typ byte, data []byte) []byte {
	n := (2 + len(data) + 7) / 8
	b := make([]byte, n*8)
	b[0], b[1] = typ, byte(n)
	copy(b[2:], data)
	return b
}

// SourceLLA and TargetLLA are the link-layer address options of neighbour discovery.
func SourceLLA(mac net.HardwareAddr) []byte { return ndOption(1, mac) }
func TargetLLA(mac net.HardwareAddr) []byte { return ndOption(2, mac) }

// RouterAdvertisementBody announces a default router (lifetime 9000 s) with the router's MAC,
// and prefix as on-link and for address autoconfiguration.
func RouterAdvertisementBody(router net.HardwareAddr, prefix netip.Prefix) []byte {
	b := []byte{64, 0}                           // current hop limit, flags
	b = binary.BigEndian.AppendUint16(b, 9000)   // router lifetime
	b = append(b, make([]byte, 8)...)            // reachable time, retransmission timer
	b = append(b, SourceLLA(router)...)          //
	pi := []byte{byte(prefix.Bits()), 0xc0}      // prefix length, on-link + autonomous
	pi = binary.BigEndian.AppendUint32(pi, 9000) // valid lifetime
	pi = binary.BigEndian.AppendUint32(pi, 9000) // preferred lifetime
	pi = append(pi, 0, 0, 0, 0)                  // reserved
	pi = append(pi, prefix.Addr().AsSlice()...)
	return append(b, ndOption(3, pi)...)
}

// RouterSolicitationBody asks for routers, giving mac as the sender's.
func RouterSolicitationBody(mac net.HardwareAddr) []byte {
	return append(make([]byte, 4), SourceLLA(mac)...)
}

// NeighborAdvertisementBody claims target for mac, with the override flag (and solicited when
// asked): receivers replace the link-layer address of an existing entry for target.
func NeighborAdvertisementBody(target netip.Addr, mac net.HardwareAddr, solicited bool) []byte {
	flags := byte(0x20) // override
	if solicited {
		flags |= 0x40
	}
	b := []byte{flags, 0, 0, 0}
	b = append(b, target.AsSlice()...)
	return append(b, TargetLLA(mac)...)
}

// NeighborSolicitationBody asks for target; mac nil leaves out the source link-layer address (as
// duplicate address detection must).
func NeighborSolicitationBody(target netip.Addr, mac net.HardwareAddr) []byte {
	b := append(make([]byte, 4), target.AsSlice()...)
	if mac != nil {
		b = append(b, SourceLLA(mac)...)
	}
	return b
}

// RedirectV6Body tells the receiver that dest is better reached through target.
func RedirectV6Body(target, dest netip.Addr) []byte {
	b := append(make([]byte, 4), target.AsSlice()...)
	return append(b, dest.AsSlice()...)
}

// RedirectV4Body tells the receiver to send to the destination of the packet invoking quotes
// through gateway (code 1: host redirect). invoking is the start of the packet the receiver is
// supposed to have sent.
func RedirectV4Body(gateway netip.Addr, invoking []byte) []byte {
	b := append([]byte{}, gateway.AsSlice()...)
	if len(invoking) > 28 {
		invoking = invoking[:28]
	}
	return append(b, invoking...)
}

// MulticastMAC is the Ethernet address of IPv6 multicast group a.
func MulticastMAC(a netip.Addr) net.HardwareAddr {
	b := a.As16()
	return net.HardwareAddr{0x33, 0x33, b[12], b[13], b[14], b[15]}
}

// SolicitedNode is the solicited-node multicast group of a.
func SolicitedNode(a netip.Addr) netip.Addr {
	b := a.As16()
	g := [16]byte{0xff, 0x02, 10: 0, 11: 1, 12: 0xff}
	copy(g[13:], b[13:])
	return netip.AddrFrom16(g)
}

// LinkLocal is the EUI-64 link-local address the kernel gives an interface with MAC mac.
func LinkLocal(mac net.HardwareAddr) netip.Addr {
	var b [16]byte
	b[0], b[1] = 0xfe, 0x80
	b[8], b[9], b[10] = mac[0]^0x02, mac[1], mac[2]
	b[11], b[12] = 0xff, 0xfe
	b[13], b[14], b[15] = mac[3], mac[4], mac[5]
	return netip.AddrFrom16(b)
}

// pseudoHeaderSum is the partial checksum of the IPv4 or IPv6 pseudo header.
func pseudoHeaderSum(src, dst netip.Addr, proto, length int) uint32 {
	var p []byte
	p = append(p, src.AsSlice()...)
	p = append(p, dst.AsSlice()...)
	if src.Is6() {
		p = binary.BigEndian.AppendUint32(p, uint32(length))
		p = append(p, 0, 0, 0, byte(proto))
	} else {
		p = append(p, 0, byte(proto))
		p = binary.BigEndian.AppendUint16(p, uint16(length))
	}
	return sum16(p, 0)
}

func sum16(b []byte, s uint32) uint32 {
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	return s
}

// checksum is the Internet checksum of b on top of the partial sum s.
func checksum(b []byte, s uint32) uint16 {
	s = sum16(b, s)
	for s > 0xffff {
		s = s>>16 + s&0xffff
	}
	return ^uint16(s)
}
