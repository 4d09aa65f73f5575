package shim

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kubenet-dev/kubenet/test/testkit"

	"github.com/kubenet-dev/kubenet/core"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

// TestCNIPluginConfDir: the cni plugin follows its conf dir without a restart. Empty dir: not
// ready, naming the dir. Files without a plugin type or with missing binaries are skipped with
// their reasons. A valid file makes it ready; a lexically earlier valid file (a single-plugin
// .conf) takes over, and its removal hands back. The pod's bandwidth annotations reach the plugin (the kubenet binary
// shapes the pod). With every file gone the plugin is not ready and refuses new pods, yet
// tears the existing pod down completely, its netns gone too, with the configuration it was
// added with.
func TestCNIPluginConfDir(t *testing.T) {
	t.Parallel()
	node := nettest.NewNode(t, binDir)
	confDir := t.TempDir()
	host := newShimHost()
	_, cn, plugins := allPlugins(t, node, confDir, binDir)
	pm := managerFor(t, plugins, "cni", host)

	expectNotReady := func(want string) {
		t.Helper()
		if err := pm.Status(); err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("Status: %v, want an error containing %q", err, want)
		}
	}
	expectNotReady("no networks found in " + confDir)

	writeConf(t, confDir, "00-notype.conf", map[string]any{"cniVersion": "1.0.0", "name": "notype"})
	writeConf(t, confDir, "05-missing.conflist", map[string]any{"cniVersion": "1.0.0", "name": "missing",
		"plugins": []any{map[string]any{"type": "no-such-plugin"}}})
	expectNotReady("no valid networks found")
	expectNotReady("00-notype.conf: error parsing configuration: missing 'type'")
	expectNotReady(`05-missing.conflist: [failed to find plugin "no-such-plugin"`)

	kubenetConf := func(name string) map[string]any {
		return map[string]any{"cniVersion": "1.0.0", "name": name, "plugins": []any{map[string]any{
			"type": "kubenet", "dataDir": node.DataDir(), "podCIDRs": []string{nettest.PodCIDR4.String()},
			"capabilities": map[string]bool{"bandwidth": true, "portMappings": true},
		}}}
	}
	writeConf(t, confDir, "10-kubenet.conflist", kubenetConf("kubenet"))
	if err := pm.Status(); err != nil {
		t.Fatalf("Status after a valid conflist appeared: %v", err)
	}
	if got := cn.NetworkName(); got != "kubenet" {
		t.Fatalf("network %q, want kubenet", got)
	}
	// A single-plugin .conf file, lexically first.
	writeConf(t, confDir, "01-first.conf", map[string]any{"cniVersion": "1.0.0", "name": "first", "type": "kubenet",
		"dataDir": node.DataDir(), "podCIDRs": []string{nettest.PodCIDR4.String()}})
	if got := cn.NetworkName(); got != "first" {
		t.Errorf("network %q after 01-first.conf appeared, want first (lexical order)", got)
	}
	if err := os.Remove(filepath.Join(confDir, "01-first.conf")); err != nil {
		t.Fatal(err)
	}
	if got := cn.NetworkName(); got != "kubenet" {
		t.Errorf("network %q after 01-first.conf went, want kubenet", got)
	}

	pod := newShimPod(t, host, "shaped")
	annotations := map[string]string{"kubernetes.io/ingress-bandwidth": "10M", "kubernetes.io/egress-bandwidth": "10M"}
	ips := setUp(t, pm, pod, annotations)
	if names := core.NamesFor("kubenet", pod.att()); !testkit.LinkExists(t, node.NS, names.IFB) {
		t.Errorf("no egress shaping device %s: the bandwidth annotations did not reach the plugin", names.IFB)
	}

	for _, f := range []string{"00-notype.conf", "05-missing.conflist", "10-kubenet.conflist"} {
		if err := os.Remove(filepath.Join(confDir, f)); err != nil {
			t.Fatal(err)
		}
	}
	expectNotReady("no networks found")
	other := newShimPod(t, host, "refused")
	if err := pm.SetUpPod(other.namespace, other.name, other.id, nil, nil); err == nil {
		t.Error("SetUpPod succeeded without any network configuration")
	}
	nettest.DeleteNS(t, pod.NS)
	if err := pm.TearDownPod(pod.namespace, pod.name, pod.id); err != nil {
		t.Fatalf("TearDownPod after the configuration was removed and the netns is gone: %v", err)
	}
	testkit.AssertNoResidue(t, node, "kubenet", pod.att(), ips)
	if err := pm.TearDownPod(other.namespace, other.name, other.id); err == nil || !strings.Contains(err.Error(), "uninitialized") {
		t.Errorf("TearDownPod of a pod never set up, without configuration: %v, want the missing configuration named", err)
	}
}
