package netpol

import (
	"encoding/binary"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"

	"github.com/kubenet-dev/kubenet/internal/policyrules"
)

// ipv4 builds an IPv4 header (no options) with proto, then l4.
func ipv4(src, dst string, proto uint8, fragOff uint16, l4 ...byte) []byte {
	h := make([]byte, 20)
	h[0] = 0x45
	binary.BigEndian.PutUint16(h[6:], fragOff)
	h[9] = proto
	copy(h[12:], netip.MustParseAddr(src).AsSlice())
	copy(h[16:], netip.MustParseAddr(dst).AsSlice())
	return append(h, l4...)
}

// ipv6 builds an IPv6 header with next, then the rest.
func ipv6(src, dst string, next uint8, rest ...byte) []byte {
	h := make([]byte, 40)
	h[0] = 0x60
	h[6] = next
	copy(h[8:], netip.MustParseAddr(src).AsSlice())
	copy(h[24:], netip.MustParseAddr(dst).AsSlice())
	return append(h, rest...)
}

// TestParsePacket: the addresses, protocol, ports or ICMP type of a logged packet, from IPv4 and
// IPv6 headers (extension headers skipped, later fragments without ports), and no answer for
// what is too short or no IP.
func TestParsePacket(t *testing.T) {
	ports := []byte{0x9c, 0x40, 0x00, 0x50} // 40000 → 80
	tests := []struct {
		name   string
		p      []byte
		ok     bool
		want   policyrules.Drop
		noPort bool
	}{
		{"IPv4 TCP", ipv4("10.0.0.1", "10.0.0.2", unix.IPPROTO_TCP, 0, ports...), true, policyrules.Drop{Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2"), Proto: 6, SrcPort: 40000, DstPort: 80, ICMPType: -1}, false},
		{"IPv4 later fragment", ipv4("10.0.0.1", "10.0.0.2", unix.IPPROTO_UDP, 0x0010, ports...), true, policyrules.Drop{Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2"), Proto: 17, ICMPType: -1}, true},
		{"IPv4 ICMP echo", ipv4("10.0.0.1", "10.0.0.2", unix.IPPROTO_ICMP, 0, 8, 0), true, policyrules.Drop{Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2"), Proto: 1, ICMPType: 8}, true},
		{"IPv6 UDP after a hop-by-hop header", ipv6("fd00::1", "fd00::2", unix.IPPROTO_HOPOPTS, append([]byte{unix.IPPROTO_UDP, 0, 0, 0, 0, 0, 0, 0}, ports...)...), true,
			policyrules.Drop{Src: netip.MustParseAddr("fd00::1"), Dst: netip.MustParseAddr("fd00::2"), Proto: 17, SrcPort: 40000, DstPort: 80, ICMPType: -1}, false},
		{"IPv6 first fragment", ipv6("fd00::1", "fd00::2", unix.IPPROTO_FRAGMENT, append([]byte{unix.IPPROTO_TCP, 0, 0, 1, 0, 0, 0, 1}, ports...)...), true,
			policyrules.Drop{Src: netip.MustParseAddr("fd00::1"), Dst: netip.MustParseAddr("fd00::2"), Proto: 6, SrcPort: 40000, DstPort: 80, ICMPType: -1}, false},
		{"IPv6 later fragment", ipv6("fd00::1", "fd00::2", unix.IPPROTO_FRAGMENT, append([]byte{unix.IPPROTO_TCP, 0, 0, 0x10, 0, 0, 0, 1}, ports...)...), true,
			policyrules.Drop{Src: netip.MustParseAddr("fd00::1"), Dst: netip.MustParseAddr("fd00::2"), Proto: 6, ICMPType: -1}, true},
		{"IPv6 ICMPv6", ipv6("fe80::1", "ff02::2", unix.IPPROTO_ICMPV6, 133, 0), true, policyrules.Drop{Src: netip.MustParseAddr("fe80::1"), Dst: netip.MustParseAddr("ff02::2"), Proto: 58, ICMPType: 133}, true},
		{"empty", nil, false, policyrules.Drop{}, true},
		{"IPv4 cut in its header", ipv4("10.0.0.1", "10.0.0.2", 6, 0)[:19], false, policyrules.Drop{}, true},
		{"IPv4 with a header length below 20", append([]byte{0x41}, make([]byte, 30)...), false, policyrules.Drop{}, true},
		{"IPv6 cut in its header", ipv6("fd00::1", "fd00::2", 17)[:39], false, policyrules.Drop{}, true},
		{"neither", []byte{0x00, 1, 2, 3}, false, policyrules.Drop{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var d policyrules.Drop
			ok := parsePacket(tt.p, &d)
			if ok != tt.ok {
				t.Fatalf("ok %v, want %v", ok, tt.ok)
			}
			if ok && d != tt.want {
				t.Errorf("got %+v, want %+v", d, tt.want)
			}
			// Every shorter snapshot of the packet is read without a panic, and never with
			// ports it does not hold.
			for n := range len(tt.p) {
				var short policyrules.Drop
				if parsePacket(tt.p[:n], &short) && short.DstPort != 0 && short.DstPort != tt.want.DstPort {
					t.Errorf("cut at %d: port %d", n, short.DstPort)
				}
			}
		})
	}
}

func TestLogPrefix(t *testing.T) {
	for _, tt := range []struct {
		network        string
		ingress, audit bool
	}{{"kubenet", true, false}, {"kubenet", false, false}, {"a b", true, false}, {"kubenet", true, true}, {"x audit", false, true}, {"x audit", false, false},
		{strings.Repeat("n", 105), true, true}, {strings.Repeat("n", 106), true, true}, {strings.Repeat("n", 128), false, false}, {strings.Repeat("n", 128), true, true}} {
		p := LogPrefix(tt.network, tt.ingress, tt.audit)
		n, in, audit, ok := ParseLogPrefix(p)
		if len(p) > maxLogPrefix {
			t.Errorf("LogPrefix(%q, %v, %v) has %d bytes, more than the kernel takes", tt.network, tt.ingress, tt.audit, len(p))
		}
		if !ok || n != LogNetwork(tt.network) || in != tt.ingress || audit != tt.audit {
			t.Errorf("ParseLogPrefix(LogPrefix(%q, %v, %v)) = %q, %v, %v, %v", tt.network, tt.ingress, tt.audit, n, in, audit, ok)
		}
	}
	for _, p := range []string{"", "kubenet ", "kubenet ingress", "other x egress", "kubenet x sideways", "kubenet audit", "kubenet ingress audit"} {
		if _, _, _, ok := ParseLogPrefix(p); ok {
			t.Errorf("ParseLogPrefix(%q) is ok, want not one of kubenet's", p)
		}
	}
}

// TestDropsDiff: a port that goes loses its counter, a new one gets one, a port whose pod is
// another gets a new one (its count starts again), an unchanged one is left alone.
func TestDropsDiff(t *testing.T) {
	have := []nftables.SetElement{dropsElement(1, "ns/a"), dropsElement(2, "ns/b"), dropsElement(3, "ns/c")}
	want := []nftables.SetElement{dropsElement(1, "ns/a"), dropsElement(2, "ns/b2"), dropsElement(4, "ns/d")}
	del, add := dropsDiff(have, want)
	port := func(els []nftables.SetElement) []uint32 {
		var out []uint32
		for _, e := range els {
			out = append(out, binary.NativeEndian.Uint32(e.Key))
		}
		return out
	}
	if d, a := port(del), port(add); len(d) != 2 || d[0] != 2 || d[1] != 3 || len(a) != 2 || a[0] != 2 || a[1] != 4 || add[0].Comment != "ns/b2" {
		t.Errorf("delete %v, add %v (%v), want delete 2 and 3, add 2 (ns/b2) and 4", d, a, add)
	}
	long := string(make([]byte, 300))
	if e := dropsElement(5, long); len(e.Comment) != maxDropsComment {
		t.Errorf("a 300-byte name: comment of %d bytes, want %d", len(e.Comment), maxDropsComment)
	}
}
