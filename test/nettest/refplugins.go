package nettest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// RefPluginsVersion is the containernetworking/plugins release the reference plugins come from
// (the version this module depends on).
const RefPluginsVersion = "v1.9.1"

// refPluginPackages are the reference CNI plugins tests compare kubenet with: binary name ->
// package in containernetworking/plugins.
func refPluginPackages() map[string]string {
	return map[string]string{
		"bridge":     "plugins/main/bridge",
		"host-local": "plugins/ipam/host-local",
		"portmap":    "plugins/meta/portmap",
		"bandwidth":  "plugins/meta/bandwidth",
		"loopback":   "plugins/main/loopback",
	}
}

// RefPluginsDirEnv overrides where InstallRefPlugins puts the binaries.
const RefPluginsDirEnv = "KUBENET_REFPLUGINS_DIR"

// InstallRefPlugins makes sure the reference plugins bridge, host-local, portmap, bandwidth and
// loopback of RefPluginsVersion are installed (`go install`) in a cache directory outside the
// checkout, and returns that directory. The directory is $KUBENET_REFPLUGINS_DIR, else
// kubenet-refplugins/<version>-static next to the Go build cache, so repeated runs only stat the
// binaries. Concurrent callers (parallel test binaries) take turns on a lock file.
//
// They are built without cgo, as the project's releases are (static binaries): kubenet is built
// the same way (BuildPackage), so a comparison times both chains as nodes run them.
func InstallRefPlugins() (string, error) {
	dir := os.Getenv(RefPluginsDirEnv)
	if dir == "" {
		out, err := exec.Command("go", "env", "GOCACHE").Output()
		if err != nil {
			return "", fmt.Errorf("go env GOCACHE: %w", err)
		}
		dir = filepath.Join(filepath.Dir(strings.TrimSpace(string(out))), "kubenet-refplugins", RefPluginsVersion+"-static")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("reference plugins dir: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_RDONLY|os.O_CREATE, 0o600)
	if err != nil {
		return "", fmt.Errorf("reference plugins lock: %w", err)
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return "", fmt.Errorf("reference plugins lock: %w", err)
	}
	var missing []string
	for name, pkg := range refPluginPackages() {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			missing = append(missing, "github.com/containernetworking/plugins/"+pkg+"@"+RefPluginsVersion)
		}
	}
	if len(missing) == 0 {
		return dir, nil
	}
	cmd := exec.Command("go", append([]string{"install"}, missing...)...)
	// Outside any module, so the checkout's go.mod plays no part and GOBIN decides the target.
	cmd.Dir = os.TempDir()
	cmd.Env = append(os.Environ(), "GOBIN="+dir, "GOFLAGS=-buildvcs=false", "GOWORK=off", "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go install reference CNI plugins: %w\n%s", err, out)
	}
	return dir, nil
}
