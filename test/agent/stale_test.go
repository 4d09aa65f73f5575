//go:build kubenet_e2e_agent

package agent

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/kubenet-dev/kubenet/agent/cri/critest"
	"github.com/kubenet-dev/kubenet/core"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

// TestAgentStaleAttachments runs the agent binary against a CRI runtime that the test plays
// (critest, on the node's runtime socket) and pods attached through libcni with the agent's
// conflist: the agent collects the attachment of a pod the runtime does not list once the grace
// period is over, never one the runtime lists (READY or NOTREADY), none younger than the grace
// period, and nothing at all while the runtime does not answer.
func TestAgentStaleAttachments(t *testing.T) {
	u, cp, agentUser := startCluster(t)
	n := newSimNode(t, u, cp, "node-1", 1, agentUser)
	createNode(t, cp.Admin, nodeObject(n.name, n.addrs, podCIDRs(1)))
	runtime := critest.Start(t, n.runtimeSocket())
	runtime.Set(nil, critest.Sandbox("listed", runtimeapi.PodSandboxState_SANDBOX_READY), critest.Sandbox("stopped", runtimeapi.PodSandboxState_SANDBOX_NOTREADY))

	n.startAgent(t, "--stale-gc-grace=1h", "--stale-gc-interval=200ms")
	n.waitSynced(t)
	if err := nettest.Eventually(converge, func() error { return conflistHas(n, podCIDRs(1)) }); err != nil {
		t.Fatal(err)
	}
	listed, stopped := addPod(t, n, "listed"), addPod(t, n, "stopped")
	addPod(t, n, "dead")

	// Passes counted from here see all three pods.
	waitPasses(t, n, "ok", 3)
	for _, id := range []string{"listed", "stopped", "dead"} {
		expectAttached(t, n, id)
	}

	n.restartAgent(t, "--stale-gc-grace=1s", "--stale-gc-interval=200ms")
	err := nettest.Eventually(converge, func() error {
		if attached(n, "dead") {
			return fmt.Errorf("dead's attachment is still there")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := logRecord(n.logFile(), "collected the attachment of a sandbox the runtime no longer lists", map[string]string{"container": "dead", "ifname": "eth0"}); err != nil {
		t.Fatal(err)
	}
	if link := core.NamesFor("kubenet", core.Attachment{ContainerID: "dead", IfName: "eth0"}).HostVeth; linkIn(t, n, link) {
		t.Errorf("dead's veth %s is still on the node", link)
	}
	m := waitPasses(t, n, "ok", 3)
	if got := m[`kubenet_agent_stale_collected_total{kind="attachment"}`]; got != 1 {
		t.Errorf("collected attachments: %v, want 1", got)
	}
	for _, id := range []string{"listed", "stopped"} {
		expectAttached(t, n, id)
	}
	expectTraffic(t, listed, stopped)
	expectTraffic(t, stopped, listed)

	// The runtime stops answering: a pod it never listed survives the grace period many times.
	runtime.Set(status.Error(codes.Unavailable, "connection refused"))
	orphan := addPod(t, n, "orphan")
	m = waitPasses(t, n, "runtime_unavailable", 10)
	expectAttached(t, n, "orphan")
	if got := m[`kubenet_agent_stale_collected_total{kind="attachment"}`]; got != 1 {
		t.Errorf("collected attachments while the runtime did not answer: %v, want still 1", got)
	}
	if _, err := logRecord(n.logFile(), "stale attachments not collected", nil); err != nil {
		t.Fatal(err)
	}
	expectTraffic(t, orphan, listed)
}

// restartAgent stops the node's agent by its pid and starts it again with extra flags.
func (n *simNode) restartAgent(t *testing.T, extra ...string) {
	t.Helper()
	if err := n.agent.Stop(); err != nil {
		t.Fatal(err)
	}
	n.startAgent(t, extra...)
	n.waitSynced(t)
}

// waitPasses waits until the agent has made k more stale-collection passes with result than
// when it was called, and returns the metrics then.
func waitPasses(t *testing.T, n *simNode, result string, k float64) map[string]float64 {
	t.Helper()
	series := fmt.Sprintf("kubenet_agent_stale_passes_total{result=%q}", result)
	start, err := n.metrics()
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]float64
	err = nettest.Eventually(converge, func() error {
		if m, err = n.metrics(); err != nil {
			return err
		}
		if got := m[series] - start[series]; got < k {
			return fmt.Errorf("%v passes with result %s, want %v", got, result, k)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// attached tells whether kubenet's record of the pod's attachment exists on the node.
func attached(n *simNode, id string) bool {
	_, err := os.Stat(core.RecordPath(filepath.Join(n.cni.DataDir(), "kubenet"), core.Attachment{ContainerID: id, IfName: "eth0"}))
	return err == nil
}

// expectAttached checks the pod's attachment: record and host veth.
func expectAttached(t *testing.T, n *simNode, id string) {
	t.Helper()
	link := core.NamesFor("kubenet", core.Attachment{ContainerID: id, IfName: "eth0"}).HostVeth
	if !attached(n, id) || !linkIn(t, n, link) {
		t.Fatalf("the attachment of %s is gone (record or veth %s)", id, link)
	}
}

func linkIn(t *testing.T, n *simNode, name string) bool {
	t.Helper()
	_, err := nettest.Output(n.ns, "ip", "link", "show", name)
	return err == nil
}
