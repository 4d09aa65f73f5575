package nettest

import (
	"net/netip"
	"testing"
)

// TestJoinPrefixes: the list Kubernetes flags take, comma-separated without spaces.
func TestJoinPrefixes(t *testing.T) {
	for _, tc := range []struct {
		ps   []string
		want string
	}{
		{nil, ""},
		{[]string{"10.96.0.0/12"}, "10.96.0.0/12"},
		{[]string{"10.244.0.0/16", "fd00:10:244::/56"}, "10.244.0.0/16,fd00:10:244::/56"},
	} {
		var ps []netip.Prefix
		for _, p := range tc.ps {
			ps = append(ps, netip.MustParsePrefix(p))
		}
		if got := JoinPrefixes(ps); got != tc.want {
			t.Errorf("JoinPrefixes(%v) = %q, want %q", tc.ps, got, tc.want)
		}
	}
}
