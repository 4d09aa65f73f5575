package policy

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kubenet-dev/kubenet/internal/policyrules"
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
func render(d policyrules.Direction) string {
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
	byPort := map[int]policyrules.Pod{}
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

// TestBlockRanges: every form of ipBlock.cidr and except the API server takes (its validation
// with StrictIPCIDRValidation at its default, off) means what Kubernetes makes of it, and
// everything it refuses allows nothing — an except kubenet cannot use never leaves its range
// allowed. test/agent's TestIPBlockForms checks the same forms against a real API server.
func TestBlockRanges(t *testing.T) {
	const (
		net10    = "10.0.0.0-10.255.255.255"
		net10cut = "10.0.0.0-10.0.255.255, 10.2.0.0-10.255.255.255" // 10.0.0.0/8 minus 10.1.0.0/16
		all4     = "0.0.0.0-255.255.255.255"
		// ::/0 without the IPv4-mapped addresses ::ffff:0:0/96.
		all6 = "::-::fffe:ffff:ffff, ::1:0:0:0-ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"
	)
	cases := []struct {
		name   string
		cidr   string
		except []string
		want   string // the ranges, "" for none
	}{
		{"IPv4", "10.0.0.0/8", nil, net10},
		{"leading zeros in octets are decimal", "010.000.000.000/8", nil, net10},
		{"leading zeros in the prefix length", "10.0.0.0/008", nil, net10},
		{"many leading zeros", "0000000010.0.0.0/0000000008", nil, net10},
		{"host bits set: the network", "10.1.2.3/8", nil, net10},
		{"one IPv4 address", "10.1.2.3/32", nil, "10.1.2.3"},
		{"all of IPv4", "0.0.0.0/0", nil, all4},
		{"all of IPv4 with host bits", "10.0.0.0/0", nil, all4},
		{"IPv4-mapped is IPv4", "::ffff:10.0.0.0/104", nil, net10},
		{"IPv4-mapped in hex, upper case", "::FFFF:A00:0/104", nil, net10},
		{"IPv4-mapped, fully written", "0:0:0:0:0:ffff:10.0.0.0/104", nil, net10},
		{"IPv4-mapped address", "::ffff:10.1.2.3/128", nil, "10.1.2.3"},
		{"IPv4-mapped with leading zeros", "::ffff:010.001.002.003/128", nil, "10.1.2.3"},
		{"IPv4-mapped /96 is all of IPv4", "::ffff:0.0.0.0/96", nil, all4},
		{"IPv4-mapped /96 with host bits", "::ffff:10.1.2.3/96", nil, all4},
		{"shorter than /96 is IPv6, without the mapped addresses", "::ffff:10.0.0.0/95", nil, "::fffe:0:0-::fffe:ffff:ffff"},
		{"all of IPv6 is not the mapped addresses", "::/0", nil, all6},
		{"IPv6", "fd00::/64", nil, "fd00::-fd00::ffff:ffff:ffff:ffff"},
		{"IPv6 upper case, not compressed", "FD00:0:0:0:0:0:0:0/64", nil, "fd00::-fd00::ffff:ffff:ffff:ffff"},
		{"IPv6 group of five hex digits", "0fd00::/16", nil, "fd00::-fd00:ffff:ffff:ffff:ffff:ffff:ffff:ffff"},
		{"IPv6 host bits set", "fd00::1/64", nil, "fd00::-fd00::ffff:ffff:ffff:ffff"},
		{"IPv4-compatible is IPv6", "::1.2.3.4/128", nil, "::102:304"},
		{"NAT64 with embedded IPv4", "64:ff9b::10.0.0.0/120", nil, "64:ff9b::a00:0-64:ff9b::a00:ff"},

		{"except", "10.0.0.0/8", []string{"10.1.0.0/16"}, net10cut},
		{"except with leading zeros", "10.0.0.0/8", []string{"010.001.000.000/16"}, net10cut},
		{"except with host bits", "10.0.0.0/8", []string{"10.1.2.3/16"}, net10cut},
		{"IPv4-mapped except of an IPv4 cidr", "10.0.0.0/8", []string{"::ffff:10.1.0.0/112"}, net10cut},
		{"IPv4-mapped except the whole cidr", "10.0.0.0/8", []string{"::ffff:10.0.0.0/104"}, ""},
		{"IPv4-mapped except wider than the cidr", "10.0.0.0/8", []string{"::ffff:10.0.0.0/103"}, ""},
		{"IPv4-mapped cidr and except", "::ffff:10.0.0.0/104", []string{"::ffff:10.1.0.0/112"}, net10cut},
		{"excepts overlapping", "10.0.0.0/8", []string{"10.1.0.0/16", "10.1.2.0/24", "10.255.255.255/32"}, "10.0.0.0-10.0.255.255, 10.2.0.0-10.255.255.254"},
		{"IPv6 except", "fd00::/64", []string{"fd00::/120"}, "fd00::100-fd00::ffff:ffff:ffff:ffff"},
		{"IPv6 except upper case", "fd00::/64", []string{"FD00:0:0:0:8000::/65"}, "fd00::-fd00::7fff:ffff:ffff:ffff"},

		// What the API server refuses allows nothing, whatever part of it kubenet could read.
		{"IPv4 except of an IPv4-mapped cidr", "::ffff:10.0.0.0/104", []string{"10.1.0.0/16"}, ""},
		{"IPv6 except of an IPv4 cidr", "10.0.0.0/8", []string{"fd00::/64"}, ""},
		{"IPv4 except of an IPv6 cidr", "::/0", []string{"10.0.0.0/8"}, ""},
		{"IPv4-mapped except of an IPv6 cidr", "::/0", []string{"::ffff:10.0.0.0/104"}, ""},
		{"except equal to the cidr", "10.0.0.0/8", []string{"10.0.0.0/8"}, ""},
		{"except outside the cidr", "10.0.0.0/8", []string{"11.0.0.0/16"}, ""},
		{"except that does not parse", "10.0.0.0/8", []string{"nonsense"}, ""},
		{"one bad except among good ones", "10.0.0.0/8", []string{"10.1.0.0/16", "10.2.0.0/33"}, ""},
		{"empty except", "10.0.0.0/8", []string{""}, ""},
		{"empty cidr", "", nil, ""},
		{"no prefix length", "10.0.0.1", nil, ""},
		{"empty prefix length", "10.0.0.0/", nil, ""},
		{"signed prefix length", "10.0.0.0/+8", nil, ""},
		{"prefix length too long", "10.0.0.0/33", nil, ""},
		{"IPv6 prefix length too long", "::ffff:10.0.0.0/129", nil, ""},
		{"leading space", " 10.0.0.0/8", nil, ""},
		{"trailing space", "10.0.0.0/8 ", nil, ""},
		{"IPv6 zone", "fe80::1%eth0/64", nil, ""},
		{"hex octet", "0x0a.0.0.0/8", nil, ""},
		{"three octets", "10.0.0/8", nil, ""},
		{"octet too large", "256.0.0.0/8", nil, ""},
		{"IPv6 group too large", "1fd00::/16", nil, ""},
		{"IPv4 not at the end of IPv6", "1.2.3.4::/32", nil, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, r := range blockRanges(&networkingv1.IPBlock{CIDR: tc.cidr, Except: tc.except}) {
				got = append(got, r.String())
			}
			if s := strings.Join(got, ", "); s != tc.want {
				t.Errorf("cidr %q except %q = %q, want %q", tc.cidr, tc.except, s, tc.want)
			}
		})
	}
}

// TestBlockRangesManyExcepts checks the sweep that subtracts excepts against a model that asks
// every address of the block: random excepts of both families, overlapping and in any order.
// Then the largest policies the API takes: 50 000 excepts, each leaving a hole.
func TestBlockRangesManyExcepts(t *testing.T) {
	rnd := rand.New(rand.NewPCG(24, 1))
	for _, cidr := range []string{"10.0.0.0/20", "fd00::/116"} {
		block := netip.MustParsePrefix(cidr)
		var excepts []netip.Prefix
		b := &networkingv1.IPBlock{CIDR: cidr}
		for range 1000 {
			// /26…/32 of the /20 (/122…/128 of the /116), anywhere in it.
			bits := block.Addr().BitLen() - rnd.IntN(7)
			a := block.Addr().AsSlice()
			a[len(a)-2] |= byte(rnd.IntN(16))
			a[len(a)-1] = byte(rnd.IntN(256))
			addr, _ := netip.AddrFromSlice(a)
			p := netip.PrefixFrom(addr, bits).Masked()
			excepts = append(excepts, p)
			b.Except = append(b.Except, p.String())
		}
		rs := blockRanges(b)
		for a := block.Addr(); block.Contains(a); a = a.Next() {
			want := !slices.ContainsFunc(excepts, func(p netip.Prefix) bool { return p.Contains(a) })
			if got := slices.ContainsFunc(rs, func(r policyrules.Range) bool { return inRange(a, r) }); got != want {
				t.Fatalf("%s: %s allowed = %v, want %v", cidr, a, got, want)
			}
		}
		for i := 1; i < len(rs); i++ {
			if !rs[i-1].Last.Next().Less(rs[i].First) {
				t.Fatalf("%s: ranges %s and %s not sorted, disjoint and apart", cidr, rs[i-1], rs[i])
			}
		}
	}

	b := &networkingv1.IPBlock{CIDR: "10.0.0.0/8"}
	for i := range 50000 {
		b.Except = append(b.Except, fmt.Sprintf("10.%d.%d.%d/32", i>>15&255, i>>7&255, i<<1&255))
	}
	rs := blockRanges(b)
	if len(rs) != 50000 || rs[0].String() != "10.0.0.1" || rs[49998].String() != "10.1.134.157" || rs[49999].String() != "10.1.134.159-10.255.255.255" {
		t.Errorf("50 000 excepts of every second address: %d ranges, want 50 000 (10.0.0.1, 10.0.0.3, …, 10.1.134.157, 10.1.134.159-10.255.255.255)", len(rs))
	}
}

// TestCompilePolicyNames checks that each direction names exactly the policies that isolate the
// pod in it: of its namespace, selecting it, of that type (an unknown type isolates both).
func TestCompilePolicyNames(t *testing.T) {
	named := func(ns, name string, spec networkingv1.NetworkPolicySpec) *networkingv1.NetworkPolicy {
		p := np(ns, spec)
		p.Name = name
		return p
	}
	policies := []*networkingv1.NetworkPolicy{
		named("a", "z-in", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "server"), PolicyTypes: ingress}),
		named("a", "all-eg", networkingv1.NetworkPolicySpec{PodSelector: *sel(), PolicyTypes: egress}),
		named("a", "both", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "server"), PolicyTypes: both}),
		named("a", "odd-type", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "client"), PolicyTypes: []networkingv1.PolicyType{"Sideways"}}),
		named("a", "bad-selector", networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: "Bogus"}}}, PolicyTypes: ingress}),
		named("b", "other-ns", networkingv1.NetworkPolicySpec{PodSelector: *sel(), PolicyTypes: both}),
		named("a", "nobody", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "none"), PolicyTypes: both}),
	}
	in := testInput()
	in.Policies = policies
	res := Compile(in)
	got := map[string][2]string{}
	for _, p := range res.Ruleset.Pods {
		got[p.Name] = [2]string{strings.Join(p.Ingress.Policies, ","), strings.Join(p.Egress.Policies, ",")}
	}
	want := map[string][2]string{
		"a/server": {"a/bad-selector,a/both,a/z-in", "a/all-eg,a/both"},
		"a/client": {"a/bad-selector,a/odd-type", "a/all-eg,a/odd-type"},
	}
	for pod, w := range want {
		if got[pod] != w {
			t.Errorf("%s: policies (ingress, egress) = %q, want %q", pod, got[pod], w)
		}
	}
}

// TestCompileAudit: a staged policy isolates only a direction no enforced policy isolates, and
// then as an audit direction; it never changes an enforced direction, and any other value of
// the annotation enforces the policy.
func TestCompileAudit(t *testing.T) {
	policy := func(name, mode string, spec networkingv1.NetworkPolicySpec) *networkingv1.NetworkPolicy {
		p := np("a", spec)
		p.Name = name
		if mode != "" {
			p.Annotations = map[string]string{AuditAnnotation: mode}
		}
		return p
	}
	fromClient := []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: sel("app", "client")}}}}
	denyServerIn := networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "server"), PolicyTypes: ingress}
	allowClientIn := networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "server"), PolicyTypes: ingress, Ingress: fromClient}
	denyAllEg := networkingv1.NetworkPolicySpec{PodSelector: *sel(), PolicyTypes: egress}
	type dir struct {
		render   string
		audit    bool
		policies string
	}
	tests := []struct {
		name                    string
		policies                []*networkingv1.NetworkPolicy
		serverIn, serverEg, cEg dir
	}{
		{"audit deny alone", []*networkingv1.NetworkPolicy{policy("stage", AuditMode, denyServerIn)},
			dir{"deny", true, "a/stage"}, dir{"-", false, ""}, dir{"-", false, ""}},
		{"audit allow alone", []*networkingv1.NetworkPolicy{policy("stage", AuditMode, allowClientIn)},
			dir{"10.0.1.11, fd00::11", true, "a/stage"}, dir{"-", false, ""}, dir{"-", false, ""}},
		{"enforced deny wins; audit changes nothing", []*networkingv1.NetworkPolicy{policy("stage", AuditMode, allowClientIn), policy("real", "", denyServerIn)},
			dir{"deny", false, "a/real"}, dir{"-", false, ""}, dir{"-", false, ""}},
		{"audit egress next to enforced ingress", []*networkingv1.NetworkPolicy{policy("real", "", allowClientIn), policy("stage", AuditMode, denyAllEg)},
			dir{"10.0.1.11, fd00::11", false, "a/real"}, dir{"deny", true, "a/stage"}, dir{"deny", true, "a/stage"}},
		{"two audit policies: their union", []*networkingv1.NetworkPolicy{policy("s1", AuditMode, denyServerIn), policy("s2", AuditMode, allowClientIn)},
			dir{"10.0.1.11, fd00::11", true, "a/s1,a/s2"}, dir{"-", false, ""}, dir{"-", false, ""}},
		{"another value enforces", []*networkingv1.NetworkPolicy{policy("typo", "Audit", denyServerIn)},
			dir{"deny", false, "a/typo"}, dir{"-", false, ""}, dir{"-", false, ""}},
		{"empty value enforces", []*networkingv1.NetworkPolicy{policy("empty", " ", denyServerIn)},
			dir{"deny", false, "a/empty"}, dir{"-", false, ""}, dir{"-", false, ""}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := testInput()
			in.Policies = tt.policies
			res := Compile(in)
			got := func(d policyrules.Direction) dir { return dir{render(d), d.Audit, strings.Join(d.Policies, ",")} }
			server, client := res.Ruleset.Pods[0], res.Ruleset.Pods[1]
			for _, c := range []struct {
				what      string
				got, want dir
			}{{"server ingress", got(server.Ingress), tt.serverIn}, {"server egress", got(server.Egress), tt.serverEg}, {"client egress", got(client.Egress), tt.cEg}} {
				if c.got != c.want {
					t.Errorf("%s = %+v, want %+v", c.what, c.got, c.want)
				}
			}
		})
	}
}

// TestSlimMetaKeepsAuditMode: the informers' transform drops annotations (kubectl's copy of the
// object) but the policy mode, which decides whether a policy is enforced.
func TestSlimMetaKeepsAuditMode(t *testing.T) {
	p := np("a", networkingv1.NetworkPolicySpec{})
	p.Annotations = map[string]string{AuditAnnotation: AuditMode, "kubectl.kubernetes.io/last-applied-configuration": strings.Repeat("x", 4096)}
	out, err := slimMeta(p)
	if err != nil {
		t.Fatal(err)
	}
	if got := out.(*networkingv1.NetworkPolicy).Annotations; len(got) != 1 || got[AuditAnnotation] != AuditMode || !isAudit(p) {
		t.Errorf("annotations after slimMeta: %v, want only %s=%s", got, AuditAnnotation, AuditMode)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "a", Annotations: map[string]string{"x": "y"}}}
	if out, _ := slimMeta(ns); out.(*corev1.Namespace).Annotations != nil {
		t.Errorf("a namespace keeps annotations %v", out.(*corev1.Namespace).Annotations)
	}
}
