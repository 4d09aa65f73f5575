package cni

import (
	"encoding/json"
	"net/netip"
	"slices"
	"testing"

	"github.com/kubenet-dev/kubenet/test/testkit"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/kubenet-dev/kubenet/core"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

// TestVerbVersionMatrix runs every verb with every CNI version the way a runtime would (direct
// exec, so libcni's own version gates do not hide the plugin's answers): ADD, DEL and VERSION
// work everywhere, CHECK from 0.4.0, STATUS and GC from 1.1.0, and older configs get code 1.
func TestVerbVersionMatrix(t *testing.T) {
	node := nettest.NewNode(t, binDir)
	versions := append(slices.Clone(core.SupportedVersions()), "0.2.0", "0.1.0", "2.0.0")
	for _, v := range versions {
		t.Run(v, func(t *testing.T) {
			supported := slices.Contains(core.SupportedVersions(), v)
			pod := node.NewPod(t, "m"+v)
			conf := map[string]any{"cniVersion": v, "name": "kubenet", "type": "kubenet",
				"podCIDRs": []string{"10.244.1.0/24"}, "dataDir": node.DataDir()}
			run := func(verb string, extra map[string]any) nettest.PluginRun {
				t.Helper()
				c := map[string]any{}
				for k, x := range conf {
					c[k] = x
				}
				for k, x := range extra {
					c[k] = x
				}
				stdin, _ := json.Marshal(c)
				r, err := node.ExecPlugin(binDir, map[string]string{"CNI_COMMAND": verb, "CNI_CONTAINERID": pod.RT.ContainerID,
					"CNI_NETNS": pod.NS.Path(), "CNI_IFNAME": "eth0", "CNI_PATH": binDir}, stdin)
				if err != nil {
					t.Fatal(err)
				}
				return r
			}
			expect := func(verb string, r nettest.PluginRun, ok bool) {
				t.Helper()
				switch {
				case ok && r.ExitCode != 0:
					t.Errorf("%s with cniVersion %s failed: %s", verb, v, r.Stdout)
				case !ok && (r.Err == nil || r.Err.Code != types.ErrIncompatibleCNIVersion):
					t.Errorf("%s with cniVersion %s: %+v, want code 1", verb, v, r)
				}
			}
			add := run("ADD", nil)
			expect("ADD", add, supported)
			if !supported {
				return
			}
			var result map[string]any
			if err := json.Unmarshal([]byte(add.Stdout), &result); err != nil || result["cniVersion"] != v {
				t.Fatalf("ADD result %q is not in cniVersion %s", add.Stdout, v)
			}
			expect("CHECK", run("CHECK", map[string]any{"prevResult": result}), v >= "0.4.0")
			expect("STATUS", run("STATUS", nil), v == "1.1.0")
			expect("GC", run("GC", map[string]any{"cni.dev/valid-attachments": []any{map[string]string{"containerID": pod.RT.ContainerID, "ifname": "eth0"}}}), v == "1.1.0")
			expect("DEL", run("DEL", map[string]any{"prevResult": result}), true)
			expect("DEL again", run("DEL", nil), true)
			testkit.AssertNoResidue(t, node, "kubenet", testkit.AttachmentOf(pod), nil)
		})
	}
}

// TestCNIVersionsList: a conflist offering several versions ("cniVersions") is run by libcni in
// the highest one both sides support, and every verb works in it.
func TestCNIVersionsList(t *testing.T) {
	node := nettest.NewNode(t, binDir)
	raw, _ := json.Marshal(map[string]any{
		"cniVersions": []string{"0.4.0", "1.1.0"}, "name": "kubenet",
		"plugins": []any{map[string]any{"type": "kubenet", "podCIDRs": []string{"10.244.1.0/24"}, "dataDir": node.DataDir()}},
	})
	list, err := libcni.NetworkConfFromBytes(raw)
	if err != nil {
		t.Fatal(err)
	}
	if list.CNIVersion != "1.1.0" {
		t.Fatalf("libcni chose cniVersion %s, want 1.1.0", list.CNIVersion)
	}
	pod := node.NewPod(t, "versions")
	if err := node.Add(list, pod); err != nil {
		t.Fatal(err)
	}
	if pod.ResultVersion != "1.1.0" {
		t.Errorf("result version %s, want 1.1.0", pod.ResultVersion)
	}
	for name, err := range map[string]error{
		"CHECK":  node.Check(list, pod),
		"STATUS": node.Status(list),
		"GC":     node.GC(list, []types.GCAttachment{{ContainerID: "versions", IfName: "eth0"}}),
	} {
		if err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	testkit.ExpectReachable(t, node.NS, nettest.StartTCPEcho(t, pod.NS, netip.AddrPortFrom(pod.IPs()[0], 80)), testkit.GatewayOf(nettest.PodCIDR4))
	if err := node.Del(list, pod); err != nil {
		t.Fatal(err)
	}
	testkit.AssertNoResidue(t, node, "kubenet", testkit.AttachmentOf(pod), pod.IPs())
}
