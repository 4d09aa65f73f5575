package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kubenet-dev/kubenet/test/e2e/criclient"
)

// CNIDirs are a runtime's private CNI configuration and plugin directories.
type CNIDirs struct {
	Conf, Bin string
}

// containerdConfig is containerd 1.6's configuration (version 2) with every path private to
// the test: root, state, sockets, runc's state, CNI dirs and netns mounts (under the state
// dir). restrict_oom_score_adj because the test may lack CAP_SYS_RESOURCE; no systemd, so
// runc uses the cgroupfs driver. Plugins that would touch the machine (/opt/containerd) or
// need what is not there (btrfs, zfs, devmapper, aufs) are disabled.
const containerdConfig = `version = 2
root = %[1]q
state = %[2]q
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs", "io.containerd.internal.v1.opt", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = %[3]q

[ttrpc]
  address = %[4]q

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[5]q
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %[6]q
    conf_dir = %[7]q
    max_conf_num = 1
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = %[8]q
`

// Containerd is a containerd daemon running in a jail, driven through its CRI socket.
type Containerd struct {
	Daemon *Daemon
	CRI    *criclient.Client
	// Version is what the CRI Version call reported.
	Version string
	// StateDir is containerd's state directory (pod netns mounts live below it).
	StateDir string
	socket   string
}

// StartContainerd writes a private configuration under dir, starts containerd in the jail,
// waits until its CRI plugin reports the runtime and the network ready, and imports the images
// of archive into the k8s.io namespace (where the CRI plugin looks for them).
func StartContainerd(t testing.TB, jail *Jail, dir string, cni CNIDirs, archive string) *Containerd {
	t.Helper()
	c := &Containerd{StateDir: filepath.Join(dir, "state"), socket: filepath.Join(dir, "containerd.sock")}
	config := fmt.Sprintf(containerdConfig, filepath.Join(dir, "root"), c.StateDir, c.socket, c.socket+".ttrpc",
		PauseImage, cni.Bin, cni.Conf, filepath.Join(dir, "runc"))
	configFile := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(configFile, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	c.Daemon = jail.StartDaemon(t, filepath.Join(dir, "containerd.log"), "containerd", "--config", configFile)
	cri, err := criclient.Dial(c.socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cri.Close() })
	c.CRI = cri
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if c.Version, err = cri.WaitReady(ctx); err != nil {
		t.Fatalf("containerd: %v", err)
	}
	jail.Run(t, "ctr", "--address", c.socket, "--namespace", "k8s.io", "images", "import", archive)
	for _, ref := range []string{PauseImage, BusyboxImage} {
		if ok, err := cri.ImageExists(ctx, ref); err != nil || !ok {
			t.Fatalf("image %s not visible through CRI after import (err %v)", ref, err)
		}
	}
	return c
}

// RemoveAllPods stops and removes every pod sandbox, as kubelet would before the node goes away;
// the test registers it so that a failure midway still runs each pod's CNI DEL. Once the
// daemon was stopped there is nothing to ask.
func (c *Containerd) RemoveAllPods(t testing.TB) {
	t.Helper()
	if c.Daemon.Stopped() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ids, err := c.CRI.PodIDs(ctx)
	if err != nil {
		t.Error(err)
		return
	}
	for _, id := range ids {
		if err := c.CRI.StopAndRemovePod(ctx, id); err != nil {
			t.Error(err)
		}
	}
}
