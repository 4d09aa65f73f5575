package main

import (
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kubenet-dev/kubenet/agent/policy"
	"github.com/kubenet-dev/kubenet/core"
	"github.com/kubenet-dev/kubenet/internal/policyrules"
)

// allowFromA is a cluster of pods a and b of namespace ns on node n1 (b's container port "http"
// is 8080) and the policy ns/allow-a: b takes TCP on port from a.
func allowFromA(port intstr.IntOrString) policy.Input {
	pod := func(name string, ports ...corev1.ContainerPort) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: map[string]string{"app": name}},
			Spec:   corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "c", Ports: ports}}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	}
	tcp := corev1.ProtocolTCP
	return policy.Input{
		Namespaces: []*corev1.Namespace{{ObjectMeta: metav1.ObjectMeta{Name: "ns"}}},
		Pods:       []*corev1.Pod{pod("a"), pod("b", corev1.ContainerPort{Name: "http", ContainerPort: 8080, Protocol: tcp})},
		Policies: []*networkingv1.NetworkPolicy{{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "allow-a"},
			Spec: networkingv1.NetworkPolicySpec{
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "b"}},
				Ingress: []networkingv1.NetworkPolicyIngressRule{{
					From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "a"}}}},
					Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}},
				}},
			},
		}},
	}
}

// TestCompareWithAPI: explain --kubeconfig compiles the API's objects as the agent does and
// says in sync when the kernel holds their group, pending with what is missing and extra when it
// holds another (or none), and that a pod the API does not have stays held.
func TestCompareWithAPI(t *testing.T) {
	local := func(pod, addr string, port int) core.PolicyLocal {
		return core.PolicyLocal{Record: core.Record{Pod: pod, IPs: []netip.Prefix{netip.MustParsePrefix(addr)}}, Port: port}
	}
	a, b, c := local("ns/a", "10.244.0.2/24", 4), local("ns/b", "10.244.0.3/24", 6), local("ns/c", "10.244.0.4/24", 8)
	in := allowFromA(intstr.FromInt32(8080))
	fromA := policyrules.Entry{Peer: policyrules.Single(netip.MustParseAddr("10.244.0.2")), Ports: &policyrules.Ports{Protocol: policyrules.TCP, First: 8080, Last: 8080}}
	group, entries, ok := core.PolicyDispatch(true, policyrules.Direction{Isolated: true, Allow: []policyrules.Entry{fromA}})
	if !ok {
		t.Fatal("no group for one entry")
	}
	old := []policyrules.Entry{fromA, {Peer: policyrules.Single(netip.MustParseAddr("10.9.9.9"))}}
	oldGroup, oldEntries, _ := core.PolicyDispatch(true, policyrules.Direction{Isolated: true, Allow: old})
	view := func(bIngress string) nodeView {
		return nodeView{locals: []core.PolicyLocal{a, b, c}, installed: policyrules.Installed{Tables: true,
			Ports: map[int]policyrules.InstalledPort{
				a.Port: {Ingress: policyrules.AllowIngress, Egress: policyrules.AllowEgress},
				b.Port: {Ingress: bIngress, Egress: policyrules.AllowEgress},
			},
			Groups: map[string]policyrules.InstalledGroup{group: {Name: group, Ingress: true, Entries: entries}, oldGroup: {Name: oldGroup, Ingress: true, Entries: oldEntries}},
		}}
	}
	cidrs := []netip.Prefix{netip.MustParsePrefix("10.244.0.0/24")}
	for _, tc := range []struct {
		name   string
		v      nodeView
		l      core.PolicyLocal
		inSync bool
		want   []string
	}{
		{"in sync", view(group), b, true, []string{"API: in sync: the kernel holds what the API's objects mean now"}},
		{"the kernel has the old group", view(oldGroup), b, false, []string{
			"API: pending: the kernel differs", "ingress: the API's objects mean " + group + " (isolated by ns/allow-a), the kernel has " + oldGroup,
			"in the kernel, no longer allowed: 10.9.9.9 any"}},
		{"the kernel has not isolated it yet", view(policyrules.AllowIngress), b, false, []string{
			"the kernel has allow-ingress", "to allow, not in the kernel: 10.244.0.2 tcp/8080"}},
		{"the kernel holds it", view(""), b, false, []string{"the kernel has none (held)"}},
		{"a pod the API does not have", view(group), c, true, []string{"the API has no pod ns/c (not yet, or not any more): it stays held"}},
		{"a pod not on the bridge", view(group), local("ns/b", "10.244.0.3/24", 0), false, []string{"held whatever the API's objects say"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmp := tc.v.compareWithAPI(in, cidrs, tc.l)
			var out strings.Builder
			cmp.print(&out)
			if cmp.InSync != tc.inSync || !cmp.Compared {
				t.Errorf("in sync %v compared %v, want %v:\n%s", cmp.InSync, cmp.Compared, tc.inSync, out.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("does not say %q:\n%s", w, out.String())
				}
			}
		})
	}
}
