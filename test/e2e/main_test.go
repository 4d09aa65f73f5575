//go:build e2e

package e2e

import (
	"os"
	"testing"

	"github.com/kubenet-dev/kubenet/test/nettest"
)

// binDir holds the plugin binary built for this run; TestMain sets it once before any test
// runs and tests only read it.
var binDir string

func TestMain(m *testing.M) { os.Exit(nettest.MainWithPlugin(m, &binDir)) }
