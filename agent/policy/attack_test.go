package policy

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// TestAttackInvalidObjectsFailClosed: objects the API server would have refused (a damaged
// store, a newer API's values, a hostile writer past admission) allow nothing they do not
// plainly allow: a piece that does not parse never widens what the rest of the policy says.
func TestAttackInvalidObjectsFailClosed(t *testing.T) {
	tcp := corev1.ProtocolTCP
	end := int32(90)
	ingressFrom := func(peer networkingv1.NetworkPolicyPeer, ports ...networkingv1.NetworkPolicyPort) *networkingv1.NetworkPolicy {
		return np("a", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "server"), PolicyTypes: ingress,
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{peer}, Ports: ports}}})
	}
	everyone := networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "0.0.0.0/0"}}
	for _, tc := range []struct {
		name   string
		policy *networkingv1.NetworkPolicy
		// unnamedPort gives the server a container port without a name.
		unnamedPort bool
		want        [2]string // server ingress | server egress
	}{
		{"an except that does not parse", ingressFrom(networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/8", Except: []string{"10.0.2.0/24x"}}}),
			false, [2]string{"deny", "-"}},
		{"an except of the other family", ingressFrom(networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/8", Except: []string{"fd00::/8"}}}),
			false, [2]string{"deny", "-"}},
		{"an empty port name", ingressFrom(everyone, networkingv1.NetworkPolicyPort{Protocol: &tcp, Port: &intstr.IntOrString{Type: intstr.String}}),
			true, [2]string{"deny", "-"}},
		{"an endPort without a port", ingressFrom(everyone, networkingv1.NetworkPolicyPort{Protocol: &tcp, EndPort: &end}),
			false, [2]string{"deny", "-"}},
		{"only an unknown policy type", np("a", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "server"), PolicyTypes: []networkingv1.PolicyType{"Egres"}}),
			false, [2]string{"deny", "deny"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := testInput()
			if tc.unnamedPort {
				in.Pods[0].Spec.Containers[0].Ports = append(in.Pods[0].Spec.Containers[0].Ports, corev1.ContainerPort{ContainerPort: 22})
			}
			in.Policies = []*networkingv1.NetworkPolicy{tc.policy}
			res := Compile(in)
			server := res.Ruleset.Pods[0]
			if server.Port != 10 {
				t.Fatalf("first pod of the ruleset is port %d, want the server's (10)", server.Port)
			}
			if got := [2]string{render(server.Ingress), render(server.Egress)}; got != tc.want {
				t.Errorf("server ingress | egress = %q, want %q", got, tc.want)
			}
		})
	}
}
