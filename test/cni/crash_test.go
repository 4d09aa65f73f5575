package cni

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/kubenet-dev/kubenet/test/testkit"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/kubenet-dev/kubenet/core"
	"github.com/kubenet-dev/kubenet/internal/nettest"
)

// TestCrashSafety kills the plugin with SIGKILL at every crash point of ADD, then cleans up with
// DEL — and, separately, with GC and an empty valid list — and finds no residue and no leaked
// address, for every point.
func TestCrashSafety(t *testing.T) {
	crashBin, err := nettest.BuildPlugin(t.TempDir(), "kubenet_crashtest")
	if err != nil {
		t.Fatal(err)
	}
	for _, cleanup := range []string{"DEL", "GC"} {
		t.Run(cleanup, func(t *testing.T) {
			node := nettest.NewNode(t, crashBin)
			list := node.ConfList(t, nettest.NetConf{PodCIDRs: testkit.DualStack(), NonMasqueradeCIDRs: []netip.Prefix{nettest.NonMasquerade4}})
			for i, point := range core.CrashPoints() {
				pod := node.NewPod(t, fmt.Sprintf("crash-%02d", i))
				// Everything ADD can create: addresses, veth, a host port, shaping both ways.
				pod.RT.CapabilityArgs = map[string]any{
					"portMappings": []map[string]any{{"hostPort": 30080, "containerPort": 80, "protocol": "udp"}},
					"bandwidth":    map[string]any{"ingressRate": 10_000_000, "egressRate": 20_000_000},
				}
				t.Setenv("KUBENET_CRASH_AT", point)
				if err := node.Add(list, pod); err == nil || !strings.Contains(err.Error(), "signal: killed") {
					t.Fatalf("ADD at crash point %q was not killed: %v", point, err)
				}
				t.Setenv("KUBENET_CRASH_AT", "")
				switch cleanup {
				case "DEL":
					err = node.Del(list, pod)
				case "GC":
					err = node.GC(list, []types.GCAttachment{})
				}
				if err != nil {
					t.Errorf("%s after a crash at %q: %v", cleanup, point, err)
				}
				testkit.AssertNoResidue(t, node, "kubenet", testkit.AttachmentOf(pod), nil)
				if left := stateFiles(t, node); len(left) > 0 {
					t.Errorf("after a crash at %q and %s the data dir still holds %v", point, cleanup, left)
				}
			}
		})
	}
}
