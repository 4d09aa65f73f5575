package netpoldiff

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The model's world for its own tests: namespaces a (team=x) and b (team=y); on the node
// a/server (app=server; http=8080/TCP, dns=53/UDP), a/client (app=client; http=9090/TCP, and no
// status.podIPs yet: known by its sandbox), b/other (app=client, no ports), b/odd (app=odd) and a
// sandbox a/ghost without a Pod object (held); on another node b/far (app=client, http=7070),
// b/gone (app=client, ended) and a/hostnet (app=client, hostNetwork, the peer host's address).
var (
	mServer = Sandbox{Namespace: "a", Name: "server", Addrs: addrs("10.244.1.2", "fd00:10:244:1::2"), LinkLocal: addr("fe80::2")}
	mClient = Sandbox{Namespace: "a", Name: "client", Addrs: addrs("10.244.1.3", "fd00:10:244:1::3"), LinkLocal: addr("fe80::3")}
	mOther  = Sandbox{Namespace: "b", Name: "other", Addrs: addrs("10.244.1.4", "fd00:10:244:1::4"), LinkLocal: addr("fe80::4")}
	mOdd    = Sandbox{Namespace: "b", Name: "odd", Addrs: addrs("10.244.1.5", "fd00:10:244:1::5"), LinkLocal: addr("fe80::5")}
	mGhost  = Sandbox{Namespace: "a", Name: "ghost", Addrs: addrs("10.244.1.6", "fd00:10:244:1::6"), LinkLocal: addr("fe80::6")}
	far4    = addr("10.244.2.10")
	gone4   = addr("10.244.2.11")
	peer4   = addr("10.200.0.2")
	ext4    = addr("198.18.0.2")
	gw4     = addr("10.244.1.1")
	uplink4 = addr("198.18.0.1")
	bcast4  = addr("10.244.1.255")
	group4  = addr("239.255.0.1")
	group6  = addr("ff05::db8:1")
)

func addr(s string) netip.Addr { return netip.MustParseAddr(s) }

func addrs(s ...string) []netip.Addr {
	var out []netip.Addr
	for _, x := range s {
		out = append(out, addr(x))
	}
	return out
}

func mPod(ns, name, app string, ips []netip.Addr, ports ...corev1.ContainerPort) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app": app}},
		Spec:   corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Ports: ports}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIPs: podIPs(ips...)}}
	return p
}

func modelWorld(policies ...*networkingv1.NetworkPolicy) World {
	gone := mPod("b", "gone", "client", []netip.Addr{gone4})
	gone.Status.Phase = corev1.PodSucceeded
	hostnet := mPod("a", "hostnet", "client", []netip.Addr{peer4})
	hostnet.Spec.HostNetwork = true
	return World{
		Namespaces: []*corev1.Namespace{
			{ObjectMeta: metav1.ObjectMeta{Name: "a", Labels: map[string]string{"team": "x"}}},
			{ObjectMeta: metav1.ObjectMeta{Name: "b", Labels: map[string]string{"team": "y"}}},
		},
		Pods: []*corev1.Pod{
			mPod("a", "server", "server", mServer.Addrs,
				corev1.ContainerPort{Name: "http", ContainerPort: 8080}, corev1.ContainerPort{Name: "dns", ContainerPort: 53, Protocol: corev1.ProtocolUDP}),
			mPod("a", "client", "client", nil, corev1.ContainerPort{Name: "http", ContainerPort: 9090, Protocol: corev1.ProtocolTCP}),
			mPod("b", "other", "client", mOther.Addrs),
			mPod("b", "odd", "odd", mOdd.Addrs),
			mPod("b", "far", "client", []netip.Addr{far4}, corev1.ContainerPort{Name: "http", ContainerPort: 7070}),
			gone, hostnet,
		},
		Policies:  policies,
		Sandboxes: []Sandbox{mServer, mClient, mOther, mOdd, mGhost},
	}
}

func local(s Sandbox) Endpoint { return Endpoint{Role: RoleLocal, Sandbox: s.Key()} }

var (
	node     = Endpoint{Role: RoleNode}
	remote   = Endpoint{Role: RoleRemote}
	peerHost = Endpoint{Role: RolePeerHost}
	external = Endpoint{Role: RoleExternal}
	ingressT = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
	egressT  = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
)

// flow from a sandbox's primary IPv4 (or link-local when dst is link-local) to dst.
func flow(from Endpoint, src netip.Addr, to Endpoint, dst netip.Addr, proto Proto, port uint16) Flow {
	return Flow{From: from, To: to, Src: src, Dst: dst, Proto: proto, Port: port}
}

func podToPod(from, to Sandbox, proto Proto, port uint16) Flow {
	return flow(local(from), from.Addrs[0], local(to), to.Addrs[0], proto, port)
}

func np(ns string, sel metav1.LabelSelector, types []networkingv1.PolicyType, in []networkingv1.NetworkPolicyIngressRule, out []networkingv1.NetworkPolicyEgressRule) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("np-%s-%d", ns, len(in)*10+len(out))},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: sel, PolicyTypes: types, Ingress: in, Egress: out}}
}

func app(v string) metav1.LabelSelector {
	return metav1.LabelSelector{MatchLabels: map[string]string{"app": v}}
}

func appPtr(v string) *metav1.LabelSelector { s := app(v); return &s }

func team(v string) *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchLabels: map[string]string{"team": v}}
}

func from(peers ...networkingv1.NetworkPolicyPeer) []networkingv1.NetworkPolicyIngressRule {
	return []networkingv1.NetworkPolicyIngressRule{{From: peers}}
}

func fromPorts(ports []networkingv1.NetworkPolicyPort, peers ...networkingv1.NetworkPolicyPeer) []networkingv1.NetworkPolicyIngressRule {
	return []networkingv1.NetworkPolicyIngressRule{{From: peers, Ports: ports}}
}

func to(ports []networkingv1.NetworkPolicyPort, peers ...networkingv1.NetworkPolicyPeer) []networkingv1.NetworkPolicyEgressRule {
	return []networkingv1.NetworkPolicyEgressRule{{To: peers, Ports: ports}}
}

func block(cidr string, except ...string) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: cidr, Except: except}}
}

func pods(s *metav1.LabelSelector) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{PodSelector: s}
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

func ports(p ...networkingv1.NetworkPolicyPort) []networkingv1.NetworkPolicyPort { return p }

// TestModel checks the model on hand-written cases, the tricky ones of the API first.
func TestModel(t *testing.T) {
	everything := metav1.LabelSelector{}
	serverIn := func(in []networkingv1.NetworkPolicyIngressRule) *networkingv1.NetworkPolicy {
		return np("a", app("server"), ingressT, in, nil)
	}
	clientOut := func(out []networkingv1.NetworkPolicyEgressRule) *networkingv1.NetworkPolicy {
		return np("a", app("client"), egressT, nil, out)
	}
	http := intstr.FromString("http")
	tests := []struct {
		name     string
		policies []*networkingv1.NetworkPolicy
		flow     Flow
		want     bool
	}{
		{"no policy", nil, podToPod(mClient, mServer, TCP, 8080), true},
		{"ingress deny all", []*networkingv1.NetworkPolicy{serverIn(nil)}, podToPod(mClient, mServer, TCP, 8080), false},
		{"deny all: the node still reaches the pod", []*networkingv1.NetworkPolicy{serverIn(nil)},
			flow(node, gw4, local(mServer), mServer.Addrs[0], TCP, 8080), true},
		{"deny all ingress: the pod's own egress is open", []*networkingv1.NetworkPolicy{serverIn(nil)}, podToPod(mServer, mClient, TCP, 80), true},
		{"policy of another namespace does not isolate", []*networkingv1.NetworkPolicy{np("b", everything, ingressT, nil, nil)}, podToPod(mClient, mServer, TCP, 8080), true},

		// policyTypes defaults
		{"empty policyTypes with egress rules isolates egress", []*networkingv1.NetworkPolicy{np("a", app("client"), nil, nil, to(nil, block("198.18.0.0/24")))},
			flow(local(mClient), mClient.Addrs[0], peerHost, peer4, TCP, 80), false},
		{"empty policyTypes with egress rules: the egress rule allows", []*networkingv1.NetworkPolicy{np("a", app("client"), nil, nil, to(nil, block("198.18.0.0/24")))},
			flow(local(mClient), mClient.Addrs[0], external, ext4, TCP, 80), true},
		{"empty policyTypes isolates ingress too", []*networkingv1.NetworkPolicy{np("a", app("client"), []networkingv1.PolicyType{}, nil, to(nil, block("0.0.0.0/0")))},
			podToPod(mOther, mClient, TCP, 80), false},
		{"missing policyTypes without egress rules leaves egress open", []*networkingv1.NetworkPolicy{np("a", app("client"), nil, nil, nil)},
			flow(local(mClient), mClient.Addrs[0], peerHost, peer4, TCP, 80), true},
		{"an empty egress list is no egress rule", []*networkingv1.NetworkPolicy{np("a", app("client"), nil, nil, []networkingv1.NetworkPolicyEgressRule{})},
			flow(local(mClient), mClient.Addrs[0], peerHost, peer4, TCP, 80), true},
		{"policyTypes Egress ignores ingress rules", []*networkingv1.NetworkPolicy{np("a", app("server"), egressT, from(), nil)},
			podToPod(mClient, mServer, TCP, 8080), true},

		// peers
		{"podSelector alone: same namespace", []*networkingv1.NetworkPolicy{serverIn(from(pods(appPtr("client"))))}, podToPod(mClient, mServer, TCP, 8080), true},
		{"podSelector alone: not another namespace", []*networkingv1.NetworkPolicy{serverIn(from(pods(appPtr("client"))))}, podToPod(mOther, mServer, TCP, 8080), false},
		{"podSelector peer: a local pod known only by its sandbox", []*networkingv1.NetworkPolicy{serverIn(from(pods(appPtr("client"))))},
			flow(local(mClient), mClient.Addrs[1], local(mServer), mServer.Addrs[1], TCP, 8080), true},
		{"namespaceSelector alone", []*networkingv1.NetworkPolicy{serverIn(from(networkingv1.NetworkPolicyPeer{NamespaceSelector: team("y")}))},
			podToPod(mOdd, mServer, TCP, 8080), true},
		{"namespaceSelector alone: not the policy's own namespace", []*networkingv1.NetworkPolicy{serverIn(from(networkingv1.NetworkPolicyPeer{NamespaceSelector: team("y")}))},
			podToPod(mClient, mServer, TCP, 8080), false},
		{"namespaceSelector: a pod of another node", []*networkingv1.NetworkPolicy{serverIn(from(networkingv1.NetworkPolicyPeer{NamespaceSelector: team("y")}))},
			flow(remote, far4, local(mServer), mServer.Addrs[0], TCP, 8080), true},
		{"both selectors in one peer: selected pod of selected namespace", []*networkingv1.NetworkPolicy{serverIn(from(networkingv1.NetworkPolicyPeer{NamespaceSelector: team("y"), PodSelector: appPtr("client")}))},
			podToPod(mOther, mServer, TCP, 8080), true},
		{"both selectors in one peer: other pod of that namespace", []*networkingv1.NetworkPolicy{serverIn(from(networkingv1.NetworkPolicyPeer{NamespaceSelector: team("y"), PodSelector: appPtr("client")}))},
			podToPod(mOdd, mServer, TCP, 8080), false},
		{"both selectors in one peer: that pod label in another namespace", []*networkingv1.NetworkPolicy{serverIn(from(networkingv1.NetworkPolicyPeer{NamespaceSelector: team("y"), PodSelector: appPtr("client")}))},
			podToPod(mClient, mServer, TCP, 8080), false},
		{"two peers are a union", []*networkingv1.NetworkPolicy{serverIn(from(networkingv1.NetworkPolicyPeer{NamespaceSelector: team("y")}, pods(appPtr("client"))))},
			podToPod(mClient, mServer, TCP, 8080), true},
		{"empty podSelector peer: every pod of the namespace", []*networkingv1.NetworkPolicy{serverIn(from(pods(&everything)))},
			podToPod(mClient, mServer, TCP, 8080), true},
		{"empty namespaceSelector peer: every pod of the cluster", []*networkingv1.NetworkPolicy{serverIn(from(networkingv1.NetworkPolicyPeer{NamespaceSelector: &everything}))},
			podToPod(mOdd, mServer, TCP, 8080), true},
		{"empty namespaceSelector peer: not a host", []*networkingv1.NetworkPolicy{serverIn(from(networkingv1.NetworkPolicyPeer{NamespaceSelector: &everything}))},
			flow(external, ext4, local(mServer), mServer.Addrs[0], TCP, 8080), false},
		{"ipBlock", []*networkingv1.NetworkPolicy{serverIn(from(block("10.244.1.0/24")))}, podToPod(mClient, mServer, TCP, 8080), true},
		{"ipBlock except", []*networkingv1.NetworkPolicy{serverIn(from(block("10.244.1.0/24", "10.244.1.3/32")))}, podToPod(mClient, mServer, TCP, 8080), false},
		{"ipBlock except: the rest of the block", []*networkingv1.NetworkPolicy{serverIn(from(block("10.244.1.0/24", "10.244.1.3/32")))}, podToPod(mOther, mServer, TCP, 8080), true},
		{"ipBlock of the other family", []*networkingv1.NetworkPolicy{serverIn(from(block("fd00::/8")))}, podToPod(mOther, mServer, TCP, 8080), false},
		{"ipBlock: an external host", []*networkingv1.NetworkPolicy{serverIn(from(block("198.18.0.0/24")))},
			flow(external, ext4, local(mServer), mServer.Addrs[0], TCP, 8080), true},
		{"hostNetwork pod is no pod peer", []*networkingv1.NetworkPolicy{serverIn(from(networkingv1.NetworkPolicyPeer{NamespaceSelector: &everything, PodSelector: appPtr("client")}))},
			flow(peerHost, peer4, local(mServer), mServer.Addrs[0], TCP, 8080), false},
		{"hostNetwork pod's address by ipBlock", []*networkingv1.NetworkPolicy{serverIn(from(block("10.200.0.0/24")))},
			flow(peerHost, peer4, local(mServer), mServer.Addrs[0], TCP, 8080), true},
		{"ended pod is no pod peer", []*networkingv1.NetworkPolicy{serverIn(from(networkingv1.NetworkPolicyPeer{NamespaceSelector: &everything, PodSelector: appPtr("client")}))},
			flow(remote, gone4, local(mServer), mServer.Addrs[0], TCP, 8080), false},

		// ports
		{"endPort: inside", []*networkingv1.NetworkPolicy{serverIn(fromPorts(ports(port("", intstr.FromInt32(8000), 8080))))}, podToPod(mClient, mServer, TCP, 8080), true},
		{"endPort: first", []*networkingv1.NetworkPolicy{serverIn(fromPorts(ports(port("", intstr.FromInt32(8000), 8080))))}, podToPod(mClient, mServer, TCP, 8000), true},
		{"endPort: past the end", []*networkingv1.NetworkPolicy{serverIn(fromPorts(ports(port("", intstr.FromInt32(8000), 8080))))}, podToPod(mClient, mServer, TCP, 8081), false},
		{"endPort: before the start", []*networkingv1.NetworkPolicy{serverIn(fromPorts(ports(port("", intstr.FromInt32(8000), 8080))))}, podToPod(mClient, mServer, TCP, 7999), false},
		{"protocol defaults to TCP", []*networkingv1.NetworkPolicy{serverIn(fromPorts(ports(port("", intstr.FromInt32(53)))))}, podToPod(mClient, mServer, UDP, 53), false},
		{"UDP port", []*networkingv1.NetworkPolicy{serverIn(fromPorts(ports(port(corev1.ProtocolUDP, intstr.FromInt32(53)))))}, podToPod(mClient, mServer, UDP, 53), true},
		{"SCTP port", []*networkingv1.NetworkPolicy{serverIn(fromPorts(ports(port(corev1.ProtocolSCTP, intstr.FromInt32(3868)))))}, podToPod(mClient, mServer, SCTP, 3868), true},
		{"protocol without port: every port", []*networkingv1.NetworkPolicy{serverIn(fromPorts([]networkingv1.NetworkPolicyPort{{Protocol: ptr(corev1.ProtocolUDP)}}))},
			podToPod(mClient, mServer, UDP, 4242), true},
		{"no ports: ICMP too", []*networkingv1.NetworkPolicy{serverIn(from(pods(appPtr("client"))))}, podToPod(mClient, mServer, ICMP, 0), true},
		{"a rule with ports never matches ICMP", []*networkingv1.NetworkPolicy{serverIn(fromPorts([]networkingv1.NetworkPolicyPort{{Protocol: ptr(corev1.ProtocolTCP)}}))},
			podToPod(mClient, mServer, ICMP, 0), false},
		{"named port on ingress: the selected pod's", []*networkingv1.NetworkPolicy{serverIn(fromPorts(ports(port("", http))))}, podToPod(mClient, mServer, TCP, 8080), true},
		{"named port on ingress: not the sender's", []*networkingv1.NetworkPolicy{serverIn(fromPorts(ports(port("", http))))}, podToPod(mClient, mServer, TCP, 9090), false},
		{"named port of another protocol", []*networkingv1.NetworkPolicy{serverIn(fromPorts(ports(port(corev1.ProtocolTCP, intstr.FromString("dns")))))}, podToPod(mClient, mServer, TCP, 53), false},
		{"named port on egress: the destination's", []*networkingv1.NetworkPolicy{clientOut(to(ports(port("", http)), pods(appPtr("server"))))},
			podToPod(mClient, mServer, TCP, 8080), true},
		{"named port on egress: not the sender's", []*networkingv1.NetworkPolicy{clientOut(to(ports(port("", http)), pods(appPtr("server"))))},
			podToPod(mClient, mServer, TCP, 9090), false},
		{"named port on egress: each destination's own number", []*networkingv1.NetworkPolicy{clientOut(to(ports(port("", http)), networkingv1.NetworkPolicyPeer{NamespaceSelector: &everything}))},
			flow(local(mClient), mClient.Addrs[0], remote, far4, TCP, 7070), true},
		{"named port on egress via ipBlock: a pod inside with the port", []*networkingv1.NetworkPolicy{clientOut(to(ports(port("", http)), block("10.244.1.0/24")))},
			podToPod(mClient, mServer, TCP, 8080), true},
		{"named port on egress via ipBlock: a pod inside without it", []*networkingv1.NetworkPolicy{clientOut(to(ports(port("", http)), block("10.244.1.0/24")))},
			podToPod(mClient, mOther, TCP, 8080), false},
		{"named port on egress via ipBlock: no pod (the node)", []*networkingv1.NetworkPolicy{clientOut(to(ports(port("", http)), block("10.244.1.0/24")))},
			flow(local(mClient), mClient.Addrs[0], node, gw4, TCP, 8080), false},
		{"named port on egress via ipBlock: a pod outside the block", []*networkingv1.NetworkPolicy{clientOut(to(ports(port("", http)), block("10.244.1.4/32")))},
			podToPod(mClient, mServer, TCP, 8080), false},
		{"union of two policies", []*networkingv1.NetworkPolicy{serverIn(fromPorts(ports(port("", intstr.FromInt32(80))))), np("a", app("server"), ingressT, fromPorts(ports(port(corev1.ProtocolUDP, intstr.FromInt32(53)))), nil)},
			podToPod(mClient, mServer, UDP, 53), true},

		// both ends
		{"ingress allows, the sender's egress does not", []*networkingv1.NetworkPolicy{serverIn(from(pods(appPtr("client")))), clientOut(nil)}, podToPod(mClient, mServer, TCP, 8080), false},
		{"both allow", []*networkingv1.NetworkPolicy{serverIn(from(pods(appPtr("client")))), clientOut(to(nil, pods(appPtr("server"))))}, podToPod(mClient, mServer, TCP, 8080), true},
		{"pod to the node: egress with the node's address", []*networkingv1.NetworkPolicy{clientOut(to(nil, block("10.244.1.1/32")))},
			flow(local(mClient), mClient.Addrs[0], node, gw4, TCP, 80), true},
		{"pod to the node's other address", []*networkingv1.NetworkPolicy{clientOut(to(nil, block("10.244.1.1/32")))},
			flow(local(mClient), mClient.Addrs[0], node, uplink4, TCP, 80), false},
		{"pod to another node's pod: only this node's side", []*networkingv1.NetworkPolicy{np("b", everything, ingressT, nil, nil)},
			flow(local(mClient), mClient.Addrs[0], remote, far4, TCP, 80), true},

		// matchExpressions on the policy's own podSelector
		{"In", []*networkingv1.NetworkPolicy{np("a", expr("app", metav1.LabelSelectorOpIn, "server", "x"), ingressT, nil, nil)}, podToPod(mClient, mServer, TCP, 8080), false},
		{"NotIn", []*networkingv1.NetworkPolicy{np("a", expr("app", metav1.LabelSelectorOpNotIn, "server"), ingressT, nil, nil)}, podToPod(mClient, mServer, TCP, 8080), true},
		{"Exists", []*networkingv1.NetworkPolicy{np("a", expr("app", metav1.LabelSelectorOpExists), ingressT, nil, nil)}, podToPod(mClient, mServer, TCP, 8080), false},
		{"DoesNotExist", []*networkingv1.NetworkPolicy{np("a", expr("app", metav1.LabelSelectorOpDoesNotExist), ingressT, nil, nil)}, podToPod(mClient, mServer, TCP, 8080), true},

		// kubenet's extensions
		{"link-local: the pod's identity", []*networkingv1.NetworkPolicy{serverIn(from(pods(appPtr("client"))))},
			flow(local(mClient), mClient.LinkLocal, local(mServer), mServer.LinkLocal, TCP, 8080), true},
		{"link-local: another pod's", []*networkingv1.NetworkPolicy{serverIn(from(pods(appPtr("client"))))},
			flow(local(mOdd), mOdd.LinkLocal, local(mServer), mServer.LinkLocal, TCP, 8080), false},
		{"link-local: an ipBlock of the pod CIDR does not cover it", []*networkingv1.NetworkPolicy{serverIn(from(block("fd00:10:244:1::/64")))},
			flow(local(mClient), mClient.LinkLocal, local(mServer), mServer.LinkLocal, TCP, 8080), false},
		{"link-local: an ipBlock that covers it", []*networkingv1.NetworkPolicy{serverIn(from(block("fe80::/10")))},
			flow(local(mClient), mClient.LinkLocal, local(mServer), mServer.LinkLocal, TCP, 8080), true},
		{"link-local: to the bridge, the node's address", []*networkingv1.NetworkPolicy{clientOut(to(nil, pods(&everything)))},
			flow(local(mClient), mClient.LinkLocal, node, addr("fe80::1"), UDP, 53), false},
		{"link-local: named port of the destination pod", []*networkingv1.NetworkPolicy{clientOut(to(ports(port("", http)), block("fe80::/64")))},
			flow(local(mClient), mClient.LinkLocal, local(mServer), mServer.LinkLocal, TCP, 8080), true},
		{"broadcast: the receiver's ingress judges the sender", []*networkingv1.NetworkPolicy{serverIn(from(pods(appPtr("client"))))},
			flow(local(mClient), mClient.Addrs[0], local(mServer), bcast4, UDP, 5000), true},
		{"broadcast: a sender the receiver does not allow", []*networkingv1.NetworkPolicy{serverIn(from(pods(appPtr("client"))))},
			flow(local(mOdd), mOdd.Addrs[0], local(mServer), bcast4, UDP, 5000), false},
		{"broadcast: the sender's egress needs a block covering the address", []*networkingv1.NetworkPolicy{clientOut(to(nil, pods(&everything)))},
			flow(local(mClient), mClient.Addrs[0], local(mServer), bcast4, UDP, 5000), false},
		{"broadcast: a block covering it", []*networkingv1.NetworkPolicy{clientOut(to(nil, block("10.244.1.0/24")))},
			flow(local(mClient), mClient.Addrs[0], local(mServer), bcast4, UDP, 5000), true},
		{"multicast: egress to a group block", []*networkingv1.NetworkPolicy{clientOut(to(ports(port(corev1.ProtocolUDP, intstr.FromInt32(5000))), block("224.0.0.0/4")))},
			flow(local(mClient), mClient.Addrs[0], local(mServer), group4, UDP, 5000), true},
		{"multicast: a named port never matches a group", []*networkingv1.NetworkPolicy{clientOut(to(ports(port(corev1.ProtocolUDP, intstr.FromString("dns"))), block("224.0.0.0/4")))},
			flow(local(mClient), mClient.Addrs[0], local(mServer), group4, UDP, 53), false},
		{"multicast: an IPv6 group outside the block", []*networkingv1.NetworkPolicy{clientOut(to(nil, block("fd00::/8")))},
			flow(local(mClient), mClient.Addrs[1], local(mServer), group6, UDP, 5000), false},
		{"multicast: the node receives by the sender's egress only", []*networkingv1.NetworkPolicy{clientOut(to(nil, block("ff00::/8")))},
			flow(local(mClient), mClient.Addrs[1], node, group6, UDP, 5000), true},
		{"held sandbox receives nothing", nil, podToPod(mClient, mGhost, TCP, 80), false},
		{"held sandbox sends nothing", nil, podToPod(mGhost, mClient, TCP, 80), false},
		{"held sandbox: not even from the node", nil, flow(node, gw4, local(mGhost), mGhost.Addrs[0], TCP, 80), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v := NewModel(modelWorld(tc.policies...)).Judge(tc.flow)
			if v.Allowed != tc.want {
				t.Errorf("%s: allowed %v, want %v (model: %s)", tc.flow, v.Allowed, tc.want, v.Why)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

func expr(key string, op metav1.LabelSelectorOperator, values ...string) metav1.LabelSelector {
	return metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: key, Operator: op, Values: values}}}
}

// TestSelectsAgreesWithTheAPI checks the model's own selector matching against apimachinery's
// on the selectors and label sets the generator makes.
func TestSelectsAgreesWithTheAPI(t *testing.T) {
	g := &generator{r: rand.New(rand.NewPCG(1, 1)), topo: &Topology{LabelKeys: []string{"app", "tier", "role"}, LabelValues: []string{"a", "b", "c"}}}
	for i := range 20000 {
		s := g.podSelector()
		l := map[string]string{}
		for _, k := range g.topo.LabelKeys {
			if g.chance(0.5) {
				l[k] = g.pick(g.topo.LabelValues)
			}
		}
		api, err := metav1.LabelSelectorAsSelector(s)
		if err != nil {
			t.Fatalf("generated selector %v is invalid: %v", s, err)
		}
		if got, want := Selects(s, l), api.Matches(labels.Set(l)); got != want {
			t.Fatalf("%d: selector %v on labels %v: model %v, apimachinery %v", i, s, l, got, want)
		}
	}
}
