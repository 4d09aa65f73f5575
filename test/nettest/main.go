package nettest

import (
	"fmt"
	"os"
	"testing"
)

// MainWithPlugin is the body of a TestMain for tests of the built plugin: it sweeps the test
// namespaces that dead runs left, builds ./cmd/kubenet into a temporary directory, stores that
// directory in *binDir before any test runs, runs the tests (removing this run's namespaces if
// SIGINT or SIGTERM ends it), removes the directory and returns the exit code for os.Exit.
func MainWithPlugin(m *testing.M, binDir *string) int {
	if os.Geteuid() == 0 {
		if err := SweepStaleNamespaces(os.Stderr); err != nil {
			fmt.Fprintln(os.Stderr, "sweep stale test namespaces:", err)
			return 1
		}
		defer sweepOnSignal()()
	}
	dir, err := os.MkdirTemp("", "kubenet-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	if *binDir, err = BuildPlugin(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}
