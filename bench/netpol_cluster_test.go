package bench

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
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

	"github.com/kubenet-dev/kubenet/internal/nettest"
	"github.com/kubenet-dev/kubenet/netpol"
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
	converge  time.Duration // agent start (informers empty) → every local pod released
	latencies samples       // API update of a policy → the node's map points to the new group
	rss, hwm  int64         // the agent's resident memory at the end, and its peak
	idleRSS   int64         // the agent's resident memory before the objects were created
}

func cpAddr(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, 244, byte(2 + i/200), byte(i%200 + 2)})
}

func npControlPlane(b *testing.B) controlPlaneResult {
	var res controlPlaneResult
	bins, err := testkit.BuildAPIServer("..")
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	pluginDir, err := nettest.BuildPlugin(filepath.Join(dir, "plugin"))
	if err != nil {
		b.Fatal(err)
	}
	agentBin, err := nettest.BuildCommand(dir, "kubenet-agent")
	if err != nil {
		b.Fatal(err)
	}
	admin := testkit.Token{Value: "admin-token", User: "admin", Groups: []string{"system:masters"}}
	u := nettest.NewUnderlay(b, 0)
	cp := testkit.StartControlPlane(b, u, netip.MustParsePrefix("192.168.78.10/24"), bins, []testkit.Token{admin})
	api := cp.Admin
	nodeNS := nettest.NewNS(b)
	u.Attach(b, nodeNS, "eth0", netip.MustParsePrefix("192.168.78.11/24"))
	node := &nettest.Node{NS: nodeNS, Dir: dir, CNI: libcni.NewCNIConfigWithCacheDir([]string{filepath.Join(dir, "bin")}, filepath.Join(dir, "cache"), nil)}
	ctx := context.Background()
	must := func(err error) {
		b.Helper()
		if err != nil {
			b.Fatal(err)
		}
	}
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}, Spec: corev1.NodeSpec{PodCIDR: "10.244.1.0/24", PodCIDRs: []string{"10.244.1.0/24"}}}
	_, err = api.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
	must(err)
	kubeconfig := filepath.Join(dir, "kubeconfig")
	must(cp.WriteKubeconfig(kubeconfig, admin.Value))
	agent := nettest.StartProcess(b, nodeNS, filepath.Join(dir, "agent.log"), agentBin,
		"--kubeconfig="+kubeconfig, "--node-name=node-1", "--cluster-cidr=10.244.0.0/16",
		"--cni-conf-dir="+filepath.Join(dir, "net.d"), "--cni-bin-dir="+filepath.Join(dir, "bin"),
		"--cni-bin-source="+filepath.Join(pluginDir, "kubenet"), "--data-dir="+node.DataDir(),
		"--metrics-bind-address=", "--log-level=info")
	conf := filepath.Join(dir, "net.d", "10-kubenet.conflist")
	must(nettest.WhileRunning(60*time.Second, func() error { _, err := os.Stat(conf); return err }, agent))
	res.idleRSS, _ = procMemory(agent.Pid())

	// Namespaces, pods (objects), policies.
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
			nodeName = "node-1"
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
	list, err := libcni.ConfListFromFile(conf)
	must(err)
	start := time.Now()
	local := make([]*nettest.Pod, cpLocal)
	for i := range cpLocal {
		p := node.NewPod(b, fmt.Sprintf("cp-local-%d", i))
		p.RT.Args = [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", fmt.Sprintf("ns-%d", i%10)}, {"K8S_POD_NAME", fmt.Sprintf("pod-%d", i)}}
		node.MustAdd(b, list, p)
		local[i] = p
	}
	must(nettest.WhileRunning(60*time.Second, func() error {
		owners, err := pendingIn(nodeNS)
		if err != nil {
			return err
		}
		if owners > 0 {
			return fmt.Errorf("%d local pods still pending", owners)
		}
		return nil
	}, agent))
	res.converge = time.Since(start)

	// Policy changes: policy i (i < cpLocal selects local pod i) gets another ingress port; the
	// time until the node's ingress map sends the pod to the new group.
	for c := range cpChanges {
		i := c % cpLocal
		ip := local[i].IPs()[0]
		before, err := ingressChain(nodeNS, ip)
		must(err)
		np, err := api.NetworkingV1().NetworkPolicies(fmt.Sprintf("ns-%d", i%10)).Get(ctx, fmt.Sprintf("p%03d", i), metav1.GetOptions{})
		must(err)
		np.Spec = cpPolicy(i, 30000+c).Spec
		t0 := time.Now()
		_, err = api.NetworkingV1().NetworkPolicies(np.Namespace).Update(ctx, np, metav1.UpdateOptions{})
		must(err)
		for {
			now, err := ingressChain(nodeNS, ip)
			must(err)
			if now != before && now != "" {
				break
			}
			if time.Since(t0) > 30*time.Second {
				b.Fatalf("policy change %d never reached the node (ingress chain of %s still %s)", c, ip, now)
			}
			time.Sleep(time.Millisecond)
		}
		res.latencies = append(res.latencies, time.Since(t0))
	}
	res.rss, res.hwm = procMemory(agent.Pid())
	return res
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

// ingressChain is the group chain the node's ingress map names for ip ("" for none).
func ingressChain(n ns.NetNS, ip netip.Addr) (string, error) {
	var chain string
	err := n.Do(func(ns.NetNS) error {
		maps, err := netpol.Dispatch("kubenet")
		chain = maps[netpol.MapIngress4][ip]
		return err
	})
	return chain, err
}

// pendingIn counts the node's pending addresses.
func pendingIn(n ns.NetNS) (int, error) {
	var count int
	err := n.Do(func(ns.NetNS) error {
		owners, err := netpol.PendingOwners("kubenet")
		count = len(owners)
		return err
	})
	return count, err
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

// procMemory reads VmRSS and VmHWM (bytes) of pid.
func procMemory(pid int) (rss, hwm int64) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "VmRSS:":
			rss = v << 10
		case "VmHWM:":
			hwm = v << 10
		}
	}
	return rss, hwm
}
