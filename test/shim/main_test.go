// Package test holds kubenet's end-to-end tests: the built plugin binary driven through libcni
// inside simulated nodes (network namespaces), asserting kernel state and real traffic.
package shim

import (
	"os"
	"testing"

	"github.com/kubenet-dev/kubenet/test/nettest"
)

// binDir holds the plugin binary built for this test run; it is set once by TestMain before any
// test runs and only read afterwards.
var binDir string

func TestMain(m *testing.M) { os.Exit(nettest.MainWithPlugin(m, &binDir)) }
