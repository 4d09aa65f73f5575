package bench

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// medianCI is a distribution-free confidence interval for the median of the population xs was
// drawn from: the order statistics x(k) and x(n+1-k) of the n sorted samples, with k the largest
// rank for which the interval still covers the median with probability at least conf (the
// number of samples below the median is binomial(n, 1/2)). It returns the interval and its exact
// coverage; ok is false when n is too small for any interval of that confidence (n < 6 for 95%).
func medianCI(xs []float64, conf float64) (lo, hi, coverage float64, ok bool) {
	n := len(xs)
	s := slices.Clone(xs)
	slices.Sort(s)
	// tail(j) = P(B <= j), B ~ binomial(n, 1/2); the interval [x(k), x(n+1-k)] misses the median
	// with probability 2*tail(k-1).
	tail := func(j int) float64 {
		p, c := 0.0, 1.0 // c = n choose i
		for i := 0; i <= j; i++ {
			p += c
			c = c * float64(n-i) / float64(i+1)
		}
		return p / math.Pow(2, float64(n))
	}
	k := 0
	for k+1 <= n/2 && 2*tail(k) <= 1-conf {
		k++
	}
	if k == 0 {
		return 0, 0, 0, false
	}
	return s[k-1], s[n-k], 1 - 2*tail(k-1), true
}

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
	if a == 0 || b == 0 {
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
