package bench

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kubenet-dev/kubenet/test/nettest"
)

// Row identifiers: every measured operation of every workload.
const (
	rowAddPlain     = "ADD, no hostPort (sequential)"
	rowFirstAdd     = "a node's first ADD, no hostPort (each session's warm-up)"
	rowDelPlain     = "DEL, no hostPort (sequential)"
	rowAddPorts     = "ADD, 1 hostPort + bandwidth (sequential)"
	rowDelPorts     = "DEL, 1 hostPort + bandwidth (sequential)"
	rowParallelAdd  = "100 ADDs, 8 in parallel (wall)"
	rowParallelDel  = "100 DELs, 8 in parallel (wall)"
	rowScaleAddLow  = "ADD pods 1–10, 2 hostPorts each"
	rowScaleAddHigh = "ADD pods 491–500, 2 hostPorts each"
	rowScaleDelHigh = "DEL pods 500–491"
	rowScaleDelLow  = "DEL pods 10–1"
	rowStatusEmpty  = "STATUS, node without pods"
	rowStatusFull   = "STATUS, node with 500 pods"
)

// rowOrder is the order of the table.
var rowOrder = []string{
	rowAddPlain, rowFirstAdd, rowDelPlain, rowAddPorts, rowDelPorts, rowParallelAdd, rowParallelDel,
	rowScaleAddLow, rowScaleAddHigh, rowScaleDelHigh, rowScaleDelLow, rowStatusEmpty, rowStatusFull,
}

// measurements collects samples per row and chain, the plugin processes each chain ran, and
// the peak RSS the probes saw.
type measurements struct {
	rows      map[string]map[string]samples // row -> chain name -> samples
	procs     map[string][]procRun          // chain name -> processes of measured work
	addRSS    map[string]map[string]int64   // row of an ADD workload -> chain name -> peak RSS of one ADD process
	pluginRSS map[procKey]int64             // peak RSS per chain, plugin and command
	shimFloor int64                         // the least RSS the probe can report
	cpu       map[cpuKey]*cpuSum            // CPU of the plugin processes of each session's body
}

// cpuKey names the plugin processes of one kind in the sessions of one workload (the session's
// row; "" for STATUS on the empty node).
type cpuKey struct {
	workload string
	procKey
}

// cpuSum is the CPU time of n processes.
type cpuSum struct {
	n     int
	total time.Duration
}

// procKey names a kind of plugin process.
type procKey struct{ chain, plugin, command string }

func newMeasurements() *measurements {
	return &measurements{rows: map[string]map[string]samples{}, procs: map[string][]procRun{},
		addRSS: map[string]map[string]int64{}, pluginRSS: map[procKey]int64{}, cpu: map[cpuKey]*cpuSum{}}
}

// keepCPU files the CPU time of the processes of one session of workload.
func (m *measurements) keepCPU(workload, chain string, runs []procRun) {
	for _, p := range runs {
		k := cpuKey{workload, procKey{chain, p.Plugin, p.Command}}
		if m.cpu[k] == nil {
			m.cpu[k] = &cpuSum{}
		}
		m.cpu[k].n++
		m.cpu[k].total += p.CPU
	}
}

func (m *measurements) record(row, chain string, d time.Duration) {
	if m.rows[row] == nil {
		m.rows[row] = map[string]samples{}
	}
	m.rows[row][chain] = append(m.rows[row][chain], d)
}

// keepRSS files what a probe saw: the peak RSS of one ADD process goes to row (unless row is
// empty), every process to the per-plugin peaks.
func (m *measurements) keepRSS(row, chain string, runs []rssRun) {
	for _, r := range runs {
		k := procKey{chain, r.Plugin, r.Command}
		m.pluginRSS[k] = max(m.pluginRSS[k], r.MaxRSS)
		if r.Command == "ADD" && row != "" {
			if m.addRSS[row] == nil {
				m.addRSS[row] = map[string]int64{}
			}
			m.addRSS[row][chain] = max(m.addRSS[row][chain], r.MaxRSS)
		}
	}
}

// options size the run.
type options struct {
	rounds        int // alternating rounds of the sequential workloads (half start with each chain)
	podsPerRound  int // pods per chain per round of the sequential workloads
	parallelPods  int
	parallelism   int
	parallelRuns  int // rounds of the parallel workload per chain
	scalePods     int
	scaleWindow   int // pods at each end of the scale workload whose latency is reported
	scaleRounds   int // rounds of the scale workload per chain
	statusSamples int // STATUS calls per chain per round
	// datapath workload: rounds per chain, and how long each measurement sends
	datapathRounds int
	datapathWindow time.Duration
}

// runner drives both chains through the workloads on one node, alternating which goes first.
type runner struct {
	t      testing.TB
	node   benchNode
	chains []*chain // kubenet first
	// floor is the floor plugin (nil: not run), which runs only in the sequential and scale
	// workloads
	// without host ports: what it cannot do is not its measure.
	floor *chain
	pods  []*pod // netns pool, reused after every full DEL
	opts  options
	m     *measurements
	seq   int
}

func newRunner(t testing.TB, node benchNode, chains []*chain, opts options) *runner {
	r := &runner{t: t, node: node, chains: chains, opts: opts, m: newMeasurements()}
	n := max(opts.podsPerRound, opts.parallelPods, opts.scalePods) + 1
	for range n {
		r.pods = append(r.pods, &pod{ns: nettest.NewNS(t)})
	}
	return r
}

// order returns the chains in the order of round i: kubenet, reference, reference, kubenet, ...
// so that drift over the run (page cache, conntrack table, CPU frequency) hits both alike.
func (r *runner) order(i int) []*chain {
	if i%2 == 0 || len(r.chains) < 2 {
		return r.chains
	}
	return []*chain{r.chains[1], r.chains[0]}
}

// containerID is a fresh sandbox ID, 64 hex digits like containerd's.
func (r *runner) containerID(c *chain) string {
	r.seq++
	sum := sha256.Sum256(fmt.Appendf(nil, "%s/%d", c.name, r.seq))
	return hex.EncodeToString(sum[:])
}

// attach prepares pool pod i for a new sandbox of spec.
func (r *runner) attach(c *chain, i int, spec podSpec) *pod {
	p := r.pods[i]
	p.rt = runtimeConf(p.ns, r.containerID(c), spec)
	return p
}

// session runs body for chain c on a node that holds nothing of the other chain: reset, then one
// pod of spec added and deleted unmeasured so the node is warm (bridge, tables and data dir
// exist, as on a node that has run pods before), then body, then a probe ADD and DEL of the same
// spec through rssshim (its peak RSS goes to row), then the audit that DEL left nothing behind.
func (r *runner) session(c *chain, row string, warm podSpec, body func() error) {
	r.t.Helper()
	if err := r.node.reset(c); err != nil {
		r.t.Fatal(err)
	}
	p := r.attach(c, len(r.pods)-1, warm)
	d, err := r.node.add(c, p)
	if err != nil {
		r.t.Fatal(err)
	}
	// The node was reset: no bridge, tables or data dir. Not part of the session's measure.
	if len(warm.hostPorts) == 0 && warm.bandwidth == nil {
		r.m.record(rowFirstAdd, c.name, d)
	}
	if _, err := r.node.del(c, p); err != nil {
		r.t.Fatal(err)
	}
	before, err := r.node.snapshot()
	if err != nil {
		r.t.Fatal(err)
	}
	c.exec.take()
	if err := body(); err != nil {
		r.t.Fatal(err)
	}
	procs := c.exec.take()
	r.m.keepCPU(row, c.name, procs)
	if keepProcs(row) {
		r.m.procs[c.name] = append(r.m.procs[c.name], procs...)
	}
	if err := r.probe(c, row, warm); err != nil {
		r.t.Fatal(err)
	}
	after, err := r.node.snapshot()
	if err != nil {
		r.t.Fatal(err)
	}
	if err := before.diff(after); err != nil {
		r.t.Fatalf("%s: %v", c.name, err)
	}
}

// keepProcs tells whether the plugin processes of a session of row go into the per-plugin table:
// only those of one pod at a time (the sequential workloads, STATUS), so that the table shows
// what a single operation costs, not how processes queue behind each other under load.
func keepProcs(row string) bool {
	return row == rowAddPlain || row == rowAddPorts || row == ""
}

// probe adds and deletes the spare pod through rssshim and files the peak RSS of its processes.
func (r *runner) probe(c *chain, row string, spec podSpec) error {
	p := r.attach(c, len(r.pods)-1, spec)
	if _, err := r.node.addWith(c, c.probe, p); err != nil {
		return err
	}
	if _, err := r.node.delWith(c, c.probe, p); err != nil {
		return err
	}
	runs, err := takeRSSLog(c.rssLog)
	if err != nil {
		return err
	}
	r.m.keepRSS(row, c.name, runs)
	return nil
}

// allChains are the chains, the floor plugin's included.
func (r *runner) allChains() []*chain {
	if r.floor == nil {
		return r.chains
	}
	return append(slices.Clone(r.chains), r.floor)
}

// withFloor is the chains of round i with the floor plugin among them, its place rotating.
func (r *runner) withFloor(i int) []*chain {
	chains := r.order(i)
	if r.floor == nil {
		return chains
	}
	return slices.Insert(slices.Clone(chains), i%(len(chains)+1), r.floor)
}

// sequential is ADD then DEL of one pod at a time; withFloor runs the floor plugin too.
func (r *runner) sequential(addRow, delRow string, floor bool, spec func(i int) podSpec) {
	for round := range r.opts.rounds {
		chains := r.order(round)
		if floor {
			chains = r.withFloor(round)
		}
		for _, c := range chains {
			r.session(c, addRow, spec(r.opts.podsPerRound), func() error {
				for i := range r.opts.podsPerRound {
					p := r.attach(c, i, spec(i))
					d, err := r.node.add(c, p)
					if err != nil {
						return err
					}
					r.m.record(addRow, c.name, d)
					if d, err = r.node.del(c, p); err != nil {
						return err
					}
					r.m.record(delRow, c.name, d)
				}
				return nil
			})
		}
	}
}

// parallel adds parallelPods pods with parallelism workers and measures the wall time until the
// last ADD returns, then deletes them the same way.
func (r *runner) parallel() {
	for round := range r.opts.parallelRuns {
		for _, c := range r.order(round) {
			r.session(c, rowParallelAdd, podSpec{}, func() error {
				pods := make([]*pod, r.opts.parallelPods)
				for i := range pods {
					pods[i] = r.attach(c, i, podSpec{})
				}
				d, err := r.fanOut(pods, func(p *pod) error { _, err := r.node.add(c, p); return err })
				if err != nil {
					return err
				}
				r.m.record(rowParallelAdd, c.name, d)
				if d, err = r.fanOut(pods, func(p *pod) error { _, err := r.node.del(c, p); return err }); err != nil {
					return err
				}
				r.m.record(rowParallelDel, c.name, d)
				return nil
			})
		}
	}
}

// fanOut runs op for every pod with r.opts.parallelism workers and returns the wall time.
func (r *runner) fanOut(pods []*pod, op func(*pod) error) (time.Duration, error) {
	work := make(chan *pod)
	errs := make(chan error, len(pods))
	var wg sync.WaitGroup
	start := time.Now()
	for range r.opts.parallelism {
		wg.Go(func() {
			for p := range work {
				errs <- op(p)
			}
		})
	}
	for _, p := range pods {
		work <- p
	}
	close(work)
	wg.Wait()
	d := time.Since(start)
	close(errs)
	for err := range errs {
		if err != nil {
			return d, err
		}
	}
	return d, nil
}

// twoHostPorts is the scale workload's pod: a TCP and a UDP hostPort of its own.
func twoHostPorts(i int) podSpec {
	return podSpec{hostPorts: []portMapping{
		{HostPort: int32(20000 + i), ContainerPort: 80, Protocol: "tcp"},
		{HostPort: int32(40000 + i), ContainerPort: 53, Protocol: "udp"},
	}}
}

// scale measures ADD and DEL of scaleWindow pods with two hostPorts each on an empty node and on
// a node that holds scalePods of them. Per session: the window added and deleted one at a time
// on the empty node; the node filled parallelism pods at a time, the window added one at a time
// on top (pods scalePods-scaleWindow+1 to scalePods), STATUS and a probe on the full node, the
// window deleted last pod first, the rest deleted in parallel; and the empty-node window once
// more. The empty-node samples are taken before and after the full-node ones, so drift during
// the session (other work on the machine) falls on both sides alike.
//
// The floor plugin runs it too (its pods get no host ports): how the kernel's own work, the
// links and addresses of a node with n pods, grows with them, against which the chains' growth
// is read.
func (r *runner) scale() {
	n, w := r.opts.scalePods, r.opts.scaleWindow
	for round := range r.opts.scaleRounds {
		for _, c := range r.withFloor(round) {
			r.session(c, rowScaleAddLow, twoHostPorts(n), func() error {
				pods := make([]*pod, n)
				seq := func(row string, op func(*chain, *pod) (time.Duration, error), ps []*pod) error {
					for _, p := range ps {
						d, err := op(c, p)
						if err != nil {
							return err
						}
						r.m.record(row, c.name, d)
					}
					return nil
				}
				attach := func(from, to int) []*pod {
					for i := from; i < to; i++ {
						pods[i] = r.attach(c, i, twoHostPorts(i))
					}
					return pods[from:to]
				}
				emptyNode := func() error {
					window := attach(0, w)
					if err := seq(rowScaleAddLow, r.node.add, window); err != nil {
						return err
					}
					return seq(rowScaleDelLow, r.node.del, reversed(window))
				}
				if err := emptyNode(); err != nil {
					return err
				}
				fill := attach(0, n-w)
				if _, err := r.fanOut(fill, func(p *pod) error { _, err := r.node.add(c, p); return err }); err != nil {
					return err
				}
				window := attach(n-w, n)
				if err := seq(rowScaleAddHigh, r.node.add, window); err != nil {
					return err
				}
				if c != r.floor { // it has no STATUS
					if err := r.statuses(c, rowStatusFull); err != nil {
						return err
					}
				}
				if err := r.probe(c, rowScaleAddHigh, twoHostPorts(n)); err != nil {
					return err
				}
				if err := seq(rowScaleDelHigh, r.node.del, reversed(window)); err != nil {
					return err
				}
				if _, err := r.fanOut(fill, func(p *pod) error { _, err := r.node.del(c, p); return err }); err != nil {
					return err
				}
				return emptyNode()
			})
		}
	}
}

func reversed(ps []*pod) []*pod {
	out := slices.Clone(ps)
	slices.Reverse(out)
	return out
}

// statusEmpty measures STATUS on a warm node without pods.
func (r *runner) statusEmpty() {
	for round := range r.opts.rounds {
		for _, c := range r.order(round) {
			r.session(c, "", podSpec{}, func() error { return r.statuses(c, rowStatusEmpty) })
		}
	}
}

func (r *runner) statuses(c *chain, row string) error {
	for range r.opts.statusSamples {
		d, err := r.node.status(c)
		if err != nil {
			return err
		}
		r.m.record(row, c.name, d)
	}
	return nil
}
