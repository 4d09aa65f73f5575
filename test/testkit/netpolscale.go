package testkit

import (
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// ScaleSize is the size of the NetworkPolicy control-plane workload (test/agent's
// BenchmarkNetworkPolicyScale, agent/policy's scale benchmarks). With N namespaces: namespace k
// is ns-k with team=t(k%3); pod i lives in ns-(i%N) with app=a((i/N)%20), pods 0 to Local-1 are
// the node's (one per namespace, all app=a0; Local ≤ N); policy j lives in ns-(j%N), selects
// app=a((j/N)%20) (policy k < Local the local pod of ns-k) and allows ingress from
// app=a((j/N+1)%20) in the namespaces with team=t(j%3) on one TCP port, and egress to
// app=a((j/N+2)%20) in every namespace on UDP 53.
type ScaleSize struct {
	Pods, Local, Namespaces, Policies int
}

// The sizes of issue 27: today's, and the one the goals are for.
var (
	ScaleSmall = ScaleSize{Pods: 1000, Local: 10, Namespaces: 10, Policies: 200}
	ScaleLarge = ScaleSize{Pods: 10000, Local: 100, Namespaces: 500, Policies: 2000}
)

func (s ScaleSize) String() string {
	return fmt.Sprintf("%dpods-%dlocal-%dpolicies-%dns", s.Pods, s.Local, s.Policies, s.Namespaces)
}

// Namespace is namespace k.
func (s ScaleSize) Namespace(k int) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("ns-%d", k), Labels: map[string]string{"team": fmt.Sprintf("t%d", k%3)}}}
}

// Pod is pod i on node, without status.
func (s ScaleSize) Pod(i int, node string) *corev1.Pod {
	no := false
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: fmt.Sprintf("ns-%d", i%s.Namespaces), Name: fmt.Sprintf("pod-%d", i), Labels: map[string]string{"app": fmt.Sprintf("a%d", (i/s.Namespaces)%20)}},
		Spec: corev1.PodSpec{NodeName: node, AutomountServiceAccountToken: &no, Containers: []corev1.Container{{Name: "c", Image: "x", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 80}}}}}}
}

// RunningPod is pod i on node with the status of a running pod at Addr(i): a pod of another
// node as the API server shows it.
func (s ScaleSize) RunningPod(i int, node string) *corev1.Pod {
	p, ip := s.Pod(i, node), s.Addr(i).String()
	p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}}
	return p
}

// LocalAddr is the address of local pod i (i < Local): 10.128.0.2 onwards.
func (s ScaleSize) LocalAddr(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, 128, 0, byte(2 + i)})
}

// Addr is the address of pod i (not a local one): 10.244.2.2 onwards, 200 a /24.
func (s ScaleSize) Addr(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, 244, byte(2 + i/200), byte(i%200 + 2)})
}

// Policy is policy j with ingress port port.
func (s ScaleSize) Policy(j, port int) *networkingv1.NetworkPolicy {
	tcp, udp := corev1.ProtocolTCP, corev1.ProtocolUDP
	p, dns := intstr.FromInt32(int32(port)), intstr.FromInt32(53)
	app := func(k int) string { return fmt.Sprintf("a%d", (j/s.Namespaces+k)%20) }
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: fmt.Sprintf("ns-%d", j%s.Namespaces), Name: fmt.Sprintf("p%03d", j)},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": app(0)}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From: []networkingv1.NetworkPolicyPeer{{
					NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": fmt.Sprintf("t%d", j%3)}},
					PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"app": app(1)}},
				}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &p}},
			}},
			Egress: []networkingv1.NetworkPolicyEgressRule{{
				To:    []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{}, PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": app(2)}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: &udp, Port: &dns}},
			}},
		}}
}
