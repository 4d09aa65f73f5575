package nettest

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
)

// Output runs a command inside n and returns its combined output. Tests use it to inspect or
// prepare state with the standard tools (nft, iptables, conntrack) the way an operator would;
// the product itself never execs them.
func Output(n ns.NetNS, name string, args ...string) (string, error) {
	var out []byte
	err := n.Do(func(ns.NetNS) error {
		var err error
		out, err = exec.Command(name, args...).CombinedOutput()
		return err
	})
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// Run is Output that fails the test on error.
func Run(t testing.TB, n ns.NetNS, name string, args ...string) string {
	t.Helper()
	out, err := Output(n, name, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}
