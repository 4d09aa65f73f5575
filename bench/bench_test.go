package bench

import (
	"flag"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"golang.org/x/sys/unix"

	"github.com/kubenet-dev/kubenet/test/nettest"
)

var (
	outFile        = flag.String("bench.out", "", "markdown file whose generated block receives the report (docs/bench.md)")
	refBackend     = flag.String("bench.ref-backend", "nftables", "netfilter backend of the reference bridge (ipMasq) and portmap: nftables or iptables")
	kubenetBackend = flag.String("bench.kubenet-backend", "nftables", "kubenet's netfilterBackend: nftables or iptables")
	section        = flag.String("bench.section", "", `-bench.out's generated block: "" is make bench's, NAME the one marked "make bench (NAME)"`)
	quick          = flag.Bool("bench.quick", false, "small sizes, to try the harness in seconds")
	withIPAM       = flag.Bool("bench.ipam", true, "also run ipam's BenchmarkAllocateRelease and include its numbers")
	only           = flag.String("bench.only", "", "comma-separated workloads to run (sequential, hostports, parallel, status, scale, datapath); empty: all")
	chainsFlag     = flag.String("bench.chains", kubenetChain+","+referenceChain+","+floorChain, "comma-separated chains to run (for profiling one alone)")
	kubenetBin     = flag.String("bench.kubenet-bin", "", "a kubenet binary to run instead of building this tree's (to compare commits in one harness; build it with CGO_ENABLED=0)")
)

// selected reports whether the item named w is in the comma-separated list (empty: everything).
func selected(list, w string) bool {
	return list == "" || slices.Contains(strings.Split(list, ","), w)
}

func sizes() options {
	if *quick {
		return options{rounds: 2, podsPerRound: 5, parallelPods: 16, parallelism: 8, parallelRuns: 2,
			scalePods: 30, scaleWindow: 5, scaleRounds: 1, statusSamples: 5, datapathRounds: 1, datapathWindow: 2 * time.Second}
	}
	return options{rounds: 10, podsPerRound: 10, parallelPods: 100, parallelism: 8, parallelRuns: 4,
		scalePods: 500, scaleWindow: 10, scaleRounds: 2, statusSamples: 10, datapathRounds: nettest.DatapathRounds, datapathWindow: nettest.DatapathWindow}
}

// BenchmarkKubenetVsReference runs the workloads of issue 6 through libcni, in one node netns,
// for kubenet and for the reference plugin chain, alternating the two, and prints (and with
// -bench.out writes) the comparison table. It runs its workloads once, whatever b.N is:
//
//	go test -run '^$' -bench KubenetVsReference -benchtime 1x -timeout 30m ./bench/ -args -bench.out ../docs/bench.md
//
// (`make bench` runs exactly this with a temporary dir for the reference plugins.)
func BenchmarkKubenetVsReference(b *testing.B) {
	nettest.RequireRoot(b)
	began := time.Now()
	// Other work on the machine shows in every number; the report says how busy it was.
	loadStart := loadAverage()
	opts := sizes()
	binDir, err := pluginDir(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	refDir, err := nettest.InstallRefPlugins()
	if err != nil {
		b.Fatal(err)
	}

	work := b.TempDir()
	shim, err := buildShim(work)
	if err != nil {
		b.Fatal(err)
	}
	floor, err := shimFloor(shim, filepath.Join(work, "floor"))
	if err != nil {
		b.Fatal(err)
	}
	node := benchNode{nettest.NewNode(b, binDir)}
	refList, err := referenceConfList(node.Node, *refBackend)
	if err != nil {
		b.Fatal(err)
	}
	floorDir := filepath.Join(work, "floor-bin")
	if _, err := nettest.BuildPackage(floorDir, "./bench/floorplugin", floorPlugin); err != nil {
		b.Fatal(err)
	}
	floorList, err := floorConfList()
	if err != nil {
		b.Fatal(err)
	}
	var chains []*chain
	for _, c := range []struct {
		name   string
		list   *libcni.NetworkConfigList
		binDir string
	}{
		{kubenetChain, kubenetConfList(b, node.Node, *kubenetBackend), binDir},
		{referenceChain, refList, refDir},
		{floorChain, floorList, floorDir},
	} {
		if !selected(*chainsFlag, c.name) {
			continue
		}
		shimDir := filepath.Join(work, "shim-"+c.name)
		if err := shimBinDir(shim, c.binDir, shimDir); err != nil {
			b.Fatal(err)
		}
		chains = append(chains, newChain(c.name, c.list, c.binDir, shimDir, node.Dir))
	}
	chains, floorPluginChain := withoutFloor(chains)
	r := newRunner(b, node, chains, opts)
	r.floor = floorPluginChain
	r.m.shimFloor = floor
	// Builds and installs leave dirty pages behind; written back during the first workload they
	// would slow kubenet's one fsync per ADD, which the reference chain does not have.
	unix.Sync()
	b.ResetTimer()
	if selected(*only, "sequential") {
		r.sequential(rowAddPlain, rowDelPlain, true, func(int) podSpec { return podSpec{} })
	}
	if selected(*only, "hostports") {
		r.sequential(rowAddPorts, rowDelPorts, false, func(i int) podSpec {
			return podSpec{hostPorts: []portMapping{{HostPort: int32(30000 + i), ContainerPort: 80, Protocol: "tcp"}}, bandwidth: shaped()}
		})
	}
	if selected(*only, "parallel") {
		r.parallel()
	}
	if selected(*only, "status") {
		r.statusEmpty()
	}
	if selected(*only, "scale") {
		r.scale()
	}
	var datapath []datapathResult
	if selected(*only, "datapath") {
		datapath = r.datapath(datapathChains(b, node, r.allChains(), work, binDir))
	}
	b.StopTimer()
	for _, c := range r.allChains() {
		if err := node.reset(c); err != nil {
			b.Fatal(err)
		}
	}
	// Last: its 60000 reservation files would keep the disk busy under the workloads.
	var ipamLines []string
	if *withIPAM {
		if ipamLines, err = ipamBenchmark(); err != nil {
			b.Fatal(err)
		}
	}

	env := append(environment(node.Dir, opts), "load average at start "+loadStart+", at end "+loadAverage())
	rep := report{m: r.m, opts: opts, env: env, ipam: ipamLines, datapath: datapath, began: began, took: time.Since(began),
		aheadOnly: *kubenetBackend != "nftables"}
	md := rep.markdown()
	fmt.Println(md)
	if *outFile != "" {
		if err := writeInto(*outFile, *section, md); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(r.m.p50(rowAddPlain, kubenetChain))/1e6, "kubenet-add-p50-ms")
	b.ReportMetric(float64(r.m.p50(rowAddPlain, referenceChain))/1e6, "reference-add-p50-ms")
}

// datapathChains are the chains the datapath workload compares: kubenet as configured (with
// anti-spoofing, its default), the same with "antiSpoofing": false, and the reference chain.
func datapathChains(b *testing.B, node benchNode, chains []*chain, work, binDir string) []*chain {
	var out []*chain
	for _, c := range chains {
		out = append(out, c)
		if c.name == kubenetChain {
			list := kubenetConfListWith(b, node.Node, *kubenetBackend, map[string]any{"antiSpoofing": false})
			out = append(out, newChain(noAntiSpoofChain, list, binDir, filepath.Join(work, "shim-"+kubenetChain), node.Dir))
		}
	}
	return out
}

// ipamBenchmark runs the IPAM allocator's benchmark in its own test binary and returns its
// result lines.
func ipamBenchmark() ([]string, error) {
	cmd := exec.Command("go", "test", "-run", "^$", "-bench", "^BenchmarkAllocateRelease$", "-benchtime", "100x", "-count", "1", "./ipam/")
	cmd.Dir = ".."
	out, err := cmd.CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("ipam benchmark: %w\n%s", err, out)
	}
	var lines []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, "Benchmark") {
			lines = append(lines, strings.Join(strings.Fields(l), " "))
		}
	}
	return lines, nil
}

// pluginDir returns a directory holding the kubenet binary the run times: built from this tree,
// or -bench.kubenet-bin copied in.
func pluginDir(dir string) (string, error) {
	if *kubenetBin == "" {
		return nettest.BuildPlugin(dir)
	}
	data, err := os.ReadFile(*kubenetBin)
	if err != nil {
		return "", fmt.Errorf("-bench.kubenet-bin: %w", err)
	}
	return dir, os.WriteFile(filepath.Join(dir, "kubenet"), data, 0o755)
}

// kubenetVersion names the kubenet the run times.
func kubenetVersion() string {
	if *kubenetBin != "" {
		return "kubenet binary " + *kubenetBin
	}
	return "kubenet " + gitDescribe()
}

// environment describes the machine and the run for the report.
func environment(dataDir string, o options) []string {
	var uts unix.Utsname
	_ = unix.Uname(&uts)
	env := []string{
		fmt.Sprintf("kernel %s", unix.ByteSliceToString(uts.Release[:])),
		fmt.Sprintf("%d CPUs (%s)", runtime.NumCPU(), cpuModel()),
		runtime.Version(),
		kubenetVersion(),
		"kubenet with the " + *kubenetBackend + " backend; reference plugins " + nettest.RefPluginsVersion + " with the " + *refBackend + " backend; both built without cgo, as released",
		"IPv4 pod CIDR " + podCIDR.String(),
		"data dirs on " + fsType(dataDir),
		"conntrack buckets " + readTrim("/proc/sys/net/netfilter/nf_conntrack_buckets"),
		"br_netfilter loaded and " + strings.Join(kubeadmBridgeNetfilter, ", ") + " 1 in the node for every chain, as on a kubeadm node",
		fmt.Sprintf("sizes: sequential %d sessions × %d pods per chain; parallel %d sessions × %d pods, %d workers; scale %d sessions × %d pods (a window of %d one at a time on the empty node before and after, and on top of the other %d, which go %d at a time); STATUS %d calls per session",
			o.rounds, o.podsPerRound, o.parallelRuns, o.parallelPods, o.parallelism, o.scaleRounds, o.scalePods, o.scaleWindow, o.scalePods-o.scaleWindow, o.parallelism, o.statusSamples),
	}
	return env
}

func cpuModel() string {
	b, _ := os.ReadFile("/proc/cpuinfo")
	m := regexp.MustCompile(`(?m)^model name\s*:\s*(.*)$`).FindSubmatch(b)
	if m == nil {
		return "unknown CPU"
	}
	return string(m[1])
}

func gitDescribe() string {
	out, err := exec.Command("git", "-C", "..", "describe", "--tags", "--always", "--dirty").Output()
	if err != nil {
		return "(no git)"
	}
	return strings.TrimSpace(string(out))
}

// loadAverage is the 1-minute load average.
func loadAverage() string {
	f := strings.Fields(readTrim("/proc/loadavg"))
	if len(f) == 0 {
		return "unknown"
	}
	return f[0]
}

func readTrim(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(b))
}

func fsType(path string) string {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return "unknown fs"
	}
	switch st.Type {
	case unix.TMPFS_MAGIC:
		return "tmpfs"
	case unix.EXT4_SUPER_MAGIC:
		return "ext4"
	case unix.XFS_SUPER_MAGIC:
		return "xfs"
	case unix.BTRFS_SUPER_MAGIC:
		return "btrfs"
	case unix.OVERLAYFS_SUPER_MAGIC:
		return "overlayfs"
	}
	return fmt.Sprintf("fs 0x%x", st.Type)
}

func TestMedianCI(t *testing.T) {
	seq := func(n int) []float64 {
		xs := make([]float64, n)
		for i := range xs {
			xs[i] = float64(n - i) // unsorted on purpose
		}
		return xs
	}
	cases := []struct {
		n        int
		ok       bool
		lo, hi   float64 // the order statistics, 1-based, of 1..n
		coverage float64
	}{
		{n: 5, ok: false}, // P(all 5 on one side) = 1/16 > 5 %
		{n: 6, ok: true, lo: 1, hi: 6, coverage: 1 - 2.0/64}, // x(1)..x(6)
		{n: 16, ok: true, lo: 4, hi: 13, coverage: 1 - 2*697.0/65536},
		{n: 20, ok: true, lo: 6, hi: 15, coverage: 1 - 2*21700.0/1048576},
	}
	for _, tc := range cases {
		lo, hi, cov, ok := medianCI(seq(tc.n), 0.95)
		if ok != tc.ok {
			t.Fatalf("n=%d: ok %v, want %v", tc.n, ok, tc.ok)
		}
		if !ok {
			continue
		}
		if lo != tc.lo || hi != tc.hi || math.Abs(cov-tc.coverage) > 1e-9 {
			t.Errorf("n=%d: [%v, %v] coverage %.5f, want [%v, %v] coverage %.5f", tc.n, lo, hi, cov, tc.lo, tc.hi, tc.coverage)
		}
		if cov < 0.95 {
			t.Errorf("n=%d: coverage %.4f below 95%%", tc.n, cov)
		}
	}
}

// TestCPUTable: CPU per operation is the sum over a chain's plugins of their mean CPU per
// process, operations the most processes of one plugin; workloads and commands without
// processes are left out, a chain without any is a dash.
func TestCPUTable(t *testing.T) {
	ms := time.Millisecond
	m := newMeasurements()
	file := func(workload, chain, plugin, command string, cpus ...time.Duration) {
		var runs []procRun
		for _, c := range cpus {
			runs = append(runs, procRun{Plugin: plugin, Command: command, CPU: c})
		}
		m.keepCPU(workload, chain, runs)
	}
	file(rowParallelAdd, kubenetChain, "kubenet", "ADD", 9*ms, 11*ms)
	file(rowParallelAdd, referenceChain, "bridge", "ADD", 30*ms, 34*ms)
	file(rowParallelAdd, referenceChain, "portmap", "ADD", 4*ms, 4*ms)
	file(rowParallelAdd, referenceChain, "bandwidth", "ADD", 2*ms, 6*ms)
	file(rowParallelAdd, kubenetChain, "kubenet", "DEL", 20*ms)
	file("", kubenetChain, "kubenet", "STATUS", 3*ms, 5*ms, 4*ms)
	want := []string{
		"| parallel ADDs and DELs | ADD | 2 / 2 | 10.0 ms | 40.0 ms | 0.25 |",
		"| parallel ADDs and DELs | DEL | 1 / 0 | 20.0 ms | – | – |",
		"| STATUS, node without pods | STATUS | 3 / 0 | 4.00 ms | – | – |",
	}
	if got := m.cpuTable(); !slices.Equal(got, want) {
		t.Errorf("cpuTable() =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestFloorRows: the floor table gives the rows the floor plugin ran, with both chains' p50
// against its own; the targets judge kubenet's ADD against the floor's and its first ADD against
// its steady one, and say "not measured" without the samples.
func TestFloorRows(t *testing.T) {
	ms := time.Millisecond
	m := newMeasurements()
	for _, s := range []struct {
		row, chain string
		d          time.Duration
	}{
		{rowAddPlain, floorChain, 4 * ms}, {rowAddPlain, kubenetChain, 6 * ms}, {rowAddPlain, referenceChain, 40 * ms},
		{rowFirstAdd, kubenetChain, 12 * ms},
		{rowDelPlain, kubenetChain, 20 * ms}, // no floor sample: no floor row
	} {
		m.record(s.row, s.chain, s.d)
	}
	want := []string{"| " + rowAddPlain + " (n=1) | 4.00 ms | 4.00 ms | 1.50 | 10.00 |"}
	if got := m.floorTable(); !slices.Equal(got, want) {
		t.Errorf("floorTable() =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for _, tc := range []struct {
		got    target
		actual string
		met    bool
	}{
		{m.floorTarget("floor", rowAddPlain, 1.3), "1.50 (6.00 ms vs 4.00 ms)", false},
		{m.floorTarget("floor", rowDelPlain, 1.3), "not measured", false},
		{m.firstAddTarget(2), "2.00 (12.0 ms vs 6.00 ms)", true},
		{newMeasurements().firstAddTarget(1.5), "not measured", false},
	} {
		if tc.got.actual != tc.actual || tc.got.met != tc.met {
			t.Errorf("%s: %q met=%v, want %q met=%v", tc.got.goal, tc.got.actual, tc.got.met, tc.actual, tc.met)
		}
	}
}
