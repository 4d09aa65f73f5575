//go:build kubenet_e2e_agent

package agent

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubenet-dev/kubenet/internal/conntrack"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

// tracked tells whether the node's conntrack has the session's connection.
func tracked(t *testing.T, n *simNode, s *nettest.Session) bool {
	t.Helper()
	local := netip.MustParseAddrPort(s.Conn.LocalAddr().String())
	found := false
	nettest.Do(t, n.ns, func() error {
		flows, err := conntrack.List()
		for _, f := range flows {
			src, _ := netip.AddrFromSlice(f.Forward.SrcIP)
			found = found || (src.Unmap() == local.Addr().Unmap() && f.Forward.SrcPort == local.Port())
		}
		return err
	})
	return found
}

// TestAgentPolicyCutEstablished: with --policy-cut-established, a new policy that denies an
// established connection removes its conntrack entry, and the connection stops at its next
// packet; a connection the policy still allows keeps flowing.
func TestAgentPolicyCutEstablished(t *testing.T) {
	u, cp, agentUser := startCluster(t)
	api := cp.Admin
	ctx := context.Background()
	n := newSimNode(t, u, cp, "node-1", 1, agentUser)
	createNode(t, api, nodeObject(n.name, n.addrs, podCIDRs(1)))
	n.startAgent(t, "--policy-cut-established")
	var list *libcni.NetworkConfigList
	if err := nettest.Eventually(converge, func() (err error) {
		if code, body, err := n.get("/readyz"); err != nil || code != 200 {
			return fmt.Errorf("/readyz %d %q %v", code, body, err)
		}
		list, err = libcni.ConfListFromFile(n.confFile())
		return err
	}); err != nil {
		t.Fatal(err)
	}

	const namespace = "cut"
	pods := map[string]*nettest.Pod{}
	for i, name := range []string{"server", "client-a", "client-b"} {
		createPod(t, api, namespace, name, n.name, map[string]string{"app": name})
		pods[name] = npPod(t, n, namespace, name, netip.MustParseAddr(fmt.Sprintf("10.244.1.%d", 110+i)))
		nettest.StartTCPEcho(t, pods[name].NS, netip.AddrPortFrom(netip.IPv6Unspecified(), 7777))
		n.cni.MustAdd(t, list, pods[name])
	}
	server := netip.AddrPortFrom(pods["server"].IPs()[0], 7777)
	denied, allowed := nettest.OpenSession(t, pods["client-a"].NS, server, converge), nettest.OpenSession(t, pods["client-b"].NS, server, converge)
	for _, s := range []*nettest.Session{denied, allowed} {
		if !s.RoundTrip("before", 3*time.Second) || !tracked(t, n, s) {
			t.Fatalf("session from %s: no echo or no conntrack entry before the policy", s.Conn.LocalAddr())
		}
	}

	onlyB := netpolOf(namespace, "only-b", networkingv1.NetworkPolicySpec{
		PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "server"}},
		PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
		Ingress:     []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "client-b"}}}}}},
	})
	start := time.Now()
	if _, err := api.NetworkingV1().NetworkPolicies(namespace).Create(ctx, onlyB, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := nettest.Eventually(converge, func() error {
		if tracked(t, n, denied) {
			return fmt.Errorf("the denied connection is still in conntrack")
		}
		return nil
	}); err != nil {
		t.Fatalf("%v\n%s", err, policyTable(t, n))
	}
	t.Logf("the denied connection's entry was gone %v after the policy was created", time.Since(start).Round(time.Millisecond))
	if denied.RoundTrip("after", 2*time.Second) {
		t.Errorf("client-a's established connection still flows after only-b")
	}
	if !allowed.RoundTrip("after", 3*time.Second) || !tracked(t, n, allowed) {
		t.Errorf("client-b's established connection (still allowed) was cut")
	}
	if m, err := n.metrics(); err != nil || m["kubenet_agent_network_policy_cut_connections_total"] < 1 {
		t.Errorf("kubenet_agent_network_policy_cut_connections_total = %v (%v), want ≥ 1", m["kubenet_agent_network_policy_cut_connections_total"], err)
	}
}
