package bench

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/kubenet-dev/kubenet/test/nettest"
)

// Environment of rssshim (see bench/rssshim).
const (
	shimTargetEnv = "KUBENET_BENCH_SHIM_TARGET"
	shimLogEnv    = "KUBENET_BENCH_RSS_LOG"
)

// buildShim compiles bench/rssshim into dir (static, like the plugins it runs) and returns the
// binary's path.
func buildShim(dir string) (string, error) {
	return nettest.BuildPackage(dir, "./bench/rssshim", "rssshim")
}

// shimBinDir makes dir a CNI bin dir in which every plugin of binDir is the shim under the
// plugin's name (bridge finds host-local there too, through CNI_PATH).
func shimBinDir(shim, binDir, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	entries, err := os.ReadDir(binDir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.Type().IsRegular() && !strings.HasPrefix(e.Name(), ".") {
			if err := os.Link(shim, filepath.Join(dir, e.Name())); err != nil {
				return fmt.Errorf("shim for %s: %w", e.Name(), err)
			}
		}
	}
	return nil
}

// rssRun is one line of the shim's log: a plugin process and its peak RSS.
type rssRun struct {
	Plugin, Command string
	MaxRSS          int64 // bytes
}

// takeRSSLog reads the shim's log and empties it.
func takeRSSLog(path string) ([]rssRun, error) {
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if err := os.Remove(path); err != nil {
		return nil, err
	}
	var runs []rssRun
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 3 {
			return nil, fmt.Errorf("rss log %s: bad line %q", path, sc.Text())
		}
		kib, err := strconv.ParseInt(f[2], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("rss log %s: bad line %q", path, sc.Text())
		}
		runs = append(runs, rssRun{Plugin: f[0], Command: f[1], MaxRSS: kib << 10})
	}
	return runs, sc.Err()
}

// shimFloor is the least peak RSS the shim can report: that of a trivial program it runs.
func shimFloor(shim, dir string) (int64, error) {
	target, err := exec.LookPath("true")
	if err != nil {
		return 0, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, err
	}
	link := filepath.Join(dir, filepath.Base(target))
	if err := os.Link(shim, link); err != nil {
		return 0, err
	}
	log := filepath.Join(dir, "floor.log")
	cmd := exec.Command(link)
	cmd.Env = []string{shimTargetEnv + "=" + filepath.Dir(target), shimLogEnv + "=" + log}
	if out, err := cmd.CombinedOutput(); err != nil {
		return 0, fmt.Errorf("shim floor: %v: %s", err, out)
	}
	runs, err := takeRSSLog(log)
	if err != nil || len(runs) != 1 {
		return 0, fmt.Errorf("shim floor: %v (%d lines)", err, len(runs))
	}
	return runs[0].MaxRSS, nil
}
