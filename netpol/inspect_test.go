package netpol

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/kubenet-dev/kubenet/internal/policyrules"
)

// TestIntervalRanges: the local-pods sets' elements, as Apply writes them and in the reverse
// order the kernel dumps an interval set, decode back into the ranges they stand for.
func TestIntervalRanges(t *testing.T) {
	cidrs := []netip.Prefix{netip.MustParsePrefix("10.3.0.0/24"), netip.MustParsePrefix("fd00:3::/64"), netip.MustParsePrefix("255.255.255.0/24")}
	node := []netip.Addr{netip.MustParseAddr("10.3.0.1"), netip.MustParseAddr("fd00:3::1")}
	r := func(a, b string) policyrules.Range {
		return policyrules.Range{First: netip.MustParseAddr(a), Last: netip.MustParseAddr(b)}
	}
	for _, c := range []struct {
		is6  bool
		want []policyrules.Range
	}{
		{false, []policyrules.Range{r("10.3.0.0", "10.3.0.0"), r("10.3.0.2", "10.3.0.255"), r("255.255.255.0", "255.255.255.255")}},
		{true, []policyrules.Range{r("fd00:3::", "fd00:3::"), r("fd00:3::2", "fd00:3::ffff:ffff:ffff:ffff")}},
	} {
		els := localPodsElements(cidrs, node, c.is6)
		slices.Reverse(els)
		if got := intervalRanges(els, c.is6); !slices.Equal(got, c.want) {
			t.Errorf("IPv6 %v: %v, want %v", c.is6, got, c.want)
		}
	}
}
