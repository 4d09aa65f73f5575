package nft

import (
	"strings"
	"testing"

	"github.com/kubenet-dev/kubenet/test/nettest"
)

// TestProbe: this kernel holds everything kubenet uses, and the probe leaves no table behind.
func TestProbe(t *testing.T) {
	node := nettest.NewNS(t)
	nettest.Do(t, node, Probe)
	if out := nettest.Run(t, node, "nft", "list", "tables"); strings.Contains(out, "kubenet-probe") {
		t.Errorf("the probe left tables:\n%s", out)
	}
}
