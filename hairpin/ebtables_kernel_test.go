package hairpin

import (
	"context"
	"net"
	"net/netip"
	"testing"

	"github.com/kubenet-dev/kubenet/internal/ipt"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

// TestDedupEbtablesReadsBack writes the dedup plan into a fresh namespace and reads it back: the
// plan is in ebtables-save's canonical form, a second Ensure writes nothing, and switching to
// another mode removes the chain and its jump.
func TestDedupEbtablesReadsBack(t *testing.T) {
	node := nettest.NewNS(t)
	d := Dedup{
		Network:   "kubenet-test",
		Bridge:    "cbr0",
		BridgeMAC: net.HardwareAddr{0x0a, 0x58, 0x0a, 0xf4, 0x01, 0x01},
		PodCIDRs:  []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd00:10:244:1::/64")},
		Gateways:  []netip.Addr{netip.MustParseAddr("10.244.1.1"), netip.MustParseAddr("fd00:10:244:1::1")},
	}
	ctx := context.Background()
	nettest.Do(t, node, func() error { return EnsureDedupEbtables(ctx, &ipt.State{}, PromiscuousBridge, d) })
	nettest.Do(t, node, func() error {
		if diffs, err := PlanDedupEbtables(d).Ensure(ctx, &ipt.State{}, ipt.Bridge, "filter"); err != nil || len(diffs) > 0 {
			t.Errorf("a second Ensure found %v (%v):\n%s", diffs, err, nettest.Run(t, node, "ebtables-save"))
		}
		return CheckDedupEbtables(ctx, &ipt.State{}, PromiscuousBridge, d)
	})
	nettest.Do(t, node, func() error {
		if err := CheckDedupEbtables(ctx, &ipt.State{}, HairpinVeth, d); err == nil {
			t.Error("CheckDedupEbtables in hairpin-veth mode passed with the dedup chain present")
		}
		if err := EnsureDedupEbtables(ctx, &ipt.State{}, HairpinVeth, d); err != nil {
			return err
		}
		return CheckDedupEbtables(ctx, &ipt.State{}, HairpinVeth, d)
	})
	if out := nettest.Run(t, node, "ebtables-save", "-t", "filter"); len(ipt.Parse(ipt.Bridge, "filter", []byte(out)).Chains["OUTPUT"]) != 0 {
		t.Errorf("jump left after leaving promiscuous-bridge mode:\n%s", out)
	}
}
