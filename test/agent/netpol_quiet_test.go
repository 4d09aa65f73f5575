//go:build kubenet_e2e_agent

package agent

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

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

	passes := func() (float64, error) {
		m, err := n.metrics()
		return m["kubenet_agent_network_policy_pass_seconds_count"], err
	}
	// Settled: the pass count stayed the same for a second (the pod's passes are done).
	var count float64
	var since time.Time
	if err := nettest.Eventually(converge, func() error {
		c, err := passes()
		if err != nil {
			return err
		}
		if c == 0 || c != count {
			count, since = c, time.Now()
			return fmt.Errorf("%v passes, still counting", c)
		}
		if time.Since(since) < time.Second {
			return fmt.Errorf("%v passes for %s", c, time.Since(since))
		}
		return nil
	}); err != nil {
		t.Fatalf("the policy passes never stopped: %v", err)
	}
	// Three more seconds (the measure, not a synchronisation): no pass.
	end := time.Now().Add(3 * time.Second)
	for time.Now().Before(end) {
		c, err := passes()
		if err != nil {
			t.Fatal(err)
		}
		if c != count {
			t.Fatalf("%v policy passes on a quiet node after %v had settled", c, count)
		}
		time.Sleep(100 * time.Millisecond) // the metric's sampling interval
	}
}
