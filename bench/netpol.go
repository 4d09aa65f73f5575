package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kubenet-dev/kubenet/agent/policy"
	"github.com/kubenet-dev/kubenet/core"
	"github.com/kubenet-dev/kubenet/internal/policyrules"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

// The data-path workload of docs/networkpolicy.md: two pods on one node, a client and a server,
// and nPolicies NetworkPolicies that all select both (label np-bench=yes). Policy 0 lets the
// client reach the server's port; every other policy i allows ingress from pods labelled tier=t<i>
// (one peer pod each, on another node) on port 10000+i and egress to 172.16.<i>.0/24 on UDP
// port 20000+i, so each connection is judged against the union of all of them.
const (
	npServerPort = 8080
	npNamespace  = "bench"
)

// npWorkload holds the objects the policy engines are fed.
type npWorkload struct {
	namespaces []*corev1.Namespace
	pods       []*corev1.Pod // the two local ones first
	policies   []*networkingv1.NetworkPolicy
}

func npObjects(nPolicies int, nodeName string, client, server netip.Addr) npWorkload {
	var w npWorkload
	w.namespaces = []*corev1.Namespace{{ObjectMeta: metav1.ObjectMeta{Name: npNamespace, Labels: map[string]string{"kubernetes.io/metadata.name": npNamespace}}}}
	pod := func(name, node string, ip netip.Addr, labels map[string]string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: npNamespace, Name: name, Labels: labels, UID: types.UID("uid-" + name)},
			Spec:   corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "x"}}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip.String(), PodIPs: []corev1.PodIP{{IP: ip.String()}}}}
	}
	w.pods = append(w.pods,
		pod("client", nodeName, client, map[string]string{"np-bench": "yes", "app": "client"}),
		pod("server", nodeName, server, map[string]string{"np-bench": "yes", "app": "server"}))
	both := []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}
	tcp, udp := corev1.ProtocolTCP, corev1.ProtocolUDP
	port := func(proto *corev1.Protocol, p int) []networkingv1.NetworkPolicyPort {
		v := intstr.FromInt32(int32(p))
		return []networkingv1.NetworkPolicyPort{{Protocol: proto, Port: &v}}
	}
	sel := func(kv ...string) *metav1.LabelSelector {
		return &metav1.LabelSelector{MatchLabels: map[string]string{kv[0]: kv[1]}}
	}
	for i := range nPolicies {
		np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: npNamespace, Name: fmt.Sprintf("p%03d", i)},
			Spec: networkingv1.NetworkPolicySpec{PodSelector: *sel("np-bench", "yes"), PolicyTypes: both}}
		if i == 0 {
			np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: sel("app", "client")}}, Ports: port(&tcp, npServerPort)}}
			np.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{{PodSelector: sel("app", "server")}}, Ports: port(&tcp, npServerPort)}}
		} else {
			tier := fmt.Sprintf("t%d", i)
			w.pods = append(w.pods, pod("peer-"+tier, "elsewhere", netip.AddrFrom4([4]byte{10, 244, 200 + byte(i/250), byte(i%250 + 1)}), map[string]string{"tier": tier}))
			np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: sel("tier", tier)}}, Ports: port(&tcp, 10000+i)}}
			np.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: fmt.Sprintf("172.16.%d.0/24", i%256)}}}, Ports: port(&udp, 20000+i)}}
		}
		w.policies = append(w.policies, np)
	}
	return w
}

// applyKubenet compiles w for the node's attachments and applies it, as one agent pass does.
func applyKubenet(t testing.TB, node ns.NetNS, dataDir string, w npWorkload) core.PolicyPass {
	t.Helper()
	var pass core.PolicyPass
	nettest.Do(t, node, func() (err error) { pass, err = applyPolicies(dataDir, w); return err })
	return pass
}

// applyPolicies is applyKubenet's pass, in the node's netns already.
func applyPolicies(dataDir string, w npWorkload) (core.PolicyPass, error) {
	return applyPoliciesLogging(dataDir, w, policyrules.DropLog{})
}

// applyPoliciesLogging is applyPolicies with the drop log's setting.
func applyPoliciesLogging(dataDir string, w npWorkload, log policyrules.DropLog) (core.PolicyPass, error) {
	in := policy.Input{Namespaces: w.namespaces, Pods: w.pods, Policies: w.policies}
	return core.ApplyPolicies(core.PolicyNetwork{DataDir: dataDir, Network: "kubenet", Bridge: core.DefaultBridge, Log: log}, func(locals []core.PolicyLocal) policyrules.Ruleset {
		in.Local = policy.LocalsOf(locals)
		return policy.Compile(in).Ruleset
	})
}

// roundRatio is the ratio of the means of one round's samples x(i) of mode b to those of the
// other mode, the round's modes being order.
func roundRatio(order []string, b string, x func(i int) float64) float64 {
	var sum [2]float64
	for i, mode := range order {
		if mode == b {
			sum[1] += x(i)
		} else {
			sum[0] += x(i)
		}
	}
	return sum[1] / sum[0]
}

// npNode is the node of the NetworkPolicy workloads: the plugin with networkPolicy on, a client
// and a server pod of namespace npNamespace, the server accepting connections on npServerPort
// (conns) and on a port no policy allows (denied).
type npNode struct {
	node               *nettest.Node
	list               *libcni.NetworkConfigList
	client, server     *nettest.Pod
	clientIP, serverIP netip.Addr
	conns, denied      netip.AddrPort
}

func newNPNode(b *testing.B) *npNode {
	binDir, err := nettest.BuildPlugin(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	n := &npNode{node: nettest.NewNode(b, binDir)}
	// Every connection of the workload leaves a conntrack entry in the node; short timeouts in
	// the node's own namespace keep them from piling up (the table is shared by the machine).
	for _, k := range []string{"nf_conntrack_tcp_timeout_time_wait", "nf_conntrack_tcp_timeout_close", "nf_conntrack_tcp_timeout_fin_wait", "nf_conntrack_tcp_timeout_close_wait", "nf_conntrack_tcp_timeout_last_ack"} {
		nettest.WriteSysctl(b, n.node.NS, "net/netfilter/"+k, "1")
	}
	n.list = n.node.ConfList(b, nettest.NetConf{PodCIDRs: []netip.Prefix{nettest.PodCIDR4}, NonMasqueradeCIDRs: []netip.Prefix{nettest.NonMasquerade4}, Extra: map[string]any{"networkPolicy": true}})
	n.client, n.server = n.pod(b, "client"), n.pod(b, "server")
	n.clientIP, n.serverIP = n.client.IPs()[0], n.server.IPs()[0]
	n.conns = connServer(b, n.server.NS, netip.AddrPortFrom(n.serverIP, npServerPort))
	n.denied = connServer(b, n.server.NS, netip.AddrPortFrom(n.serverIP, 9999))
	return n
}

// pod adds pod name of namespace npNamespace to the node.
func (n *npNode) pod(b *testing.B, name string) *nettest.Pod {
	p := n.newPod(b, name)
	n.node.MustAdd(b, n.list, p)
	return p
}

// newPod is pod name of namespace npNamespace, not added yet.
func (n *npNode) newPod(b *testing.B, name string) *nettest.Pod {
	p := n.node.NewPod(b, "np-bench-"+name)
	p.RT.Args = [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", npNamespace}, {"K8S_POD_NAME", name}}
	return p
}

// connServer accepts TCP connections and closes each at once: the client sees EOF, so the
// server side holds the TIME_WAIT and the client's ports are free again at once.
func connServer(t testing.TB, n ns.NetNS, addr netip.AddrPort) netip.AddrPort {
	t.Helper()
	var l net.Listener
	nettest.Do(t, n, func() (err error) { l, err = net.Listen("tcp", addr.String()); return err })
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	return netip.MustParseAddrPort(l.Addr().String())
}

// cpuMeter reads the CPU time spent on the workload: this process (both pods' sockets, and the
// kernel's work on their packets, which runs in the sending thread's context on veths) plus any
// helper process (kube-network-policies' verdicts are made in its own process).
type cpuMeter struct{ pids []int }

func (m cpuMeter) now() time.Duration {
	var ru unix.Rusage
	_ = unix.Getrusage(unix.RUSAGE_SELF, &ru)
	d := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	for _, pid := range m.pids {
		d += procCPU(pid)
	}
	return d
}

// procCPU is the user and system time of pid (/proc/<pid>/stat, in ticks of 10 ms).
func procCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0
	}
	var ut, st int64
	fmt.Sscan(f[11], &ut)
	fmt.Sscan(f[12], &st)
	return time.Duration(ut+st) * 10 * time.Millisecond
}

// connResult is one measurement of new connections.
type connResult struct {
	perSecond float64       // completed connections per second of wall time
	cpuEach   time.Duration // CPU time per completed connection
	failed    int64
}

// connRate opens connections from inside src to dst with workers goroutines for window and
// returns the completed connections (connect, then EOF from the server) per second and the CPU
// each cost. Failed attempts are counted apart: a policy that drops the SYN must not look like a
// fast one. On a shared machine the wall-clock rate moves with everybody else's load; the CPU a
// connection costs does not, and on a node whose CPU is the limit it decides the rate.
func connRate(src ns.NetNS, dst netip.AddrPort, workers int, window time.Duration, cpu cpuMeter) connResult {
	var ok, failed atomic.Int64
	var wg sync.WaitGroup
	stop := time.Now().Add(window)
	dial := nettest.DialIn(src)
	start, cpu0 := time.Now(), cpu.now()
	for range workers {
		wg.Go(func() {
			buf := make([]byte, 1)
			for time.Now().Before(stop) {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				c, err := dial(ctx, "tcp", dst.String())
				cancel()
				if err != nil {
					failed.Add(1)
					continue
				}
				_ = c.SetReadDeadline(time.Now().Add(time.Second))
				if _, err := c.Read(buf); err != io.EOF {
					failed.Add(1)
				} else {
					ok.Add(1)
				}
				_ = c.Close()
			}
		})
	}
	wg.Wait()
	took, used := time.Since(start), cpu.now()-cpu0
	r := connResult{perSecond: float64(ok.Load()) / took.Seconds(), failed: failed.Load()}
	if n := ok.Load(); n > 0 {
		r.cpuEach = used / time.Duration(n)
	}
	return r
}

// streamResult is one throughput measurement.
type streamResult struct {
	bitsPerSecond float64
	cpuPerGB      time.Duration // CPU time per 10^9 bytes received
}

// streamRate sends one TCP stream from inside src to sink for warmup+window and returns the rate
// at which the sink received during window, and the CPU time per gigabyte over that window.
func streamRate(src ns.NetNS, sink *nettest.Sink, warmup, window time.Duration, cpu cpuMeter) (streamResult, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	c, err := nettest.DialIn(src)(ctx, "tcp", sink.Addr.String())
	cancel()
	if err != nil {
		return streamResult{}, fmt.Errorf("connect to sink %s: %w", sink.Addr, err)
	}
	done := make(chan error, 1)
	go func() {
		buf := make([]byte, 64<<10)
		for {
			if _, err := c.Write(buf); err != nil {
				done <- err
				return
			}
		}
	}()
	time.Sleep(warmup) // part of the measurement: slow start is not counted
	t0, b0, c0 := time.Now(), sink.Received(), cpu.now()
	time.Sleep(window)
	t1, b1, c1 := time.Now(), sink.Received(), cpu.now()
	c.Close()
	<-done
	got := b1 - b0
	if got <= 0 {
		return streamResult{}, fmt.Errorf("stream to %s: nothing received", sink.Addr)
	}
	return streamResult{bitsPerSecond: float64(got) * 8 / t1.Sub(t0).Seconds(), cpuPerGB: (c1 - c0) * time.Duration(1e9) / time.Duration(got)}, nil
}

// knp is kube-network-policies v0.8.0 built from hack/knp (its own module).
type knp struct{ bin string }

// buildKNP builds hack/knp into dir. The engine and one of its dependencies are not in the Go
// checksum database, hence GONOSUMDB for their two module paths.
func buildKNP(dir string) (knp, error) {
	out := filepath.Join(dir, "knp-bench")
	cmd := exec.Command("go", "build", "-o", out, ".")
	cmd.Dir = filepath.Join("..", "hack", "knp")
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod", "GONOSUMDB=sigs.k8s.io/kube-network-policies,sigs.k8s.io/network-policy-api")
	if b, err := cmd.CombinedOutput(); err != nil {
		return knp{}, fmt.Errorf("build hack/knp: %w\n%s", err, b)
	}
	return knp{bin: out}, nil
}

// startKNP runs kube-network-policies in node and sends it the packets its own rules would.
// Its rules queue the first packet of every connection of a selected pod to userspace with the
// nftables queue expression, which needs CONFIG_NFT_QUEUE; kernels without it (this machine's
// among them) refuse the whole table. The engine keeps serving its queue regardless, so the
// bench adds the equivalent of its rules through the xt NFQUEUE target (iptables-nft): queue 100,
// in postrouting before SNAT, new connections from or to the two pods. The userspace verdict
// path, which is what the engine's cost is made of, is the engine's own.
func startKNP(t testing.TB, node ns.NetNS, k knp, objFile string, pods ...netip.Addr) (pid int, stop func() error) {
	t.Helper()
	proc := nettest.StartProcess(t, node, filepath.Join(t.TempDir(), "knp.log"), k.bin, "-objects", objFile, "-node", "bench-node")
	err := nettest.WhileRunning(30*time.Second, func() error {
		var b []byte
		err := node.Do(func(ns.NetNS) error {
			var err error
			b, err = os.ReadFile("/proc/thread-self/net/netfilter/nfnetlink_queue") // this thread's netns, not the process's
			return err
		})
		if err != nil || !strings.HasPrefix(strings.TrimSpace(string(b)), "100 ") {
			return fmt.Errorf("queue 100 not bound yet (%v): %q", err, b)
		}
		return nil
	}, proc)
	if err != nil {
		t.Fatal(err)
	}
	var rules [][]string
	for _, p := range pods {
		for _, dir := range []string{"-s", "-d"} {
			rules = append(rules, []string{"POSTROUTING", dir, p.String(), "-m", "conntrack", "--ctstate", "NEW", "-j", "NFQUEUE", "--queue-num", "100"})
		}
	}
	for _, r := range rules {
		nettest.Run(t, node, "iptables", append([]string{"-t", "mangle", "-A"}, r...)...)
	}
	return proc.Pid(), func() error {
		var errs []error
		for _, r := range rules {
			if _, err := nettest.Output(node, "iptables", append([]string{"-t", "mangle", "-D"}, r...)...); err != nil {
				errs = append(errs, err)
			}
		}
		return errors.Join(append(errs, proc.Stop())...)
	}
}

// knpObjects is the JSON file the harness reads.
func knpObjects(path string, w npWorkload) error {
	type objects struct {
		Namespaces []corev1.Namespace           `json:"namespaces"`
		Pods       []corev1.Pod                 `json:"pods"`
		Policies   []networkingv1.NetworkPolicy `json:"policies"`
	}
	var o objects
	for _, x := range w.namespaces {
		o.Namespaces = append(o.Namespaces, *x)
	}
	for _, x := range w.pods {
		o.Pods = append(o.Pods, *x)
	}
	for _, x := range w.policies {
		o.Policies = append(o.Policies, *x)
	}
	return writeJSON(path, o)
}

func writeJSON(path string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o600)
}

// rates are the per-round results of one mode.
type rates struct {
	conns  []connResult
	stream []streamResult
}
