package cni

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kubenet-dev/kubenet/test/testkit"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/kubenet-dev/kubenet/core"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

// TestCrashSafety kills the plugin with SIGKILL at every crash point of ADD, then cleans up with
// DEL — and, separately, with GC and an empty valid list — and finds no residue and no leaked
// address, for every point.
func TestCrashSafety(t *testing.T) {
	crashBin, err := nettest.BuildPlugin(t.TempDir(), "kubenet_crashtest")
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range crashVariants() {
		t.Run(v.backend+"/"+v.cleanup, func(t *testing.T) {
			node := nettest.NewNode(t, crashBin)
			list := node.ConfList(t, nettest.NetConf{PodCIDRs: testkit.DualStack(), NonMasqueradeCIDRs: []netip.Prefix{nettest.NonMasquerade4}, NetfilterBackend: v.backend})
			cleanup := v.cleanup
			for i, point := range core.CrashPoints() {
				pod := crashPod(node, fmt.Sprintf("crash-%02d", i), t)
				crashAt(t, point, "ADD", func() error { return node.Add(list, pod) })
				cleanUpAfterCrash(t, node, list, pod, cleanup, point, nil)
			}
		})
	}
	// A DEL killed at any of its own steps leaves a state the next DEL (or GC) finishes; until
	// then the pod's addresses stay reserved, so no other pod can be handed them.
	for _, v := range crashVariants() {
		t.Run(v.backend+"/DEL crashed, then "+v.cleanup, func(t *testing.T) {
			node := nettest.NewNode(t, crashBin)
			list := node.ConfList(t, nettest.NetConf{PodCIDRs: testkit.DualStack(), NonMasqueradeCIDRs: []netip.Prefix{nettest.NonMasquerade4}, NetfilterBackend: v.backend})
			cleanup := v.cleanup
			for i, point := range core.DelCrashPoints() {
				pod := crashPod(node, fmt.Sprintf("delcrash-%02d", i), t)
				if err := node.Add(list, pod); err != nil {
					t.Fatal(err)
				}
				ips := pod.IPs()
				crashAt(t, point, "DEL", func() error { return node.Del(list, pod) })
				if point != "del: addresses released" {
					for _, ip := range ips {
						if b, err := os.ReadFile(filepath.Join(node.DataDir(), "kubenet", ip.String())); err != nil || !strings.HasPrefix(string(b), pod.RT.ContainerID+"\r\n") {
							t.Errorf("after DEL died at %q, %s is no longer reserved for the pod: %q %v", point, ip, b, err)
						}
					}
				}
				cleanUpAfterCrash(t, node, list, pod, cleanup, point, ips)
			}
		})
	}
}

// crashVariants: each cleanup verb on each backend.
func crashVariants() []struct{ backend, cleanup string } {
	var out []struct{ backend, cleanup string }
	for _, b := range backends {
		for _, c := range []string{"DEL", "GC"} {
			out = append(out, struct{ backend, cleanup string }{b, c})
		}
	}
	return out
}

// crashPod is a pod that asks for everything ADD can create: addresses, veth, a host port,
// shaping both ways.
func crashPod(node *nettest.Node, id string, t *testing.T) *nettest.Pod {
	pod := node.NewPod(t, id)
	pod.RT.CapabilityArgs = map[string]any{
		"portMappings": []map[string]any{{"hostPort": 30080, "containerPort": 80, "protocol": "udp"}},
		"bandwidth":    map[string]any{"ingressRate": 10_000_000, "egressRate": 20_000_000},
	}
	return pod
}

// crashAt runs verb with KUBENET_CRASH_AT=point and requires that it was killed there.
func crashAt(t *testing.T, point, verb string, run func() error) {
	t.Helper()
	t.Setenv("KUBENET_CRASH_AT", point)
	if err := run(); err == nil || !strings.Contains(err.Error(), "signal: killed") {
		t.Fatalf("%s at crash point %q was not killed: %v", verb, point, err)
	}
	t.Setenv("KUBENET_CRASH_AT", "")
}

// cleanUpAfterCrash runs cleanup (DEL, or GC with an empty list) and requires that nothing of
// the pod is left: links, reservations, record, host-port state, conntrack entries of ips.
func cleanUpAfterCrash(t *testing.T, node *nettest.Node, list *libcni.NetworkConfigList, pod *nettest.Pod, cleanup, point string, ips []netip.Addr) {
	t.Helper()
	var err error
	switch cleanup {
	case "DEL":
		err = node.Del(list, pod)
	case "GC":
		err = node.GC(list, []types.GCAttachment{})
	}
	if err != nil {
		t.Errorf("%s after a crash at %q: %v", cleanup, point, err)
	}
	testkit.AssertNoResidue(t, node, "kubenet", testkit.AttachmentOf(pod), ips)
	testkit.AssertNoHostPortResidue(t, node, ips, 30080)
	if left := stateFiles(t, node); len(left) > 0 {
		t.Errorf("after a crash at %q and %s the data dir still holds %v", point, cleanup, left)
	}
}

// TestCrashDuringBackendSwitch kills the ADD that switches the node from one backend to the
// other at every point of the switch: holding the backend lock exclusively, with the old
// backend's rules removed, and with the record naming the new backend but nothing put back in
// it. The kernel releases the dead process's locks; the next ADD (through the switching
// configuration) must finish the switch: every running pod isolated in the new backend (CHECK),
// its host port leading to it there, and nothing of the network left in the old backend.
func TestCrashDuringBackendSwitch(t *testing.T) {
	crashBin, err := nettest.BuildPlugin(t.TempDir(), "kubenet_crashtest")
	if err != nil {
		t.Fatal(err)
	}
	for _, from := range []core.NetfilterBackend{core.NetfilterIPTables, core.NetfilterNFTables} {
		to := map[core.NetfilterBackend]core.NetfilterBackend{core.NetfilterIPTables: core.NetfilterNFTables, core.NetfilterNFTables: core.NetfilterIPTables}[from]
		for _, point := range core.SwitchCrashPoints() {
			t.Run(string(from)+" to "+string(to)+"/"+point, func(t *testing.T) {
				node := nettest.NewNode(t, crashBin)
				old := node.ConfList(t, nettest.NetConf{PodCIDRs: testkit.DualStack(), NetfilterBackend: string(from)})
				running := crashPod(node, "running", t)
				if err := node.Add(old, running); err != nil {
					t.Fatal(err)
				}
				switching := node.ConfList(t, nettest.NetConf{PodCIDRs: testkit.DualStack(), NetfilterBackend: string(to)})
				crashed := node.NewPod(t, "crashed")
				crashAt(t, point, "ADD", func() error { return node.Add(switching, crashed) })
				next := node.NewPod(t, "next")
				if err := node.Add(switching, next); err != nil {
					t.Fatalf("ADD after a switch died at %q: %v", point, err)
				}
				if b := testkit.NodeBackend(node); b != to {
					t.Errorf("after the next ADD the node records backend %q, want %q", b, to)
				}
				for _, p := range []*nettest.Pod{running, next} {
					if err := node.Check(switching, p); err != nil {
						t.Errorf("CHECK %s after a switch died at %q: %v", p.RT.ContainerID, point, err)
					}
				}
				if left := otherBackendRules(t, node); len(left) > 0 {
					t.Errorf("after a switch died at %q the old backend still holds rules of the network: %v", point, left)
				}
				if len(testkit.HostPortElements(t, node)) == 0 && to == core.NetfilterNFTables {
					t.Errorf("after a switch died at %q the running pod's host port is not in the new backend's maps", point)
				}
				for _, p := range []*nettest.Pod{crashed, running, next} {
					if err := node.Del(switching, p); err != nil {
						t.Errorf("DEL %s: %v", p.RT.ContainerID, err)
					}
				}
				testkit.AssertNoHostPortResidue(t, node, running.IPs(), 30080)
			})
		}
	}
}
