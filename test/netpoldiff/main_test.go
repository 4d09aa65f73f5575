package netpoldiff

import (
	"os"
	"testing"

	"github.com/kubenet-dev/kubenet/test/nettest"
)

// binDir holds the plugin binary built for this test run; TestMain sets it before any test runs.
var binDir string

func TestMain(m *testing.M) { os.Exit(nettest.MainWithPlugin(m, &binDir)) }
