package e2e

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// podmanContainersConf selects podman 4's CNI backend with private plugin and config dirs,
// the cgroupfs manager (no systemd), a file events log, and pinned default ulimits (podman
// otherwise copies the machine's limits, which a test process may not be allowed to raise).
const podmanContainersConf = `[containers]
default_ulimits = ["nofile=4096:4096", "nproc=4096:4096"]
log_driver = "k8s-file"

[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = %[1]q
runtime = "runc"

[network]
network_backend = "cni"
cni_plugin_dirs = [%[2]q]
network_config_dir = %[3]q
`

const podmanStorageConf = `[storage]
driver = "overlay"
graphroot = %q
runroot = %q
`

// Podman runs podman commands in a jail whose /etc/containers is private to the test.
type Podman struct {
	jail *Jail
}

// PodmanEtc writes a private /etc/containers under dir (containers.conf, storage.conf, an
// empty registries.conf and an accept-anything policy.json for `podman load`) and returns the
// binds a jail needs to show it, and the CNI conf dir, at the paths podman reads.
func PodmanEtc(t testing.TB, dir string, cni CNIDirs) []Bind {
	t.Helper()
	etc := filepath.Join(dir, "etc-containers")
	files := map[string]string{
		"containers.conf": fmt.Sprintf(podmanContainersConf, filepath.Join(dir, "events.log"), cni.Bin, cni.Conf),
		"storage.conf":    fmt.Sprintf(podmanStorageConf, filepath.Join(dir, "storage"), filepath.Join(dir, "runroot")),
		"registries.conf": "unqualified-search-registries = []\n",
		"policy.json":     `{"default": [{"type": "insecureAcceptAnything"}]}` + "\n",
	}
	if err := os.MkdirAll(etc, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(etc, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return []Bind{{Source: etc, Target: "/etc/containers"}, {Source: cni.Conf, Target: "/etc/cni/net.d"}}
}

// NewPodman uses podman inside jail (made with the binds of PodmanEtc) and loads the images of
// archive into its store.
func NewPodman(t testing.TB, jail *Jail, archive string) *Podman {
	t.Helper()
	p := &Podman{jail: jail}
	p.Run(t, "load", "--input", archive)
	return p
}

// Run runs `podman args...` and returns its output, failing the test on error.
func (p *Podman) Run(t testing.TB, args ...string) string {
	t.Helper()
	return strings.TrimSpace(p.jail.Run(t, "podman", args...))
}

// Output runs `podman args...` and returns its output and error.
func (p *Podman) Output(args ...string) (string, error) {
	out, err := p.jail.Output("podman", args...)
	return strings.TrimSpace(out), err
}

// IPs returns the addresses podman reports for container name on network.
func (p *Podman) IPs(t testing.TB, name, network string) []netip.Addr {
	t.Helper()
	var settings struct {
		Networks map[string]struct {
			IPAddress         string
			GlobalIPv6Address string
		}
	}
	raw := p.Run(t, "inspect", "--format", "{{json .NetworkSettings}}", name)
	if err := json.Unmarshal([]byte(raw), &settings); err != nil {
		t.Fatalf("podman inspect %s: %v: %s", name, err, raw)
	}
	n, ok := settings.Networks[network]
	if !ok {
		t.Fatalf("podman inspect %s: not on network %s: %s", name, network, raw)
	}
	var out []netip.Addr
	for _, s := range []string{n.IPAddress, n.GlobalIPv6Address} {
		if a, err := netip.ParseAddr(s); err == nil {
			out = append(out, a)
		}
	}
	return out
}
