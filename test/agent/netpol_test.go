//go:build kubenet_e2e_agent

package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/plugins/pkg/ns"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/kubenet-dev/kubenet/agent/policy"
	"github.com/kubenet-dev/kubenet/netpol"
	"github.com/kubenet-dev/kubenet/test/nettest"
	"github.com/kubenet-dev/kubenet/test/testkit"
)

// createPod makes a pod object bound to node, as the scheduler would leave it before the kubelet
// runs its sandbox (the default ServiceAccount is made first: no controller-manager runs here).
func createPod(t testing.TB, api kubernetes.Interface, namespace, name, node string, labels map[string]string) {
	t.Helper()
	ctx := context.Background()
	if _, err := api.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: namespace}}
	if _, err := api.CoreV1().ServiceAccounts(namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	no := false
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, Labels: labels},
		Spec: corev1.PodSpec{NodeName: node, AutomountServiceAccountToken: &no,
			Containers: []corev1.Container{{Name: "c", Image: "kubenet-e2e/none", Ports: []corev1.ContainerPort{{Name: "echo", ContainerPort: 7777}}}}},
	}
	if _, err := api.CoreV1().Pods(namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod %s/%s: %v", namespace, name, err)
	}
}

// npPod prepares (without adding) a pod sandbox on n named namespace/name whose address is
// pinned with the ipRanges capability, so a client can aim at it before it exists.
func npPod(t *testing.T, n *simNode, namespace, name string, addrs ...netip.Addr) *nettest.Pod {
	t.Helper()
	p := n.cni.NewPod(t, fmt.Sprintf("%s-%s", namespace, name))
	p.RT.Args = [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", namespace}, {"K8S_POD_NAME", name}}
	var ranges [][]map[string]string
	for _, a := range addrs {
		cidr := podCIDRs(1)[0]
		if a.Is6() {
			cidr = podCIDRs(1)[1]
		}
		ranges = append(ranges, []map[string]string{{"subnet": cidr.String(), "rangeStart": a.String(), "rangeEnd": a.String()}})
	}
	if len(ranges) > 0 {
		p.RT.CapabilityArgs = map[string]any{"ipRanges": ranges}
	}
	return p
}

// hammer connects from src to every dst in tight loops (four per destination, a fresh
// connection each time, each attempt bounded by 50 ms) until stop is closed, and counts the
// connections that got through.
type hammer struct {
	attempts, successes atomic.Int64
	stop                chan struct{}
	wg                  sync.WaitGroup
}

func startHammer(src ns.NetNS, dsts ...netip.AddrPort) *hammer {
	h := &hammer{stop: make(chan struct{})}
	for _, dst := range slices.Concat(dsts, dsts, dsts, dsts) {
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			dial := nettest.DialIn(src)
			for {
				select {
				case <-h.stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
				c, err := dial(ctx, "tcp", dst.String())
				cancel()
				h.attempts.Add(1)
				if err == nil {
					h.successes.Add(1)
					c.Close()
				} else if !isTimeout(err) {
					time.Sleep(5 * time.Millisecond) // refused or unreachable: the kernel answered at once
				}
			}
		}()
	}
	return h
}

func isTimeout(err error) bool {
	var ne net.Error
	return (errors.As(err, &ne) && ne.Timeout()) || strings.Contains(err.Error(), "deadline")
}

func (h *hammer) halt() (attempts, successes int64) {
	close(h.stop)
	h.wg.Wait()
	return h.attempts.Load(), h.successes.Load()
}

func netpolOf(namespace, name string, spec networkingv1.NetworkPolicySpec) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}, Spec: spec}
}

// policyTable lists the node's policy tables the way an operator would.
func policyTable(t *testing.T, n *simNode) string {
	t.Helper()
	out, err := policyTables(n)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func policyTables(n *simNode) (string, error) {
	var all string
	for _, family := range []string{"bridge", "inet"} {
		out, err := nettest.Output(n.ns, "nft", "list", "table", family, netpol.TableName("kubenet"))
		if err != nil {
			return "", err
		}
		all += out
	}
	// The drop counters' values move with traffic and start again with the table: what the
	// tests compare are the rules and elements.
	return counterValues.ReplaceAllString(all, "packets - bytes -"), nil
}

var counterValues = regexp.MustCompile(`packets [0-9]+ bytes [0-9]+`)

// startPolicyNode makes n's Node object, starts its agent with the extra flags, waits until it
// is ready and returns its conflist, which must turn NetworkPolicy on.
func startPolicyNode(t *testing.T, api kubernetes.Interface, n *simNode, extra ...string) *libcni.NetworkConfigList {
	t.Helper()
	createNode(t, api, nodeObject(n.name, n.addrs, podCIDRs(1)))
	n.startAgent(t, extra...)
	if err := nettest.Eventually(converge, func() error {
		if code, body, err := n.get("/readyz"); err != nil || code != 200 {
			return fmt.Errorf("/readyz %d %q %v", code, body, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	list, err := libcni.ConfListFromFile(n.confFile())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(list.Bytes), `"networkPolicy": true`) {
		t.Fatalf("conflist without networkPolicy:\n%s", list.Bytes)
	}
	return list
}

// heldPod tells whether p's port has no policy elements (its guard holds it).
func heldPod(t *testing.T, n *simNode, p *nettest.Pod) bool {
	t.Helper()
	port, err := testkit.PolicyPort(n.ns, "kubenet", p)
	if err != nil {
		t.Fatal(err)
	}
	in, out, err := testkit.PolicyChains(n.ns, "kubenet", port)
	if err != nil {
		t.Fatal(err)
	}
	return port == 0 || in == "" || out == ""
}

// TestAgentNetworkPolicy runs kubenet-agent with NetworkPolicy on (the manifest's flags and RBAC)
// against a real API server and checks what no kernel test can: that a pod's policy holds from
// its first packet on (a denied client hammering the pod's address from before its ADD never
// gets through, in either direction, while the same hammer does get through once allowed), and
// that the rules stay while the agent is down and are reconciled when it is back.
func TestAgentNetworkPolicy(t *testing.T) {
	u, cp, agentUser := startCluster(t)
	api := cp.Admin
	ctx := context.Background()

	n := newSimNode(t, u, cp, "node-1", 1, agentUser)
	list := startPolicyNode(t, api, n)

	const namespace = "np"
	podAddr := func(i int) []netip.Addr {
		return []netip.Addr{netip.MustParseAddr(fmt.Sprintf("10.244.1.%d", 100+i)), netip.MustParseAddr(fmt.Sprintf("fd00:10:244:1::%d", 100+i))}
	}
	// The client, and a server for egress checks, both unrestricted.
	createPod(t, api, namespace, "client", n.name, map[string]string{"app": "client"})
	client := npPod(t, n, namespace, "client", podAddr(0)...)
	n.cni.MustAdd(t, list, client)
	clientSrv := nettest.StartTCPEcho(t, client.NS, netip.AddrPortFrom(netip.IPv6Unspecified(), 7777))
	if err := nettest.Eventually(converge, func() error {
		_, err := nettest.TCPRequest(client.NS, netip.AddrPortFrom(client.IPs()[0], 7777), "self", time.Second)
		return err
	}); err != nil {
		t.Fatalf("the client is never released: %v\n%s", err, policyTable(t, n))
	}
	_ = clientSrv

	denyTarget := netpolOf(namespace, "deny-target", networkingv1.NetworkPolicySpec{
		PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "target"}},
		PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
	})
	if _, err := api.NetworkingV1().NetworkPolicies(namespace).Create(ctx, denyTarget, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// startWindow adds a pod called name (app=target) at address i while the client hammers it
	// and the pod hammers the client, from before its ADD until well after the agent has
	// installed its rules, and returns how many connections got through each way.
	// The pods live as long as the whole test (outer), not the subtest that starts them.
	outer := t
	startWindow := func(t *testing.T, name string, i int) (in, out int64, pod *nettest.Pod) {
		createPod(t, api, namespace, name, n.name, map[string]string{"app": "target"})
		pod = npPod(outer, n, namespace, name, podAddr(i)...)
		// The pod's server listens before its interface exists, as a container started early
		// would; so does its own client loop, which fails (no route) until ADD.
		nettest.StartTCPEcho(outer, pod.NS, netip.AddrPortFrom(netip.IPv6Unspecified(), 7777))
		var inDsts, outDsts []netip.AddrPort
		for j, a := range podAddr(i) {
			inDsts = append(inDsts, netip.AddrPortFrom(a, 7777))
			outDsts = append(outDsts, netip.AddrPortFrom(podAddr(0)[j], 7777))
		}
		hin, hout := startHammer(client.NS, inDsts...), startHammer(pod.NS, outDsts...)
		time.Sleep(300 * time.Millisecond) // part of the measurement: the hammers run before ADD
		n.cni.MustAdd(outer, list, pod)
		// Until the agent has released the pod (its port in the maps), and a second more on top.
		if err := nettest.Eventually(converge, func() error {
			if heldPod(t, n, pod) {
				return fmt.Errorf("still held")
			}
			return nil
		}); err != nil {
			links, _ := nettest.Output(n.ns, "ip", "-o", "link")
			t.Fatalf("%s: %v\n%s\n%s", name, err, policyTable(t, n), links)
		}
		time.Sleep(time.Second)
		inAttempts, in := hin.halt()
		outAttempts, out := hout.halt()
		t.Logf("%s: %d attempts in (%d through), %d out (%d through)", name, inAttempts, in, outAttempts, out)
		if inAttempts < 20 || outAttempts < 20 {
			t.Errorf("the hammers made only %d and %d attempts: not a tight loop", inAttempts, outAttempts)
		}
		return in, out, pod
	}

	var target1 *nettest.Pod
	t.Run("pod start: denied from its first packet", func(t *testing.T) {
		var in, out int64
		in, out, target1 = startWindow(t, "target-1", 1)
		if in != 0 || out != 0 {
			t.Errorf("%d connections reached the new pod and %d left it, before or after its policy was in force; want none", in, out)
		}
	})

	t.Run("pod start: the same hammer gets through when allowed (control)", func(t *testing.T) {
		allow := netpolOf(namespace, "allow-client", networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "target"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
			Ingress:     []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}}}}}},
			Egress:      []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}}}}}},
		})
		if _, err := api.NetworkingV1().NetworkPolicies(namespace).Create(ctx, allow, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		in, out, _ := startWindow(t, "target-2", 2)
		if in == 0 || out == 0 {
			t.Errorf("with the client allowed, %d connections in and %d out got through; want some each way", in, out)
		}
		if err := api.NetworkingV1().NetworkPolicies(namespace).Delete(ctx, "allow-client", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	})

	// targetDenied waits until the client cannot reach target-1 (allow-client was deleted).
	targetDenied := func(t *testing.T, target netip.AddrPort) {
		t.Helper()
		if err := nettest.Eventually(converge, func() error {
			if _, err := nettest.TCPRequest(client.NS, target, "x", 500*time.Millisecond); err == nil {
				return fmt.Errorf("the client reaches target-1 after allow-client was deleted")
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("flushed ruleset: the policies come back without waiting for the resync", func(t *testing.T) {
		target := netip.AddrPortFrom(podAddr(1)[0], 7777)
		targetDenied(t, target)
		before := policyTable(t, n)
		start := time.Now()
		nettest.Run(t, n.ns, "nft", "flush", "ruleset")
		// The healer sees the flush as an nftables event and wakes the policy controller; a
		// third of the controller's resync tells that apart from its timer.
		err := nettest.Eventually(policy.DefaultResync/3, func() error {
			table, err := policyTables(n)
			if err != nil {
				return fmt.Errorf("no policy table: %v", err)
			}
			for _, l := range strings.Split(before, "\n") {
				if !strings.Contains(table, l) {
					return fmt.Errorf("the policy table lacks %q", l)
				}
			}
			if _, err := nettest.TCPRequest(client.NS, target, "x", 300*time.Millisecond); err == nil {
				return fmt.Errorf("the client reaches target-1")
			}
			return nil
		})
		if err != nil {
			t.Fatalf("after nft flush ruleset: %v", err)
		}
		t.Logf("the policies were back %v after the flush", time.Since(start).Round(time.Millisecond))
	})

	t.Run("explain and trace: from the kernel, against traffic and the API", func(t *testing.T) {
		if target1 == nil {
			t.Fatal("target-1 was not started (its subtest failed)")
		}
		target := netip.AddrPortFrom(podAddr(1)[0], 7777)
		targetDenied(t, target)
		ctl := func(args ...string) string {
			return nettest.Run(t, n.ns, testBins.ctl, append([]string{"--kubenet-data-dir", n.cni.DataDir()}, args...)...)
		}
		explain := func() string {
			return ctl("policy", "explain", namespace+"/target-1", "--kubeconfig", cp.AdminKubeconfig)
		}
		expectSaid := func(what, out string, want ...string) {
			t.Helper()
			flat := strings.Join(strings.Fields(out), " ")
			for _, w := range want {
				if !strings.Contains(flat, w) {
					t.Errorf("%s does not say %q:\n%s", what, w, out)
				}
			}
		}
		reaches := func() bool {
			_, err := nettest.TCPRequest(client.NS, target, "x", 700*time.Millisecond)
			return err == nil
		}
		expectSaid("explain, settled", explain(),
			"ingress: isolated by np/deny-target (group in-", "egress: isolated by np/deny-target (group out-", "allows nothing",
			"agent: the kernel holds what the agent's last pass installed", "API: in sync")
		expectSaid("trace client → target-1", ctl("policy", "trace", "np/client", "np/target-1", "7777/tcp"),
			"7777/tcp from np/client (10.244.1.100) to np/target-1 (10.244.1.101): denied", "egress of np/client", "not isolated for egress",
			"ingress of np/target-1", "no element of group in-", "dropped by its last rule", "isolated for ingress by np/deny-target")
		if reaches() {
			t.Error("trace says denied, the client reaches target-1")
		}

		// The agent down and a policy allowing the client: the kernel is behind the API.
		n.agent.Kill()
		port := intstr.FromInt32(7777)
		allowIn := netpolOf(namespace, "allow-client-in", networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "target"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Port: &port}},
			}},
		})
		if _, err := api.NetworkingV1().NetworkPolicies(namespace).Create(ctx, allowIn, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		expectSaid("explain, agent down", explain(), "API: pending", "ingress: the API's objects mean in-",
			"(isolated by np/allow-client-in, np/deny-target)", "to allow, not in the kernel: 10.244.1.100 tcp/7777")
		expectSaid("trace, agent down", ctl("policy", "trace", "np/client", "np/target-1", "7777/tcp"), "denied", "no element of group in-")
		if reaches() {
			t.Error("agent down: trace says denied, the client reaches target-1")
		}

		// The agent back: the kernel catches up, and trace's verdict with the traffic.
		n.startAgent(t)
		if err := nettest.Eventually(converge, func() error {
			if !reaches() {
				return errors.New("the client does not reach target-1")
			}
			return nil
		}); err != nil {
			t.Fatalf("%v\n%s", err, policyTable(t, n))
		}
		expectSaid("explain, agent back", explain(), "API: in sync",
			"ingress: isolated by np/allow-client-in, np/deny-target (group in-", "allows from 10.244.1.100 tcp/7777",
			"agent: the kernel holds what the agent's last pass installed")
		expectSaid("trace, agent back", ctl("policy", "trace", "np/client", "np/target-1", "7777/tcp"),
			"7777/tcp from np/client (10.244.1.100) to np/target-1 (10.244.1.101): allowed", "element 10.244.1.100 tcp/7777")
		expectSaid("trace, other port", ctl("policy", "trace", "np/client", "np/target-1", "7778/tcp"), "denied")
		expectSaid("trace target-1 → client", ctl("policy", "trace", "np/target-1", "np/client", "7777/tcp", "-o", "json"), `"allowed":false`, `"direction":"egress"`)
		if _, err := nettest.TCPRequest(target1.NS, netip.AddrPortFrom(podAddr(0)[0], 7777), "x", 700*time.Millisecond); err == nil {
			t.Error("trace says target-1's egress denies, target-1 reaches the client")
		}
		if err := api.NetworkingV1().NetworkPolicies(namespace).Delete(ctx, "allow-client-in", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		targetDenied(t, target)
	})

	t.Run("agent down: rules kept; back: reconciled", func(t *testing.T) {
		target := netip.AddrPortFrom(podAddr(1)[0], 7777)
		targetDenied(t, target)
		before := policyTable(t, n)
		n.agent.Kill()
		// While it is down: the same rules, the same verdicts, also for a policy change the
		// agent cannot see and for a pod that starts meanwhile (it stays pending: denied).
		allowAll := netpolOf(namespace, "allow-all", networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
			Ingress:     []networkingv1.NetworkPolicyIngressRule{{}},
			Egress:      []networkingv1.NetworkPolicyEgressRule{{}},
		})
		if _, err := api.NetworkingV1().NetworkPolicies(namespace).Create(ctx, allowAll, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		createPod(t, api, namespace, "while-down", n.name, map[string]string{"app": "other"})
		late := npPod(t, n, namespace, "while-down", podAddr(3)...)
		n.cni.MustAdd(t, list, late)
		nettest.StartTCPEcho(t, late.NS, netip.AddrPortFrom(netip.IPv6Unspecified(), 7777))
		time.Sleep(2 * time.Second) // the agent stays down for a while: nothing may change
		if _, err := nettest.TCPRequest(client.NS, target, "x", 700*time.Millisecond); err == nil {
			t.Error("with the agent down, target-1 became reachable")
		}
		if _, err := nettest.TCPRequest(client.NS, netip.AddrPortFrom(podAddr(3)[0], 7777), "x", 700*time.Millisecond); err == nil {
			t.Error("with the agent down, a pod started meanwhile is reachable before its policies are known")
		}
		during := policyTable(t, n)
		for _, l := range strings.Split(before, "\n") {
			if !strings.Contains(during, l) {
				t.Errorf("while the agent is down, the policy table lost %q", l)
			}
		}
		if !heldPod(t, n, late) {
			t.Errorf("the pod added while the agent is down is not held:\n%s", during)
		}
		n.startAgent(t)
		for _, dst := range []netip.AddrPort{target, netip.AddrPortFrom(podAddr(3)[0], 7777), netip.AddrPortFrom(podAddr(3)[1], 7777)} {
			if err := nettest.Eventually(converge, func() error {
				_, err := nettest.TCPRequest(client.NS, dst, "x", time.Second)
				return err
			}); err != nil {
				t.Errorf("after the agent's restart, %s stays unreachable under allow-all: %v\n%s", dst, err, policyTable(t, n))
			}
		}
	})
}
