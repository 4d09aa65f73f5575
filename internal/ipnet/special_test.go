package ipnet

import (
	"net/netip"
	"testing"
)

// TestOverlappingSpecial: each special range is found from inside, from a wider prefix around
// it, and not from its unicast neighbours just outside.
func TestOverlappingSpecial(t *testing.T) {
	tests := []struct {
		pod  string
		want string // the special prefix, "" when none
	}{
		{"0.0.0.0/32", "0.0.0.0/8"},
		{"0.255.255.0/24", "0.0.0.0/8"},
		{"1.0.0.0/24", ""},
		{"127.1.0.0/24", "127.0.0.0/8"},
		{"126.255.255.0/24", ""},
		{"128.0.0.0/24", ""},
		{"169.254.169.254/32", "169.254.0.0/16"},
		{"169.253.0.0/16", ""},
		{"169.255.0.0/16", ""},
		{"224.0.0.0/24", "224.0.0.0/4"},
		{"239.255.255.0/24", "224.0.0.0/4"},
		{"223.255.255.0/24", ""},
		{"240.0.0.0/24", ""},                       // class E: Linux routes it
		{"255.255.255.0/24", "255.255.255.255/32"}, // holds the broadcast address
		{"255.255.254.0/24", ""},
		{"100.64.0.0/10", ""},
		{"10.244.0.0/16", ""},
		{"0.0.0.0/0", "0.0.0.0/8"},
		{"::/128", "::/96"},
		{"::1/128", "::/96"},
		{"::a00:1/128", "::/96"}, // IPv4-compatible
		{"::1:0:0/96", ""},
		{"::ffff:10.244.0.0/120", "::ffff:0:0/96"},
		{"::ffff:0:a00:0/120", "::ffff:0:0:0/96"},
		{"64:ff9b::a00:0/120", "64:ff9b::/96"},
		{"64:ff9b:0:0:0:1::/96", ""},
		{"64:ff9b:1:2::/64", "64:ff9b:1::/48"},
		{"64:ff9b:2::/48", ""},
		{"100::/64", "100::/64"},
		{"100:0:0:1::/64", ""},
		{"fe80::/64", "fe80::/10"},
		{"febf::/16", "fe80::/10"},
		{"fec0::/10", ""},
		{"ff02::/64", "ff00::/8"},
		{"fd00:10:244::/48", ""},
		{"2001:db8::/32", ""},
		{"::/0", "::/96"},
	}
	for _, tt := range tests {
		t.Run(tt.pod, func(t *testing.T) {
			got, ok := OverlappingSpecial(netip.MustParsePrefix(tt.pod))
			if tt.want == "" {
				if ok {
					t.Fatalf("OverlappingSpecial = %s (%s), want none", got.Prefix, got.What)
				}
				return
			}
			if !ok || got.Prefix != netip.MustParsePrefix(tt.want) || got.What == "" {
				t.Fatalf("OverlappingSpecial = %+v, %v, want %s", got, ok, tt.want)
			}
		})
	}
}

// TestSpecialHolding: an address is in the range that contains it, and one just outside in none.
func TestSpecialHolding(t *testing.T) {
	tests := []struct {
		addr string
		want string
	}{
		{"0.0.0.0", "0.0.0.0/8"},
		{"127.0.0.53", "127.0.0.0/8"},
		{"169.254.169.254", "169.254.0.0/16"},
		{"239.1.2.3", "224.0.0.0/4"},
		{"255.255.255.255", "255.255.255.255/32"},
		{"255.255.255.254", ""},
		{"192.168.1.2", ""},
		{"::", "::/96"},
		{"::1", "::/96"},
		{"::ffff:192.168.1.2", "::ffff:0:0/96"},
		{"64:ff9b::c0a8:102", "64:ff9b::/96"},
		{"fe80::1", "fe80::/10"},
		{"2001:db8::1", ""},
	}
	for _, tt := range tests {
		t.Run(tt.addr, func(t *testing.T) {
			got, ok := SpecialHolding(netip.MustParseAddr(tt.addr))
			if ok != (tt.want != "") || (ok && got.Prefix != netip.MustParsePrefix(tt.want)) {
				t.Fatalf("SpecialHolding = %s, %v, want %q", got.Prefix, ok, tt.want)
			}
		})
	}
}

// TestSpecialRangesIsACopy: a caller changing its slice changes no other caller's list.
func TestSpecialRangesIsACopy(t *testing.T) {
	first := SpecialRanges()
	if len(first) != 13 {
		t.Fatalf("SpecialRanges has %d entries, want 13", len(first))
	}
	first[0].Prefix = netip.MustParsePrefix("10.0.0.0/8")
	if again := SpecialRanges(); again[0].Prefix.String() != "0.0.0.0/8" {
		t.Fatalf("a caller's change reached the list: %s", again[0].Prefix)
	}
	if _, ok := OverlappingSpecial(netip.MustParsePrefix("10.1.0.0/16")); ok {
		t.Fatal("a caller's change reached OverlappingSpecial")
	}
}

// TestSpecialRangesAreCanonical: every entry is a network (no host bits) with a name, and only
// the link-local ones are pod destinations.
func TestSpecialRangesAreCanonical(t *testing.T) {
	for _, r := range SpecialRanges() {
		if !r.Prefix.IsValid() || r.Prefix.Masked() != r.Prefix || r.What == "" {
			t.Errorf("entry %+v is no named network", r)
		}
		if r.PodDestination != r.Prefix.Addr().IsLinkLocalUnicast() {
			t.Errorf("%s: PodDestination = %v, want it only for link-local", r.Prefix, r.PodDestination)
		}
	}
}
