//go:build kubenet_e2e_agent

package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubenet-dev/kubenet/agent/policy"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

// TestAgentPolicyDropLog runs kubenet-agent with --policy-log against a real API server: a
// connection a policy denies shows in kubenet_networkpolicy_drops_total of the denied pod and
// direction (and no other pod's), and as a drop log line naming both pods, the protocol, the
// port and the policy, within a second or two; the series goes when the pod does. The agent
// restarted without --policy-log takes the log action out of the rules, and puts it back with it.
func TestAgentPolicyDropLog(t *testing.T) {
	u, cp, agentUser := startCluster(t)
	api := cp.Admin
	ctx := context.Background()
	n := newSimNode(t, u, cp, "node-1", 1, agentUser)
	list := startPolicyNode(t, api, n, "--policy-log")

	const namespace = "drops"
	createPod(t, api, namespace, "client", n.name, map[string]string{"app": "client"})
	createPod(t, api, namespace, "target", n.name, map[string]string{"app": "target"})
	client := npPod(t, n, namespace, "client", netip.MustParseAddr("10.244.1.50"))
	target := npPod(t, n, namespace, "target", netip.MustParseAddr("10.244.1.51"))
	n.cni.MustAdd(t, list, client)
	n.cni.MustAdd(t, list, target)
	targetAddr := netip.AddrPortFrom(target.IPs()[0], 7777)
	nettest.StartTCPEcho(t, target.NS, netip.AddrPortFrom(netip.IPv6Unspecified(), 7777))
	if err := nettest.Eventually(converge, func() error {
		_, err := nettest.TCPRequest(client.NS, targetAddr, "before", time.Second)
		return err
	}); err != nil {
		t.Fatalf("client → target without a policy: %v\n%s", err, policyTable(t, n))
	}

	deny := netpolOf(namespace, "deny-target", networkingv1.NetworkPolicySpec{
		PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "target"}},
		PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
	})
	if _, err := api.NetworkingV1().NetworkPolicies(namespace).Create(ctx, deny, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := nettest.Eventually(converge, func() error {
		if _, err := nettest.TCPRequest(client.NS, targetAddr, "denied", 300*time.Millisecond); err == nil {
			return errors.New("client still reaches target")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	denied := time.Now()

	series := `kubenet_networkpolicy_drops_total{direction="ingress",namespace="drops",pod="target"}`
	if err := nettest.Eventually(5*time.Second, func() error {
		m, err := n.metrics()
		if err != nil {
			return err
		}
		if m[series] == 0 {
			return fmt.Errorf("%s = %v", series, m[series])
		}
		for k := range m {
			if strings.HasPrefix(k, "kubenet_networkpolicy_drops_total{") && k != series {
				return fmt.Errorf("another pod's drops series: %s", k)
			}
		}
		return nil
	}); err != nil {
		t.Error(err)
	}

	var line map[string]any
	if err := nettest.Eventually(3*time.Second, func() error {
		var err error
		line, err = dropLogLine(n.logFile(), "drops", "target", "ingress")
		return err
	}); err != nil {
		t.Fatalf("%v\n%s", err, nettest.Tail(n.logFile(), 20))
	}
	t.Logf("drop log line %v, %v after the denial was seen", line, time.Since(denied))
	src, _ := line["src"].(map[string]any)
	if src["pod"] != "client" || src["namespace"] != namespace || src["ip"] != "10.244.1.50" || line["protocol"] != "tcp" ||
		line["port"] != float64(7777) || fmt.Sprint(line["policies"]) != "[drops/deny-target]" || line["node"] != n.name {
		t.Errorf("drop log line %v: want from drops/client 10.244.1.50, tcp port 7777, policies [drops/deny-target], node %s", line, n.name)
	}

	// Restarted without --policy-log: the rules lose their log action; with it, they get it back.
	const logAction = `log prefix "kubenet kubenet `
	if !strings.Contains(policyTable(t, n), logAction) {
		t.Fatalf("with --policy-log, no %q in the rules:\n%s", logAction, policyTable(t, n))
	}
	for _, tc := range []struct {
		args []string
		log  bool
	}{{nil, false}, {[]string{"--policy-log"}, true}} {
		if err := n.agent.Stop(); err != nil {
			t.Fatal(err)
		}
		n.startAgent(t, tc.args...)
		if err := nettest.Eventually(converge, func() error {
			if logs := strings.Contains(policyTable(t, n), logAction); logs != tc.log {
				return fmt.Errorf("agent with %v: the drop chains log: %v", tc.args, logs)
			}
			return nil
		}); err != nil {
			t.Error(err)
		}
	}

	// The pod goes: so does its series.
	if err := n.cni.Del(list, target); err != nil {
		t.Fatal(err)
	}
	if err := nettest.Eventually(converge, func() error {
		m, err := n.metrics()
		if err != nil {
			return err
		}
		if _, ok := m[series]; ok {
			return fmt.Errorf("%s still exported after the pod's DEL", series)
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
}

// dropLogLine finds a drop log line of a pod and direction in the agent's output.
func dropLogLine(file, namespace, pod, direction string) (map[string]any, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	end := "dst"
	if direction == "egress" {
		end = "src"
	}
	for _, l := range strings.Split(string(b), "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(l), &rec) != nil || rec["msg"] != policy.DropLogMsg || rec["direction"] != direction {
			continue
		}
		if e, _ := rec[end].(map[string]any); e["namespace"] == namespace && e["pod"] == pod {
			return rec, nil
		}
	}
	return nil, fmt.Errorf("no drop log line of %s/%s (%s) in %s", namespace, pod, direction, file)
}
