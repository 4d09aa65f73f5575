package conntrack

import (
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"
)

func TestSelectorValidate(t *testing.T) {
	v4, v6 := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("fd00::1")
	tests := []struct {
		name string
		sel  Selector
		ok   bool
	}{
		{"source only", Selector{Src: v4}, true},
		{"destination, protocol and port", Selector{Dst: v6, Proto: unix.IPPROTO_UDP, DstPort: 53}, true},
		{"no address: it would flush every entry", Selector{Proto: unix.IPPROTO_UDP}, false},
		{"two families", Selector{Src: v4, Dst: v6}, false},
		{"a port without a protocol", Selector{Dst: v4, DstPort: 53}, false},
		{"a port of a protocol whose ports the kernel filter ignores", Selector{Dst: v4, Proto: unix.IPPROTO_SCTP, DstPort: 53}, false},
		{"both addresses and a protocol without ports: an exact tuple for an older kernel", Selector{Src: v4, Dst: v4, Proto: unix.IPPROTO_ESP}, false},
		{"both addresses, UDP and a port", Selector{Src: v4, Dst: v4, Proto: unix.IPPROTO_UDP, DstPort: 53}, true},
		{"both addresses", Selector{Src: v4, Dst: v4}, true},
	}
	for _, tt := range tests {
		err := tt.sel.validate()
		if (err == nil) != tt.ok {
			t.Errorf("%s: validate(%v) = %v, want ok=%v", tt.name, tt.sel, err, tt.ok)
		}
		if !tt.ok {
			if err := deleteSelected([]Selector{tt.sel}, func(Selector) error {
				t.Fatalf("%s: an invalid selector reached the kernel", tt.name)
				return nil
			}); err == nil {
				t.Errorf("%s: DeleteSelected took an invalid selector", tt.name)
			}
		}
	}
}
