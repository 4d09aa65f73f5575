package stale

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/kubenet-dev/kubenet/agent/cri"
	"github.com/kubenet-dev/kubenet/agent/cri/critest"
	"github.com/kubenet-dev/kubenet/core"
)

// attachment is one attachment on the fake node: its key and when its files were written.
type attachment struct {
	id, ifName string
	written    time.Time
}

// node plays the core's part the way core.Collect decides (that decision is tested against
// the kernel in test/TestCollectSparesYoung): it asks the keeper about every attachment and
// collects those neither in use nor written at or after the cutoff.
type node struct {
	attachments []attachment
	calls       int
	lastKeeper  core.Keeper
}

func (n *node) collect(_ context.Context, _ *core.Config, k core.Keeper) (core.GCReport, error) {
	n.calls++
	n.lastKeeper = k
	var r core.GCReport
	n.attachments = slices.DeleteFunc(n.attachments, func(a attachment) bool {
		if k.InUse(a.id, a.ifName) || !a.written.Before(k.WrittenBefore) {
			return false
		}
		r.Attachments = append(r.Attachments, core.Record{ContainerID: a.id, IfName: a.ifName})
		return true
	})
	return r, nil
}

func (n *node) has(id string) bool {
	return slices.ContainsFunc(n.attachments, func(a attachment) bool { return a.id == id })
}

// fakeRuntime lists ids, or fails with err.
type fakeRuntime struct {
	ids []string
	err error
}

func (f *fakeRuntime) Sandboxes(context.Context) ([]string, error) { return f.ids, f.err }

// clock is a fake monotonic clock.
type clock struct{ t time.Time }

func (c *clock) now() time.Time                { return c.t }
func (c *clock) advance(d time.Duration)       { c.t = c.t.Add(d) }
func newClock() *clock                         { return &clock{t: time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)} }
func (c *clock) ago(d time.Duration) time.Time { return c.t.Add(-d) }

const grace = time.Minute

func newCollector(t *testing.T, rt Runtime, n *node, c *clock) *Collector {
	t.Helper()
	col, err := New(rt, grace, n.collect)
	if err != nil {
		t.Fatal(err)
	}
	col.now = c.now
	return col
}

// TestPasses follows attachments through passes of the collector, each step one pass at a time
// on the fake clock, and checks which attachments are left after it.
func TestPasses(t *testing.T) {
	type step struct {
		name    string
		advance time.Duration
		listed  []string
		listErr error
		add     []attachment // written at the step's time unless set
		left    []string     // attachments after the pass (by container ID)
		wantErr bool
	}
	tests := []struct {
		name  string
		old   []string // attachments written an hour before the start
		steps []step
	}{
		{
			name: "listed sandboxes keep their attachments, whatever their age",
			old:  []string{"a", "b"},
			steps: []step{
				{name: "first pass", listed: []string{"a", "b"}, left: []string{"a", "b"}},
				{name: "an hour later", advance: time.Hour, listed: []string{"a", "b"}, left: []string{"a", "b"}},
			},
		},
		{
			name: "an old attachment without a sandbox goes once it has been seen so for the grace period",
			old:  []string{"live", "dead"},
			steps: []step{
				{name: "first seen: kept", listed: []string{"live"}, left: []string{"dead", "live"}},
				{name: "half the grace later: kept", advance: grace / 2, listed: []string{"live"}, left: []string{"dead", "live"}},
				{name: "the grace later: collected", advance: grace / 2, listed: []string{"live"}, left: []string{"live"}},
			},
		},
		{
			name: "runtime unreachable: nothing is collected, however long",
			old:  []string{"a", "b"},
			steps: []step{
				{name: "first pass", listErr: errors.New("connection refused"), left: []string{"a", "b"}, wantErr: true},
				{name: "an hour later", advance: time.Hour, listErr: errors.New("connection refused"), left: []string{"a", "b"}, wantErr: true},
				{name: "the runtime is back, lists a", advance: time.Minute, listed: []string{"a"}, left: []string{"a", "b"}},
				{name: "the grace later", advance: grace, listed: []string{"a"}, left: []string{"a"}},
			},
		},
		{
			name: "a failed listing in between does not reset a suspect",
			old:  []string{"dead"},
			steps: []step{
				{name: "first seen", left: []string{"dead"}},
				{name: "the grace later, runtime down", advance: grace, listErr: errors.New("deadline exceeded"), left: []string{"dead"}, wantErr: true},
				{name: "back", listed: nil, left: nil},
			},
		},
		{
			name: "an attachment younger than the grace period is kept though its sandbox is not listed (an ADD in flight)",
			steps: []step{
				{name: "ADD writes, sandbox not listed yet", add: []attachment{{id: "creating", ifName: "eth0"}}, left: []string{"creating"}},
				// The suspect rule alone would collect it now; its files are not older than the
				// grace period before this listing.
				{name: "unlisted for the grace period, written the grace period before", advance: grace, left: []string{"creating"}},
				{name: "listed now", advance: time.Second, listed: []string{"creating"}, left: []string{"creating"}},
				{name: "listed long after", advance: time.Hour, listed: []string{"creating"}, left: []string{"creating"}},
			},
		},
		{
			name: "old files of an attachment first seen now are not enough (a wall clock stepped forward)",
			old:  []string{"new-after-clock-step"},
			steps: []step{
				{name: "first seen", left: []string{"new-after-clock-step"}},
				{name: "listed before the grace is over", advance: 10 * time.Second, listed: []string{"new-after-clock-step"}, left: []string{"new-after-clock-step"}},
			},
		},
		{
			name: "a sandbox that leaves the list again starts a new grace period",
			old:  []string{"flaky"},
			steps: []step{
				{name: "first unlisted", left: []string{"flaky"}},
				{name: "listed", advance: grace / 2, listed: []string{"flaky"}, left: []string{"flaky"}},
				{name: "unlisted again", advance: grace / 2, left: []string{"flaky"}},
				{name: "not yet a grace period since", advance: grace / 2, left: []string{"flaky"}},
				{name: "a grace period since", advance: grace / 2, left: nil},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newClock()
			n := &node{}
			for _, id := range tt.old {
				n.attachments = append(n.attachments, attachment{id: id, ifName: "eth0", written: c.ago(time.Hour)})
			}
			rt := &fakeRuntime{}
			col := newCollector(t, rt, n, c)
			for _, s := range tt.steps {
				c.advance(s.advance)
				for _, a := range s.add {
					if a.written.IsZero() {
						a.written = c.now()
					}
					n.attachments = append(n.attachments, a)
				}
				rt.ids, rt.err = s.listed, s.listErr
				calls := n.calls
				_, err := col.Pass(context.Background(), nil)
				if s.wantErr {
					if !errors.Is(err, ErrRuntimeUnavailable) {
						t.Fatalf("%s: Pass = %v, want ErrRuntimeUnavailable", s.name, err)
					}
					if n.calls != calls {
						t.Fatalf("%s: the runtime did not answer, yet GC ran", s.name)
					}
				} else if err != nil {
					t.Fatalf("%s: %v", s.name, err)
				}
				var left []string
				for _, a := range n.attachments {
					left = append(left, a.id)
				}
				slices.Sort(left)
				if !slices.Equal(left, s.left) {
					t.Fatalf("%s: attachments left %q, want %q", s.name, left, s.left)
				}
			}
		})
	}
}

// TestCutoff: the cutoff handed to the core is the grace period before the runtime was asked.
func TestCutoff(t *testing.T) {
	c := newClock()
	n := &node{}
	col := newCollector(t, &fakeRuntime{}, n, c)
	if _, err := col.Pass(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	if want := c.ago(grace); !n.lastKeeper.WrittenBefore.Equal(want) {
		t.Errorf("WrittenBefore = %s, want %s", n.lastKeeper.WrittenBefore, want)
	}
}

func TestNewRefusesNoGrace(t *testing.T) {
	for _, g := range []time.Duration{0, -time.Second} {
		if _, err := New(&fakeRuntime{}, g, nil); err == nil {
			t.Errorf("New with grace %s succeeded", g)
		}
	}
}

// TestNotReadySandboxOverCRI: through a CRI socket, a NOTREADY sandbox keeps its attachment
// like a READY one, and an unlisted one goes; a runtime that stops answering stops collection.
func TestNotReadySandboxOverCRI(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "cri.sock")
	srv := critest.Start(t, socket)
	client, err := cri.Dial("unix://" + socket)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	c := newClock()
	n := &node{}
	for _, id := range []string{"ready", "notready", "gone"} {
		n.attachments = append(n.attachments, attachment{id: id, ifName: "eth0", written: c.ago(time.Hour)})
	}
	col := newCollector(t, client, n, c)
	srv.Set(nil, critest.Sandbox("ready", runtimeapi.PodSandboxState_SANDBOX_READY), critest.Sandbox("notready", runtimeapi.PodSandboxState_SANDBOX_NOTREADY))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for range 2 {
		if _, err := col.Pass(ctx, nil); err != nil {
			t.Fatal(err)
		}
		c.advance(grace)
	}
	if !n.has("ready") || !n.has("notready") || n.has("gone") {
		t.Fatalf("after two passes a grace period apart: %+v, want ready and notready kept, gone collected", n.attachments)
	}
	n.attachments = append(n.attachments, attachment{id: "orphan", ifName: "eth0", written: c.ago(time.Hour)})
	res, err := col.Pass(ctx, nil)
	if err != nil || res.Sandboxes != 2 || res.Unlisted != 1 {
		t.Fatalf("pass = %+v, %v, want 2 sandboxes and 1 unlisted attachment", res, err)
	}
	srv.Set(errors.New("server is not initialized yet"))
	c.advance(grace)
	calls := n.calls
	if _, err := col.Pass(ctx, nil); !errors.Is(err, ErrRuntimeUnavailable) || n.calls != calls || !n.has("orphan") {
		t.Fatalf("runtime erring: Pass = %v, GC calls %d -> %d, attachments %+v", err, calls, n.calls, n.attachments)
	}
}
