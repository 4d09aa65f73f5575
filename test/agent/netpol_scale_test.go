//go:build kubenet_e2e_agent

package agent

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/plugins/pkg/ns"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kubenet-dev/kubenet/test/nettest"
	"github.com/kubenet-dev/kubenet/test/testkit"
)

// The control-plane workload: a real kube-apiserver holding cpPods pods (cpLocal of them on
// the node under test, attached through the plugin; the others on nine other nodes, objects
// only) in ten namespaces (ns-k, team=t(k%3)) and cpPolicies NetworkPolicies, and kubenet-agent
// on the node. Pod i lives in ns-(i%10) with app=a((i/10)%20): pods 0-9 are the local ones, one
// per namespace, all app=a0. Policy j lives in ns-(j%10), selects app=a((j/10)%20) (five pods,
// policy k < 10 the local pod of ns-k) and allows ingress from app=a((j/10+1)%20) in the
// namespaces with team=t(j%3) (about 17 pods) on TCP 8000+j, and egress to app=a((j/10+2)%20) in
// every namespace (50 pods) on UDP 53.
const (
	cpPods     = 1000
	cpLocal    = 10
	cpPolicies = 200
	cpChanges  = 20
)

// controlPlaneResult is what the control-plane workload measured.
type controlPlaneResult struct {
	converge  time.Duration   // cpLocal ADDs → every local pod released
	latencies []time.Duration // API update of a policy → the node's map points to the new group
	idleRSS   int64           // the agent's resident memory before the objects were created
	rss, peak int64           // at the end, and the highest sampled (every 100 ms)
}

func cpAddr(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, 244, byte(2 + i/200), byte(i%200 + 2)})
}

var netpolOut = flag.String("netpol.out", "", "markdown file whose control-plane block receives BenchmarkNetworkPolicyScale's table (docs/networkpolicy.md)")

// BenchmarkNetworkPolicyScale measures kubenet-agent's NetworkPolicy controller in a cluster of
// cpPods pods and cpPolicies policies (a real API server; objects only, except the node's own
// pods): how long a policy change takes from the API to the node's rules, how long new pods wait
// for their policies, and the agent's memory. It runs once whatever b.N is (`make bench-netpol`).
// Goals (docs/networkpolicy.md): under 1 s from change to rules, under 150 MiB.
func BenchmarkNetworkPolicyScale(b *testing.B) {
	began := time.Now()
	var res controlPlaneResult
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
	n.startAgent(b, "--log-level=info")
	ctx := context.Background()
	must(nettest.WhileRunning(60*time.Second, func() error { _, err := os.Stat(n.confFile()); return err }, n.agent))
	res.idleRSS = procStatus(b, n.agent.Pid(), "VmRSS")
	mem := sampleRSS(n.agent.Pid())

	for k := range 10 {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("ns-%d", k), Labels: map[string]string{"team": fmt.Sprintf("t%d", k%3)}}}
		_, err := api.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{})
		must(err)
		sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: ns.Name}}
		_, err = api.CoreV1().ServiceAccounts(ns.Name).Create(ctx, sa, metav1.CreateOptions{})
		must(err)
	}
	no := false
	podObj := func(i int, node string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: fmt.Sprintf("ns-%d", i%10), Name: fmt.Sprintf("pod-%d", i), Labels: map[string]string{"app": fmt.Sprintf("a%d", (i/10)%20)}},
			Spec: corev1.PodSpec{NodeName: node, AutomountServiceAccountToken: &no, Containers: []corev1.Container{{Name: "c", Image: "x", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 80}}}}}}
	}
	must(parallel(8, cpPods, func(i int) error {
		nodeName := fmt.Sprintf("node-%d", 2+i%9)
		if i < cpLocal {
			nodeName = n.name
		}
		p, err := api.CoreV1().Pods(fmt.Sprintf("ns-%d", i%10)).Create(ctx, podObj(i, nodeName), metav1.CreateOptions{})
		if err != nil || i < cpLocal {
			return err
		}
		ip := cpAddr(i).String()
		p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}}
		_, err = api.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{})
		return err
	}))
	for j := range cpPolicies {
		_, err := api.NetworkingV1().NetworkPolicies(fmt.Sprintf("ns-%d", j%10)).Create(ctx, cpPolicy(j, 8000+j), metav1.CreateOptions{})
		must(err)
	}

	// The local pods, through the plugin with the agent's conflist: each is pending until the
	// agent has its policies in place.
	list, err := libcni.ConfListFromFile(n.confFile())
	must(err)
	start := time.Now()
	local := make([]*nettest.Pod, cpLocal)
	for i := range cpLocal {
		p := n.cni.NewPod(b, fmt.Sprintf("cp-local-%d", i))
		p.RT.Args = [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", fmt.Sprintf("ns-%d", i%10)}, {"K8S_POD_NAME", fmt.Sprintf("pod-%d", i)}}
		n.cni.MustAdd(b, list, p)
		local[i] = p
	}
	must(nettest.WhileRunning(60*time.Second, func() error {
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

	// Policy changes: policy i (i < cpLocal selects local pod i) gets another ingress port; the
	// time until the node's ingress map sends the pod to the new group.
	for c := range cpChanges {
		i := c % cpLocal
		port, err := testkit.PolicyPort(n.ns, "kubenet", local[i])
		must(err)
		before, _, err := testkit.PolicyChains(n.ns, "kubenet", port)
		must(err)
		np, err := api.NetworkingV1().NetworkPolicies(fmt.Sprintf("ns-%d", i%10)).Get(ctx, fmt.Sprintf("p%03d", i), metav1.GetOptions{})
		must(err)
		np.Spec = cpPolicy(i, 30000+c).Spec
		t0 := time.Now()
		_, err = api.NetworkingV1().NetworkPolicies(np.Namespace).Update(ctx, np, metav1.UpdateOptions{})
		must(err)
		for {
			now, _, err := testkit.PolicyChains(n.ns, "kubenet", port)
			must(err)
			if now != before && now != "" {
				break
			}
			if time.Since(t0) > 30*time.Second {
				b.Fatalf("policy change %d never reached the node (ingress chain of port %d still %s)", c, port, now)
			}
			time.Sleep(time.Millisecond)
		}
		res.latencies = append(res.latencies, time.Since(t0))
	}
	res.rss = procStatus(b, n.agent.Pid(), "VmRSS")
	res.peak = mem.stop()
	md := cpReport(res, began)
	b.Log("\n" + md)
	slices.Sort(res.latencies)
	b.ReportMetric(float64(res.latencies[len(res.latencies)/2])/1e6, "change-p50-ms")
	b.ReportMetric(float64(res.latencies[len(res.latencies)-1])/1e6, "change-max-ms")
	b.ReportMetric(mib(res.peak), "peak-rss-MiB")
	if *netpolOut != "" {
		must(nettest.ReplaceGenerated(*netpolOut, "<!-- begin generated by make bench-netpol: control plane -->", "<!-- end generated by make bench-netpol: control plane -->", md))
	}
}

// cpReport renders the control-plane results with the goals of issue 14.
func cpReport(res controlPlaneResult, began time.Time) string {
	lat := slices.Clone(res.latencies)
	slices.Sort(lat)
	p50, worst := lat[len(lat)/2], lat[len(lat)-1]
	load, _ := os.ReadFile("/proc/loadavg")
	var b strings.Builder
	fmt.Fprintf(&b, "Run %s, %s in all; load average %s.\n\n", began.UTC().Format("2006-01-02 15:04 MST"), time.Since(began).Round(time.Second), strings.Fields(string(load))[0])
	fmt.Fprintf(&b, "A real kube-apiserver with %d pods (%d on the node) and %d NetworkPolicies, kubenet-agent on the node (the manifest's RBAC); %d policy updates, each timed from just before the API call until the node's ingress map sends the pod to its new group (read through netlink every millisecond).\n\n", cpPods, cpLocal, cpPolicies, cpChanges)
	b.WriteString("| measure | value |\n|---|--:|\n")
	fmt.Fprintf(&b, "| policy change → node's rules, p50 | %s |\n| policy change → node's rules, max of %d | %s |\n", p50.Round(100*time.Microsecond), len(lat), worst.Round(100*time.Microsecond))
	fmt.Fprintf(&b, "| %d pods added one after another on the node → all released (policies in force) | %s |\n", cpLocal, res.converge.Round(time.Millisecond))
	fmt.Fprintf(&b, "| agent RSS before the objects / at the end / peak (sampled every 100 ms) | %.1f / %.1f / %.1f MiB |\n", mib(res.idleRSS), mib(res.rss), mib(res.peak))
	yes := func(ok bool) string {
		if ok {
			return "yes"
		}
		return "**no**"
	}
	b.WriteString("\n| goal | measured | met |\n|---|---|---|\n")
	fmt.Fprintf(&b, "| policy change on the node < 1 s (%d pods, %d policies) | max %s | %s |\n", cpPods, cpPolicies, worst.Round(100*time.Microsecond), yes(worst < time.Second))
	fmt.Fprintf(&b, "| agent memory < 150 MiB at that size | peak %.1f MiB | %s |\n", mib(res.peak), yes(res.peak > 0 && res.peak < 150<<20))
	return b.String()
}

// cpPolicy is policy j of the control-plane workload with ingress port port.
func cpPolicy(j, port int) *networkingv1.NetworkPolicy {
	tcp, udp := corev1.ProtocolTCP, corev1.ProtocolUDP
	p, dns := intstr.FromInt32(int32(port)), intstr.FromInt32(53)
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: fmt.Sprintf("ns-%d", j%10), Name: fmt.Sprintf("p%03d", j)},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("a%d", (j/10)%20)}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From: []networkingv1.NetworkPolicyPeer{{
					NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": fmt.Sprintf("t%d", j%3)}},
					PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("a%d", (j/10+1)%20)}},
				}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &p}},
			}},
			Egress: []networkingv1.NetworkPolicyEgressRule{{
				To:    []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{}, PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("a%d", (j/10+2)%20)}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: &udp, Port: &dns}},
			}},
		}}
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
