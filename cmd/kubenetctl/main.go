// Command kubenetctl drives the network plugin layer (network/) the way kubelet's dockershim did,
// one operation per run, with kubelet's flag names: select a plugin (--network-plugin=kubenet,
// cni or ""), give it the node's pod CIDR, and set up, inspect or tear down one pod sandbox
// given by its network namespace. It also lists and collects kubenet's allocations, shows who
// owns the node-wide settings, and explains the node's NetworkPolicy state from the kernel.
// Shims embed network/ instead; kubenetctl is for operators, scripts and tests.
//
//	kubenetctl [flags] setup NAMESPACE NAME --netns PATH [--port HOSTPORT:CONTAINERPORT[/PROTO][@HOSTIP]]... [--annotation K=V]... [--json]
//	kubenetctl [flags] teardown NAMESPACE NAME --netns PATH
//	kubenetctl [flags] status NAMESPACE NAME --netns PATH [--json]
//	kubenetctl [flags] ready
//	kubenetctl [flags] allocations [--json]
//	kubenetctl [flags] gc (--valid ID[/IFNAME]... | --all)
//	kubenetctl [flags] node [--json]
//	kubenetctl [flags] peers [--agent URL] [--json]
//	kubenetctl [flags] policy explain NAMESPACE/POD [--kubeconfig FILE] [-o text|json]
//	kubenetctl [flags] policy trace SRC DST PORT/PROTO [-o text|json]
//
// The commands are one table (commands.go); the usage text is made from it. Exit status: 0
// success, 1 the operation failed (or the plugin is not ready), 2 bad usage (an unknown command
// or flag, a wrong number of arguments, a flag the command does not take, a flag value the
// plugins refuse). Errors are one line on stderr.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
)

// Exit statuses.
const (
	exitOK     = 0
	exitFailed = 1
	exitUsage  = 2
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// usageError is bad command-line input (exit 2).
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

// run executes one command and returns the exit status.
func run(args []string, stdout, stderr io.Writer) int {
	err := execute(args, stdout, stderr)
	if err == nil {
		return exitOK
	}
	// One line: joined errors (errors.Join) are separated by "; ".
	fmt.Fprintln(stderr, "kubenetctl: "+strings.ReplaceAll(strings.TrimSpace(err.Error()), "\n", "; "))
	var ue usageError
	if errors.As(err, &ue) {
		return exitUsage
	}
	return exitFailed
}
