package overlay

import (
	"net/netip"
	"slices"
	"testing"
)

func TestIntervals(t *testing.T) {
	p := netip.MustParsePrefix
	cases := []struct {
		name string
		nets []netip.Prefix
		is6  bool
		want []string // "start" or "end:" and the key
	}{
		{"none", nil, false, nil},
		{"peers inside the cluster CIDR", []netip.Prefix{p("10.244.3.0/24"), p("10.244.0.0/16"), p("10.244.1.0/24"), p("fd00:10:244::/48")}, false,
			[]string{"10.244.0.0", "end:10.245.0.0"}},
		{"neighbours merge, a gap stays", []netip.Prefix{p("10.244.1.0/24"), p("10.244.0.0/24"), p("10.244.3.0/24")}, false,
			[]string{"10.244.0.0", "end:10.244.2.0", "10.244.3.0", "end:10.244.4.0"}},
		{"host bits, duplicates", []netip.Prefix{p("10.244.1.7/24"), p("10.244.1.0/24")}, false, []string{"10.244.1.0", "end:10.244.2.0"}},
		{"the last address has no end", []netip.Prefix{p("255.255.255.0/24")}, false, []string{"255.255.255.0"}},
		{"IPv6 alone", []netip.Prefix{p("10.244.0.0/16"), p("fd00:10:244:1::/64"), p("fd00:10:244:2::/64")}, true,
			[]string{"fd00:10:244:1::", "end:fd00:10:244:3::"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, e := range intervals(tc.nets, tc.is6) {
				a, _ := netip.AddrFromSlice(e.Key)
				if e.IntervalEnd {
					got = append(got, "end:"+a.String())
				} else {
					got = append(got, a.String())
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("intervals = %q, want %q", got, tc.want)
			}
		})
	}
}
