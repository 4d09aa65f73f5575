package cni

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
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
	// A DEL killed at any of its own steps leaves a state the next DEL (or GC) finishes; until
	// then the pod's addresses stay reserved, so no other pod can be handed them.
	for _, cleanup := range []string{"DEL", "GC"} {
		t.Run("DEL crashed, then "+cleanup, func(t *testing.T) {
			node := nettest.NewNode(t, crashBin)
			list := node.ConfList(t, nettest.NetConf{PodCIDRs: testkit.DualStack(), NonMasqueradeCIDRs: []netip.Prefix{nettest.NonMasquerade4}})
			for i, point := range core.DelCrashPoints() {
				pod := node.NewPod(t, fmt.Sprintf("delcrash-%02d", i))
				pod.RT.CapabilityArgs = map[string]any{
					"portMappings": []map[string]any{{"hostPort": 30081, "containerPort": 80, "protocol": "udp"}},
					"bandwidth":    map[string]any{"ingressRate": 10_000_000, "egressRate": 20_000_000},
				}
				if err := node.Add(list, pod); err != nil {
					t.Fatal(err)
				}
				ips := pod.IPs()
				t.Setenv("KUBENET_CRASH_AT", point)
				if err := node.Del(list, pod); err == nil || !strings.Contains(err.Error(), "signal: killed") {
					t.Fatalf("DEL at crash point %q was not killed: %v", point, err)
				}
				t.Setenv("KUBENET_CRASH_AT", "")
				if point != "del: addresses released" {
					for _, ip := range ips {
						if b, err := os.ReadFile(filepath.Join(node.DataDir(), "kubenet", ip.String())); err != nil || !strings.HasPrefix(string(b), pod.RT.ContainerID+"\r\n") {
							t.Errorf("after DEL died at %q, %s is no longer reserved for the pod: %q %v", point, ip, b, err)
						}
					}
				}
				switch cleanup {
				case "DEL":
					err = node.Del(list, pod)
				case "GC":
					err = node.GC(list, []types.GCAttachment{})
				}
				if err != nil {
					t.Errorf("%s after DEL crashed at %q: %v", cleanup, point, err)
				}
				testkit.AssertNoResidue(t, node, "kubenet", testkit.AttachmentOf(pod), ips)
				testkit.AssertNoHostPortResidue(t, node, ips, 30081)
				if left := stateFiles(t, node); len(left) > 0 {
					t.Errorf("after DEL crashed at %q and %s the data dir still holds %v", point, cleanup, left)
				}
			}
		})
	}
}
