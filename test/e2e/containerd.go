package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kubenet-dev/kubenet/test/e2e/criclient"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

// CNIDirs are a runtime's private CNI configuration and plugin directories.
type CNIDirs struct {
	Conf, Bin string
}

// ContainerdRelease is a containerd the tests run: Debian's 1.6 from the machine's PATH, or
// containerd 2 as hack/containerd/build.sh builds it (containerd, its runc v2 shim and ctr in
// one directory; runc stays Debian's).
type ContainerdRelease struct {
	// Name is what flags and logs call it: "1.6" or "2.2".
	Name string
	// Dir holds the binaries; "" means the machine's PATH (Debian's package).
	Dir string
}

// Bin is the path (or, for Debian's, the name on PATH) of one of the release's binaries:
// containerd, ctr or containerd-shim-runc-v2.
func (r ContainerdRelease) Bin(name string) string {
	if r.Dir == "" {
		return name
	}
	return filepath.Join(r.Dir, name)
}

// V2 tells whether this is containerd 2: configuration version 3, libcni 1.3, which reads a
// conflist's cniVersions (and so calls kubenet with 1.1.0, STATUS included), and the pod's lo
// brought up by containerd itself instead of the reference loopback plugin.
func (r ContainerdRelease) V2() bool { return r.Dir != "" }

// CNIVersion is the version this release calls kubenet with, given a conflist as the agent
// writes it (cniVersion 1.0.0, cniVersions 1.0.0 and 1.1.0): containerd 1.6's libcni knows
// only cniVersion, containerd 2's picks the highest of cniVersions it supports.
func (r ContainerdRelease) CNIVersion() string {
	if r.V2() {
		return "1.1.0"
	}
	return "1.0.0"
}

// NeedsLoopback tells whether the release runs the reference loopback plugin for the pod's lo
// (a network of its own before kubenet's): 1.6 does; 2's configuration here has it bring lo up
// itself (use_internal_loopback), so kubenet is the only CNI binary on the node.
func (r ContainerdRelease) NeedsLoopback() bool { return !r.V2() }

// containerdPaths are the paths and names a configuration sets, each private to the test or
// the node.
type containerdPaths struct {
	Root, State, Socket string
	// SandboxImage is the pause image.
	SandboxImage string
	// CNIConf and CNIBin are the CNI conf dir and the one bin dir.
	CNIConf, CNIBin string
	// RuncRoot is runc's state directory.
	RuncRoot string
}

// Config is the release's configuration with every path p says. Both versions:
// restrict_oom_score_adj because the test may lack CAP_SYS_RESOURCE; no systemd, so runc uses
// the cgroupfs driver; netns mounts under the state dir; one CNI network; plugins that would
// touch the machine (/opt/containerd, containerd 2's NRI socket and conf.d imports) or need what
// is not there (btrfs, zfs, devmapper, aufs, blockfile, erofs) disabled.
func (r ContainerdRelease) Config(p containerdPaths) string {
	if !r.V2() {
		return fmt.Sprintf(containerdConfigV2, p.Root, p.State, p.Socket, p.Socket+".ttrpc",
			p.SandboxImage, p.CNIBin, p.CNIConf, p.RuncRoot)
	}
	return fmt.Sprintf(containerdConfigV3, p.Root, p.State, p.Socket, p.Socket+".ttrpc",
		p.SandboxImage, p.CNIBin, p.CNIConf, p.RuncRoot, r.Bin("containerd-shim-runc-v2"))
}

// containerdConfigV2 is containerd 1.6's configuration (version 2).
const containerdConfigV2 = `version = 2
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

// containerdConfigV3 is containerd 2's configuration (version 3): the CRI plugin split into
// io.containerd.cri.v1.images (snapshotter, the pinned sandbox image) and
// io.containerd.cri.v1.runtime (CNI, runtimes), CNI bin dirs as a list, and the shim named by
// path (runtime_path), since the PATH has Debian's 1.6 shim. imports is emptied: its default
// reads /etc/containerd/conf.d of the machine.
const containerdConfigV3 = `version = 3
root = %[1]q
state = %[2]q
imports = []
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.nri.v1.nri", "io.containerd.snapshotter.v1.blockfile", "io.containerd.snapshotter.v1.erofs", "io.containerd.differ.v1.erofs", "io.containerd.mount-handler.v1.erofs"]

[grpc]
  address = %[3]q

[ttrpc]
  address = %[4]q

[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'overlayfs'
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = %[5]q

[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = [%[6]q]
    conf_dir = %[7]q
    max_conf_num = 1
    use_internal_loopback = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = 'runc'
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = 'io.containerd.runc.v2'
      runtime_path = %[9]q
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = %[8]q
`

// Containerd is a containerd daemon running in a jail, driven through its CRI socket.
type Containerd struct {
	Daemon  *Daemon
	CRI     *criclient.Client
	Release ContainerdRelease
	// Version is what the CRI Version call reported.
	Version string
	// StateDir is containerd's state directory (pod netns mounts live below it).
	StateDir string
	socket   string
	jail     *Jail
}

// StartContainerd writes a private configuration of release r under dir, starts containerd in
// the jail, waits until its CRI plugin reports the runtime and the network ready, and imports
// the images of archive into the k8s.io namespace (where the CRI plugin looks for them).
func StartContainerd(t testing.TB, r ContainerdRelease, jail *Jail, dir string, cni CNIDirs, archive string) *Containerd {
	t.Helper()
	c := &Containerd{Release: r, jail: jail, StateDir: filepath.Join(dir, "state"), socket: filepath.Join(dir, "containerd.sock")}
	config := r.Config(containerdPaths{Root: filepath.Join(dir, "root"), State: c.StateDir, Socket: c.socket,
		SandboxImage: PauseImage, CNIConf: cni.Conf, CNIBin: cni.Bin, RuncRoot: filepath.Join(dir, "runc")})
	configFile := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(configFile, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	c.Daemon = jail.StartDaemon(t, filepath.Join(dir, "containerd.log"), r.Bin("containerd"), "--config", configFile)
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
	c.Ctr(t, "images", "import", archive)
	// The CRI plugin learns of imported images from containerd's events, a moment after ctr
	// returns (seen with containerd 2.2).
	err = nettest.Eventually(time.Minute, func() error {
		for _, ref := range []string{PauseImage, BusyboxImage} {
			if ok, err := cri.ImageExists(ctx, ref); err != nil || !ok {
				return fmt.Errorf("image %s not visible through CRI after import (err %v)", ref, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Ctr runs the release's ctr against this containerd, in its k8s.io namespace (CRI's), inside the
// jail, and returns its output; it fails the test on error.
func (c *Containerd) Ctr(t testing.TB, args ...string) string {
	t.Helper()
	out, err := c.CtrOutput(args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// CtrOutput is Ctr returning the error instead.
func (c *Containerd) CtrOutput(args ...string) (string, error) {
	return c.jail.Output(c.Release.Bin("ctr"), append([]string{"--address", c.socket, "--namespace", "k8s.io"}, args...)...)
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
