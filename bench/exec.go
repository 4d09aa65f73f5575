package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"
)

// procRun is one plugin process libcni started.
type procRun struct {
	Plugin  string        // binary name: kubenet, bridge, portmap, ...
	Command string        // CNI_COMMAND
	Wall    time.Duration // fork to reap
	// CPU is the user and system time the kernel accounted to the process and to the processes
	// it waited for (host-local under bridge, nft and the iptables tools): exact in sum, as the
	// kernel splits the scheduler's runtime between the two by its tick samples.
	CPU time.Duration
}

// recordingExec is libcni's plugin executor with accounting: it runs each plugin like
// invoke.RawExec does, with env added to the environment, and keeps the wall time of every
// process, so the report can say which plugin of a chain the time goes to.
type recordingExec struct {
	version.PluginDecoder
	env []string

	mu   sync.Mutex
	runs []procRun
}

func (e *recordingExec) FindInPath(plugin string, paths []string) (string, error) {
	return invoke.FindInPath(plugin, paths)
}

func (e *recordingExec) ExecPlugin(ctx context.Context, pluginPath string, stdin []byte, environ []string) ([]byte, error) {
	var stdout, stderr bytes.Buffer
	c := exec.CommandContext(ctx, pluginPath)
	c.Env = append(environ, e.env...)
	c.Stdin = bytes.NewReader(stdin)
	c.Stdout, c.Stderr = &stdout, &stderr
	start := time.Now()
	err := c.Run()
	run := procRun{Plugin: filepath.Base(pluginPath), Command: envValue(environ, "CNI_COMMAND"), Wall: time.Since(start)}
	if ps := c.ProcessState; ps != nil { // nil: the process never started
		if ru, ok := ps.SysUsage().(*syscall.Rusage); ok {
			run.CPU = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
		}
	}
	e.mu.Lock()
	e.runs = append(e.runs, run)
	e.mu.Unlock()
	if err != nil {
		return nil, pluginError(err, stdout.Bytes(), stderr.Bytes())
	}
	return stdout.Bytes(), nil
}

// take returns the processes recorded since the last call and forgets them.
func (e *recordingExec) take() []procRun {
	e.mu.Lock()
	defer e.mu.Unlock()
	runs := e.runs
	e.runs = nil
	return runs
}

// pluginError turns a failed plugin run into the CNI error it printed, as libcni's RawExec does,
// keeping stderr for the benchmark's failure message.
func pluginError(err error, stdout, stderr []byte) error {
	var e types.Error
	if len(stdout) == 0 || json.Unmarshal(stdout, &e) != nil {
		return fmt.Errorf("plugin failed: %v: stdout %q stderr %q", err, stdout, stderr)
	}
	if len(stderr) > 0 {
		e.Details = strings.TrimSpace(e.Details + " " + string(stderr))
	}
	return &e
}

func envValue(environ []string, key string) string {
	for _, kv := range environ {
		if v, ok := strings.CutPrefix(kv, key+"="); ok {
			return v
		}
	}
	return ""
}
