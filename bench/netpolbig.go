package bench

import (
	"encoding/json"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/google/nftables"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kubenet-dev/kubenet/internal/policyrules"
	"github.com/kubenet-dev/kubenet/netpol"
	"github.com/kubenet-dev/kubenet/test/nettest"
	"github.com/kubenet-dev/kubenet/test/testkit"
)

// The big-policy workload of docs/networkpolicy.md: one NetworkPolicy with n ipBlock peers
// (testkit.IPBlockPeers: mixed sizes, one in ten with exceptions) and the client pod, on the
// server's port, selecting the server and a third pod, keeper, which only holds the policy's
// group in the kernel: with the server not selected (mode A, the server not isolated) the group
// stays, so that A and B differ by one map element, as in the data path's rounds.

// passMeasure is one policy pass: compile and apply, as the agent's.
type passMeasure struct {
	wall, cpu time.Duration
	alloc     uint64 // bytes the pass allocated (the agent's heap churn)
	applied   policyrules.Applied
}

// bigRow is what one size measured.
type bigRow struct {
	entries     int
	policyBytes int // the policy as JSON (the API's limit on an object is about 1.5 MB)
	elements    int // the group's set elements in the kernel
	install     passMeasure
	unchanged   passMeasure
	// addIdle are ADDs of a new pod with no pass running; addDuring those started while an
	// install pass ran (duringPass: that pass's wall time).
	addIdle, addDuring []time.Duration
	duringPass         time.Duration
	connWall, connCPU  []float64 // per round of new connections: the server selected / not
}

// bigObjects is base with the big policy over peers, selecting keeper, and the server too when
// onServer.
func bigObjects(base npWorkload, peers []networkingv1.NetworkPolicyPeer, onServer bool) npWorkload {
	w := base
	w.pods = append(slices.Clone(base.pods), &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: npNamespace, Name: "keeper", Labels: map[string]string{"app": "keeper"}, UID: types.UID("uid-keeper")},
		Spec:   corev1.PodSpec{NodeName: "bench-node", Containers: []corev1.Container{{Name: "c", Image: "x"}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning}})
	selected := []string{"keeper"}
	if onServer {
		selected = append(selected, "server")
	}
	port := intstr.FromInt32(npServerPort)
	from := append(slices.Clone(peers), networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}}})
	w.policies = []*networkingv1.NetworkPolicy{{ObjectMeta: metav1.ObjectMeta{Namespace: npNamespace, Name: "big"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: metav1.LabelSelectorOpIn, Values: selected}}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress:     []networkingv1.NetworkPolicyIngressRule{{From: from, Ports: []networkingv1.NetworkPolicyPort{{Port: &port}}}},
		}}}
	return w
}

// timedPass applies w and measures the pass: wall time, the process's CPU time (the compiler's
// and the kernel's work on the netlink messages, which runs in the sending thread), allocation.
func (n *npNode) timedPass(b *testing.B, w npWorkload) passMeasure {
	runtime.GC()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	cpu0, t0 := (cpuMeter{}).now(), time.Now()
	pass := applyKubenet(b, n.node.NS, n.node.DataDir(), w)
	wall, cpu := time.Since(t0), (cpuMeter{}).now()-cpu0
	runtime.ReadMemStats(&m1)
	if len(pass.Applied.Refused) > 0 {
		b.Fatalf("pass refused %v", pass.Applied.Refused)
	}
	return passMeasure{wall: wall, cpu: cpu, alloc: m1.TotalAlloc - m0.TotalAlloc, applied: pass.Applied}
}

// timeAdd times the ADD of a new pod (then deletes it).
func (n *npNode) timeAdd(b *testing.B, name string) time.Duration {
	p := n.newPod(b, name)
	start := time.Now()
	if err := n.node.Add(n.list, p); err != nil {
		b.Fatalf("ADD %s: %v", name, err)
	}
	took := time.Since(start)
	if err := n.node.Del(n.list, p); err != nil {
		b.Fatalf("DEL %s: %v", name, err)
	}
	return took
}

// groupElements counts the elements of the policy groups' sets in the node.
func (n *npNode) groupElements(b *testing.B) int {
	count := 0
	nettest.Do(b, n.node.NS, func() error {
		c, err := nftables.New()
		if err != nil {
			return err
		}
		t := netpol.BridgeTable("kubenet")
		sets, err := c.GetSets(t)
		if err != nil {
			return err
		}
		for _, s := range sets {
			if !netpol.IsPodState(s.Name) || s.Name == netpol.MapEgress || s.Name == netpol.MapIngress || s.Name == netpol.SetDropsEgress || s.Name == netpol.SetDropsIngress {
				continue
			}
			els, err := c.GetSetElements(s)
			if err != nil {
				return fmt.Errorf("elements of %s: %w", s.Name, err)
			}
			count += len(els)
		}
		return nil
	})
	return count
}

// expectServer checks that the client reaches the server's port and, when isolated, that the
// port no policy allows is refused (answered when not).
func (n *npNode) expectServer(b *testing.B, isolated bool) {
	if _, err := nettest.TCPRequest(n.client.NS, n.conns, "x", 2*time.Second); !answered(err) {
		b.Fatalf("client → server:%d: %v", npServerPort, err)
	}
	if _, err := nettest.TCPRequest(n.client.NS, n.denied, "x", 700*time.Millisecond); answered(err) == isolated {
		b.Fatalf("client → server:%d with the server isolated %v: %v", n.denied.Port(), isolated, err)
	}
}

// answered tells whether a request to a connServer got through: it closes every connection at
// once, so the client reads EOF; a dropped SYN times out.
func answered(err error) bool {
	return err == nil || !strings.Contains(err.Error(), "timeout")
}

// bigRow measures one size: the install pass (from a node without the policy's group) and an
// unchanged pass after it; ADDs of other pods while an install pass runs and with none; then
// rounds of new connections client → server, A B B A (B A A B in odd rounds), A without the
// server selected, B with.
func (n *npNode) bigRow(b *testing.B, base npWorkload, entries, rounds int) bigRow {
	peers := testkit.IPBlockPeers(entries, 1)
	keeperOnly, onServer := bigObjects(base, peers, false), bigObjects(base, peers, true)
	row := bigRow{entries: entries}
	if js, err := json.Marshal(onServer.policies[0]); err == nil {
		row.policyBytes = len(js)
	}

	applyKubenet(b, n.node.NS, n.node.DataDir(), base) // no group of an earlier size
	row.install = n.timedPass(b, onServer)
	row.unchanged = n.timedPass(b, onServer)
	row.elements = n.groupElements(b)
	n.expectServer(b, true)

	for i := range 5 {
		row.addIdle = append(row.addIdle, n.timeAdd(b, fmt.Sprintf("idle-%d-%d", entries, i)))
	}
	applyKubenet(b, n.node.NS, n.node.DataDir(), base)
	type result struct {
		took time.Duration
		err  error
	}
	done := make(chan result, 1)
	go func() {
		start := time.Now()
		var err error
		_ = n.node.NS.Do(func(ns.NetNS) error { _, err = applyPolicies(n.node.DataDir(), onServer); return nil })
		done <- result{time.Since(start), err}
	}()
	for i := 0; row.duringPass == 0; i++ {
		row.addDuring = append(row.addDuring, n.timeAdd(b, fmt.Sprintf("during-%d-%d", entries, i)))
		select {
		case r := <-done:
			if r.err != nil {
				b.Fatal(r.err)
			}
			row.duringPass = r.took
		default:
		}
	}

	applyKubenet(b, n.node.NS, n.node.DataDir(), keeperOnly)
	n.expectServer(b, false)
	const a, bb = "server not selected", "server selected"
	for round := range rounds {
		order := []string{a, bb, bb, a}
		if round%2 == 1 {
			order = []string{bb, a, a, bb}
		}
		var cr []connResult
		for i, mode := range order {
			w := keeperOnly
			if mode == bb {
				w = onServer
			}
			applyKubenet(b, n.node.NS, n.node.DataDir(), w)
			if i < 2 {
				n.expectServer(b, mode == bb)
			}
			cr = append(cr, connRate(n.client.NS, n.conns, 4, time.Second, cpuMeter{}))
		}
		row.connWall = append(row.connWall, roundRatio(order, bb, func(i int) float64 { return cr[i].perSecond }))
		row.connCPU = append(row.connCPU, 1/roundRatio(order, bb, func(i int) float64 { return float64(cr[i].cpuEach) }))
	}
	b.Logf("%d entries: install %s (CPU %s, %d transactions, longest %s), unchanged %s, %d elements; ADD idle %v, during a pass of %s %v; connections B/A by wall %v",
		entries, row.install.wall, row.install.cpu, row.install.applied.Transactions, row.install.applied.LongestTransaction, row.unchanged.wall, row.elements,
		row.addIdle, row.duringPass, row.addDuring, row.connWall)
	return row
}
