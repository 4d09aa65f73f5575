// Command rssshim measures the peak RSS of a CNI plugin process. Installed (linked) under a
// plugin's name, it runs $KUBENET_BENCH_SHIM_TARGET/<its own name> with its arguments, stdin,
// stdout, stderr and environment, appends "<name> <CNI_COMMAND> <peak RSS in KiB>" to
// $KUBENET_BENCH_RSS_LOG and exits with the plugin's status.
//
// Why a shim: Go starts children with vfork semantics (CLONE_VM), and at execve the kernel folds
// the RSS high-water mark of the mm being left behind, the parent's, into the child's
// ru_maxrss. A plugin started straight from the benchmark process therefore reports the
// benchmark's RSS. Started from this small process it reports its own, or the shim's when that
// is larger (the floor the benchmark prints).
package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
)

func main() {
	name := filepath.Base(os.Args[0])
	cmd := exec.Command(filepath.Join(os.Getenv("KUBENET_BENCH_SHIM_TARGET"), name), os.Args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	err := cmd.Run()
	var exitErr *exec.ExitError
	if err != nil && !errors.As(err, &exitErr) {
		fmt.Fprintf(os.Stderr, "rssshim: %v\n", err)
		os.Exit(127)
	}
	verb := os.Getenv("CNI_COMMAND")
	if verb == "" {
		verb = "-"
	}
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		if f, err := os.OpenFile(os.Getenv("KUBENET_BENCH_RSS_LOG"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600); err == nil {
			// One short write with O_APPEND: lines of concurrent shims do not interleave.
			_, _ = fmt.Fprintf(f, "%s %s %d\n", name, verb, ru.Maxrss)
			_ = f.Close()
		}
	}
	os.Exit(cmd.ProcessState.ExitCode())
}
