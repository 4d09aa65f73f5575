package bench

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kubenet-dev/kubenet/test/nettest"
)

// Goals of issue 24 for one policy with many ipBlock peers.
const (
	bigLockEntries   = 10000                  // the size the lock goal is set at
	bigLockLimit     = 100 * time.Millisecond // longest the kernel's nftables mutex may be held
	bigLinearFrom    = 1000                   // the pass's CPU per entry at the largest size within
	bigLinearFactor  = 2.0                    // this factor of its CPU per entry at bigLinearFrom
	bigConnsMinRatio = 0.95
)

// npBigReport renders the big-policy rows as markdown, with the goals of issue 24.
func npBigReport(rows []bigRow, rounds int, env []string, began time.Time) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Run %s, %s in all. %s.\n\n", began.UTC().Format("2006-01-02 15:04 MST"), time.Since(began).Round(time.Second), strings.Join(env, "; "))
	fmt.Fprintf(&b, "One policy with n ipBlock peers (mixed sizes, one in ten with exceptions, one in five IPv6) and the client pod on the server's port, selecting the server. A pass is what the agent does: compile, then apply. The install pass starts from a node without the policy's group; the unchanged pass follows it. CPU is the bench process's: the compiler and the kernel's work on the netlink messages, done in the sending thread. ADD is the plugin adding a new pod on the node (then deleting it), with no pass running and back to back while an install pass runs. New connections: %d rounds of 1 s samples, the server selected (B) or not (A, the group staying in place for another pod), A B B A (B A A B in odd rounds); the ratio is B over A.\n\n", rounds)
	b.WriteString("| ipBlock peers | policy (JSON) | set elements | install pass: wall | CPU | CPU per peer | transactions | longest transaction | allocated | unchanged pass: wall | CPU | ADD, idle: median | ADD during an install pass: median, max (ADDs; the pass's wall time) | new connections/s B/A: median of rounds, wall (CPU) |\n")
	b.WriteString("|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %d | %s | %d | %s | %s | %.1f µs | %d | %s | %s | %s | %s | %s | %s, %s (%d; %s) | %.3f (%.3f) |\n",
			r.entries, kib(r.policyBytes), r.elements, ms(r.install.wall), ms(r.install.cpu), cpuPerEntry(r), r.install.applied.Transactions,
			ms(r.install.applied.LongestTransaction), mib(int64(r.install.alloc)), ms(r.unchanged.wall), ms(r.unchanged.cpu),
			ms(samples(r.addIdle).p50()), ms(samples(r.addDuring).p50()), ms(slices.Max(r.addDuring)), len(r.addDuring), ms(r.duringPass),
			nettest.Median(r.connWall), nettest.Median(r.connCPU))
	}
	b.WriteString("\nGoals of issue 24 (same run):\n\n| goal | measured | met |\n|---|---|---|\n")
	for _, g := range bigGoals(rows) {
		met := "**no**"
		if g.met {
			met = "yes"
		}
		fmt.Fprintf(&b, "| %s | %s | %s |\n", g.goal, g.measured, met)
	}
	return b.String()
}

type bigGoal struct {
	goal, measured string
	met            bool
}

// bigGoals judges the goals on the rows that have the sizes they speak of.
func bigGoals(rows []bigRow) []bigGoal {
	var out []bigGoal
	row := func(entries int) (bigRow, bool) {
		i := slices.IndexFunc(rows, func(r bigRow) bool { return r.entries == entries })
		if i < 0 {
			return bigRow{}, false
		}
		return rows[i], true
	}
	if r, ok := row(bigLockEntries); ok {
		longest := r.install.applied.LongestTransaction
		out = append(out, bigGoal{
			goal: fmt.Sprintf("a pass holds no lock ADD or DEL wait for longer than %s, at %d peers", ms(bigLockLimit), bigLockEntries),
			measured: fmt.Sprintf("the pass takes no lock; the kernel's nftables mutex is held one transaction at a time, the longest %s; ADD during the pass: median %s, max %s; idle: median %s",
				ms(longest), ms(samples(r.addDuring).p50()), ms(slices.Max(r.addDuring)), ms(samples(r.addIdle).p50())),
			met: longest < bigLockLimit,
		})
	}
	if len(rows) > 0 {
		largest := rows[len(rows)-1]
		if from, ok := row(bigLinearFrom); ok && largest.entries > bigLinearFrom {
			f := cpuPerEntry(largest) / cpuPerEntry(from)
			out = append(out, bigGoal{
				goal:     fmt.Sprintf("the pass linear in peers: CPU per peer of the install pass at %d within %.0f× of at %d", largest.entries, bigLinearFactor, bigLinearFrom),
				measured: fmt.Sprintf("%.1f µs against %.1f µs: %.2f× (wall time per peer %.2f×)", cpuPerEntry(largest), cpuPerEntry(from), f, perEntry(largest.install.wall, largest.entries)/perEntry(from.install.wall, from.entries)),
				met:      f <= bigLinearFactor,
			})
		}
	}
	for _, r := range rows {
		m := nettest.Median(r.connWall)
		measured := fmt.Sprintf("%.3f (by CPU %.3f); rounds %.3f – %.3f", m, nettest.Median(r.connCPU), slices.Min(r.connWall), slices.Max(r.connWall))
		if lo, hi, cov, ok := medianCI(r.connWall, 0.95); ok {
			measured += fmt.Sprintf("; confidence interval of the median %.3f – %.3f (%.1f%%)", lo, hi, 100*cov)
			if lo < bigConnsMinRatio && hi >= bigConnsMinRatio {
				measured += ": reaches across the bound, so this run cannot tell the outcome from noise"
			}
		}
		out = append(out, bigGoal{
			goal:     fmt.Sprintf("new connections/s with %d peers ≥ %.2f× of no policy", r.entries, bigConnsMinRatio),
			measured: measured,
			met:      m >= bigConnsMinRatio,
		})
	}
	return out
}

func cpuPerEntry(r bigRow) float64 { return perEntry(r.install.cpu, r.entries) }

// perEntry is d per entry, in microseconds.
func perEntry(d time.Duration, entries int) float64 {
	return float64(d) / float64(time.Microsecond) / math.Max(float64(entries), 1)
}

func kib(bytes int) string { return fmt.Sprintf("%.0f KiB", float64(bytes)/1024) }

// TestBigGoals: the goals of the big-policy rows are judged on the rows of the sizes they name.
func TestBigGoals(t *testing.T) {
	mk := func(entries int, cpu, longest time.Duration, conns float64) bigRow {
		r := bigRow{entries: entries, addIdle: []time.Duration{time.Millisecond}, addDuring: []time.Duration{time.Millisecond}, connWall: []float64{conns}, connCPU: []float64{conns}}
		r.install.cpu, r.install.applied.LongestTransaction = cpu, longest
		return r
	}
	cases := []struct {
		name string
		rows []bigRow
		want map[string]bool // goal prefix → met
	}{
		{"all met", []bigRow{mk(1000, 10*time.Millisecond, time.Millisecond, 1), mk(10000, 100*time.Millisecond, 99*time.Millisecond, 0.96), mk(50000, 990*time.Millisecond, 0, 0.95)},
			map[string]bool{"a pass holds no lock": true, "the pass linear": true, "new connections/s with 1000": true, "new connections/s with 50000": true}},
		{"a transaction of 100 ms at 10 000", []bigRow{mk(1000, 10*time.Millisecond, 0, 1), mk(10000, 100*time.Millisecond, 100*time.Millisecond, 1)},
			map[string]bool{"a pass holds no lock": false}},
		{"CPU per peer 2.1× at 50 000", []bigRow{mk(1000, 10*time.Millisecond, 0, 1), mk(50000, 1050*time.Millisecond, 0, 1)},
			map[string]bool{"the pass linear": false}},
		{"connections at 0.94", []bigRow{mk(100, time.Millisecond, 0, 0.94)},
			map[string]bool{"new connections/s with 100 ": false}},
	}
	noisy := mk(100, time.Millisecond, 0, 1)
	noisy.connWall = []float64{0.7, 0.8, 0.9, 0.95, 0.96, 1.0, 1.1, 1.2, 1.3, 1.4}
	if g := bigGoals([]bigRow{noisy}); len(g) != 1 || !g[0].met || !strings.Contains(g[0].measured, "cannot tell") {
		t.Errorf("noisy rounds around the bound: %+v, want met by the median and said to be inconclusive", g)
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			goals := bigGoals(tc.rows)
			for prefix, want := range tc.want {
				i := slices.IndexFunc(goals, func(g bigGoal) bool { return strings.HasPrefix(g.goal, prefix) })
				if i < 0 {
					t.Errorf("no goal %q in %v", prefix, goals)
				} else if goals[i].met != want {
					t.Errorf("%q: met %v, want %v (%s)", goals[i].goal, goals[i].met, want, goals[i].measured)
				}
			}
		})
	}
}
