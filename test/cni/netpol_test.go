package cni

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kubenet-dev/kubenet/agent/policy"
	"github.com/kubenet-dev/kubenet/core"
	"github.com/kubenet-dev/kubenet/internal/policyrules"
	"github.com/kubenet-dev/kubenet/internal/tcguard"
	"github.com/kubenet-dev/kubenet/netpol"
	"github.com/kubenet-dev/kubenet/test/nettest"
	"github.com/kubenet-dev/kubenet/test/testkit"
)

// npCluster is a dual-stack node enforcing NetworkPolicy, with three pods attached through the
// plugin (networkPolicy on): a/server (app=server, container ports http=8080/TCP, alt=9090/TCP,
// dns=5353/UDP, hostPort 30080→8080), a/client (app=client) and b/other (app=client, namespace
// team=y). The node's peer host (10.200.0.2, fd00:200::2) routes the pod CIDRs to the node; the
// external host (198.18.0.2, 2001:db8:e::2) reaches the node's uplink. Policies are compiled by
// agent/policy and applied by the core as kubenet-agent does, without an API server.
type npCluster struct {
	node                  *nettest.Node
	list                  *libcni.NetworkConfigList
	server, client, other *nettest.Pod
	objs                  map[*nettest.Pod]*corev1.Pod
	namespaces            []*corev1.Namespace
	// servers in the server pod, by name
	tcp8080, tcp9090 *nettest.EchoServer
	udp5353          *nettest.EchoServer
	// echo servers on the node (its address on the peer link) and on the hosts
	onNode, onPeer, onExternal map[bool]*nettest.EchoServer
}

func npPod(node *nettest.Node, t *testing.T, namespace, name string) *nettest.Pod {
	p := node.NewPod(t, fmt.Sprintf("np-%s-%s-%d", namespace, name, time.Now().UnixNano()%1e9))
	p.RT.Args = [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", namespace}, {"K8S_POD_NAME", name}}
	return p
}

func newNPCluster(t *testing.T) *npCluster {
	t.Helper()
	node := nettest.NewNode(t, binDir)
	c := &npCluster{node: node, objs: map[*nettest.Pod]*corev1.Pod{}}
	c.list = node.ConfList(t, nettest.NetConf{
		PodCIDRs:           testkit.DualStack(),
		NonMasqueradeCIDRs: []netip.Prefix{nettest.NonMasquerade4, nettest.NonMasquerade6},
		Extra:              map[string]any{"networkPolicy": true},
	})
	c.namespaces = []*corev1.Namespace{
		{ObjectMeta: metav1.ObjectMeta{Name: "a", Labels: map[string]string{"team": "x", "kubernetes.io/metadata.name": "a"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "b", Labels: map[string]string{"team": "y", "kubernetes.io/metadata.name": "b"}}},
	}
	c.server, c.client, c.other = npPod(node, t, "a", "server"), npPod(node, t, "a", "client"), npPod(node, t, "b", "other")
	c.server.RT.CapabilityArgs = hpArgs(true, hpMapping{30080, 8080, "TCP", ""})
	// The other pod is shaped both ways: its redirect shares the clsact qdisc with its guard.
	c.other.RT.CapabilityArgs = map[string]any{"bandwidth": map[string]any{"ingressRate": 100_000_000, "egressRate": 100_000_000}}
	for _, p := range []*nettest.Pod{c.server, c.client, c.other} {
		node.MustAdd(t, c.list, p)
	}
	mk := func(p *nettest.Pod, app string, ports ...corev1.ContainerPort) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: p.RT.Args[1][1], Name: p.RT.Args[2][1], Labels: map[string]string{"app": app}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Ports: ports}}}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	}
	c.objs[c.server] = mk(c.server, "server",
		corev1.ContainerPort{Name: "http", ContainerPort: 8080}, corev1.ContainerPort{Name: "alt", ContainerPort: 9090},
		corev1.ContainerPort{Name: "dns", ContainerPort: 5353, Protocol: corev1.ProtocolUDP})
	c.objs[c.client] = mk(c.client, "client")
	c.objs[c.other] = mk(c.other, "client")

	any6 := netip.IPv6Unspecified()
	c.tcp8080 = nettest.StartTCPEcho(t, c.server.NS, netip.AddrPortFrom(any6, 8080))
	c.tcp9090 = nettest.StartTCPEcho(t, c.server.NS, netip.AddrPortFrom(any6, 9090))
	c.udp5353 = nettest.StartUDPEcho(t, c.server.NS, netip.AddrPortFrom(any6, 5353))
	c.onNode, c.onPeer, c.onExternal = map[bool]*nettest.EchoServer{}, map[bool]*nettest.EchoServer{}, map[bool]*nettest.EchoServer{}
	for _, is6 := range []bool{false, true} {
		c.onNode[is6] = nettest.StartTCPEcho(t, node.NS, netip.AddrPortFrom(byFamily(is6, nettest.NodePeerLink4, nettest.NodePeerLink6).Addr(), 0))
		c.onPeer[is6] = nettest.StartTCPEcho(t, node.Peer, netip.AddrPortFrom(byFamily(is6, nettest.Peer4, nettest.Peer6).Addr(), 0))
		c.onExternal[is6] = nettest.StartTCPEcho(t, node.External, netip.AddrPortFrom(byFamily(is6, nettest.External4, nettest.External6).Addr(), 0))
	}
	// The external host reaches the pod CIDRs through the node (a cloud route would do this).
	nettest.AddRoute(t, node.External, netip.MustParsePrefix("10.244.0.0/16"), nettest.NodeUplink4.Addr())
	nettest.AddRoute(t, node.External, netip.MustParsePrefix("fd00:10:244::/48"), nettest.NodeUplink6.Addr())
	return c
}

func byFamily[T any](is6 bool, v4, v6 T) T {
	if is6 {
		return v6
	}
	return v4
}

// apply compiles policies for the node's pods and applies them inside the node, as one pass of
// kubenet-agent's controller does.
func (c *npCluster) apply(t *testing.T, policies ...*networkingv1.NetworkPolicy) {
	t.Helper()
	in := policy.Input{Policies: policies, Namespaces: c.namespaces}
	for p, obj := range c.objs {
		o := obj.DeepCopy()
		for _, a := range p.IPs() {
			o.Status.PodIPs = append(o.Status.PodIPs, corev1.PodIP{IP: a.String()})
		}
		in.Pods = append(in.Pods, o)
	}
	nettest.Do(t, c.node.NS, func() error {
		_, err := core.ApplyPolicies(core.PolicyNetwork{DataDir: c.node.DataDir(), Network: "kubenet", Bridge: core.DefaultBridge, PodCIDRs: testkit.DualStack()},
			func(locals []core.PolicyLocal) policyrules.Ruleset {
				in.Local = policy.LocalsOf(locals)
				return policy.Compile(in).Ruleset
			})
		return err
	})
}

// expect checks that a TCP connection from src to dst succeeds (and the server saw from, when
// valid) or fails.
func expect(t *testing.T, what string, src ns.NetNS, dst netip.AddrPort, allowed bool, from netip.Addr) {
	t.Helper()
	timeout := testkit.UnreachableTimeout
	if allowed {
		timeout = testkit.TrafficTimeout
	}
	r, err := nettest.TCPRequest(src, dst, "np", timeout)
	switch {
	case allowed && err != nil:
		t.Errorf("%s: %s not reached: %v", what, dst, err)
	case allowed && from.IsValid() && r.From != from:
		t.Errorf("%s: %s saw the client as %s, want %s", what, dst, r.From, from)
	case !allowed && err == nil:
		t.Errorf("%s: %s reached (seen from %s), want denied", what, dst, r.From)
	}
}

func policyOf(ns, name string, spec networkingv1.NetworkPolicySpec) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: spec}
}

func labelSel(kv ...string) *metav1.LabelSelector {
	s := &metav1.LabelSelector{MatchLabels: map[string]string{}}
	for i := 0; i+1 < len(kv); i += 2 {
		s.MatchLabels[kv[i]] = kv[i+1]
	}
	return s
}

func npPort(proto corev1.Protocol, p intstr.IntOrString, end ...int32) networkingv1.NetworkPolicyPort {
	pp := networkingv1.NetworkPolicyPort{Protocol: &proto, Port: &p}
	if len(end) > 0 {
		pp.EndPort = &end[0]
	}
	return pp
}

// TestNetworkPolicyTraffic drives every feature of the API through real traffic on a node the
// plugin set up, IPv4 and IPv6: pods on the node, the node itself, a cluster peer host and an
// external host, directly and through a hostPort.
func TestNetworkPolicyTraffic(t *testing.T) {
	c := newNPCluster(t)
	for _, is6 := range []bool{false, true} {
		fam := byFamily(is6, "ipv4", "ipv6")
		like := byFamily(is6, netip.IPv4Unspecified(), netip.IPv6Unspecified())
		srv := func(port uint16) netip.AddrPort { return netip.AddrPortFrom(c.server.IP(like), port) }
		clientIP, otherIP := c.client.IP(like), c.other.IP(like)
		peerIP := byFamily(is6, nettest.Peer4, nettest.Peer6).Addr()
		uplink := byFamily(is6, nettest.NodeUplink4, nettest.NodeUplink6).Addr()
		hostPort := netip.AddrPortFrom(uplink, 30080)
		ingress := []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
		egress := []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
		serverSel := *labelSel("app", "server")

		t.Run(fam+"/held until the first apply", func(t *testing.T) {
			// As ADD left the pods before any apply: no policy tables, the guards on.
			nettest.Do(t, c.node.NS, func() error { return netpol.Remove("kubenet") })
			expect(t, "client to held server", c.client.NS, srv(8080), false, netip.Addr{})
			expect(t, "held client to the peer", c.client.NS, c.onPeer[is6].Addr, false, netip.Addr{})
			expect(t, "the node to held server", c.node.NS, srv(8080), false, netip.Addr{})
			c.apply(t)
			expect(t, "after the first apply, no policy", c.client.NS, srv(8080), true, clientIP)
		})

		t.Run(fam+"/ingress deny all", func(t *testing.T) {
			c.apply(t, policyOf("a", "deny", networkingv1.NetworkPolicySpec{PodSelector: serverSel, PolicyTypes: ingress}))
			expect(t, "client", c.client.NS, srv(8080), false, netip.Addr{})
			expect(t, "peer host", c.node.Peer, srv(8080), false, netip.Addr{})
			expect(t, "the node (kubelet's probes)", c.node.NS, srv(8080), true, netip.Addr{})
			expect(t, "server's own connection out, and its replies", c.server.NS, c.onPeer[is6].Addr, true, c.server.IP(like))
			expect(t, "client through the hostPort", c.client.NS, hostPort, false, netip.Addr{})
			expect(t, "external host through the hostPort", c.node.External, hostPort, false, netip.Addr{})
		})

		t.Run(fam+"/podSelector and named port", func(t *testing.T) {
			c.apply(t, policyOf("a", "p", networkingv1.NetworkPolicySpec{PodSelector: serverSel, PolicyTypes: ingress,
				Ingress: []networkingv1.NetworkPolicyIngressRule{{
					From:  []networkingv1.NetworkPolicyPeer{{PodSelector: labelSel("app", "client")}},
					Ports: []networkingv1.NetworkPolicyPort{npPort(corev1.ProtocolTCP, intstr.FromString("http"))},
				}}}))
			expect(t, "client on http", c.client.NS, srv(8080), true, clientIP)
			expect(t, "client on another port", c.client.NS, srv(9090), false, netip.Addr{})
			expect(t, "same labels in another namespace", c.other.NS, srv(8080), false, netip.Addr{})
			expect(t, "client through the hostPort keeps its address", c.client.NS, hostPort, true, clientIP)
			expect(t, "other through the hostPort stays denied", c.other.NS, hostPort, false, netip.Addr{})
		})

		t.Run(fam+"/through a Service and a NodePort (kube-proxy's NAT)", func(t *testing.T) {
			svc, nodePort := c.kubeProxy(t, is6)
			c.apply(t, policyOf("a", "p", networkingv1.NetworkPolicySpec{PodSelector: serverSel, PolicyTypes: ingress,
				Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: labelSel("app", "client")}}}}}))
			expect(t, "client through the Service", c.client.NS, svc, true, netip.Addr{})
			expect(t, "other through the Service stays denied", c.other.NS, svc, false, netip.Addr{})
			expect(t, "client through the NodePort", c.client.NS, nodePort, true, netip.Addr{})
			expect(t, "other through the NodePort stays denied", c.other.NS, nodePort, false, netip.Addr{})
			expect(t, "peer host through the NodePort stays denied", c.node.Peer, netip.AddrPortFrom(byFamily(is6, nettest.NodePeerLink4, nettest.NodePeerLink6).Addr(), nodePort.Port()), false, netip.Addr{})
		})

		t.Run(fam+"/namespaceSelector", func(t *testing.T) {
			c.apply(t, policyOf("a", "p", networkingv1.NetworkPolicySpec{PodSelector: serverSel, PolicyTypes: ingress,
				Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: labelSel("team", "y")}}}}}))
			expect(t, "other (namespace team=y)", c.other.NS, srv(9090), true, otherIP)
			expect(t, "client (namespace team=x)", c.client.NS, srv(9090), false, netip.Addr{})
		})

		t.Run(fam+"/ipBlock with except", func(t *testing.T) {
			block := byFamily(is6, "10.200.0.0/24", "fd00:200::/64")
			except := byFamily(is6, "10.200.0.2/32", "fd00:200::2/128")
			c.apply(t, policyOf("a", "p", networkingv1.NetworkPolicySpec{PodSelector: serverSel, PolicyTypes: ingress,
				Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: block}}}}}}))
			expect(t, "peer host inside the block", c.node.Peer, srv(8080), true, peerIP)
			c.apply(t, policyOf("a", "p", networkingv1.NetworkPolicySpec{PodSelector: serverSel, PolicyTypes: ingress,
				Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: block, Except: []string{except}}}}}}}))
			expect(t, "peer host in the except", c.node.Peer, srv(8080), false, netip.Addr{})
			ext := byFamily(is6, "198.18.0.0/24", "2001:db8:e::/64")
			c.apply(t, policyOf("a", "p", networkingv1.NetworkPolicySpec{PodSelector: serverSel, PolicyTypes: ingress,
				Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: ext}}}}}}))
			expect(t, "external host directly", c.node.External, srv(8080), true, byFamily(is6, nettest.External4, nettest.External6).Addr())
			expect(t, "external host through the hostPort", c.node.External, hostPort, true, netip.Addr{})
			expect(t, "client", c.client.NS, srv(8080), false, netip.Addr{})
		})

		t.Run(fam+"/egress", func(t *testing.T) {
			c.apply(t, policyOf("a", "p", networkingv1.NetworkPolicySpec{PodSelector: *labelSel("app", "client"), PolicyTypes: egress,
				Egress: []networkingv1.NetworkPolicyEgressRule{
					{To: []networkingv1.NetworkPolicyPeer{{PodSelector: labelSel("app", "server")}}, Ports: []networkingv1.NetworkPolicyPort{npPort(corev1.ProtocolTCP, intstr.FromInt32(9000), 9100)}},
					{To: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: byFamily(is6, "198.18.0.0/24", "2001:db8:e::/64")}}}},
				}}))
			expect(t, "client to server in the port range", c.client.NS, srv(9090), true, clientIP)
			expect(t, "client to server outside the range", c.client.NS, srv(8080), false, netip.Addr{})
			expect(t, "client to the external host (ipBlock)", c.client.NS, c.onExternal[is6].Addr, true, netip.Addr{})
			expect(t, "client to the peer host", c.client.NS, c.onPeer[is6].Addr, false, netip.Addr{})
			expect(t, "client to the node itself", c.client.NS, c.onNode[is6].Addr, false, netip.Addr{})
			expect(t, "server not egress-isolated", c.server.NS, c.onPeer[is6].Addr, true, netip.Addr{})
			expect(t, "the server still reaches the client (client's ingress open)", c.server.NS, c.onPeer[is6].Addr, true, netip.Addr{})
		})

		t.Run(fam+"/egress named port, the destination's", func(t *testing.T) {
			c.apply(t, policyOf("a", "p", networkingv1.NetworkPolicySpec{PodSelector: *labelSel("app", "client"), PolicyTypes: egress,
				Egress: []networkingv1.NetworkPolicyEgressRule{{Ports: []networkingv1.NetworkPolicyPort{npPort(corev1.ProtocolTCP, intstr.FromString("alt"))}}}}))
			expect(t, "to the server's alt port", c.client.NS, srv(9090), true, clientIP)
			expect(t, "to the server's http port", c.client.NS, srv(8080), false, netip.Addr{})
		})

		t.Run(fam+"/UDP and protocols", func(t *testing.T) {
			c.apply(t, policyOf("a", "p", networkingv1.NetworkPolicySpec{PodSelector: serverSel, PolicyTypes: ingress,
				Ingress: []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{npPort(corev1.ProtocolUDP, intstr.FromString("dns"))}}}}))
			payload := "udp-allowed-" + fam
			r, err := nettest.UDPRequest(c.client.NS, srv(5353), payload, testkit.TrafficTimeout)
			if err := nettest.ExpectFrom(r, err, clientIP); err != nil {
				t.Errorf("UDP to the allowed port: %v", err)
			}
			expect(t, "TCP to a UDP-only rule", c.client.NS, srv(8080), false, netip.Addr{})
			c.apply(t, policyOf("a", "p", networkingv1.NetworkPolicySpec{PodSelector: serverSel, PolicyTypes: ingress}))
			denied := "udp-denied-" + fam
			if _, err := nettest.UDPRequest(c.client.NS, srv(5353), denied, testkit.UnreachableTimeout); err == nil || c.udp5353.Received(denied) > 0 {
				t.Errorf("UDP to a denied port reached the server (err %v)", err)
			}
		})

		t.Run(fam+"/both directions must allow", func(t *testing.T) {
			c.apply(t,
				policyOf("a", "in", networkingv1.NetworkPolicySpec{PodSelector: serverSel, PolicyTypes: ingress,
					Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: labelSel("app", "client")}}}}}),
				policyOf("a", "out", networkingv1.NetworkPolicySpec{PodSelector: *labelSel("app", "client"), PolicyTypes: egress}))
			expect(t, "server allows client, client's egress denies", c.client.NS, srv(8080), false, netip.Addr{})
			c.apply(t,
				policyOf("a", "in", networkingv1.NetworkPolicySpec{PodSelector: serverSel, PolicyTypes: ingress,
					Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: labelSel("app", "client")}}}}}),
				policyOf("a", "out", networkingv1.NetworkPolicySpec{PodSelector: *labelSel("app", "client"), PolicyTypes: egress,
					Egress: []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{{PodSelector: labelSel("app", "server")}}}}}))
			expect(t, "both allow", c.client.NS, srv(8080), true, clientIP)
		})
		c.apply(t)
	}
}

// kubeProxy installs what kube-proxy does for a ClusterIP Service and a NodePort leading to the
// server's port 8080 (DNAT in prerouting and output, masquerade of every NodePort connection and
// of marked ones), in a table of the test's own in the node, and returns the two addresses.
func (c *npCluster) kubeProxy(t *testing.T, is6 bool) (svc, nodePort netip.AddrPort) {
	t.Helper()
	family, ip := "ip", "ip"
	clusterIP := netip.MustParseAddr("10.96.0.10")
	if is6 {
		family, ip, clusterIP = "ip6", "ip6", netip.MustParseAddr("fd00:96::10")
	}
	backend := netip.AddrPortFrom(c.server.IP(clusterIP), 8080)
	table := "kproxy-emu-" + family
	script := fmt.Sprintf(`table %[1]s %[2]s {
	chain services {
		%[3]s daddr %[4]s tcp dport 80 meta mark set mark or 0x4000 dnat to %[5]s
		fib daddr type local tcp dport 31080 meta mark set mark or 0x4000 dnat to %[5]s
	}
	chain prerouting { type nat hook prerouting priority dstnat; jump services; }
	chain output { type nat hook output priority -100; jump services; }
	chain postrouting { type nat hook postrouting priority srcnat; meta mark & 0x4000 != 0 masquerade; }
}
`, family, table, ip, clusterIP, backend)
	f := filepath.Join(t.TempDir(), "kproxy.nft")
	if err := os.WriteFile(f, []byte(script), 0o600); err != nil {
		t.Fatal(err)
	}
	nettest.Run(t, c.node.NS, "nft", "-f", f)
	t.Cleanup(func() { _, _ = nettest.Output(c.node.NS, "nft", "delete", "table", family, table) })
	return netip.AddrPortFrom(clusterIP, 80), netip.AddrPortFrom(byFamily(is6, nettest.NodeUplink4, nettest.NodeUplink6).Addr(), 31080)
}

// TestNetworkPolicyLeaks: DEL and GC leave no map element of the pod's port.
func TestNetworkPolicyLeaks(t *testing.T) {
	c := newNPCluster(t)
	c.apply(t, policyOf("a", "deny", networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{}, PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}}))
	port := func(p *nettest.Pod) int {
		var i int
		nettest.Do(t, c.node.NS, func() error {
			l, err := netlink.LinkByName(core.NamesFor("kubenet", testkit.AttachmentOf(p)).HostVeth)
			if err == nil {
				i = l.Attrs().Index
			}
			return err
		})
		return i
	}
	maps := func() map[string]map[int]string {
		var m map[string]map[int]string
		nettest.Do(t, c.node.NS, func() (err error) { m, err = netpol.Dispatch("kubenet"); return err })
		return m
	}
	clientPort := port(c.client)
	if m := maps(); m[netpol.MapIngress][clientPort] == "" || m[netpol.MapEgress][clientPort] == "" {
		t.Fatalf("before DEL the maps do not hold the client's port %d: %v", clientPort, m)
	}
	if err := c.node.Del(c.list, c.client); err != nil {
		t.Fatal(err)
	}
	if m := maps(); m[netpol.MapIngress][clientPort] != "" || m[netpol.MapEgress][clientPort] != "" {
		t.Errorf("after DEL the maps still hold the client's port %d: %v", clientPort, m)
	}
	testkit.AssertNoResidue(t, c.node, "kubenet", testkit.AttachmentOf(c.client), c.client.IPs())

	// A new pod that was never applied is held (its guard, no element); GC of it (the runtime
	// lost it) leaves nothing.
	late := npPod(c.node, t, "a", "late")
	c.node.MustAdd(t, c.list, late)
	if m := maps(); m[netpol.MapIngress][port(late)] != "" {
		t.Fatalf("the new pod is in the maps before any apply: %v", m)
	}
	var valid []types.GCAttachment
	for _, p := range []*nettest.Pod{c.server, c.other} {
		valid = append(valid, types.GCAttachment{ContainerID: p.RT.ContainerID, IfName: p.RT.IfName})
	}
	if err := c.node.GC(c.list, valid); err != nil {
		t.Fatal(err)
	}
	testkit.AssertNoResidue(t, c.node, "kubenet", testkit.AttachmentOf(late), late.IPs())
}

// TestNetworkPolicyCheckAndStatus: with policies in force CHECK and STATUS pass (guards, the
// bridge's nf_call options, a shaped pod's redirect beside its guard); each piece another tool
// removes makes CHECK fail and is put back by the agent's pass. STATUS stays ready: the next ADD
// or the agent's pass restores these (a node whose configuration just turned networkPolicy on
// has neither yet, and must get that ADD); it answers 50 only where enforcement is impossible
// (no br_netfilter).
func TestNetworkPolicyCheckAndStatus(t *testing.T) {
	c := newNPCluster(t)
	c.apply(t)
	for _, p := range []*nettest.Pod{c.server, c.client, c.other} {
		if err := c.node.Check(c.list, p); err != nil {
			t.Errorf("CHECK of %s: %v", p.RT.ContainerID, err)
		}
	}
	if err := c.node.Status(c.list); err != nil {
		t.Errorf("STATUS: %v", err)
	}
	srv := netip.AddrPortFrom(c.server.IP(netip.IPv4Unspecified()), 8080)
	expect(t, "client to server", c.client.NS, srv, true, netip.Addr{})
	bridgeIdx := func() int {
		var i int
		nettest.Do(t, c.node.NS, func() error {
			l, err := netlink.LinkByName(core.DefaultBridge)
			if err == nil {
				i = l.Attrs().Index
			}
			return err
		})
		return i
	}
	serverPort, err := testkit.PolicyPort(c.node.NS, "kubenet", c.server)
	if err != nil {
		t.Fatal(err)
	}
	for _, tamper := range []struct {
		name string
		do   func() error
	}{
		{"the server's port guard removed", func() error { return tcguard.Remove(serverPort, tcguard.Egress) }},
		{"the bridge guard removed", func() error { return tcguard.Remove(bridgeIdx(), tcguard.Ingress) }},
		{"the bridge's nf_call options off", func() error {
			out, err := exec.Command("ip", "link", "set", core.DefaultBridge, "type", "bridge", "nf_call_iptables", "0", "nf_call_ip6tables", "0").CombinedOutput()
			if err != nil {
				return fmt.Errorf("%v: %s", err, out)
			}
			return nil
		}},
	} {
		t.Run(tamper.name, func(t *testing.T) {
			nettest.Do(t, c.node.NS, tamper.do)
			if err := c.node.Check(c.list, c.server); err == nil {
				t.Errorf("CHECK passed")
			}
			if err := c.node.Status(c.list); err != nil {
				t.Errorf("STATUS = %v, want ready (the next ADD or the agent repairs it)", err)
			}
			c.apply(t) // the agent's pass puts it back
			if err := c.node.Check(c.list, c.server); err != nil {
				t.Errorf("CHECK after the agent's pass: %v", err)
			}
			if err := c.node.Status(c.list); err != nil {
				t.Errorf("STATUS after the agent's pass: %v", err)
			}
			expect(t, "client to server", c.client.NS, srv, true, netip.Addr{})
		})
	}
}

// TestNetworkPolicyWithoutBridgeNetfilter: where br_netfilter is not loaded, traffic between
// pods of one bridge never meets conntrack, and enforcement would hold every pod; networkPolicy
// is refused instead: ADD fails with code 7 naming it and changes nothing, STATUS answers 50
// naming br_netfilter, CHECK of a pod added before fails. The plugin runs in a mount namespace
// of its own in which /proc/sys/net/bridge is an empty tmpfs, as on a node without the module
// (this kernel has it built in).
func TestNetworkPolicyWithoutBridgeNetfilter(t *testing.T) {
	bare := t.TempDir()
	wrapper := "#!/bin/sh\nexec unshare --mount --propagation private sh -c 'mount -t tmpfs none /proc/sys/net/bridge && exec \"$0\"' " + filepath.Join(binDir, "kubenet") + "\n"
	if err := os.WriteFile(filepath.Join(bare, "kubenet"), []byte(wrapper), 0o755); err != nil {
		t.Fatal(err)
	}
	conf := nettest.NetConf{PodCIDRs: testkit.DualStack(), Extra: map[string]any{"networkPolicy": true}}

	// A pod added while br_netfilter was there.
	node := nettest.NewNode(t, binDir)
	list := node.ConfList(t, conf)
	before := node.NewPod(t, "np-brnf-before")
	node.MustAdd(t, list, before)
	if err := node.Check(list, before); err != nil {
		t.Fatalf("CHECK with br_netfilter: %v", err)
	}

	without := nettest.NewNode(t, bare)
	without.NS, without.Dir = node.NS, node.Dir
	without.CNI = libcni.NewCNIConfigWithCacheDir([]string{bare}, filepath.Join(node.Dir, "cache"), nil)
	if err := without.Check(list, before); err == nil || !strings.Contains(err.Error(), "br_netfilter") {
		t.Errorf("CHECK without br_netfilter = %v, want a failure naming br_netfilter", err)
	}
	if code, msg := testkit.StatusCode(t, without, list); code != 50 || !strings.Contains(msg, "br_netfilter") || !strings.Contains(msg, "networkPolicy") {
		t.Errorf("STATUS without br_netfilter = %d %q, want 50 naming networkPolicy and br_netfilter", code, msg)
	}
	filesBefore := testkit.DataDirFiles(t, node)
	err := without.Add(list, without.NewPod(t, "np-brnf-refused"))
	if code := testkit.CNICode(err); code != types.ErrInvalidNetworkConfig || !strings.Contains(err.Error(), "networkPolicy") || !strings.Contains(err.Error(), "br_netfilter") {
		t.Errorf("ADD without br_netfilter = %v, want code 7 naming networkPolicy and br_netfilter", err)
	}
	if after := testkit.DataDirFiles(t, node); !slices.Equal(after, filesBefore) {
		t.Errorf("the refused ADD changed the data dir:\nbefore %v\nafter  %v", filesBefore, after)
	}
}
