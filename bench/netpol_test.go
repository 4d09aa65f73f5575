package bench

import (
	"encoding/json"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kubenet-dev/kubenet/internal/nettest"
)

var (
	npOutFile  = flag.String("bench.netpol-out", "", "markdown file whose generated block receives the NetworkPolicy report (docs/networkpolicy.md)")
	npWithKNP  = flag.Bool("bench.knp", true, "also measure kube-network-policies v0.8.0 (hack/knp) on the data-path workload")
	npPolicies = flag.Int("bench.netpol-policies", 100, "policies selecting both pods in the data-path workload")
	npParts    = flag.String("bench.netpol-parts", "", "comma-separated parts to run (datapath, cluster); empty: both")
)

func writeJSON(path string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o600)
}

// Modes of the data-path workload.
const (
	modeNone    = "no policy"
	modeKubenet = "kubenet, %d policies"
	modeKNP     = "kube-network-policies v0.8.0, %d policies"
)

// BenchmarkNetworkPolicy measures what NetworkPolicy costs on a kubenet node (docs/networkpolicy.md
// says what and how), and writes the table with -bench.netpol-out:
//
//	go test -run '^$' -bench '^BenchmarkNetworkPolicy$' -benchtime 1x ./bench/ -args -bench.netpol-out ../docs/networkpolicy.md
func BenchmarkNetworkPolicy(b *testing.B) {
	nettest.RequireRoot(b)
	began := time.Now()
	loadStart := loadAverage()
	rounds := 10
	if *quick {
		rounds = 2
	}
	var dp dataPath
	var cp controlPlaneResult
	if selected(*npParts, "datapath") {
		dp = npDataPath(b, rounds)
	}
	if selected(*npParts, "cluster") {
		cp = npControlPlane(b)
	}
	env := []string{"kernel " + unameRelease(), fmt.Sprintf("%s; load average at start %s, at end %s", cpuModel(), loadStart, loadAverage()), "kubenet " + gitDescribe()}
	md := npReport(dp, cp, rounds, env, began)
	fmt.Println(md)
	if *npOutFile != "" {
		if err := writeInto(*npOutFile, md); err != nil {
			b.Fatal(err)
		}
	}
}

// dataPath are the data-path results by mode, in the modes' order.
type dataPath struct {
	modes []string
	by    map[string]*rates
}

// npDataPath runs the two-pod workload in every mode, rounds times, rotating the order of the
// modes from round to round, and checks in every round that the policies really are in force
// (a port no policy allows is refused) or really are not.
func npDataPath(b *testing.B, rounds int) dataPath {
	binDir, err := nettest.BuildPlugin(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	node := nettest.NewNode(b, binDir)
	// Every connection of the workload leaves a conntrack entry in the node; short timeouts in
	// the node's own namespace keep them from piling up (the table is shared by the machine).
	for _, k := range []string{"nf_conntrack_tcp_timeout_time_wait", "nf_conntrack_tcp_timeout_close", "nf_conntrack_tcp_timeout_fin_wait", "nf_conntrack_tcp_timeout_close_wait", "nf_conntrack_tcp_timeout_last_ack"} {
		nettest.WriteSysctl(b, node.NS, "net/netfilter/"+k, "1")
	}
	list := node.ConfList(b, nettest.NetConf{PodCIDRs: []netip.Prefix{nettest.PodCIDR4}, NonMasqueradeCIDRs: []netip.Prefix{nettest.NonMasquerade4}, Extra: map[string]any{"networkPolicy": true}})
	pod := func(name string) *nettest.Pod {
		p := node.NewPod(b, "np-bench-"+name)
		p.RT.Args = [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", npNamespace}, {"K8S_POD_NAME", name}}
		node.MustAdd(b, list, p)
		return p
	}
	client, server := pod("client"), pod("server")
	clientIP, serverIP := client.IPs()[0], server.IPs()[0]
	conns := connServer(b, server.NS, netip.AddrPortFrom(serverIP, npServerPort))
	sinkLn := nettest.StartSink(b, server.NS, netip.AddrPortFrom(serverIP, npServerPort+1))
	denied := connServer(b, server.NS, netip.AddrPortFrom(serverIP, 9999))

	full := npObjects(*npPolicies, "bench-node", clientIP, serverIP)
	allowSink(full)
	none := npObjects(0, "bench-node", clientIP, serverIP)

	modes := []string{modeNone, fmt.Sprintf(modeKubenet, *npPolicies)}
	var k knp
	objFile := filepath.Join(b.TempDir(), "objects.json")
	if *npWithKNP {
		if k, err = buildKNP(b.TempDir()); err != nil {
			b.Fatal(err)
		}
		if err := knpObjects(objFile, full); err != nil {
			b.Fatal(err)
		}
		modes = append(modes, fmt.Sprintf(modeKNP, *npPolicies))
	}
	res := dataPath{modes: modes, by: map[string]*rates{}}
	for _, m := range modes {
		res.by[m] = &rates{}
	}
	stream := nettest.Stream{Warmup: 300 * time.Millisecond, Window: time.Second}
	for round := range rounds {
		order := append(modes[round%len(modes):], modes[:round%len(modes)]...)
		for _, mode := range order {
			var stop func() error
			switch {
			case mode == modeNone:
				applyKubenet(b, node.NS, node.DataDir(), none)
			case strings.HasPrefix(mode, "kubenet"):
				applyKubenet(b, node.NS, node.DataDir(), full)
			default:
				applyKubenet(b, node.NS, node.DataDir(), none)
				stop = startKNP(b, node.NS, k, objFile, clientIP, serverIP)
			}
			// The policies are in force (or not): a port no policy allows.
			_, err := nettest.TCPRequest(client.NS, denied, "x", 700*time.Millisecond)
			if (mode == modeNone) != (err == nil || !strings.Contains(err.Error(), "timeout")) {
				b.Fatalf("%s: connection to a port no policy allows: %v", mode, err)
			}
			rate, failed, err := connRate(client.NS, conns, 4, time.Second)
			if err != nil {
				b.Fatal(err)
			}
			bps, err := stream.Measure(client.NS, sinkLn)
			if err != nil {
				b.Fatalf("%s: %v", mode, err)
			}
			r := res.by[mode]
			r.conns, r.throughput, r.failed = append(r.conns, rate), append(r.throughput, bps), r.failed+failed
			b.Logf("round %d %s: %.0f connections/s (%d failed), %.2f Gbit/s", round, mode, rate, failed, bps/1e9)
			if stop != nil {
				if err := stop(); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	return res
}

// allowSink lets policy 0 also allow the stream's port (the server's port + 1).
func allowSink(w npWorkload) {
	if len(w.policies) == 0 {
		return
	}
	p := w.policies[0]
	extra := *p.Spec.Ingress[0].Ports[0].DeepCopy()
	v := intstr.FromInt32(npServerPort + 1)
	extra.Port = &v
	p.Spec.Ingress[0].Ports = append(p.Spec.Ingress[0].Ports, extra)
	p.Spec.Egress[0].Ports = append(p.Spec.Egress[0].Ports, extra)
}

func fmtList(v []float64, f string) string {
	var parts []string
	for _, x := range v {
		parts = append(parts, fmt.Sprintf(f, x))
	}
	return strings.Join(parts, ", ")
}

func unameRelease() string {
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(b))
}

// npReport renders both workloads' results as markdown, with the goals of issue 14.
func npReport(dp dataPath, cp controlPlaneResult, rounds int, env []string, began time.Time) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Run %s, %s in all. %s.\n\n", began.UTC().Format("2006-01-02 15:04 MST"), time.Since(began).Round(time.Second), strings.Join(env, "; "))
	fmt.Fprintf(&b, "Data path: two pods on one node, %d rounds, the modes' order rotating per round; medians of the rounds.\n\n", rounds)
	b.WriteString("| mode | new TCP connections/s | pod→pod TCP throughput | failed connections | per round (connections/s) |\n|---|--:|--:|--:|---|\n")
	for _, m := range dp.modes {
		r := dp.by[m]
		fmt.Fprintf(&b, "| %s | %.0f | %.2f Gbit/s | %d | %s |\n", m, median(r.conns), median(r.throughput)/1e9, r.failed, fmtList(r.conns, "%.0f"))
	}
	// Each round measures every mode back to back, so the ratio of one round is taken under the
	// same load; the goal is judged on the median of the rounds' ratios.
	var connRatio, tputRatio float64
	if len(dp.modes) > 1 {
		none, kube := dp.by[modeNone], dp.by[dp.modes[1]]
		var cr, tr []float64
		for i := range min(len(none.conns), len(kube.conns)) {
			cr = append(cr, kube.conns[i]/none.conns[i])
			tr = append(tr, kube.throughput[i]/none.throughput[i])
		}
		connRatio, tputRatio = median(cr), median(tr)
		fmt.Fprintf(&b, "\nPer-round ratios kubenet/none: connections %s; throughput %s.\n", fmtList(cr, "%.2f"), fmtList(tr, "%.2f"))
	}
	b.WriteString("\nControl plane: ")
	fmt.Fprintf(&b, "a real kube-apiserver with %d pods (%d on the node) and %d NetworkPolicies, kubenet-agent on the node; %d policy updates, each timed from just before the API call until the node's ingress map sends the pod to its new group (polled every millisecond through netlink).\n\n", cpPods, cpLocal, cpPolicies, cpChanges)
	fmt.Fprintf(&b, "| measure | value |\n|---|--:|\n")
	fmt.Fprintf(&b, "| policy change → node's rules, p50 | %s |\n| policy change → node's rules, p99 (max of %d) | %s |\n", ms(cp.latencies.p50()), len(cp.latencies), ms(cp.latencies.p99()))
	fmt.Fprintf(&b, "| %d pods added on the node → all released (policies in force) | %s |\n", cpLocal, ms(cp.converge))
	fmt.Fprintf(&b, "| agent RSS before the objects / at the end / peak | %s / %s / %s |\n", mib(cp.idleRSS), mib(cp.rss), mib(cp.hwm))
	b.WriteString("\nGoals of issue 14 (same run):\n\n| goal | measured | met |\n|---|---|---|\n")
	row := func(goal, actual string, met bool) {
		m := "**no**"
		if met {
			m = "yes"
		}
		fmt.Fprintf(&b, "| %s | %s | %s |\n", goal, actual, m)
	}
	row(fmt.Sprintf("new connections/s with %d policies ≥ 0.9 × with none (median of per-round ratios)", *npPolicies), fmt.Sprintf("%.3f", connRatio), connRatio >= 0.9)
	row("pod→pod throughput unchanged within 3% (median of per-round ratios)", fmt.Sprintf("%.3f", tputRatio), tputRatio >= 0.97 && tputRatio <= 1.03)
	row(fmt.Sprintf("policy change on the node < 1 s (%d pods, %d policies)", cpPods, cpPolicies), "max "+ms(cp.latencies.percentile(1)), len(cp.latencies) > 0 && cp.latencies.percentile(1) < time.Second)
	row("agent memory < 150 MiB at that size", "peak "+mib(cp.hwm), cp.hwm > 0 && cp.hwm < 150<<20)
	return b.String()
}
