//go:build kubenet_e2e_agent

package agent

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/kubenet-dev/kubenet/agent/policy"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

// TestAgentPolicyQuiet: once the node's rules are in place and nothing changes, the policy
// controller makes no pass until its resync (30 s): its own writes (the policy state it records
// after each pass, its nftables transactions seen by the healer) ask for none. Each pass used to
// wake the next through the policy state file, every 20 ms for as long as the agent ran.
func TestAgentPolicyQuiet(t *testing.T) {
	u, cp, agentUser := startCluster(t)
	api := cp.Admin
	n := newSimNode(t, u, cp, "node-1", 1, agentUser)
	list := startPolicyNode(t, api, n)
	createPod(t, api, "quiet", "pod", n.name, map[string]string{"app": "quiet"})
	n.cni.MustAdd(t, list, npPod(t, n, "quiet", "pod", netip.MustParseAddr("10.244.1.60")))

	count, err := n.settledPasses(converge, policy.DefaultBusyFloor+time.Second)
	if err != nil {
		t.Fatalf("the policy passes never stopped: %v", err)
	}
	// Three more seconds (the measure, not a synchronisation): no pass.
	end := time.Now().Add(3 * time.Second)
	for time.Now().Before(end) {
		c, err := n.policyPasses()
		if err != nil {
			t.Fatal(err)
		}
		if c != count {
			t.Fatalf("%v policy passes on a quiet node after %v had settled", c, count)
		}
		time.Sleep(100 * time.Millisecond) // the metric's sampling interval
	}
}

// policyPasses is the agent's count of policy passes.
func (n *simNode) policyPasses() (float64, error) {
	m, err := n.metrics()
	return m["kubenet_agent_network_policy_pass_seconds_count"], err
}

// settledPasses waits until the agent's policy passes have stopped (their count unchanged for
// quiet, after at least one) and returns their count. quiet must be longer than the gap a busy
// pass leaves before the next (policy.DefaultBusyGap times its duration, at least
// policy.DefaultBusyFloor), or a pass still
// waiting for its turn is taken for none.
func (n *simNode) settledPasses(timeout, quiet time.Duration) (float64, error) {
	var count float64
	var since time.Time
	err := nettest.Eventually(timeout, func() error {
		c, err := n.policyPasses()
		if err != nil {
			return err
		}
		if c == 0 || c != count {
			count, since = c, time.Now()
			return fmt.Errorf("%v passes, still counting", c)
		}
		if time.Since(since) < quiet {
			return fmt.Errorf("%v passes for %s", c, time.Since(since))
		}
		return nil
	})
	return count, err
}
