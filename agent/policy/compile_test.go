package policy

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kubenet-dev/kubenet/core"
)

// The test cluster: namespaces "a" (team=x) and "b" (team=y); pods, with their addresses:
//
//	a/server   10.0.1.10 fd00::10  app=server  ports http=8080/TCP, dns=53/UDP  (local)
//	a/client   10.0.1.11 fd00::11  app=client                                  (local)
//	a/other    10.0.2.12            app=other   port http=9090/TCP               (remote)
//	b/client   10.0.2.13            app=client  port http=7070/TCP               (remote)
//	b/host     192.168.0.1          app=client  hostNetwork                      (remote)
//	b/done     10.0.2.14            app=client  Succeeded                        (remote)
func testInput() Input {
	ns := func(name, team string) *corev1.Namespace {
		return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"team": team, "kubernetes.io/metadata.name": name}}}
	}
	pod := func(ns, name, app string, ips []string, ports ...corev1.ContainerPort) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app": app}},
			Spec:   corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Ports: ports}}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning}}
		for _, ip := range ips {
			p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip})
		}
		return p
	}
	host := pod("b", "host", "client", []string{"192.168.0.1"})
	host.Spec.HostNetwork = true
	done := pod("b", "done", "client", []string{"10.0.2.14"})
	done.Status.Phase = corev1.PodSucceeded
	return Input{
		Namespaces: []*corev1.Namespace{ns("a", "x"), ns("b", "y")},
		Pods: []*corev1.Pod{
			// The local pods' status has no address yet: the records give it.
			pod("a", "server", "server", nil, corev1.ContainerPort{Name: "http", ContainerPort: 8080}, corev1.ContainerPort{Name: "dns", ContainerPort: 53, Protocol: corev1.ProtocolUDP}),
			pod("a", "client", "client", nil),
			pod("a", "other", "other", []string{"10.0.2.12"}, corev1.ContainerPort{Name: "http", ContainerPort: 9090}),
			pod("b", "client", "client", []string{"10.0.2.13"}, corev1.ContainerPort{Name: "http", ContainerPort: 7070}),
			host, done,
		},
		Local: []Local{
			{Port: 10, Namespace: "a", Name: "server", IPs: []netip.Addr{netip.MustParseAddr("10.0.1.10"), netip.MustParseAddr("fd00::10")}},
			{Port: 11, Namespace: "a", Name: "client", IPs: []netip.Addr{netip.MustParseAddr("10.0.1.11"), netip.MustParseAddr("fd00::11")}},
		},
	}
}

func sel(kv ...string) *metav1.LabelSelector {
	s := &metav1.LabelSelector{MatchLabels: map[string]string{}}
	for i := 0; i+1 < len(kv); i += 2 {
		s.MatchLabels[kv[i]] = kv[i+1]
	}
	return s
}

func np(ns string, spec networkingv1.NetworkPolicySpec) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "p"}, Spec: spec}
}

func port(proto corev1.Protocol, p intstr.IntOrString, end ...int32) networkingv1.NetworkPolicyPort {
	pp := networkingv1.NetworkPolicyPort{Port: &p}
	if proto != "" {
		pp.Protocol = &proto
	}
	if len(end) > 0 {
		pp.EndPort = &end[0]
	}
	return pp
}

var (
	ingress = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
	egress  = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
	both    = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}
)

// render describes a direction: "-" when not isolated, "deny" when nothing is allowed, else the
// sorted, de-duplicated entries.
func render(d core.PolicyDirection) string {
	if !d.Isolated {
		return "-"
	}
	var parts []string
	for _, e := range d.Allow {
		s := e.Peer.String()
		if e.Peer == allIPv4 {
			s = "all4"
		} else if e.Peer == allIPv6 {
			s = "all6"
		}
		if e.Ports != nil {
			s += " " + e.Ports.String()
		}
		if !slices.Contains(parts, s) {
			parts = append(parts, s)
		}
	}
	if len(parts) == 0 {
		return "deny"
	}
	slices.Sort(parts)
	return strings.Join(parts, ", ")
}

func TestCompile(t *testing.T) {
	udp := corev1.ProtocolUDP
	sctp := corev1.ProtocolSCTP
	peerPods := func(ps ...networkingv1.NetworkPolicyPeer) []networkingv1.NetworkPolicyPeer { return ps }
	cases := []struct {
		name     string
		policies []*networkingv1.NetworkPolicy
		// want: server ingress | server egress | client ingress | client egress
		want [4]string
	}{
		{"no policies", nil, [4]string{"-", "-", "-", "-"}},
		{"deny all ingress in namespace", []*networkingv1.NetworkPolicy{np("a", networkingv1.NetworkPolicySpec{PolicyTypes: ingress})},
			[4]string{"deny", "-", "deny", "-"}},
		{"policy of another namespace selects nobody here", []*networkingv1.NetworkPolicy{np("b", networkingv1.NetworkPolicySpec{PolicyTypes: both})},
			[4]string{"-", "-", "-", "-"}},
		{"deny all egress", []*networkingv1.NetworkPolicy{np("a", networkingv1.NetworkPolicySpec{PolicyTypes: egress})},
			[4]string{"-", "deny", "-", "deny"}},
		{"policyTypes empty: ingress only without egress rules", []*networkingv1.NetworkPolicy{np("a", networkingv1.NetworkPolicySpec{})},
			[4]string{"deny", "-", "deny", "-"}},
		{"policyTypes empty with egress rules: both", []*networkingv1.NetworkPolicy{np("a", networkingv1.NetworkPolicySpec{
			PodSelector: *sel("app", "server"), Egress: []networkingv1.NetworkPolicyEgressRule{{}}})},
			[4]string{"deny", "all4, all6", "-", "-"}},
		{"egress rules but policyTypes Ingress: egress not isolated", []*networkingv1.NetworkPolicy{np("a", networkingv1.NetworkPolicySpec{
			PolicyTypes: ingress, Egress: []networkingv1.NetworkPolicyEgressRule{{}}})},
			[4]string{"deny", "-", "deny", "-"}},
		{"allow all ingress: empty rule", []*networkingv1.NetworkPolicy{np("a", networkingv1.NetworkPolicySpec{
			PolicyTypes: ingress, Ingress: []networkingv1.NetworkPolicyIngressRule{{}}})},
			[4]string{"all4, all6", "-", "all4, all6", "-"}},
		{"podSelector target and peer in the policy's namespace", []*networkingv1.NetworkPolicy{np("a", networkingv1.NetworkPolicySpec{
			PodSelector: *sel("app", "server"), PolicyTypes: ingress,
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: peerPods(networkingv1.NetworkPolicyPeer{PodSelector: sel("app", "client")})}}})},
			[4]string{"10.0.1.11, fd00::11", "-", "-", "-"}},
		{"empty podSelector peer: every pod of the namespace", []*networkingv1.NetworkPolicy{np("a", networkingv1.NetworkPolicySpec{
			PodSelector: *sel("app", "server"), PolicyTypes: ingress,
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: peerPods(networkingv1.NetworkPolicyPeer{PodSelector: sel()})}}})},
			[4]string{"10.0.1.10, 10.0.1.11, 10.0.2.12, fd00::10, fd00::11", "-", "-", "-"}},
		{"namespaceSelector alone: every pod of the selected namespaces, not hostNetwork or ended ones", []*networkingv1.NetworkPolicy{np("a", networkingv1.NetworkPolicySpec{
			PodSelector: *sel("app", "server"), PolicyTypes: ingress,
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: peerPods(networkingv1.NetworkPolicyPeer{NamespaceSelector: sel("team", "y")})}}})},
			[4]string{"10.0.2.13", "-", "-", "-"}},
		{"empty namespaceSelector: all namespaces", []*networkingv1.NetworkPolicy{np("a", networkingv1.NetworkPolicySpec{
			PodSelector: *sel("app", "server"), PolicyTypes: ingress,
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: peerPods(networkingv1.NetworkPolicyPeer{NamespaceSelector: sel(), PodSelector: sel("app", "client")})}}})},
			[4]string{"10.0.1.11, 10.0.2.13, fd00::11", "-", "-", "-"}},
		{"both selectors in one peer: AND", []*networkingv1.NetworkPolicy{np("a", networkingv1.NetworkPolicySpec{
			PodSelector: *sel("app", "server"), PolicyTypes: ingress,
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: peerPods(networkingv1.NetworkPolicyPeer{NamespaceSelector: sel("team", "y"), PodSelector: sel("app", "other")})}}})},
			[4]string{"deny", "-", "-", "-"}},
		{"two peers: OR", []*networkingv1.NetworkPolicy{np("a", networkingv1.NetworkPolicySpec{
			PodSelector: *sel("app", "server"), PolicyTypes: ingress,
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: peerPods(
				networkingv1.NetworkPolicyPeer{NamespaceSelector: sel("team", "y")},
				networkingv1.NetworkPolicyPeer{PodSelector: sel("app", "other")})}}})},
			[4]string{"10.0.2.12, 10.0.2.13", "-", "-", "-"}},
		{"matchExpressions", []*networkingv1.NetworkPolicy{np("a", networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"server"}}}},
			PolicyTypes: ingress})},
			[4]string{"-", "-", "deny", "-"}},
		{"ipBlock with except", []*networkingv1.NetworkPolicy{np("a", networkingv1.NetworkPolicySpec{
			PodSelector: *sel("app", "server"), PolicyTypes: ingress,
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: peerPods(
				networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/16", Except: []string{"10.0.1.0/24", "10.0.255.255/32"}}},
				networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "fd00::/64", Except: []string{"fd00::/120"}}})}}})},
			[4]string{"10.0.0.0-10.0.0.255, 10.0.2.0-10.0.255.254, fd00::100-fd00::ffff:ffff:ffff:ffff", "-", "-", "-"}},
		{"ipBlock egress with ports", []*networkingv1.NetworkPolicy{np("a", networkingv1.NetworkPolicySpec{
			PodSelector: *sel("app", "client"), PolicyTypes: egress,
			Egress: []networkingv1.NetworkPolicyEgressRule{{To: peerPods(networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "198.18.0.0/24"}}),
				Ports: []networkingv1.NetworkPolicyPort{port(udp, intstr.FromInt32(53))}}}})},
			[4]string{"-", "-", "-", "198.18.0.0-198.18.0.255 udp/53"}},
		{"ports: default TCP, endPort, protocol without port, SCTP", []*networkingv1.NetworkPolicy{np("a", networkingv1.NetworkPolicySpec{
			PodSelector: *sel("app", "server"), PolicyTypes: ingress,
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: peerPods(networkingv1.NetworkPolicyPeer{PodSelector: sel("app", "client")}),
				Ports: []networkingv1.NetworkPolicyPort{
					port("", intstr.FromInt32(80)),
					port(udp, intstr.FromInt32(1000), 2000),
					{Protocol: &sctp},
				}}}})},
			[4]string{"10.0.1.11 sctp/0-65535, 10.0.1.11 tcp/80, 10.0.1.11 udp/1000-2000, fd00::11 sctp/0-65535, fd00::11 tcp/80, fd00::11 udp/1000-2000", "-", "-", "-"}},
		{"named port on ingress: the selected pod's", []*networkingv1.NetworkPolicy{np("a", networkingv1.NetworkPolicySpec{
			PodSelector: *sel("app", "server"), PolicyTypes: ingress,
			Ingress: []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{
				port("", intstr.FromString("http")), port(udp, intstr.FromString("dns")), port(udp, intstr.FromString("http")), port("", intstr.FromString("nope"))}}}})},
			[4]string{"all4 tcp/8080, all4 udp/53, all6 tcp/8080, all6 udp/53", "-", "-", "-"}},
		{"named port on egress: each peer pod's own", []*networkingv1.NetworkPolicy{np("a", networkingv1.NetworkPolicySpec{
			PodSelector: *sel("app", "client"), PolicyTypes: egress,
			Egress: []networkingv1.NetworkPolicyEgressRule{{To: peerPods(networkingv1.NetworkPolicyPeer{NamespaceSelector: sel()}),
				Ports: []networkingv1.NetworkPolicyPort{port("", intstr.FromString("http"))}}}})},
			[4]string{"-", "-", "-", "10.0.1.10 tcp/8080, 10.0.2.12 tcp/9090, 10.0.2.13 tcp/7070, fd00::10 tcp/8080"}},
		{"named port on egress to an ipBlock: the pods inside it", []*networkingv1.NetworkPolicy{np("a", networkingv1.NetworkPolicySpec{
			PodSelector: *sel("app", "client"), PolicyTypes: egress,
			Egress: []networkingv1.NetworkPolicyEgressRule{{To: peerPods(networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.2.0/24"}}),
				Ports: []networkingv1.NetworkPolicyPort{port("", intstr.FromString("http"))}}}})},
			[4]string{"-", "-", "-", "10.0.2.12 tcp/9090, 10.0.2.13 tcp/7070"}},
		{"policies add up", []*networkingv1.NetworkPolicy{
			np("a", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "server"), PolicyTypes: ingress,
				Ingress: []networkingv1.NetworkPolicyIngressRule{{From: peerPods(networkingv1.NetworkPolicyPeer{PodSelector: sel("app", "client")}), Ports: []networkingv1.NetworkPolicyPort{port("", intstr.FromInt32(80))}}}}),
			np("a", networkingv1.NetworkPolicySpec{PodSelector: *sel(), PolicyTypes: ingress,
				Ingress: []networkingv1.NetworkPolicyIngressRule{{From: peerPods(networkingv1.NetworkPolicyPeer{PodSelector: sel("app", "other")})}}}),
		}, [4]string{"10.0.1.11 tcp/80, 10.0.2.12, fd00::11 tcp/80", "-", "10.0.2.12", "-"}},
		{"a rule with peers and ports: both must match", []*networkingv1.NetworkPolicy{np("a", networkingv1.NetworkPolicySpec{
			PodSelector: *sel("app", "server"), PolicyTypes: both,
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: peerPods(networkingv1.NetworkPolicyPeer{PodSelector: sel("app", "other")}), Ports: []networkingv1.NetworkPolicyPort{port("", intstr.FromInt32(80))}}},
			Egress:  []networkingv1.NetworkPolicyEgressRule{{Ports: []networkingv1.NetworkPolicyPort{port(udp, intstr.FromInt32(53))}}}})},
			[4]string{"10.0.2.12 tcp/80", "all4 udp/53, all6 udp/53", "-", "-"}},
		{"invalid selector in a peer selects nobody", []*networkingv1.NetworkPolicy{np("a", networkingv1.NetworkPolicySpec{
			PodSelector: *sel("app", "server"), PolicyTypes: ingress,
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: peerPods(networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{
				MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: "bogus"}}}})}}})},
			[4]string{"deny", "-", "-", "-"}},
		{"invalid podSelector of the policy: every pod of its namespace isolated, nothing allowed by it", []*networkingv1.NetworkPolicy{
			np("a", networkingv1.NetworkPolicySpec{
				PodSelector: metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: "bogus"}}},
				PolicyTypes: both,
				Ingress:     []networkingv1.NetworkPolicyIngressRule{{}},
				Egress:      []networkingv1.NetworkPolicyEgressRule{{}}}),
			// The valid policies of the namespace still allow what they allow.
			np("a", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "server"), PolicyTypes: ingress,
				Ingress: []networkingv1.NetworkPolicyIngressRule{{From: peerPods(networkingv1.NetworkPolicyPeer{PodSelector: sel("app", "client")})}}}),
		}, [4]string{"10.0.1.11, fd00::11", "deny", "deny", "deny"}},
		{"invalid podSelector of an ingress-only policy leaves egress alone", []*networkingv1.NetworkPolicy{np("a", networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "not a valid label value!"}}})},
			[4]string{"deny", "-", "deny", "-"}},
		{"invalid CIDR allows nothing", []*networkingv1.NetworkPolicy{np("a", networkingv1.NetworkPolicySpec{
			PodSelector: *sel("app", "server"), PolicyTypes: ingress,
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: peerPods(networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "nonsense"}})}}})},
			[4]string{"deny", "-", "-", "-"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := testInput()
			in.Policies = tc.policies
			res := Compile(in)
			if len(res.Ruleset.Pods) != 2 {
				t.Fatalf("%d pods in the ruleset, want 2", len(res.Ruleset.Pods))
			}
			got := [4]string{render(res.Ruleset.Pods[0].Ingress), render(res.Ruleset.Pods[0].Egress), render(res.Ruleset.Pods[1].Ingress), render(res.Ruleset.Pods[1].Egress)}
			for i, what := range []string{"server ingress", "server egress", "client ingress", "client egress"} {
				if got[i] != tc.want[i] {
					t.Errorf("%s = %q, want %q", what, got[i], tc.want[i])
				}
			}
		})
	}
}

func TestCompileLocalPods(t *testing.T) {
	in := testInput()
	in.Local = append(in.Local,
		Local{Port: 20, IPs: []netip.Addr{netip.MustParseAddr("10.0.1.20")}},                                // not a pod
		Local{Port: 21, Namespace: "a", Name: "ghost", IPs: []netip.Addr{netip.MustParseAddr("10.0.1.21")}}, // not in the API
		Local{Port: 0, Namespace: "a", Name: "other", IPs: []netip.Addr{netip.MustParseAddr("10.0.1.22")}},  // not on the bridge (yet)
	)
	in.Policies = []*networkingv1.NetworkPolicy{np("a", networkingv1.NetworkPolicySpec{PolicyTypes: both})}
	res := Compile(in)
	byPort := map[int]core.PolicyPod{}
	for _, p := range res.Ruleset.Pods {
		byPort[p.Port] = p
	}
	if p, ok := byPort[20]; !ok || p.Ingress.Isolated || p.Egress.Isolated {
		t.Errorf("a container that is no pod: %+v, %v; want it released and not isolated", p, ok)
	}
	if _, ok := byPort[21]; ok {
		t.Error("a pod the API does not know was released")
	}
	if _, ok := byPort[0]; ok {
		t.Error("a pod without a bridge port was released")
	}
	if len(res.Unknown) != 1 || res.Unknown[0].Port != 21 {
		t.Errorf("Unknown = %v, want the ghost", res.Unknown)
	}
	if res.Isolated != 2 {
		t.Errorf("Isolated = %d, want 2", res.Isolated)
	}
	if got := fmt.Sprint(byPort[10].IPs); got != "[10.0.1.10 fd00::10]" {
		t.Errorf("server's addresses = %s, want those of its record", got)
	}
}

// TestCompileAddressReuse: the API may still show a deleted pod of this node with its address
// (status.podIPs), and a pod of another node may claim an address of this node's pod CIDR; a new
// local pod holding that address must get neither's rights as a peer.
func TestCompileAddressReuse(t *testing.T) {
	in := testInput()
	in.NodeName = "n1"
	in.LocalCIDRs = []netip.Prefix{netip.MustParsePrefix("10.0.1.0/24"), netip.MustParsePrefix("fd00::/64")}
	gone := podObj("a", "gone", "trusted", []string{"10.0.1.30"}) // deleted on this node, still in the API
	gone.Spec.NodeName = "n1"
	// The same, from before the node's pod CIDR changed: outside today's CIDRs.
	older := podObj("a", "older", "trusted", []string{"10.0.9.9"})
	older.Spec.NodeName = "n1"
	liar := podObj("a", "liar", "trusted", []string{"10.0.1.31", "10.0.2.31"}) // another node claims a local address
	liar.Spec.NodeName = "n2"
	in.Pods = append(in.Pods, gone, older, liar, podObj("a", "newcomer", "untrusted", nil))
	in.Local = append(in.Local, Local{Port: 30, Namespace: "a", Name: "newcomer", IPs: []netip.Addr{netip.MustParseAddr("10.0.1.30")}})
	in.Policies = []*networkingv1.NetworkPolicy{np("a", networkingv1.NetworkPolicySpec{
		PodSelector: *sel("app", "server"),
		Ingress:     []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: sel("app", "trusted")}}}},
	})}
	res := Compile(in)
	for _, p := range res.Ruleset.Pods {
		if p.Port != 10 {
			continue
		}
		if got := render(p.Ingress); got != "10.0.2.31" {
			t.Errorf("server's ingress = %q, want only the other node's own address of the trusted pod", got)
		}
		return
	}
	t.Fatal("server not in the ruleset")
}

// podObj is a running pod in namespace ns labelled app=app with the given status addresses.
func podObj(ns, name, app string, ips []string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app": app}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	for _, ip := range ips {
		p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip})
	}
	return p
}
