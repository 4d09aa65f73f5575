package e2e

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"

	"github.com/kubenet-dev/kubenet/test/nettest"
)

// kubeRunName matches the names a cluster gives what it makes on the machine and captures the
// pid of the test binary that made it.
var kubeRunName = regexp.MustCompile(`^` + KubeRunPrefix + `([0-9]+)-`)

// SweepKubeRuns removes what clusters of dead runs left on the machine: a run killed before its
// cleanups (a go test timeout, a SIGKILL) leaves its network namespaces (and with them the
// underlay and every node's links and rules), its jails' cgroups, its containers' cgroups and
// its directory. Its processes are gone already: each daemon died with its jail's PID
// namespace, and the jails and control-plane processes with the test binary (Pdeathsig). Only names that embed a pid
// no longer running are touched, so concurrent runs, and anything not made by a cluster, are
// left alone. Names with the caller's own pid were left by a former process with that pid and
// are swept too: call it before making any cluster. It returns what it removed.
func SweepKubeRuns() ([]string, error) {
	var removed []string
	var errs []error
	dead := func(name string) bool {
		m := kubeRunName.FindStringSubmatch(name)
		if m == nil {
			return false
		}
		pid, err := strconv.Atoi(m[1])
		if err != nil {
			return false
		}
		if pid == os.Getpid() {
			// A former process that had this pid: this one has made nothing yet.
			return true
		}
		_, err = os.Stat(filepath.Join("/proc", m[1]))
		return errors.Is(err, os.ErrNotExist)
	}
	entries, _ := os.ReadDir("/run/netns")
	for _, e := range entries {
		if dead(e.Name()) {
			p := filepath.Join("/run/netns", e.Name())
			if err := nettest.RemoveNS(p); err != nil {
				errs = append(errs, err)
				continue
			}
			removed = append(removed, "netns "+p)
		}
	}
	hierarchies, _ := os.ReadDir(cgroupRoot)
	seen := map[string]bool{}
	for _, h := range hierarchies {
		groups, _ := os.ReadDir(filepath.Join(cgroupRoot, h.Name()))
		for _, g := range groups {
			if g.IsDir() && dead(g.Name()) && !seen[g.Name()] {
				seen[g.Name()] = true
				if err := removeCgroup("/" + g.Name()); err != nil {
					errs = append(errs, err)
					continue
				}
				removed = append(removed, "cgroup /"+g.Name())
			}
		}
	}
	dirs, _ := os.ReadDir(os.TempDir())
	for _, d := range dirs {
		if d.IsDir() && dead(d.Name()) {
			p := filepath.Join(os.TempDir(), d.Name())
			// The cgroups of the containers its nodes ran, which its directory names.
			nodes, _ := filepath.Glob(filepath.Join(p, "node*"))
			for _, n := range nodes {
				if err := removeContainerCgroups(n); err != nil {
					errs = append(errs, err)
				}
			}
			if err := os.RemoveAll(p); err != nil {
				errs = append(errs, fmt.Errorf("remove %s: %w", p, err))
				continue
			}
			removed = append(removed, "directory "+p)
		}
	}
	return removed, errors.Join(errs...)
}
