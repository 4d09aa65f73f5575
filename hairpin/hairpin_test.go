package hairpin

import (
	"net"
	"net/netip"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	cases := []struct {
		in      string
		want    Mode
		wantErr bool
	}{
		{"", HairpinVeth, false},
		{"hairpin-veth", HairpinVeth, false},
		{"promiscuous-bridge", PromiscuousBridge, false},
		{"none", None, false},
		{"Hairpin-Veth", "", true},
		{"promiscuous", "", true},
	}
	for _, tc := range cases {
		got, err := Parse(tc.in)
		if (err != nil) != tc.wantErr || got != tc.want {
			t.Errorf("Parse(%q) = %q, %v; want %q, error %v", tc.in, got, err, tc.want, tc.wantErr)
		}
		if err != nil && !strings.Contains(err.Error(), tc.in) {
			t.Errorf("Parse(%q) error %q does not name the value", tc.in, err)
		}
	}
	if !PromiscuousBridge.PortFlag() || !HairpinVeth.PortFlag() || None.PortFlag() {
		t.Error("port flag: want it in hairpin-veth and promiscuous-bridge, not in none")
	}
}

func TestPlanDedup(t *testing.T) {
	d := Dedup{
		Network: "n", Bridge: "cbr0", BridgeMAC: net.HardwareAddr{0x0a, 0x58, 10, 244, 1, 1},
		PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd00::/64")},
		Gateways: []netip.Addr{netip.MustParseAddr("10.244.1.1"), netip.MustParseAddr("fd00::1")},
	}
	rules := PlanDedup(d)
	if len(rules) != 4 {
		t.Fatalf("%d rules, want accept+drop per family", len(rules))
	}
	// The gateway's accept must come before its family's drop, or the host's own frames die.
	for i := 0; i < len(rules); i += 2 {
		if !strings.Contains(rules[i].Comment, "gateway") || !strings.Contains(rules[i+1].Comment, "dropped") {
			t.Errorf("rules %d,%d out of order: %q, %q", i, i+1, rules[i].Comment, rules[i+1].Comment)
		}
	}
}
