package shim

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/kubenet-dev/kubenet/network"
	"github.com/kubenet-dev/kubenet/network/plugins"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

// fakeCNI is test/fakecni installed for one test: the plugin, the conf dir and where the plugin
// records its calls.
type fakeCNI struct {
	binDir, confDir, recordDir string
}

func newFakeCNI(t *testing.T) *fakeCNI {
	t.Helper()
	f := &fakeCNI{binDir: t.TempDir(), confDir: t.TempDir(), recordDir: t.TempDir()}
	if _, err := nettest.BuildPackage(f.binDir, "./test/fakecni", "fakecni"); err != nil {
		t.Fatal(err)
	}
	return f
}

// conflist writes file with one fakecni plugin configured by extra.
func (f *fakeCNI) conflist(t *testing.T, file string, extra map[string]any) {
	t.Helper()
	plugin := map[string]any{"type": "fakecni", "recordDir": f.recordDir}
	for k, v := range extra {
		plugin[k] = v
	}
	writeConf(t, f.confDir, file, map[string]any{"cniVersion": "1.0.0", "name": "fake", "plugins": []any{plugin}})
}

// record reads what the verb's call for the sandbox recorded; ok is false when it never ran.
func (f *fakeCNI) record(t *testing.T, verb, id string) (rec struct {
	Pid   int             `json:"pid"`
	NetNS string          `json:"netns"`
	Stdin json.RawMessage `json:"stdin"`
}, ok bool) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(f.recordDir, verb+"-"+id+".json"))
	if os.IsNotExist(err) {
		return rec, false
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		t.Fatalf("record of %s %s: %v", verb, id, err)
	}
	return rec, true
}

// manager probes the plugins as a shim does (plugins.Probe), with the CNI wrapper's plugins run
// in nodeNS, selects cni and wraps it.
func (f *fakeCNI) manager(t *testing.T, nodeNS ns.NetNS, host network.Host, opts plugins.Options) *network.PluginManager {
	t.Helper()
	opts.CNIConfDir, opts.NodeNS, opts.Logger = f.confDir, nodeNS, testLogger(t)
	if opts.CNIBinDirs == nil {
		opts.CNIBinDirs = []string{f.binDir}
	}
	opts.CNICacheDir = filepath.Join(t.TempDir(), "cache")
	opts.Kubenet.DataDir = t.TempDir()
	all := plugins.Probe(opts)
	t.Cleanup(func() { _ = plugins.Close(all) })
	return managerFor(t, all, "cni", host)
}

// TestCNIPluginDNSCapability: SetUpPod's options["dns"] reaches a plugin that declares the dns
// capability as runtimeConfig.dns with CNI's key names; a plugin that does not declare it gets
// none; a malformed option fails SetUpPod before any plugin runs.
func TestCNIPluginDNSCapability(t *testing.T) {
	t.Parallel()
	f := newFakeCNI(t)
	host := newShimHost()
	nodeNS := nettest.NewNS(t)
	const dns = `{"servers":["10.96.0.10"],"searches":["default.svc.cluster.local","svc.cluster.local"],"options":["ndots:5"]}`
	options := map[string]string{"dns": dns}
	runtimeConfig := func(id string) map[string]json.RawMessage {
		rec, ok := f.record(t, "ADD", id)
		if !ok {
			t.Fatalf("the plugin did not run ADD for %s", id)
		}
		var conf struct {
			RuntimeConfig map[string]json.RawMessage `json:"runtimeConfig"`
		}
		if err := json.Unmarshal(rec.Stdin, &conf); err != nil {
			t.Fatal(err)
		}
		return conf.RuntimeConfig
	}

	f.conflist(t, "10-fake.conflist", map[string]any{"capabilities": map[string]bool{"dns": true, "portMappings": true}})
	pm := f.manager(t, nodeNS, host, plugins.Options{})
	pod := newShimPod(t, host, "dns")
	if err := pm.SetUpPod(pod.namespace, pod.name, pod.id, nil, options); err != nil {
		t.Fatal(err)
	}
	if got := string(runtimeConfig(pod.id.ID)["dns"]); got != dns {
		t.Errorf("runtimeConfig.dns %s, want %s", got, dns)
	}

	bad := newShimPod(t, host, "bad-dns")
	err := pm.SetUpPod(bad.namespace, bad.name, bad.id, nil, map[string]string{"dns": `{"servers":["kube-dns"]}`})
	if err == nil || !strings.Contains(err.Error(), `server "kube-dns" is not an IP address`) {
		t.Errorf("SetUpPod with a malformed dns option: %v, want it refused naming the server", err)
	}
	if _, ran := f.record(t, "ADD", bad.id.ID); ran {
		t.Error("the plugin ran although the dns option was malformed")
	}

	// The same conf dir with a network that does not declare dns (picked up without a restart).
	f.conflist(t, "10-fake.conflist", map[string]any{"capabilities": map[string]bool{"portMappings": true}})
	plain := newShimPod(t, host, "no-dns")
	if err := pm.SetUpPod(plain.namespace, plain.name, plain.id, nil, options); err != nil {
		t.Fatal(err)
	}
	rc := runtimeConfig(plain.id.ID)
	if _, has := rc["dns"]; has {
		t.Errorf("runtimeConfig %v has dns although the network does not declare it", rc)
	}
	if _, has := rc["portMappings"]; !has {
		t.Errorf("runtimeConfig %v lacks the declared portMappings: the check above proves nothing", rc)
	}
}

// TestCNIPluginTimeout: a plugin that hangs is killed when the call's timeout expires, and
// SetUpPod fails saying so (kubelet bounded CNI calls by 220 s, under the CRI's 4 minutes).
func TestCNIPluginTimeout(t *testing.T) {
	t.Parallel()
	f := newFakeCNI(t)
	host := newShimHost()
	f.conflist(t, "10-fake.conflist", map[string]any{"hang": []string{"ADD"}})
	const timeout = 2 * time.Second
	pm := f.manager(t, nettest.NewNS(t), host, plugins.Options{CNITimeout: timeout})
	pod := newShimPod(t, host, "hangs")
	err := pm.SetUpPod(pod.namespace, pod.name, pod.id, nil, nil)
	if err == nil || !strings.Contains(err.Error(), "timed out after "+timeout.String()) {
		t.Fatalf("SetUpPod with a hanging plugin: %v, want a timeout error", err)
	}
	rec, ok := f.record(t, "ADD", pod.id.ID)
	if !ok {
		t.Fatal("the plugin never started")
	}
	// The hung process is gone (killed and reaped), not left running.
	if err := nettest.Eventually(10*time.Second, func() error {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", rec.Pid)); err == nil {
			return fmt.Errorf("plugin process %d still exists", rec.Pid)
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
}

// TestCNIPluginTearDownVanishedNetns: TearDownPod after the sandbox's netns is gone succeeds when
// an (old) plugin fails DEL only with "no such file or directory", as kubelet tolerated; any
// other DEL error is reported, naming the network.
func TestCNIPluginTearDownVanishedNetns(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		extra   map[string]any
		wantErr string
	}{
		{"old plugin: no such file or directory is ignored", map[string]any{"delNeedsNetns": true}, ""},
		{"any other DEL error is reported", map[string]any{"delError": "permission denied"}, `from CNI network "fake"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeCNI(t)
			host := newShimHost()
			f.conflist(t, "10-fake.conflist", c.extra)
			pm := f.manager(t, nettest.NewNS(t), host, plugins.Options{})
			pod := newShimPod(t, host, "gone")
			if err := pm.SetUpPod(pod.namespace, pod.name, pod.id, nil, nil); err != nil {
				t.Fatal(err)
			}
			nettest.DeleteNS(t, pod.NS)
			err := pm.TearDownPod(pod.namespace, pod.name, pod.id)
			if _, ran := f.record(t, "DEL", pod.id.ID); !ran {
				t.Fatal("TearDownPod did not run the plugin's DEL")
			}
			switch {
			case c.wantErr == "" && err != nil:
				t.Errorf("TearDownPod with the netns gone: %v, want success", err)
			case c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr) || !strings.Contains(err.Error(), "permission denied")):
				t.Errorf("TearDownPod: %v, want the DEL error reported with %q", err, c.wantErr)
			}
		})
	}
}

// TestCNIPluginVendorDir: a plugin found only in kubelet's vendor dir <prefix>/opt/<type>/bin is
// used; with another prefix it is not found and Status names the missing plugin.
func TestCNIPluginVendorDir(t *testing.T) {
	t.Parallel()
	f := newFakeCNI(t)
	prefix := t.TempDir()
	vendorDir := filepath.Join(prefix, "opt", "fakecni", "bin")
	if err := os.MkdirAll(vendorDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(f.binDir, "fakecni"), filepath.Join(vendorDir, "fakecni")); err != nil {
		t.Fatal(err)
	}
	f.conflist(t, "10-fake.conflist", nil)
	host := newShimHost()
	nodeNS := nettest.NewNS(t)

	pm := f.manager(t, nodeNS, host, plugins.Options{VendorCNIDirPrefix: t.TempDir()})
	if err := pm.Status(); err == nil || !strings.Contains(err.Error(), `failed to find plugin "fakecni"`) {
		t.Errorf("Status without the vendor dir: %v, want the missing plugin named", err)
	}
	pm = f.manager(t, nodeNS, host, plugins.Options{VendorCNIDirPrefix: prefix})
	if err := pm.Status(); err != nil {
		t.Fatalf("Status with the plugin in %s: %v", vendorDir, err)
	}
	pod := newShimPod(t, host, "vendor")
	if err := pm.SetUpPod(pod.namespace, pod.name, pod.id, nil, nil); err != nil {
		t.Fatal(err)
	}
	if _, ran := f.record(t, "ADD", pod.id.ID); !ran {
		t.Error("the vendor dir's plugin did not run ADD")
	}
	if err := pm.TearDownPod(pod.namespace, pod.name, pod.id); err != nil {
		t.Fatal(err)
	}
	if _, ran := f.record(t, "DEL", pod.id.ID); !ran {
		t.Error("the vendor dir's plugin did not run DEL")
	}
}
