package agent

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kubenet-dev/kubenet/core"
	"github.com/kubenet-dev/kubenet/internal/nft"
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

// TestSubscriptionRetriedAfterFailure: a subscription that could not be opened (at start, or
// again after its socket overflowed) is tried again until it opens: one failed attempt must not
// leave the healer without events, checking only every period, until the agent restarts.
func TestSubscriptionRetriedAfterFailure(t *testing.T) {
	ends := func(context.Context) bool { return true } // the socket overflowed at once
	follows := func(ctx context.Context) bool { <-ctx.Done(); return false }
	refused := errors.New("no buffer space available")
	for _, tc := range []struct {
		name  string
		opens []error // the answer of each attempt to open; nil: opened
	}{
		{"failed at start", []error{refused, nil}},
		{"failed when subscribing again", []error{nil, refused, nil}},
		{"failed several times", []error{refused, refused, refused, nil}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHealer(slog.New(slog.NewTextHandler(io.Discard, nil)), time.Hour, time.Millisecond,
				func() (*core.Config, error) { return nil, nil }, nil)
			var mu sync.Mutex
			attempts := 0
			h.openTables = func() (func(context.Context) bool, func(), error) {
				mu.Lock()
				defer mu.Unlock()
				attempts++
				switch {
				case attempts > len(tc.opens):
					t.Errorf("attempt %d: the subscription was opened already", attempts)
					return follows, func() {}, nil
				case tc.opens[attempts-1] != nil:
					return nil, nil, tc.opens[attempts-1]
				case attempts < len(tc.opens):
					return ends, func() {}, nil
				default:
					return follows, func() {}, nil
				}
			}
			h.openLinks = func() (func(context.Context) bool, func(), error) { return follows, func() {}, nil }
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); h.run(ctx) }()
			defer func() { cancel(); <-done }()
			for end := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				mu.Lock()
				n := attempts
				mu.Unlock()
				if n >= len(tc.opens) {
					break
				}
				if time.Now().After(end) {
					t.Fatalf("%d attempts to subscribe after 20 s, want %d", n, len(tc.opens))
				}
			}
		})
	}
}

// TestPolicyAskOfHealPass: what a heal pass asks of the policy controller. Only a pass that ran
// because nftables events were lost, and found the node intact, asks for a check instead of a
// read-back of every group set: the lost events are mostly the controller's own element writes,
// and a read-back after each overflow made most passes at 10 000 pods read every set. A change
// announced by an event, a node found changed (a flushed ruleset) or a failed pass still ask
// for the read-back, whether or not the pass is the periodic one.
func TestPolicyAskOfHealPass(t *testing.T) {
	for _, tc := range []struct {
		name string
		pass healPass
		want policyAsk
	}{
		{"periodic pass", healPass{full: true}, policyNothing},
		// The tool that changed the node-wide state unannounced (events lost, or the
		// subscription down) may have flushed the policy tables too: the node forwards
		// unfiltered until the controller's own resync, up to 30 s later.
		{"periodic pass that repaired", healPass{full: true, NodeRepair: core.NodeRepair{Restored: 2}}, policyVerify},
		{"periodic pass that found a flushed ruleset", healPass{full: true, NodeRepair: core.NodeRepair{Found: errors.New("table gone")}}, policyVerify},
		// An event of another process's change that came as the period elapsed is taken by
		// the periodic pass: it asks what the event's own pass would have.
		{"periodic pass an event asked for too", healPass{full: true, announced: true}, policyVerify},
		{"periodic pass after events were lost", healPass{full: true, eventsLost: true}, policyCheck},
		{"event of a kubenet table, node intact", healPass{}, policyVerify},
		{"event of a kubenet table, node repaired", healPass{NodeRepair: core.NodeRepair{Found: errors.New("table gone")}}, policyVerify},
		{"events lost, node intact", healPass{eventsLost: true}, policyCheck},
		{"events lost, flushed ruleset found", healPass{eventsLost: true, NodeRepair: core.NodeRepair{Found: errors.New("table gone")}}, policyVerify},
		{"events lost, host port elements restored", healPass{eventsLost: true, NodeRepair: core.NodeRepair{Restored: 1}}, policyVerify},
		{"events lost, a port's guard restored", healPass{eventsLost: true, NodeRepair: core.NodeRepair{PolicyGuards: 1}}, policyVerify},
		{"events lost, pass failed", healPass{eventsLost: true, err: errors.New("netlink")}, policyVerify},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := policyAskOf(tc.pass); got != tc.want {
				t.Errorf("policyAskOf(%+v) = %d, want %d", tc.pass, got, tc.want)
			}
		})
	}
}

// TestForwardWakesOnOthersTransactions: a transaction that changed a kubenet table wakes the
// healer when another process committed it, and not when this process did (the agent's own
// writes: the policy controller's group rebuilds woke a heal pass, a policy read-back of every
// set and a node sync each).
func TestForwardWakesOnOthersTransactions(t *testing.T) {
	kubenetTable, policyTable := nft.TableName("kubenet"), "kubenetpolicy-kubenet"
	ours := func(changes ...nftChange) nftBatch { return nftBatch{changes: changes, pid: 1, comm: "kubenet-agent"} }
	theirs := func(changes ...nftChange) nftBatch { return nftBatch{changes: changes, pid: 2, comm: "nft"} }
	chainOf := func(table string) nftChange { return nftChange{msgType: unix.NFT_MSG_NEWCHAIN, table: table} }
	for _, tc := range []struct {
		name  string
		batch nftBatch
		wake  bool
	}{
		{"another process flushed a kubenet table", theirs(nftChange{msgType: unix.NFT_MSG_DELTABLE, table: kubenetTable}), true},
		{"another process changed a policy table", theirs(chainOf(policyTable)), true},
		{"another process changed another table", theirs(chainOf("firewalld")), false},
		{"the agent rebuilt a policy group", ours(chainOf(policyTable), nftChange{msgType: unix.NFT_MSG_DELCHAIN, table: policyTable}), false},
		{"the agent wrote a kubenet table", ours(chainOf(kubenetTable)), false},
		{"a transaction nobody is named for", nftBatch{changes: []nftChange{chainOf(kubenetTable)}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHealer(slog.New(slog.NewTextHandler(io.Discard, nil)), time.Hour, time.Millisecond, func() (*core.Config, error) { return nil, nil }, nil)
			h.ours = func(b nftBatch) bool { return b.pid == 1 }
			events := make(chan nftBatch, 1)
			events <- tc.batch
			close(events)
			woken := 0
			if ended := h.forward(context.Background(), events, func() { woken++ }); !ended {
				t.Fatal("forward did not report the end of the subscription")
			}
			if got := woken > 0; got != tc.wake {
				t.Errorf("woken %d times, want a wake-up: %v", woken, tc.wake)
			}
		})
	}
}
