package nettest

import (
	"testing"
	"time"
)

// AddRemoveLoop is the loop of a mechanism's add-and-remove benchmark: b.N times add then
// remove, each timed on its own, reported as the mean µs/add and µs/del. It resets b's timer
// first, so the caller's setup (the node's other pods) is not counted. It runs on the caller's
// goroutine, inside the namespace the caller entered.
func AddRemoveLoop(b *testing.B, add, remove func() error) error {
	var added, removed time.Duration
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		if err := add(); err != nil {
			return err
		}
		t1 := time.Now()
		if err := remove(); err != nil {
			return err
		}
		added += t1.Sub(t0)
		removed += time.Since(t1)
	}
	b.ReportMetric(float64(added.Microseconds())/float64(b.N), "µs/add")
	b.ReportMetric(float64(removed.Microseconds())/float64(b.N), "µs/del")
	return nil
}
