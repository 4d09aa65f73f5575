// Package stale collects kubenet's attachments whose pod sandbox the container runtime no longer
// knows. containerd 1.6 and 1.7 never send CNI GC, so an attachment whose sandbox died without a
// CNI DEL (a node reboot, a runtime that lost its state) keeps its addresses reserved forever,
// until ADD fails with "no IP addresses available". The collector closes that: it asks the
// runtime which sandboxes exist and hands the rest to the core's GC.
//
// A sandbox is listed only once its ADD is over (containerd calls CNI ADD before it adds the
// sandbox to its list), so "not listed" alone would take the network of every pod being
// created. An attachment is collected only when both hold:
//
//   - its record and reservation files were written more than the grace period before the
//     runtime was asked, judged by the core under the network lock (ADD writes them first, under
//     that lock, so an ADD that began after the listing is always spared);
//   - the collector has seen it without a sandbox for at least the grace period, on the
//     monotonic clock (so a wall clock stepped forward, as at boot, cannot age a new record).
//
// A runtime that cannot be asked collects nothing.
package stale

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kubenet-dev/kubenet/core"
)

// Runtime lists the pod sandboxes the runtime knows, in every state (cri.Client).
type Runtime interface {
	Sandboxes(ctx context.Context) ([]string, error)
}

// ErrRuntimeUnavailable wraps a failed listing: nothing was collected.
var ErrRuntimeUnavailable = errors.New("container runtime unavailable; nothing collected")

// CollectFunc is core.Collect; tests put a recorder in its place.
type CollectFunc func(ctx context.Context, cfg *core.Config, k core.Keeper) (core.GCReport, error)

type key struct{ id, ifName string }

// Collector runs passes; one goroutine at a time.
type Collector struct {
	runtime Runtime
	grace   time.Duration
	collect CollectFunc
	now     func() time.Time
	// suspects are the attachments seen without a sandbox, with the start of the pass that saw
	// them so first. Only those still without one at the last pass are remembered.
	suspects map[key]time.Time
}

// New returns a collector that asks rt and spares attachments younger than grace.
func New(rt Runtime, grace time.Duration, collect CollectFunc) (*Collector, error) {
	if grace <= 0 {
		return nil, fmt.Errorf("stale attachments: grace period %s: must be positive", grace)
	}
	return &Collector{runtime: rt, grace: grace, collect: collect, now: time.Now, suspects: map[key]time.Time{}}, nil
}

// Result is what one pass found and did.
type Result struct {
	Sandboxes int           // sandboxes the runtime listed
	Unlisted  int           // attachments (container and interface) without a sandbox that the pass met
	Report    core.GCReport // what was collected
}

// Pass asks the runtime once and collects, in cfg's network, what has been without a sandbox
// for the grace period. An error wrapping ErrRuntimeUnavailable means nothing was touched.
func (c *Collector) Pass(ctx context.Context, cfg *core.Config) (Result, error) {
	asked := c.now()
	ids, err := c.runtime.Sandboxes(ctx)
	if err != nil {
		return Result{}, fmt.Errorf("%w: %w", ErrRuntimeUnavailable, err)
	}
	live := make(map[string]bool, len(ids))
	for _, id := range ids {
		live[id] = true
	}
	seen := map[key]bool{}
	keeper := core.Keeper{
		InUse: func(id, ifName string) bool {
			if live[id] {
				return true
			}
			k := key{id, ifName}
			seen[k] = true
			first, ok := c.suspects[k]
			if !ok {
				c.suspects[k] = asked
				first = asked
			}
			return asked.Sub(first) < c.grace
		},
		WrittenBefore: asked.Add(-c.grace),
	}
	report, err := c.collect(ctx, cfg, keeper)
	// Forget what this pass did not meet: collected, torn down by the runtime, or listed now.
	for k := range c.suspects {
		if !seen[k] {
			delete(c.suspects, k)
		}
	}
	return Result{Sandboxes: len(ids), Unlisted: len(seen), Report: report}, err
}
