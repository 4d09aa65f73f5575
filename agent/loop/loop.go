// Package loop runs the agent's controllers: each is one pass function, run on one goroutine
// whenever something asks for it (a trigger), every period, again after a failure with a growing
// backoff, and when the last pass asked to be run again later. Triggers that fire while a pass
// runs, or while the loop waits out its minimum gap, are coalesced into the next pass, which
// learns every reason it runs for.
package loop

import (
	"context"
	"maps"
	"slices"
	"sync"
	"time"
)

// Config is one controller's loop.
type Config struct {
	// Pass does the controller's work; it runs on the goroutine that called Run (the network
	// namespace that goroutine is in is the one the pass works in).
	Pass func(ctx context.Context, w Wake) Outcome
	// AtStart runs a first pass as soon as Run starts.
	AtStart bool
	// Period, when not zero, runs a pass this often (Wake.Periodic).
	Period time.Duration
	// MinGap is the shortest time from the end of one pass to the start of the next that only
	// triggers ask for: a controller whose own writes are events must not spin on them, and one
	// whose passes take longer than MinGap (another tool fighting it) must not run back to back.
	MinGap time.Duration
	// BusyGap, when not zero, bounds the share of time passes take while triggers keep coming
	// faster than passes: after a pass during which triggers fired more than once, the next
	// pass that only triggers ask for waits BusyGap times that pass's duration (at least
	// MinGap). BusyGap 3 keeps such passes to a quarter of the time. A trigger that comes after
	// a quiet pass (at most one fire while it ran) waits only MinGap: a single change is not
	// delayed, changes that keep coming are batched into fewer passes.
	BusyGap float64
	// BusyFloor, when not zero, is the shortest wait after a busy pass (with BusyGap): passes
	// made cheap do not run more often than this under sustained triggers, so the time they take
	// falls with their cost (BusyGap alone keeps it at the same share of the time, however
	// cheap they get). A trigger after a quiet pass does not wait for it.
	BusyFloor time.Duration
	// Prompt are the triggers that wait only MinGap after a busy pass, and end a busy gap that
	// has begun: repairs of what somebody else changed, which must not wait for the churn. Not
	// after a busy pass that one of them ran for: another tool fighting over what the passes
	// repair must not keep them back to back.
	Prompt []string
	// Urgent are the triggers that never wait for BusyGap (MinGap only), also after a busy pass
	// that ran for them: what no other party can fire at will and a pass must not keep waiting
	// behind the batching of the others (a pod held until it has its rules).
	Urgent []string
	// BackoffMin and BackoffMax bound the wait before a failed pass is retried: it starts at
	// BackoffMin and doubles with every failure in a row. Zero BackoffMin: no retries (the next
	// trigger or period runs the next pass).
	BackoffMin, BackoffMax time.Duration
	// Wanted, when set, decides on the loop's goroutine whether a wake calls for a pass at all;
	// a declined one is dropped, and counts as no pass for MinGap.
	Wanted func(Wake) bool
	// OnFailure, when set, is told of every pass that failed with an error, the failures in a
	// row before it, and when it is retried.
	OnFailure func(err error, failuresBefore int, retryIn time.Duration)
}

// Wake is why a pass runs. Several reasons may hold at once.
type Wake struct {
	Start    bool // the first pass (Config.AtStart)
	Periodic bool // the period elapsed
	Retry    bool // the previous pass failed and its backoff elapsed
	Again    bool // the previous pass asked for another (Outcome.After)
	// Failures is how many passes in a row failed before this one.
	Failures int
	fired    map[string]bool
}

// Fired tells whether trigger fired since the previous pass.
func (w Wake) Fired(trigger string) bool { return w.fired[trigger] }

// OnlyFired tells whether trigger is the one reason for this pass.
func (w Wake) OnlyFired(trigger string) bool {
	return w.onlyTriggers() && len(w.fired) == 1 && w.fired[trigger]
}

// onlyTriggers tells whether nothing but triggers asked for this pass.
func (w Wake) onlyTriggers() bool { return !w.Start && !w.Periodic && !w.Retry && !w.Again }

// Outcome is what a pass tells its loop.
type Outcome struct {
	// Err: the pass failed; it is retried after the backoff (and reported to OnFailure).
	Err error
	// Retry: the pass did not get everything done, with nothing to report; retried like a
	// failure.
	Retry bool
	// After, for a pass that did not fail, asks for another pass this long from now (0: none),
	// in place of any earlier request; a failed pass leaves an earlier request as it was.
	After time.Duration
}

// Loop is one controller's loop. Make it with New, run it with Run, ask for passes with Fire.
type Loop struct {
	cfg  Config
	wake chan struct{} // 1-buffered: a pending wake-up

	mu    sync.Mutex
	fired map[string]bool // triggers fired since the last pass
	fires int             // Fire calls since the last take
}

// New returns a loop that is not running yet; Fire may be called before Run.
func New(cfg Config) *Loop {
	return &Loop{cfg: cfg, wake: make(chan struct{}, 1), fired: map[string]bool{}}
}

// Fire asks for a pass for trigger, without waiting. Fires before the pass starts collapse into
// it.
func (l *Loop) Fire(trigger string) {
	l.mu.Lock()
	l.fired[trigger] = true
	l.fires++
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// take returns the triggers fired since the last take, merged into into.
func (l *Loop) take(into map[string]bool) map[string]bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if into == nil {
		into = map[string]bool{}
	}
	maps.Copy(into, l.fired)
	clear(l.fired)
	l.fires = 0
	return into
}

// firesSinceTake is how many times Fire was called since the last take.
func (l *Loop) firesSinceTake() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.fires
}

// gapAfter is the shortest time before a pass that only triggers ask for, after a pass that
// took took and during which fires triggers fired (Config.BusyGap).
func (l *Loop) gapAfter(took time.Duration, fires int) time.Duration {
	if l.cfg.BusyGap <= 0 || fires < 2 {
		return l.cfg.MinGap
	}
	return max(l.cfg.MinGap, time.Duration(l.cfg.BusyGap*float64(took)), l.cfg.BusyFloor)
}

// Run runs passes until ctx ends; a running pass is not interrupted but by ctx itself.
func (l *Loop) Run(ctx context.Context) {
	var tick <-chan time.Time
	if l.cfg.Period > 0 {
		t := time.NewTicker(l.cfg.Period)
		defer t.Stop()
		tick = t.C
	}
	var retry, again <-chan time.Time
	var backoff time.Duration
	failures := 0
	var last time.Time // the end of the last pass
	minGap := l.cfg.MinGap
	lastPrompt := false // the last pass ran for a prompt trigger
	w := Wake{Start: l.cfg.AtStart}
	for ctx.Err() == nil {
		if !w.Start {
			select {
			case <-ctx.Done():
				return
			case <-tick:
				w.Periodic = true
			case <-l.wake:
			case <-retry:
				w.Retry, retry = true, nil
			case <-again:
				w.Again, again = true, nil
			}
		}
		w.fired = l.take(nil)
		if w.onlyTriggers() && len(w.fired) == 0 {
			w = Wake{} // a wake-up whose triggers an earlier pass already took
			continue
		}
		if l.cfg.Wanted != nil && !l.cfg.Wanted(w) {
			w = Wake{}
			continue
		}
		for w.onlyTriggers() && !last.IsZero() {
			gap := minGap
			if (!lastPrompt && slices.ContainsFunc(l.cfg.Prompt, w.Fired)) || slices.ContainsFunc(l.cfg.Urgent, w.Fired) {
				gap = l.cfg.MinGap
			}
			gap -= time.Since(last)
			if gap <= 0 {
				break
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(gap):
			case <-l.wake: // a prompt or urgent trigger may end the gap
			}
			w.fired = l.take(w.fired)
		}
		w.Failures = failures
		started := time.Now()
		out := l.cfg.Pass(ctx, w)
		last, lastPrompt = time.Now(), slices.ContainsFunc(l.cfg.Prompt, w.Fired)
		minGap = l.gapAfter(last.Sub(started), l.firesSinceTake())
		w = Wake{}
		if (out.Err != nil || out.Retry) && l.cfg.BackoffMin > 0 {
			backoff = min(max(2*backoff, l.cfg.BackoffMin), max(l.cfg.BackoffMax, l.cfg.BackoffMin))
			retry = time.After(backoff)
			if out.Err != nil && l.cfg.OnFailure != nil {
				l.cfg.OnFailure(out.Err, failures, backoff)
			}
			failures++
			continue
		}
		failures, backoff, retry = 0, 0, nil
		again = nil
		if out.After > 0 {
			again = time.After(out.After)
		}
	}
}
