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
	"k8s.io/client-go/kubernetes"

	"github.com/kubenet-dev/kubenet/internal/conntrack"
	"github.com/kubenet-dev/kubenet/netpol"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

// ctMark is the mark of the node's conntrack entry of the session's connection, and whether
// there is one.
func ctMark(t *testing.T, n *simNode, s *nettest.Session) (mark uint32, found bool) {
	t.Helper()
	local := netip.MustParseAddrPort(s.Conn.LocalAddr().String())
	nettest.Do(t, n.ns, func() error {
		flows, err := conntrack.List()
		for _, f := range flows {
			if src, _ := netip.AddrFromSlice(f.Forward.SrcIP); src.Unmap() == local.Addr().Unmap() && f.Forward.SrcPort == local.Port() {
				mark, found = f.Mark, true
			}
		}
		return err
	})
	return mark, found
}

// cut tells whether the session's connection is cut: its entry carries netpol.CtMarkCut.
func cut(t *testing.T, n *simNode, s *nettest.Session) bool {
	mark, found := ctMark(t, n, s)
	return found && mark&netpol.CtMarkCut != 0
}

// cutBed is one node with a server and two clients, each with an established connection to the
// server: the one only-b denies (client-a's) and the one it allows (client-b's).
type cutBed struct {
	n               *simNode
	api             kubernetes.Interface
	server          netip.AddrPort
	pods            map[string]*nettest.Pod
	denied, allowed *nettest.Session
}

const cutNamespace = "cut"

func newCutBed(t *testing.T, agentFlags ...string) *cutBed {
	u, cp, agentUser := startCluster(t)
	b := &cutBed{api: cp.Admin, pods: map[string]*nettest.Pod{}}
	b.n = newSimNode(t, u, cp, "node-1", 1, agentUser)
	createNode(t, b.api, nodeObject(b.n.name, b.n.addrs, podCIDRs(1)))
	b.n.startAgent(t, agentFlags...)
	var list *libcni.NetworkConfigList
	if err := nettest.Eventually(converge, func() (err error) {
		if code, body, err := b.n.get("/readyz"); err != nil || code != 200 {
			return fmt.Errorf("/readyz %d %q %v", code, body, err)
		}
		list, err = libcni.ConfListFromFile(b.n.confFile())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	for i, name := range []string{"server", "client-a", "client-b"} {
		createPod(t, b.api, cutNamespace, name, b.n.name, map[string]string{"app": name})
		b.pods[name] = npPod(t, b.n, cutNamespace, name, netip.MustParseAddr(fmt.Sprintf("10.244.1.%d", 110+i)))
		nettest.StartTCPEcho(t, b.pods[name].NS, netip.AddrPortFrom(netip.IPv6Unspecified(), 7777))
		b.n.cni.MustAdd(t, list, b.pods[name])
	}
	b.server = netip.AddrPortFrom(b.pods["server"].IPs()[0], 7777)
	b.denied, b.allowed = nettest.OpenSession(t, b.pods["client-a"].NS, b.server, converge), nettest.OpenSession(t, b.pods["client-b"].NS, b.server, converge)
	for _, s := range []*nettest.Session{b.denied, b.allowed} {
		if _, found := ctMark(t, b.n, s); !s.RoundTrip("before", 3*time.Second) || !found || cut(t, b.n, s) {
			t.Fatalf("session from %s: no echo, no conntrack entry or a cut one before the policy", s.Conn.LocalAddr())
		}
	}
	return b
}

// createOnlyB creates the policy that lets only client-b reach the server.
func (b *cutBed) createOnlyB(t *testing.T) {
	onlyB := netpolOf(cutNamespace, "only-b", networkingv1.NetworkPolicySpec{
		PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "server"}},
		PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
		Ingress:     []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "client-b"}}}}}},
	})
	if _, err := b.api.NetworkingV1().NetworkPolicies(cutNamespace).Create(context.Background(), onlyB, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// expectCut waits until the denied session's entry is marked cut and checks that it no longer
// flows while the allowed one does, unmarked.
func (b *cutBed) expectCut(t *testing.T) {
	t.Helper()
	if err := nettest.Eventually(converge, func() error {
		if !cut(t, b.n, b.denied) {
			return fmt.Errorf("the denied connection's conntrack entry is not marked cut")
		}
		return nil
	}); err != nil {
		t.Fatalf("%v\n%s", err, policyTable(t, b.n))
	}
	if b.denied.RoundTrip("after", 2*time.Second) {
		t.Errorf("client-a's established connection still flows after only-b")
	}
	if !b.allowed.RoundTrip("after", 3*time.Second) || cut(t, b.n, b.allowed) {
		t.Errorf("client-b's established connection (still allowed) was cut")
	}
}

// TestAgentPolicyCutEstablished: with --policy-cut-established, a new policy that denies an
// established connection marks its conntrack entry cut, and the connection stops at its next
// packet; a connection the policy still allows keeps flowing.
func TestAgentPolicyCutEstablished(t *testing.T) {
	b := newCutBed(t, "--policy-cut-established")
	start := time.Now()
	b.createOnlyB(t)
	b.expectCut(t)
	t.Logf("the denied connection was cut %v after the policy was created", time.Since(start).Round(time.Millisecond))
	if m, err := b.n.metrics(); err != nil || m["kubenet_agent_network_policy_cut_connections_total"] < 1 {
		t.Errorf("kubenet_agent_network_policy_cut_connections_total = %v (%v), want ≥ 1", m["kubenet_agent_network_policy_cut_connections_total"], err)
	}
}

// TestAgentPolicyCutAfterRestart: an agent that starts with --policy-cut-established over rules
// already in force cuts what they deny. Its first pass changes nothing, yet it is what an agent
// stopped between an apply and its cut (or started with the flag newly on) finds: without a cut
// on the first pass, the denied connection would flow until it ends.
func TestAgentPolicyCutAfterRestart(t *testing.T) {
	b := newCutBed(t)
	b.createOnlyB(t)
	if err := nettest.Eventually(converge, func() error {
		if _, err := nettest.TCPRequest(b.pods["client-a"].NS, b.server, "new", 300*time.Millisecond); err == nil {
			return fmt.Errorf("a new connection client-a → server is still allowed")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if !b.denied.RoundTrip("in force, not cut", 3*time.Second) {
		t.Fatal("client-a's established connection stopped without --policy-cut-established")
	}
	b.n.restartAgent(t, "--policy-cut-established")
	b.expectCut(t)
}
