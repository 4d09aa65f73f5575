package shaping

import (
	"strconv"
	"testing"
)

// FuzzParseRate: any string either parses to a rate within [MinRate, MaxRate] or fails; a
// plain decimal number of bits parses to itself.
func FuzzParseRate(f *testing.F) {
	for _, seed := range []string{"10M", "1.5G", "100Mi", "1e6", ".5M", "1k", "1P", "1E", "10Q", "-1M", "999", "0x10", "1e1001", " 1M"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := ParseRate(s)
		if err != nil {
			return
		}
		if v < MinRate || v > MaxRate {
			t.Fatalf("ParseRate(%q) = %d, outside [%d, %d]", s, v, uint64(MinRate), uint64(MaxRate))
		}
		if n, perr := strconv.ParseUint(s, 10, 64); perr == nil && n != v {
			t.Fatalf("ParseRate(%q) = %d, want %d", s, v, n)
		}
	})
}
