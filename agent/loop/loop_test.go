package loop

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"
)

const deadline = 5 * time.Second

// run starts l until the test ends and returns the wakes of its passes as they happen.
func run(t *testing.T, cfg Config, passes chan Wake) *Loop {
	t.Helper()
	pass := cfg.Pass
	cfg.Pass = func(ctx context.Context, w Wake) Outcome {
		out := Outcome{}
		if pass != nil {
			out = pass(ctx, w)
		}
		passes <- w
		return out
	}
	l := New(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); l.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return l
}

// next returns what the next pass sends on passes, or fails the test at the deadline.
func next[T any](t *testing.T, passes <-chan T) T {
	t.Helper()
	select {
	case w := <-passes:
		return w
	case <-time.After(deadline):
		t.Fatal("no pass")
		var zero T
		return zero
	}
}

func fired(w Wake) []string {
	return slices.Sorted(func(yield func(string) bool) {
		for k := range w.fired {
			if !yield(k) {
				return
			}
		}
	})
}

// TestTriggersCoalesce: triggers fired while a pass runs make one pass after it, which sees each
// of them; nothing runs before the first trigger when there is no start pass.
func TestTriggersCoalesce(t *testing.T) {
	passes := make(chan Wake, 10)
	release := make(chan struct{})
	started := make(chan struct{}, 10)
	l := run(t, Config{Pass: func(ctx context.Context, w Wake) Outcome {
		started <- struct{}{}
		if w.Fired("first") {
			<-release
		}
		return Outcome{}
	}}, passes)
	l.Fire("first")
	select {
	case <-started:
	case <-time.After(deadline):
		t.Fatal("no pass for the first trigger")
	}
	for range 3 {
		l.Fire("a")
	}
	l.Fire("b")
	close(release)
	if w := next(t, passes); !slices.Equal(fired(w), []string{"first"}) || w.Start {
		t.Fatalf("first pass %+v, want only the trigger first", w)
	}
	if w := next(t, passes); !slices.Equal(fired(w), []string{"a", "b"}) || w.Periodic || w.Retry {
		t.Fatalf("second pass fired %v (%+v), want a and b in one pass", fired(w), w)
	}
	// Had the four fires made more than one pass, the next would not be c's alone.
	l.Fire("c")
	if w := next(t, passes); !slices.Equal(fired(w), []string{"c"}) || !w.OnlyFired("c") {
		t.Fatalf("third pass fired %v, want c only", fired(w))
	}
}

// TestStartAndPeriod: a start pass at once, then periodic passes without any trigger.
func TestStartAndPeriod(t *testing.T) {
	passes := make(chan Wake, 10)
	run(t, Config{AtStart: true, Period: 20 * time.Millisecond}, passes)
	if w := next(t, passes); !w.Start || w.Periodic {
		t.Fatalf("first pass %+v, want the start pass", w)
	}
	for range 2 {
		if w := next(t, passes); !w.Periodic || w.Start || len(w.fired) > 0 {
			t.Fatalf("pass %+v, want a periodic one", w)
		}
	}
}

// TestBackoff: failed passes are retried after a wait that doubles up to the maximum, and a
// pass that succeeds starts the next failure's wait from the minimum again.
func TestBackoff(t *testing.T) {
	passes := make(chan Wake, 1000)
	var mu sync.Mutex
	var waits []time.Duration
	var befores []int
	failing, successes := true, 0
	l := run(t, Config{
		AtStart:    true,
		BackoffMin: 5 * time.Millisecond, BackoffMax: 20 * time.Millisecond,
		Pass: func(context.Context, Wake) Outcome {
			mu.Lock()
			defer mu.Unlock()
			if failing {
				return Outcome{Err: errors.New("broken")}
			}
			successes++
			return Outcome{}
		},
		OnFailure: func(err error, before int, in time.Duration) {
			mu.Lock()
			defer mu.Unlock()
			waits, befores = append(waits, in), append(befores, before)
		},
	}, passes)
	var last time.Time
	for i := range 5 {
		w := next(t, passes)
		if i > 0 && (!w.Retry || w.Failures != i) {
			t.Fatalf("pass %d: %+v, want a retry after %d failures", i, w, i)
		}
		if i > 0 {
			mu.Lock()
			want := waits[i-1]
			mu.Unlock()
			if took := time.Since(last); took < want {
				t.Fatalf("retry %d after %s, before its backoff %s", i, took, want)
			}
		}
		last = time.Now()
	}
	mu.Lock()
	if got := waits[:4]; !slices.Equal(got, []time.Duration{5 * time.Millisecond, 10 * time.Millisecond, 20 * time.Millisecond, 20 * time.Millisecond}) {
		t.Errorf("backoffs %v, want 5ms 10ms 20ms 20ms", got)
	}
	if !slices.Equal(befores[:4], []int{0, 1, 2, 3}) {
		t.Errorf("failures before %v", befores[:4])
	}
	failing = false
	mu.Unlock()
	// The retry pending succeeds; a failure after it waits the minimum again.
	poll(t, func() bool { mu.Lock(); defer mu.Unlock(); return successes > 0 })
	mu.Lock()
	failing, waits = true, nil
	mu.Unlock()
	l.Fire("x")
	poll(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(waits) > 0 })
	mu.Lock()
	defer mu.Unlock()
	if waits[0] != 5*time.Millisecond {
		t.Fatalf("backoff after a success %v, want 5ms first", waits)
	}
}

// poll waits until cond holds, or fails the test at the deadline.
func poll(t *testing.T, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(deadline); !cond(); {
		if time.Now().After(end) {
			t.Fatal("condition not met by the deadline")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestAgainAndMinGap: a pass that asks for another gets it; passes that only triggers ask for
// keep the minimum gap from the previous one.
func TestAgainAndMinGap(t *testing.T) {
	passes := make(chan Wake, 10)
	asked := false
	l := run(t, Config{AtStart: true, MinGap: 50 * time.Millisecond, Pass: func(_ context.Context, w Wake) Outcome {
		if !asked {
			asked = true
			return Outcome{After: 10 * time.Millisecond}
		}
		return Outcome{}
	}}, passes)
	next(t, passes)
	if w := next(t, passes); !w.Again {
		t.Fatalf("second pass %+v, want the one asked for", w)
	}
	start := time.Now()
	l.Fire("event")
	w := next(t, passes)
	if !w.OnlyFired("event") {
		t.Fatalf("third pass %+v, want the event's", w)
	}
	if took := time.Since(start); took < 40*time.Millisecond {
		t.Fatalf("a triggered pass %s after the previous one, want the minimum gap of 50ms", took)
	}
}

// TestWantedDeclines: a wake the controller declines makes no pass.
func TestWantedDeclines(t *testing.T) {
	passes := make(chan Wake, 10)
	l := run(t, Config{Wanted: func(w Wake) bool { return !w.OnlyFired("noise") }}, passes)
	l.Fire("noise")
	l.Fire("noise")
	// Fired after the noise was declined, or together with it: either way the pass is for real.
	l.Fire("real")
	w := next(t, passes)
	if !w.Fired("real") {
		t.Fatalf("pass %+v, want the real trigger's", w)
	}
	select {
	case w := <-passes:
		t.Fatalf("a second pass %+v for declined noise", w)
	default:
	}
}

// TestStopsOnCancel: Run returns once ctx ends, after the pass that runs, and starts no other.
func TestStopsOnCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	inPass := make(chan struct{})
	passes := 0
	l := New(Config{Period: time.Millisecond, AtStart: true, Pass: func(ctx context.Context, w Wake) Outcome {
		passes++
		if passes == 1 {
			close(inPass)
			<-ctx.Done()
		}
		return Outcome{}
	}})
	done := make(chan struct{})
	go func() { defer close(done); l.Run(ctx) }()
	<-inPass
	cancel()
	l.Fire("late")
	select {
	case <-done:
	case <-time.After(deadline):
		t.Fatal("Run did not return after its context ended")
	}
	if passes != 1 {
		t.Fatalf("%d passes, want only the one that ran when ctx ended", passes)
	}
}

// storm fires trigger from a goroutine of its own until the test ends, as another tool fighting
// over the controller's state keeps making events.
func storm(t *testing.T, l *Loop, trigger string) {
	t.Helper()
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			l.Fire(trigger)
			time.Sleep(time.Millisecond) // an event a millisecond: a storm, without pinning a core
		}
	}()
	t.Cleanup(func() { close(stop); <-done })
}

// span is when a pass ran.
type span struct{ start, end time.Time }

// timedPass is a pass that works for took and sends when it ran on spans.
func timedPass(took time.Duration, spans chan<- span) func(context.Context, Wake) Outcome {
	return func(context.Context, Wake) Outcome {
		start := time.Now()
		time.Sleep(took) // the pass's work
		spans <- span{start, time.Now()}
		return Outcome{}
	}
}

// TestMinGapAfterLongPass: the minimum gap is time the loop leaves idle after a pass. A pass
// longer than the gap (a heal of a big node), woken all along by events (another tool flushing
// the ruleset in a loop), still waits the gap before the next triggered pass: it must not run
// back to back and keep a core busy for as long as the fight lasts.
func TestMinGapAfterLongPass(t *testing.T) {
	const gap, took = 50 * time.Millisecond, 80 * time.Millisecond
	spans := make(chan span, 100)
	l := run(t, Config{MinGap: gap, Pass: timedPass(took, spans)}, make(chan Wake, 100))
	storm(t, l, "event")
	prev := next(t, spans)
	for i := range 4 {
		s := next(t, spans)
		if idle := s.start.Sub(prev.end); idle < gap-5*time.Millisecond {
			t.Fatalf("pass %d started %s after the previous one ended, want at least the gap %s (a %s pass)", i+2, idle, gap, took)
		}
		prev = s
	}
}

// TestTriggerStorm: thousands of fires from many goroutines while passes run coalesce into few
// passes, triggered passes keep the minimum gap, the last fire still gets its pass, and Run
// leaves no goroutine behind.
func TestTriggerStorm(t *testing.T) {
	const gap = 20 * time.Millisecond
	before := runtime.NumGoroutine()
	var mu sync.Mutex
	var starts []time.Time
	ctx, cancel := context.WithCancel(context.Background())
	l := New(Config{MinGap: gap, Pass: func(_ context.Context, w Wake) Outcome {
		mu.Lock()
		starts = append(starts, time.Now())
		mu.Unlock()
		return Outcome{}
	}})
	done := make(chan struct{})
	go func() { defer close(done); l.Run(ctx) }()
	var firing sync.WaitGroup
	for g := range 8 {
		firing.Go(func() {
			for i := range 5000 {
				l.Fire([]string{"a", "b", "c"}[(g+i)%3])
			}
		})
	}
	firing.Wait()
	l.Fire("last")
	poll(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(starts) > 0 && time.Since(starts[len(starts)-1]) > 3*gap
	})
	mu.Lock()
	n := len(starts)
	for i := 1; i < n; i++ {
		if d := starts[i].Sub(starts[i-1]); d < gap {
			t.Errorf("passes %d and %d %s apart, want the gap %s", i, i+1, d, gap)
		}
	}
	mu.Unlock()
	if n > 200 {
		t.Errorf("%d passes for 40000 fires", n)
	}
	l.mu.Lock()
	if len(l.fired) != 0 {
		t.Errorf("triggers %v left without a pass", l.fired)
	}
	l.mu.Unlock()
	cancel()
	<-done
	poll(t, func() bool { return runtime.NumGoroutine() <= before })
}

// TestTriggerDuringFailedPass: a trigger fired while a pass fails is not lost in the backoff: the
// next pass sees it, and once a pass succeeds no retry follows.
func TestTriggerDuringFailedPass(t *testing.T) {
	passes := make(chan Wake, 10)
	var l *Loop
	fail := true
	ready := make(chan struct{})
	l = run(t, Config{AtStart: true, BackoffMin: time.Hour, BackoffMax: time.Hour, Pass: func(_ context.Context, w Wake) Outcome {
		if fail {
			fail = false
			<-ready
			l.Fire("during")
			return Outcome{Err: errors.New("refused")}
		}
		return Outcome{}
	}}, passes)
	close(ready)
	next(t, passes)
	if w := next(t, passes); !w.Fired("during") || w.Retry || w.Failures != 1 {
		t.Fatalf("pass after the failure %+v, want the trigger's, after 1 failure, before the hour's retry", w)
	}
	select {
	case w := <-passes:
		t.Fatalf("another pass %+v after the success", w)
	case <-time.After(50 * time.Millisecond): // a retry left armed would come now: the period is 0
	}
}

// TestStopsDuringGap: ctx ending while a triggered pass waits out the minimum gap ends Run at
// once, without that pass.
func TestStopsDuringGap(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	passes := make(chan Wake, 10)
	l := New(Config{AtStart: true, MinGap: time.Hour, Pass: func(_ context.Context, w Wake) Outcome { passes <- w; return Outcome{} }})
	done := make(chan struct{})
	go func() { defer close(done); l.Run(ctx) }()
	next(t, passes)
	l.Fire("x")
	cancel()
	select {
	case <-done:
	case <-time.After(deadline):
		t.Fatal("Run did not return while it waited out the gap")
	}
	if len(passes) > 0 {
		t.Fatalf("a pass %+v after the start pass, want none", <-passes)
	}
}

// TestBusyGap: while triggers keep coming during passes (pods churning), the loop leaves BusyGap
// times the last pass's duration idle before the next, and at least BusyFloor (passes far
// cheaper than the floor), so passes take at most a share of the time; a trigger that comes
// after a quiet pass (one change after another, each waiting for the last) gets its pass after
// MinGap alone.
func TestBusyGap(t *testing.T) {
	const busyGap = 3
	for _, tc := range []struct {
		name        string
		took, floor time.Duration
		churn       bool
		minIdle     time.Duration // the shortest idle time allowed between passes
		maxIdle     time.Duration // the longest (0: no bound)
		wantIdle    string
	}{
		{"changes keep coming", 60 * time.Millisecond, 0, true, busyGap*60*time.Millisecond - 5*time.Millisecond, 0, "at least BusyGap times the pass"},
		{"one change after another", 60 * time.Millisecond, 0, false, 0, 60 * time.Millisecond, "less than one pass (MinGap is 0)"},
		{"cheap passes, changes keep coming", 5 * time.Millisecond, 150 * time.Millisecond, true, 145 * time.Millisecond, 0, "at least the floor"},
		{"cheap passes, one change after another", 5 * time.Millisecond, 150 * time.Millisecond, false, 0, 75 * time.Millisecond, "well under the floor"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spans := make(chan span, 100)
			l := run(t, Config{BusyGap: busyGap, BusyFloor: tc.floor, Pass: timedPass(tc.took, spans)}, make(chan Wake, 100))
			if tc.churn {
				storm(t, l, "change")
			} else {
				l.Fire("change")
			}
			prev := next(t, spans)
			for i := range 3 {
				if !tc.churn {
					l.Fire("change") // the next change, once the last one's pass is done
				}
				s := next(t, spans)
				idle := s.start.Sub(prev.end)
				if idle < tc.minIdle || (tc.maxIdle > 0 && idle > tc.maxIdle) {
					t.Fatalf("pass %d started %s after the previous %s pass ended, want %s", i+2, idle, tc.took, tc.wantIdle)
				}
				prev = s
			}
		})
	}
}

// TestUrgentSkipsBusyGap: in the middle of churn, whose passes leave BusyGap times their
// duration idle, an urgent trigger (a new pod held until its pass) starts the next pass at once
// (MinGap only); without it, the next pass waits the busy gap.
func TestUrgentSkipsBusyGap(t *testing.T) {
	const took, busyGap = 60 * time.Millisecond, 20 // a busy gap of 1.2 s
	for _, tc := range []struct {
		name     string
		urgent   []string
		wantIdle func(time.Duration) bool
		want     string
	}{
		{"urgent", []string{"record"}, func(d time.Duration) bool { return d < busyGap*took/4 }, "well under the busy gap"},
		{"not urgent", nil, func(d time.Duration) bool { return d >= busyGap*took-5*time.Millisecond }, "the busy gap"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spans := make(chan span, 100)
			l := run(t, Config{BusyGap: busyGap, Urgent: tc.urgent, Pass: timedPass(took, spans)}, make(chan Wake, 100))
			storm(t, l, "change")
			next(t, spans)
			prev := next(t, spans) // a pass during the storm: the next waits the busy gap
			l.Fire("record")
			s := next(t, spans)
			if idle := s.start.Sub(prev.end); !tc.wantIdle(idle) {
				t.Fatalf("the pass after the record started %s after the previous ended, want %s (%s)", idle, tc.want, busyGap*took)
			}
		})
	}
}

// TestPromptTriggerSkipsBusyGap: a trigger of Config.Prompt (the healer asking the policy
// controller to repair tables another tool flushed: the node forwards unfiltered until then)
// waits only MinGap after a busy pass, not BusyGap times the pass, and cuts short a busy gap
// that has begun; the others still wait it, and so does a prompt trigger after a busy pass that
// one ran for (another tool fighting over the tables must not keep the passes back to back).
func TestPromptTriggerSkipsBusyGap(t *testing.T) {
	const took, busyGap, minGap = 100 * time.Millisecond, 20, 10 * time.Millisecond // a busy gap of 2 s
	for _, tc := range []struct {
		name        string
		first, then string        // the triggers of the busy pass and of the next
		within      time.Duration // the next pass starts this soon after the busy one ended (0: no bound)
		atLeast     time.Duration // and not sooner
	}{
		{"prompt trigger after churn", "change", "repair", took, minGap},
		{"other trigger after churn", "change", "change", 0, busyGap * took},
		{"prompt trigger after a busy repair", "repair", "repair", 0, busyGap * took},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spans := make(chan span, 10)
			passes := 0
			var l *Loop
			l = run(t, Config{BusyGap: busyGap, MinGap: minGap, Prompt: []string{"repair"}, Pass: func(ctx context.Context, w Wake) Outcome {
				if passes++; passes == 1 {
					l.Fire("change") // changes kept coming during the first pass: a busy one
					l.Fire("change")
				}
				return timedPass(took, spans)(ctx, w)
			}}, make(chan Wake, 10))
			l.Fire(tc.first)
			busy := next(t, spans)
			time.Sleep(took / 2) // the busy gap has begun; no synchronisation rests on it
			l.Fire(tc.then)
			s := next(t, spans)
			idle := s.start.Sub(busy.end)
			if idle < tc.atLeast || (tc.within > 0 && idle > tc.within) {
				t.Errorf("a pass for %q %s after a busy %s pass for %q, want between %s and %s", tc.then, idle, took, tc.first, tc.atLeast, tc.within)
			}
		})
	}
}
