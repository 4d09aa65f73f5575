//go:build kubenet_e2e_agent

package agent

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubenet-dev/kubenet/agent/policy"
	"github.com/kubenet-dev/kubenet/test/nettest"
	"github.com/kubenet-dev/kubenet/test/testkit"
)

// The control-plane workload is testkit.ScaleSize's, of the size -netpol.size names: a real
// kube-apiserver holding its pods (Local of them on the node under test, attached through the
// plugin; the others on nine other nodes, objects only), namespaces and policies, and
// kubenet-agent on the node.
const (
	cpChanges    = 20  // policy updates timed
	cpPodChanges = 100 // pod label changes timed
	cpChurnRate  = 50  // pod changes a second during the churn
)

var (
	netpolSize      = flag.String("netpol.size", "small", "BenchmarkNetworkPolicyScale's cluster: small (1000 pods, 200 policies, 10 namespaces, 10 on the node) or large (10000, 2000, 500, 100)")
	netpolChurn     = flag.Duration("netpol.churn", time.Minute, "how long BenchmarkNetworkPolicyScale changes pods at 50 a second to measure the agent's CPU")
	netpolProf      = flag.String("netpol.cpuprofile", "", "file that receives the agent's CPU profile during BenchmarkNetworkPolicyScale's churn (the agent runs with --profiling)")
	netpolStartProf = flag.String("netpol.startprofile", "", "file that receives the agent's CPU profile over the first seconds after its restart (BenchmarkNetworkPolicyScale's first pass; the agent runs with --profiling)")
	netpolKeep      = flag.String("netpol.keep", "", "directory that receives BenchmarkNetworkPolicyScale's agent log (agent.log, the first agent's) and each timed change's start and duration (changes.tsv), to match slow changes with the passes around them")
	netpolHeapProf  = flag.String("netpol.heapprofile", "", "file that receives the agent's heap profile at the end of BenchmarkNetworkPolicyScale's churn (the agent runs with --profiling)")
)

// controlPlaneResult is what the control-plane workload measured.
type controlPlaneResult struct {
	size       testkit.ScaleSize
	converge   time.Duration   // Local ADDs → every local pod released
	latencies  []time.Duration // API update of a policy → the node's map points to the new group
	podChanges []time.Duration // API update of a pod's labels → the node's group of a local pod changed
	// quietChanges are podChanges each made once no pass had run for quietBefore: one change on
	// its own, where podChanges (one right after the other) also time the wait for the end of
	// the last change's pass and the loop's MinGap after it.
	quietChanges []time.Duration
	churnCPU     float64 // the agent's CPU, % of one core, while pods change at cpChurnRate a second
	churned      int     // pod changes made during the churn
	// churnPasses and churnPassTime are the passes during the churn and their time in all
	// (the agent's metrics): how much of the CPU the passes are.
	churnPasses   float64
	churnPassTime time.Duration
	firstPass     time.Duration // the first pass after a restart (the agent's log)
	idleRSS       int64         // the agent's resident memory before the objects were created
	rss, peak     int64         // at the end, and the highest sampled (every 100 ms)
}

// quietBefore is how long no pass has run before each of the quiet pod changes: five times the
// agent's MinGap.
const quietBefore = 5 * policy.DefaultMinGap

var netpolOut = flag.String("netpol.out", "", "markdown file whose control-plane block receives BenchmarkNetworkPolicyScale's table (docs/networkpolicy.md)")

// BenchmarkNetworkPolicyScale measures kubenet-agent's NetworkPolicy controller in the cluster of
// -netpol.size (a real API server; objects only, except the node's own pods): how long a policy
// change and a pod change take from the API to the node's rules, how long new pods wait for their
// policies, the agent's CPU while pods change, its first pass after a restart and its memory. It
// runs once whatever b.N is (`make bench-netpol`; `make bench-netpol-large` for issue 27's size).
// Goals (docs/networkpolicy.md): under 1 s from policy change to rules, p99 under 100 ms from pod
// change to rules, first pass under 1 s, CPU under 10 % of a core at 50 pod changes a second,
// memory under 150 MiB.
func BenchmarkNetworkPolicyScale(b *testing.B) {
	began := time.Now()
	var res controlPlaneResult
	switch *netpolSize {
	case "small":
		res.size = testkit.ScaleSmall
	case "large":
		res.size = testkit.ScaleLarge
	default:
		b.Fatalf("-netpol.size %q: small or large", *netpolSize)
	}
	size := res.size
	must := func(err error) {
		b.Helper()
		if err != nil {
			b.Fatal(err)
		}
	}
	u, cp, agentUser := startCluster(b)
	api := cp.Admin
	n := newSimNode(b, u, cp, "node-1", 1, agentUser)
	createNode(b, api, nodeObject(n.name, n.addrs, []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}))
	n.startAgent(b, "--log-level=info", fmt.Sprint("--profiling=", *netpolProf != "" || *netpolHeapProf != ""))
	ctx := context.Background()
	must(nettest.WhileRunning(60*time.Second, func() error { _, err := os.Stat(n.confFile()); return err }, n.agent))
	res.idleRSS = procStatus(b, n.agent.Pid(), "VmRSS")
	mem := sampleRSS(n.agent.Pid())

	must(parallel(8, size.Namespaces, func(k int) error {
		ns, err := api.CoreV1().Namespaces().Create(ctx, size.Namespace(k), metav1.CreateOptions{})
		if err != nil {
			return err
		}
		sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: ns.Name}}
		_, err = api.CoreV1().ServiceAccounts(ns.Name).Create(ctx, sa, metav1.CreateOptions{})
		return err
	}))
	must(parallel(8, size.Pods, func(i int) error {
		nodeName := fmt.Sprintf("node-%d", 2+i%9)
		if i < size.Local {
			nodeName = n.name
		}
		pod := size.Pod(i, nodeName)
		p, err := api.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{})
		if err != nil || i < size.Local {
			return err
		}
		ip := size.Addr(i).String()
		p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}}
		_, err = api.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{})
		return err
	}))
	must(parallel(8, size.Policies, func(j int) error {
		np := size.Policy(j, 8000+j)
		_, err := api.NetworkingV1().NetworkPolicies(np.Namespace).Create(ctx, np, metav1.CreateOptions{})
		return err
	}))

	// The local pods, through the plugin with the agent's conflist: each is pending until the
	// agent has its policies in place.
	list, err := libcni.ConfListFromFile(n.confFile())
	must(err)
	start := time.Now()
	local := make([]*nettest.Pod, size.Local)
	for i := range size.Local {
		pod := size.Pod(i, n.name)
		p := n.cni.NewPod(b, fmt.Sprintf("cp-local-%d", i))
		p.RT.Args = [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", pod.Namespace}, {"K8S_POD_NAME", pod.Name}}
		n.cni.MustAdd(b, list, p)
		local[i] = p
	}
	must(nettest.WhileRunning(120*time.Second, func() error {
		held, err := heldIn(n.ns, local)
		if err != nil {
			return err
		}
		if held > 0 {
			return fmt.Errorf("%d local pods still held", held)
		}
		return nil
	}, n.agent))
	res.converge = time.Since(start)

	// timeChange times change until the node's ingress map sends local pod i to another group.
	// The map is read again at every nftables notification of the node (its commits), not
	// polled: a read every millisecond took a share of the two cores the agent runs on.
	var timed strings.Builder // what, start (RFC 3339, ns), duration (ms): -netpol.keep's changes.tsv
	var commits *netlink.Conn
	nettest.Do(b, n.ns, func() (err error) {
		commits, err = netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{Groups: 1 << (unix.NFNLGRP_NFTABLES - 1)})
		return err
	})
	defer func() { _ = commits.Close() }() // also when a change fails the benchmark
	must(commits.SetReadBuffer(8 << 20))
	timeChange := func(what string, i int, change func() error) time.Duration {
		port, err := testkit.PolicyPort(n.ns, "kubenet", local[i])
		must(err)
		before, _, err := testkit.PolicyChains(n.ns, "kubenet", port)
		must(err)
		t0 := time.Now()
		must(change())
		for {
			now, _, err := testkit.PolicyChains(n.ns, "kubenet", port)
			must(err)
			if now != before && now != "" {
				took := time.Since(t0)
				fmt.Fprintf(&timed, "%s\t%s\t%.1f\n", what, t0.UTC().Format(time.RFC3339Nano), float64(took.Microseconds())/1000)
				return took
			}
			if time.Since(t0) > 30*time.Second {
				b.Fatalf("%s never reached the node (ingress chain of port %d still %s)", what, port, now)
			}
			// The next commit, or a second without one (a lost notification costs a second,
			// never the change).
			must(commits.SetReadDeadline(time.Now().Add(time.Second)))
			if _, err := commits.Receive(); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) && !errors.Is(err, unix.ENOBUFS) {
				must(err)
			}
		}
	}
	// Policy changes: policy i (i < Local selects local pod i) gets another ingress port.
	for c := range cpChanges {
		i := c % size.Local
		np := size.Policy(i, 30000+c)
		res.latencies = append(res.latencies, timeChange(fmt.Sprint("policy change ", c), i, func() error {
			old, err := api.NetworkingV1().NetworkPolicies(np.Namespace).Get(ctx, np.Name, metav1.GetOptions{})
			if err == nil {
				old.Spec = np.Spec
				_, err = api.NetworkingV1().NetworkPolicies(np.Namespace).Update(ctx, old, metav1.UpdateOptions{})
			}
			return err
		}))
	}
	// Pod changes: a remote pod of a namespace with team=t0 (pod N*(5+c%5), app=a5) is relabelled
	// app=a1 and back: it enters and leaves the ingress peers of local pod 0 (policy 0), and of
	// every local pod of a t0 namespace.
	relabel := func(name, namespace, app string) error {
		patch := fmt.Sprintf(`{"metadata":{"labels":{"app":%q}}}`, app)
		_, err := api.CoreV1().Pods(namespace).Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		return err
	}
	for c := range cpPodChanges {
		pod := size.Pod(size.Namespaces*(5+c/2%5), "")
		app := "a1"
		if c%2 == 1 {
			app = pod.Labels["app"]
		}
		res.podChanges = append(res.podChanges, timeChange(fmt.Sprint("pod change ", c), 0, func() error { return relabel(pod.Name, pod.Namespace, app) }))
	}
	for c := range cpPodChanges {
		pod := size.Pod(size.Namespaces*(5+c/2%5), "")
		app := "a1"
		if c%2 == 1 {
			app = pod.Labels["app"]
		}
		_, err := n.settledPasses(30*time.Second, quietBefore)
		must(err)
		res.quietChanges = append(res.quietChanges, timeChange(fmt.Sprint("quiet pod change ", c), 0, func() error { return relabel(pod.Name, pod.Namespace, app) }))
	}
	_ = commits.Close() // the churn is not timed: its commits need no reader

	// Churn: cpChurnRate pod changes a second, remote pods moving between the local pods'
	// ingress peers (a1), egress peers (a2) and no peers (a7); the agent's CPU meanwhile.
	churnCtx, stopChurn := context.WithCancel(ctx)
	var churning sync.WaitGroup
	churning.Go(func() {
		tick := time.NewTicker(time.Second / cpChurnRate)
		defer tick.Stop()
		for c := 0; ; c++ {
			select {
			case <-churnCtx.Done():
				return
			case <-tick.C:
			}
			pod := size.Pod(size.Local+c*7919%(size.Pods-size.Local), "")
			if err := relabel(pod.Name, pod.Namespace, []string{"a1", "a2", "a7"}[c%3]); err != nil && churnCtx.Err() == nil {
				b.Errorf("churn: %v", err)
				return
			}
			res.churned = c + 1
		}
	})
	passMetrics := func() (count, seconds float64) {
		m, err := n.metrics()
		must(err)
		return m["kubenet_agent_network_policy_pass_seconds_count"], m["kubenet_agent_network_policy_pass_seconds_sum"]
	}
	count0, sum0 := passMetrics()
	var profiled sync.WaitGroup
	if *netpolProf != "" {
		profiled.Go(func() {
			if err := n.saveCPUProfile(*netpolProf, *netpolChurn); err != nil {
				b.Errorf("agent CPU profile: %v", err)
			}
		})
	}
	res.churnCPU = measureCPU(b, n.agent.Pid(), *netpolChurn)
	profiled.Wait()
	count1, sum1 := passMetrics()
	res.churnPasses, res.churnPassTime = count1-count0, time.Duration((sum1-sum0)*float64(time.Second))
	stopChurn()
	churning.Wait()
	if *netpolHeapProf != "" {
		must(n.saveProfile(*netpolHeapProf, "heap", 0))
	}
	res.rss = procStatus(b, n.agent.Pid(), "VmRSS")
	res.peak = mem.stop()
	if *netpolKeep != "" {
		must(os.MkdirAll(*netpolKeep, 0o755))
		must(os.WriteFile(filepath.Join(*netpolKeep, "changes.tsv"), []byte(timed.String()), 0o644))
		log, err := os.ReadFile(n.logFile())
		must(err)
		must(os.WriteFile(filepath.Join(*netpolKeep, "agent.log"), log, 0o644))
	}

	// A restart: the first pass compiles everything (its time from the agent's log). The agent
	// stops once it has applied the churn's last changes: the first pass measures a restart, not
	// the backlog of changes made while a pass of the churn waited.
	// Passes of the churn take up to about a second each, and a busy pass leaves
	// policy.DefaultBusyGap times its duration before the next.
	_, err = n.settledPasses(2*time.Minute, time.Duration(policy.DefaultBusyGap+2)*time.Second)
	must(err)
	must(n.agent.Stop())
	n.startAgent(b, "--log-level=info", fmt.Sprint("--profiling=", *netpolStartProf != ""))
	mem = sampleRSS(n.agent.Pid())
	if *netpolStartProf != "" {
		// From as soon as the agent serves: its informers' lists, then the first pass.
		must(nettest.WhileRunning(30*time.Second, func() error { return n.saveCPUProfile(*netpolStartProf, 5*time.Second) }, n.agent))
	}
	must(nettest.WhileRunning(120*time.Second, func() error {
		rec, err := logRecord(n.logFile(), "network policy: compiled everything", map[string]string{"localPods": fmt.Sprint(size.Local)})
		if err == nil {
			took, _ := rec["took"].(float64)
			res.firstPass = time.Duration(took)
		}
		return err
	}, n.agent))
	res.peak = max(res.peak, mem.stop())
	md := cpReport(res, began)
	fmt.Println(md) // the benchmark's log is cut short; its table is what it is for
	slices.Sort(res.latencies)
	b.ReportMetric(float64(res.latencies[len(res.latencies)/2])/1e6, "change-p50-ms")
	b.ReportMetric(float64(res.latencies[len(res.latencies)-1])/1e6, "change-max-ms")
	b.ReportMetric(float64(percentile(res.podChanges, 99))/1e6, "pod-change-p99-ms")
	b.ReportMetric(float64(percentile(res.quietChanges, 99))/1e6, "quiet-pod-change-p99-ms")
	b.ReportMetric(res.churnCPU, "churn-cpu-%")
	b.ReportMetric(float64(res.firstPass)/1e6, "first-pass-ms")
	b.ReportMetric(mib(res.peak), "peak-rss-MiB")
	if *netpolOut != "" {
		must(nettest.ReplaceGenerated(*netpolOut, "<!-- begin generated by make bench-netpol: control plane -->", "<!-- end generated by make bench-netpol: control plane -->", md))
	}
}

// percentile is the p-th percentile of ds (nearest rank).
func percentile(ds []time.Duration, p int) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, (len(s)*p+99)/100-1)]
}

// cpReport renders the control-plane results with the goals of issues 14 and 27.
func cpReport(res controlPlaneResult, began time.Time) string {
	size := res.size
	p50, worst := percentile(res.latencies, 50), percentile(res.latencies, 100)
	pod50, pod99 := percentile(res.podChanges, 50), percentile(res.podChanges, 99)
	load, _ := os.ReadFile("/proc/loadavg")
	var b strings.Builder
	fmt.Fprintf(&b, "Run %s, %s in all; load average %s.\n\n", began.UTC().Format("2006-01-02 15:04 MST"), time.Since(began).Round(time.Second), strings.Fields(string(load))[0])
	fmt.Fprintf(&b, "A real kube-apiserver with %d pods (%d on the node) in %d namespaces and %d NetworkPolicies, kubenet-agent on the node (the manifest's RBAC); %d policy updates and %d pod label changes, each timed from just before the API call until the node's ingress map sends a local pod to its new group (read through netlink at each nftables commit of the node); then %s of %d pod label changes a second.\n\n",
		size.Pods, size.Local, size.Namespaces, size.Policies, len(res.latencies), len(res.podChanges), *netpolChurn, cpChurnRate)
	b.WriteString("| measure | value |\n|---|--:|\n")
	fmt.Fprintf(&b, "| policy change → node's rules, p50 | %s |\n| policy change → node's rules, max of %d | %s |\n", p50.Round(100*time.Microsecond), len(res.latencies), worst.Round(100*time.Microsecond))
	fmt.Fprintf(&b, "| pod label change → node's rules, p50 / p99 of %d | %s / %s |\n", len(res.podChanges), pod50.Round(100*time.Microsecond), pod99.Round(100*time.Microsecond))
	fmt.Fprintf(&b, "| the same, each once no pass ran for %s, p50 / p99 of %d | %s / %s |\n", quietBefore, len(res.quietChanges),
		percentile(res.quietChanges, 50).Round(100*time.Microsecond), percentile(res.quietChanges, 99).Round(100*time.Microsecond))
	fmt.Fprintf(&b, "| agent CPU while %d pods change a second (%d changes) | %.1f %% of a core |\n", cpChurnRate, res.churned, res.churnCPU)
	fmt.Fprintf(&b, "| passes meanwhile, and their time in all | %.0f, %s |\n", res.churnPasses, res.churnPassTime.Round(time.Millisecond))
	fmt.Fprintf(&b, "| first pass after a restart (the agent's log) | %s |\n", res.firstPass.Round(time.Millisecond))
	fmt.Fprintf(&b, "| %d pods added one after another on the node → all released (policies in force) | %s |\n", size.Local, res.converge.Round(time.Millisecond))
	fmt.Fprintf(&b, "| agent RSS before the objects / at the end / peak (sampled every 100 ms) | %.1f / %.1f / %.1f MiB |\n", mib(res.idleRSS), mib(res.rss), mib(res.peak))
	yes := func(ok bool) string {
		if ok {
			return "yes"
		}
		return "**no**"
	}
	b.WriteString("\n| goal | measured | met |\n|---|---|---|\n")
	fmt.Fprintf(&b, "| policy change on the node < 1 s | max %s | %s |\n", worst.Round(100*time.Microsecond), yes(worst < time.Second))
	fmt.Fprintf(&b, "| pod change on the node, p99 < 100 ms | %s | %s |\n", pod99.Round(100*time.Microsecond), yes(pod99 < 100*time.Millisecond))
	fmt.Fprintf(&b, "| first full pass < 1 s | %s | %s |\n", res.firstPass.Round(time.Millisecond), yes(res.firstPass > 0 && res.firstPass < time.Second))
	fmt.Fprintf(&b, "| agent CPU < 10 %% of a core at %d pod changes a second | %.1f %% | %s |\n", cpChurnRate, res.churnCPU, yes(res.churnCPU < 10))
	fmt.Fprintf(&b, "| agent memory < 150 MiB | peak %.1f MiB | %s |\n", mib(res.peak), yes(res.peak > 0 && res.peak < 150<<20))
	return b.String()
}

// heldIn counts the pods whose ports have no policy elements (their guards hold them).
func heldIn(n ns.NetNS, pods []*nettest.Pod) (int, error) {
	held := 0
	for _, p := range pods {
		port, err := testkit.PolicyPort(n, "kubenet", p)
		if err != nil {
			return 0, err
		}
		in, out, err := testkit.PolicyChains(n, "kubenet", port)
		if err != nil {
			return 0, err
		}
		if port == 0 || in == "" || out == "" {
			held++
		}
	}
	return held, nil
}

// parallel runs f(0..n-1) with workers goroutines and returns the first error.
func parallel(workers, n int, f func(int) error) error {
	var mu sync.Mutex
	var first error
	next := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := range next {
				if err := f(i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	return first
}
