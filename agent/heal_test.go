package agent

import (
	"context"
	"testing"
	"time"
)

// TestSubscriptionClosedWhenItEnds: a subscription that ended on its own (its socket overflowed)
// is closed then, not when the healer stops: the healer subscribes again each time, and a
// burst of link changes from another tool must not pile up sockets for the agent's lifetime.
func TestSubscriptionClosedWhenItEnds(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	subs := &subscriptions{ctx: ctx}
	closed := make(chan struct{}, 2)
	ended := make(chan struct{}, 1)
	open := func() (func(context.Context) bool, func(), error) {
		return func(context.Context) bool { return true }, func() { closed <- struct{}{} }, nil
	}
	if err := subs.follow(open, func() { ended <- struct{}{} }); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the end of the subscription was not signalled")
	}
	select {
	case <-closed:
	default:
		t.Fatal("the subscription that ended is still open (closed only when the healer stops)")
	}
	subs.close()
	if len(closed) != 0 {
		t.Errorf("the subscription was closed %d more times when the healer stopped", len(closed))
	}
}
