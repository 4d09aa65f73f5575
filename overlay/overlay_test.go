package overlay

import (
	"net/netip"
	"testing"
)

func TestMAC(t *testing.T) {
	tests := []struct {
		addr string
		want string // "" : only the general properties are checked
	}{
		{"192.168.77.11", "0e:4b:c0:a8:4d:0b"},
		{"10.0.0.1", "0e:4b:0a:00:00:01"},
		{"::ffff:10.0.0.1", "0e:4b:0a:00:00:01"}, // the mapped form is the same node
		{"fd00:77::11", ""},
		{"2001:db8::1", ""},
	}
	seen := map[string]string{}
	for _, tt := range tests {
		mac := MAC(netip.MustParseAddr(tt.addr))
		if tt.want != "" && mac.String() != tt.want {
			t.Errorf("MAC(%s) = %s, want %s", tt.addr, mac, tt.want)
		}
		// Locally administered (bit 1 set) and unicast (bit 0 clear): never a vendor's, never a
		// group address the device would flood.
		if len(mac) != 6 || mac[0]&0x02 == 0 || mac[0]&0x01 != 0 {
			t.Errorf("MAC(%s) = %s: not a locally administered unicast MAC", tt.addr, mac)
		}
		if other, ok := seen[mac.String()]; ok && netip.MustParseAddr(other).Unmap() != netip.MustParseAddr(tt.addr).Unmap() {
			t.Errorf("MAC(%s) = MAC(%s) = %s", tt.addr, other, mac)
		}
		seen[mac.String()] = tt.addr
		if again := MAC(netip.MustParseAddr(tt.addr)); again.String() != mac.String() {
			t.Errorf("MAC(%s) is not deterministic: %s then %s", tt.addr, mac, again)
		}
	}
}

func TestOverheadAndNextHop(t *testing.T) {
	if got := Overhead(netip.MustParseAddr("192.0.2.1")); got != 50 {
		t.Errorf("IPv4 underlay overhead %d, want 50", got)
	}
	if got := Overhead(netip.MustParseAddr("2001:db8::1")); got != 70 {
		t.Errorf("IPv6 underlay overhead %d, want 70", got)
	}
	if got := Overhead(netip.MustParseAddr("::ffff:192.0.2.1")); got != 50 {
		t.Errorf("IPv4-mapped underlay overhead %d, want 50 (it is IPv4 on the wire)", got)
	}
	for cidr, want := range map[string]string{"10.244.3.0/24": "10.244.3.0", "10.244.3.0/23": "10.244.2.0", "fd00:10:244:3::/64": "fd00:10:244:3::"} {
		if got := NextHop(netip.MustParsePrefix(cidr)); got.String() != want {
			t.Errorf("NextHop(%s) = %s, want %s", cidr, got, want)
		}
	}
}
