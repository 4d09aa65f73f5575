package masq

import (
	"net/netip"
	"strings"
	"testing"
)

func TestPlan(t *testing.T) {
	p4, p6 := netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd00:10:244:1::/64")
	n4, n6 := netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")
	extra4 := netip.MustParsePrefix("192.168.0.0/16")
	cases := []struct {
		name      string
		cfg       Config
		wantRules int
	}{
		{"ipv4 without non-masquerade CIDRs", Config{PodCIDRs: []netip.Prefix{p4}}, 3},
		{"ipv4 with one", Config{PodCIDRs: []netip.Prefix{p4}, NonMasqueradeCIDRs: []netip.Prefix{n4}}, 4},
		{"other family's CIDRs are ignored", Config{PodCIDRs: []netip.Prefix{p4}, NonMasqueradeCIDRs: []netip.Prefix{n4, n6, extra4}}, 5},
		{"dual stack", Config{PodCIDRs: []netip.Prefix{p4, p6}, NonMasqueradeCIDRs: []netip.Prefix{n4, n6}}, 8},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rules := Plan(tc.cfg)
			if len(rules) != tc.wantRules {
				t.Fatalf("%d rules, want %d", len(rules), tc.wantRules)
			}
			// Within a family the masquerade rule comes last, after every exemption.
			for i, r := range rules {
				last := i == len(rules)-1 || strings.Contains(rules[i+1].Comment, "own pod CIDR")
				if strings.Contains(r.Comment, "SNAT to the node") != last {
					t.Errorf("rule %d %q is out of order", i, r.Comment)
				}
			}
		})
	}
}
