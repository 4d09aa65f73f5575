package ipam

import (
	"fmt"
	"math"
	"net/netip"
	"testing"
)

func TestNewRangeDefaults(t *testing.T) {
	tests := []struct {
		subnet              string
		gateway, start, end string
		size                uint64
	}{
		{"10.244.1.0/24", "10.244.1.1", "10.244.1.1", "10.244.1.254", 253},
		{"10.0.0.0/30", "10.0.0.1", "10.0.0.1", "10.0.0.2", 1},
		{"10.0.0.0/8", "10.0.0.1", "10.0.0.1", "10.255.255.254", 1<<24 - 3},
		{"fd00::/126", "fd00::1", "fd00::1", "fd00::3", 2},
		{"fd00:10:244:1::/120", "fd00:10:244:1::1", "fd00:10:244:1::1", "fd00:10:244:1::ff", 254},
		{"fd00:10:244:1::/64", "fd00:10:244:1::1", "fd00:10:244:1::1", "fd00:10:244:1:ffff:ffff:ffff:ffff", math.MaxUint64 - 1},
		{"fd00::/48", "fd00::1", "fd00::1", "fd00::ffff:ffff:ffff:ffff:ffff", math.MaxUint64}, // saturates
	}
	for _, tc := range tests {
		t.Run(tc.subnet, func(t *testing.T) {
			r, err := NewRange(netip.MustParsePrefix(tc.subnet))
			if err != nil {
				t.Fatal(err)
			}
			want := Range{netip.MustParsePrefix(tc.subnet), netip.MustParseAddr(tc.gateway),
				netip.MustParseAddr(tc.start), netip.MustParseAddr(tc.end)}
			if r != want {
				t.Errorf("NewRange = %+v, want %+v", r, want)
			}
			if got := r.Size(); got != tc.size {
				t.Errorf("Size = %d, want %d", got, tc.size)
			}
			if got := r.String(); got != tc.subnet {
				t.Errorf("String = %q, want %q", got, tc.subnet)
			}
			if again, err := r.Normalize(); err != nil || again != r {
				t.Errorf("Normalize not idempotent: %+v, %v", again, err)
			}
		})
	}
}

// TestNormalizeCustom covers hand-set gateway and bounds, including bounds that reach the network
// and broadcast addresses, which stay out of Size (and of allocation, see allocate_test.go).
func TestNormalizeCustom(t *testing.T) {
	tests := []struct {
		name                string
		gateway, start, end string
		size                uint64
		str                 string
	}{
		{"pool", "", "10.0.0.10", "10.0.0.20", 11, "10.0.0.0/24 (10.0.0.10-10.0.0.20)"},
		{"gateway inside pool", "10.0.0.15", "10.0.0.10", "10.0.0.20", 10, "10.0.0.0/24 (10.0.0.10-10.0.0.20)"},
		{"whole subnet", "", "10.0.0.0", "10.0.0.255", 253, "10.0.0.0/24 (10.0.0.0-10.0.0.255)"},
		{"last gateway", "10.0.0.254", "", "", 253, "10.0.0.0/24"},
		{"single address", "", "10.0.0.7", "10.0.0.7", 1, "10.0.0.0/24 (10.0.0.7-10.0.0.7)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n, err := handRange("10.0.0.0/24", tc.gateway, tc.start, tc.end).Normalize()
			if err != nil {
				t.Fatal(err)
			}
			if got := n.Size(); got != tc.size {
				t.Errorf("Size = %d, want %d", got, tc.size)
			}
			if got := n.String(); got != tc.str {
				t.Errorf("String = %q, want %q", got, tc.str)
			}
		})
	}
}

func TestNormalizeErrors(t *testing.T) {
	tests := []struct {
		name                        string
		subnet, gateway, start, end string
		want                        []string // every one must appear in the error
	}{
		{"host bits", "10.0.0.1/24", "", "", "", []string{"10.0.0.1/24", "host bits"}},
		{"host bits v6", "fd00::1/64", "", "", "", []string{"fd00::1/64", "host bits"}},
		{"v4 /31", "10.0.0.0/31", "", "", "", []string{"10.0.0.0/31", "too small"}},
		{"v4 /32", "10.0.0.0/32", "", "", "", []string{"10.0.0.0/32", "too small"}},
		{"v6 /127", "fd00::/127", "", "", "", []string{"fd00::/127", "too small"}},
		{"v6 /128", "fd00::/128", "", "", "", []string{"fd00::/128", "too small"}},
		{"no subnet", "", "", "", "", []string{"not a valid prefix"}},
		{"mapped", "::ffff:10.0.0.0/120", "", "", "", []string{"::ffff:10.0.0.0/120", "IPv4-mapped"}},
		{"gateway outside", "10.0.0.0/24", "10.0.1.1", "", "", []string{"gateway 10.0.1.1", "10.0.0.0/24"}},
		{"gateway other family", "10.0.0.0/24", "fd00::1", "", "", []string{"gateway fd00::1"}},
		{"gateway network", "10.0.0.0/24", "10.0.0.0", "", "", []string{"gateway 10.0.0.0"}},
		{"gateway broadcast", "10.0.0.0/24", "10.0.0.255", "", "", []string{"gateway 10.0.0.255"}},
		{"start outside", "10.0.0.0/24", "", "10.0.1.5", "", []string{"range start 10.0.1.5"}},
		{"end outside", "10.0.0.0/24", "", "", "11.0.0.1", []string{"range end 11.0.0.1"}},
		{"end outside v6", "fd00::/64", "", "", "fd01::1", []string{"range end fd01::1"}},
		{"start after end", "10.0.0.0/24", "", "10.0.0.20", "10.0.0.10", []string{"10.0.0.20", "10.0.0.10"}},
		{"only gateway", "10.0.0.0/24", "", "10.0.0.1", "10.0.0.1", []string{"10.0.0.1-10.0.0.1", "no address"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := handRange(tc.subnet, tc.gateway, tc.start, tc.end)
			_, err := r.Normalize()
			wantErrorMentions(t, fmt.Sprintf("Normalize(%+v)", r), err, tc.want...)
		})
	}
}

func TestContains(t *testing.T) {
	r, err := handRange("10.0.0.0/24", "", "10.0.0.10", "10.0.0.20").Normalize()
	if err != nil {
		t.Fatal(err)
	}
	r6 := rangeSet(t, "fd00::/64")[0]
	tests := []struct {
		r    Range
		addr string
		want bool
	}{
		{r, "10.0.0.10", true},
		{r, "10.0.0.20", true},
		{r, "10.0.0.15", true},
		{r, "10.0.0.9", false},
		{r, "10.0.0.21", false},
		{r, "::ffff:10.0.0.15", false},
		{r, "fd00::15", false},
		{r6, "fd00::1", true},
		{r6, "fd00::ffff:ffff:ffff:ffff", true},
		{r6, "fd00::", false},
		{r6, "fd00:0:0:1::", false},
		{r6, "fd00::5%eth0", false},
		{r6, "10.0.0.15", false},
		{Range{}, "10.0.0.1", false},
	}
	for _, tc := range tests {
		if got := tc.r.Contains(netip.MustParseAddr(tc.addr)); got != tc.want {
			t.Errorf("%s.Contains(%s) = %v, want %v", tc.r, tc.addr, got, tc.want)
		}
	}
}
