package bench

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/kubenet-dev/kubenet/test/nettest"
)

const (
	kubenetChain   = "kubenet"
	referenceChain = "reference"
	// floorChain is bench/floorplugin: what no bridge plugin can skip, and nothing else.
	floorChain = "floor"
)

// target is one goal of issues 6 and 26, judged on numbers of the same run.
type target struct {
	goal   string
	actual string
	met    bool
}

func (m *measurements) p50(row, chain string) time.Duration { return m.rows[row][chain].p50() }

// ratioTarget: kubenet's p50 of row at most limit times the reference's.
func (m *measurements) ratioTarget(goal, row string, limit float64) target {
	return m.ratioTo(goal, row, referenceChain, limit)
}

// floorTarget: kubenet's p50 of row at most limit times the floor plugin's.
func (m *measurements) floorTarget(goal, row string, limit float64) target {
	return m.ratioTo(goal, row, floorChain, limit)
}

// ratioTo: kubenet's p50 of row at most limit times the p50 of chain base.
func (m *measurements) ratioTo(goal, row, base string, limit float64) target {
	k, r := m.p50(row, kubenetChain), m.p50(row, base)
	if r == 0 {
		return target{goal: goal, actual: "not measured"}
	}
	v := float64(k) / float64(r)
	return target{goal: goal, actual: fmt.Sprintf("%.2f (%s vs %s)", v, ms(k), ms(r)), met: v <= limit}
}

func (m *measurements) targets() []target {
	low, high := m.p50(rowScaleAddLow, kubenetChain), m.p50(rowScaleAddHigh, kubenetChain)
	scale := target{goal: "500 hostPort pods: ADD p50 of pods 491–500 ≤ 1.15 × pods 1–10", actual: "not measured"}
	if low > 0 {
		v := float64(high) / float64(low)
		scale.actual, scale.met = fmt.Sprintf("%.2f (%s vs %s)", v, ms(high), ms(low)), v <= 1.15
		if fl, fh := m.p50(rowScaleAddLow, floorChain), m.p50(rowScaleAddHigh, floorChain); fl > 0 {
			scale.actual += fmt.Sprintf("; the floor plugin's %.2f (%s vs %s)", float64(fh)/float64(fl), ms(fh), ms(fl))
		}
	}
	out := []target{
		m.ratioTarget("single-pod ADD p50 ≤ 0.2 × reference (no hostPort)", rowAddPlain, 0.2),
		m.ratioTarget("single-pod ADD p50 ≤ 0.2 × reference (hostPort + bandwidth)", rowAddPorts, 0.2),
		m.ratioTarget("DEL p50 ≤ 0.2 × reference (no hostPort)", rowDelPlain, 0.2),
		m.ratioTarget("DEL p50 ≤ 0.2 × reference (hostPort + bandwidth)", rowDelPorts, 0.2),
		scale,
		m.ratioTarget("100 parallel ADDs: wall ≤ 0.2 × reference", rowParallelAdd, 0.2),
		m.cpuTarget("100 parallel ADDs: plugin CPU per ADD ≤ 0.2 × reference", rowParallelAdd, "ADD", 0.2),
		m.floorTarget("single-pod ADD p50 ≤ 1.3 × the floor plugin (no hostPort)", rowAddPlain, 1.3),
		m.firstAddTarget(1.5),
	}
	return append(out, m.statusTargets(4*time.Millisecond)...)
}

// statusTargets: kubenet's STATUS p50 at most limit, on an empty node and with 500 pods.
func (m *measurements) statusTargets(limit time.Duration) []target {
	var out []target
	for _, row := range []string{rowStatusEmpty, rowStatusFull} {
		d, actual := m.p50(row, kubenetChain), "not measured"
		if d > 0 {
			actual = ms(d)
		}
		out = append(out, target{goal: fmt.Sprintf("STATUS p50 ≤ %s (%s)", ms(limit), strings.TrimPrefix(row, "STATUS, ")), actual: actual, met: d > 0 && d <= limit})
	}
	return out
}

// cpuTarget: kubenet's plugin CPU per operation of command in workload row at most limit times
// the reference's (the CPU table's ratio).
func (m *measurements) cpuTarget(goal, row, command string, limit float64) target {
	k, r := m.cpuPerOp(row, kubenetChain, command), m.cpuPerOp(row, referenceChain, command)
	if k == 0 || r == 0 {
		return target{goal: goal, actual: "not measured"}
	}
	v := float64(k) / float64(r)
	return target{goal: goal, actual: fmt.Sprintf("%.2f (%s vs %s)", v, ms(k), ms(r)), met: v <= limit}
}

// firstAddTarget: kubenet's first ADD on a node at most limit times its steady one (p50s).
func (m *measurements) firstAddTarget(limit float64) target {
	goal := fmt.Sprintf("a node's first ADD p50 ≤ %.1f × a steady ADD p50 (no hostPort)", limit)
	first, steady := m.p50(rowFirstAdd, kubenetChain), m.p50(rowAddPlain, kubenetChain)
	if first == 0 || steady == 0 {
		return target{goal: goal, actual: "not measured"}
	}
	v := float64(first) / float64(steady)
	return target{goal: goal, actual: fmt.Sprintf("%.2f (%s vs %s)", v, ms(first), ms(steady)), met: v <= limit}
}

// floorTable compares both chains with the floor plugin on the rows it ran.
func (m *measurements) floorTable() []string {
	var out []string
	for _, row := range rowOrder {
		f := m.rows[row][floorChain]
		if len(f) == 0 {
			continue
		}
		k, r := m.rows[row][kubenetChain], m.rows[row][referenceChain]
		out = append(out, fmt.Sprintf("| %s (n=%d) | %s | %s | %s | %s |", row, len(f), ms(f.p50()), ms(f.p99()), ratio(k.p50(), f.p50()), ratio(r.p50(), f.p50())))
	}
	return out
}

// aheadTargets is one target per measured workload: kubenet's p50 below the reference's.
func (m *measurements) aheadTargets() []target {
	var out []target
	for _, row := range rowOrder {
		if m.p50(row, kubenetChain) == 0 || m.p50(row, referenceChain) == 0 {
			continue
		}
		out = append(out, m.ratioTarget(row+": kubenet p50 < reference p50", row, 0.9999))
	}
	out = append(out, m.ratioTarget("single-pod ADD p50 ≤ 0.5 × reference (no hostPort)", rowAddPlain, 0.5))
	if m.p50(rowStatusFull, kubenetChain) > 0 {
		out = append(out, m.statusTargets(5 * time.Millisecond)[1])
	}
	return out
}

// report is everything the run found, rendered as markdown.
type report struct {
	// aheadOnly replaces issue 6's targets with one per workload: kubenet's p50 below the
	// reference's (the iptables pass, where the goal is to stay ahead).
	aheadOnly bool
	m         *measurements
	opts      options
	env       []string // lines describing the machine and the run
	ipam      []string // BenchmarkAllocateRelease result lines
	// datapath holds the datapath workload's results, if it ran
	datapath []datapathResult
	began    time.Time
	took     time.Duration
}

// labels puts the run's scale sizes into the row names and goals, which are written for the
// full run's 500 pods and windows of 10.
func (o options) labels() *strings.Replacer {
	n, w := o.scalePods, o.scaleWindow
	return strings.NewReplacer(
		"491–500", fmt.Sprintf("%d–%d", n-w+1, n), "500–491", fmt.Sprintf("%d–%d", n, n-w+1),
		"1–10", fmt.Sprintf("1–%d", w), "10–1", fmt.Sprintf("%d–1", w), "500 ", fmt.Sprintf("%d ", n),
		"100 ", fmt.Sprintf("%d ", o.parallelPods), "8 in parallel", fmt.Sprintf("%d in parallel", o.parallelism))
}

func (r report) markdown() string {
	label := r.opts.labels()
	var b bytes.Buffer
	fmt.Fprintf(&b, "Run %s, %s in all. %s\n\n", r.began.UTC().Format("2006-01-02 15:04 MST"), r.took.Round(time.Second), strings.Join(r.env, "; "))
	b.WriteString("| workload | kubenet p50 | kubenet p99 | reference p50 | reference p99 | ratio p50 | ratio p99 | peak RSS of one ADD process (kubenet / reference) |\n")
	b.WriteString("|---|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, row := range rowOrder {
		k, ref := r.m.rows[row][kubenetChain], r.m.rows[row][referenceChain]
		if len(k) == 0 && len(ref) == 0 {
			continue
		}
		rss := "–"
		if v := r.m.addRSS[row]; v != nil {
			rss = mib(v[kubenetChain]) + " / " + mib(v[referenceChain])
		}
		fmt.Fprintf(&b, "| %s (n=%d) | %s | %s | %s | %s | %s | %s | %s |\n", label.Replace(row), len(k),
			ms(k.p50()), ms(k.p99()), ms(ref.p50()), ms(ref.p99()),
			ratio(k.p50(), ref.p50()), ratio(k.p99(), ref.p99()), rss)
	}
	b.WriteString("\nTargets (same run):\n\n| target | measured | met |\n|---|---|---|\n")
	targets := r.m.targets()
	if r.aheadOnly {
		targets = r.m.aheadTargets()
	}
	for _, t := range targets {
		met := "**no**"
		if t.met {
			met = "yes"
		}
		fmt.Fprintf(&b, "| %s | %s | %s |\n", label.Replace(t.goal), t.actual, met)
	}
	if lines := r.m.floorTable(); len(lines) > 0 {
		b.WriteString("\nThe floor plugin (bench/floorplugin, in the same sessions' rotation): a Go CNI plugin that does only what no bridge plugin can skip: on ADD a veth pair, the pod end made inside the pod's netns, the host end on the bridge; in the pod the address and the default route; on DEL the veth deleted. No address store, netfilter, sysctls or record.\n\n")
		b.WriteString("| workload | floor p50 | floor p99 | kubenet p50 / floor p50 | reference p50 / floor p50 |\n|---|--:|--:|--:|--:|\n")
		for _, line := range lines {
			b.WriteString(label.Replace(line) + "\n")
		}
	}
	if len(r.datapath) > 0 {
		b.WriteString(datapathMarkdown(r.datapath, noAntiSpoofChain, r.opts))
	}
	fmt.Fprintf(&b, "\nPlugin processes of the sequential workloads and STATUS (one operation at a time): wall time from fork to reap, and the peak RSS (ru_maxrss) the probes through rssshim saw in all workloads; bridge's includes the host-local it runs, and %s is the shim's floor.\n\n", mib(r.m.shimFloor))
	b.WriteString("| chain | plugin | command | processes | p50 | p99 | peak RSS |\n|---|---|---|--:|--:|--:|--:|\n")
	for _, line := range r.m.processTable() {
		b.WriteString(line + "\n")
	}
	if lines := r.m.cpuTable(); len(lines) > 0 {
		b.WriteString("\nCPU per operation (user + system time of every plugin process of the chain, which includes the processes a plugin waits for: host-local under bridge, nft and the iptables tools; mean over the operations of each workload's measured part). With more operations than cores, as in the parallel workloads, wall time follows it.\n\n")
		b.WriteString("| workload | command | operations (kubenet / reference) | kubenet | reference | ratio |\n|---|---|--:|--:|--:|--:|\n")
		for _, line := range lines {
			b.WriteString(line + "\n")
		}
	}
	if len(r.ipam) > 0 {
		b.WriteString("\nIPAM allocator, in-process (`BenchmarkAllocateRelease`: one Allocate + hinted Release in a /16 holding n reservations; mean of 100 iterations, fsync included):\n\n```\n")
		for _, l := range r.ipam {
			b.WriteString(l + "\n")
		}
		b.WriteString("```\n")
	}
	return b.String()
}

// processTable summarises the plugin processes per chain, plugin and command.
func (m *measurements) processTable() []string {
	walls := map[procKey]samples{}
	var keys []procKey
	for chain, runs := range m.procs {
		for _, p := range runs {
			k := procKey{chain, p.Plugin, p.Command}
			if _, ok := walls[k]; !ok {
				keys = append(keys, k)
			}
			walls[k] = append(walls[k], p.Wall)
		}
	}
	// Plugins that other plugins run (host-local under bridge) appear only in the probes.
	for k := range m.pluginRSS {
		if _, ok := walls[k]; !ok && k.command != "-" {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, func(a, b procKey) int {
		return strings.Compare(a.chain+"/"+a.command+"/"+a.plugin, b.chain+"/"+b.command+"/"+b.plugin)
	})
	var out []string
	for _, k := range keys {
		s, ok := walls[k]
		if !ok {
			out = append(out, fmt.Sprintf("| %s | %s (run by another plugin) | %s | – | – | – | %s |", k.chain, k.plugin, k.command, mib(m.pluginRSS[k])))
			continue
		}
		out = append(out, fmt.Sprintf("| %s | %s | %s | %d | %s | %s | %s |", k.chain, k.plugin, k.command, len(s), ms(s.p50()), ms(s.p99()), mib(m.pluginRSS[k])))
	}
	return out
}

// cpuWorkloads are the workloads whose CPU the report shows, by the row their sessions file
// under, with their names there.
var cpuWorkloads = []struct{ row, name string }{
	{rowAddPlain, "sequential, no hostPort"},
	{rowAddPorts, "sequential, 1 hostPort + bandwidth"},
	{rowParallelAdd, "parallel ADDs and DELs"},
	{rowScaleAddLow, "scale (pods with 2 hostPorts each)"},
	{"", "STATUS, node without pods"},
}

// opKey is one command of one chain in one workload.
type opKey struct{ workload, chain, command string }

// cpuPerOps is the CPU per operation of every chain's command in every workload: the sum over the
// chain's plugins of their mean CPU per process (each runs once per operation), and the number
// of operations, the most processes of one plugin.
func (m *measurements) cpuPerOps() (perOp map[opKey]time.Duration, ops map[opKey]int) {
	perOp, ops = map[opKey]time.Duration{}, map[opKey]int{}
	for k, c := range m.cpu {
		o := opKey{k.workload, k.chain, k.command}
		perOp[o] += c.total / time.Duration(c.n)
		ops[o] = max(ops[o], c.n)
	}
	return perOp, ops
}

// cpuPerOp is chain's CPU per operation of command in workload row (cpuPerOps); 0 when it did
// not run.
func (m *measurements) cpuPerOp(row, chain, command string) time.Duration {
	perOp, _ := m.cpuPerOps()
	return perOp[opKey{row, chain, command}]
}

// cpuTable gives each workload's CPU per operation and chain: the sum over the chain's plugins
// of their mean CPU per process (each runs once per operation), operations being the most
// processes of one plugin.
func (m *measurements) cpuTable() []string {
	perOp, ops := m.cpuPerOps()
	var out []string
	for _, w := range cpuWorkloads {
		for _, command := range []string{"ADD", "DEL", "STATUS"} {
			k, r := opKey{w.row, kubenetChain, command}, opKey{w.row, referenceChain, command}
			if ops[k] == 0 && ops[r] == 0 {
				continue
			}
			cell := func(o opKey) string {
				if ops[o] == 0 {
					return "–"
				}
				return ms(perOp[o])
			}
			kr := "–"
			if ops[k] > 0 {
				kr = ratio(perOp[k], perOp[r])
			}
			out = append(out, fmt.Sprintf("| %s | %s | %d / %d | %s | %s | %s |", w.name, command, ops[k], ops[r], cell(k), cell(r), kr))
		}
	}
	return out
}

// Markers around the generated part of docs/bench.md; the prose around them is written by hand.
const (
	beginMarker = "<!-- begin generated by make bench -->"
	endMarker   = "<!-- end generated by make bench -->"
)

// writeInto replaces the generated block of the markdown file at path with body.
// writeInto replaces the generated block of path named section ("" is make bench's own).
func writeInto(path, section, body string) error {
	begin, end := beginMarker, endMarker
	if section != "" {
		begin = strings.Replace(begin, "make bench", "make bench ("+section+")", 1)
		end = strings.Replace(end, "make bench", "make bench ("+section+")", 1)
	}
	return nettest.ReplaceGenerated(path, begin, end, body)
}
