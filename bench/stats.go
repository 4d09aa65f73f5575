package bench

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// samples are the wall times of one operation of one workload, for one chain.
type samples []time.Duration

// percentile is the nearest-rank percentile q (0 < q <= 1): the smallest sample that at least
// q of all samples do not exceed. With 100 samples p99 is the second largest.
func (s samples) percentile(q float64) time.Duration {
	if len(s) == 0 {
		return 0
	}
	sorted := slices.Clone(s)
	slices.Sort(sorted)
	rank := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(rank, 0)]
}

func (s samples) p50() time.Duration { return s.percentile(0.50) }
func (s samples) p99() time.Duration { return s.percentile(0.99) }

// ms formats d in milliseconds with a precision that suits its size.
func ms(d time.Duration) string {
	v := float64(d) / float64(time.Millisecond)
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f ms", v)
	case v >= 10:
		return fmt.Sprintf("%.1f ms", v)
	default:
		return fmt.Sprintf("%.2f ms", v)
	}
}

// ratio is a/b, formatted.
func ratio(a, b time.Duration) string {
	if b == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f", float64(a)/float64(b))
}

func mib(bytes int64) string {
	if bytes == 0 {
		return "–"
	}
	return fmt.Sprintf("%.1f MiB", float64(bytes)/(1<<20))
}
