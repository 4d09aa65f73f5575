package nettest

import (
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"

	"github.com/containernetworking/cni/pkg/types"
)

// PluginRun is the outcome of one direct plugin invocation.
type PluginRun struct {
	Stdout, Stderr string
	ExitCode       int
	Err            *types.Error // the error JSON on stdout, when the plugin failed
}

// ExecPlugin runs the kubenet binary from binDir inside the node with exactly env (plus PATH)
// and stdin, the way a runtime would, without libcni's validation in between. Tests use it for
// malformed input that libcni would refuse to send.
func (n *Node) ExecPlugin(binDir string, env map[string]string, stdin []byte) (PluginRun, error) {
	var run PluginRun
	err := n.runInNode(func(ctx context.Context) error {
		cmd := exec.CommandContext(ctx, filepath.Join(binDir, "kubenet"))
		cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
		for k, v := range env {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
		cmd.Stdin = bytes.NewReader(stdin)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		run.Stdout, run.Stderr = stdout.String(), stderr.String()
		if exitErr, ok := err.(*exec.ExitError); ok {
			run.ExitCode = exitErr.ExitCode()
			var e types.Error
			if json.Unmarshal(stdout.Bytes(), &e) == nil {
				run.Err = &e
			}
			return nil
		}
		return err
	})
	return run, err
}
