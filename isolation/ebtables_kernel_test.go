package isolation

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/kubenet-dev/kubenet/internal/ipt"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

// TestEbtablesReadsBack writes the node's chains and two pods' chains into a fresh namespace and
// reads them back: everything is in ebtables-save's canonical form (a second Ensure writes
// nothing and CHECK passes), Remove takes one pod's chain and dispatch rule and nothing else, and
// GC removes the ports keep rejects and pod chains nothing leads to.
func TestEbtablesReadsBack(t *testing.T) {
	for _, antiSpoofing := range []bool{true, false} {
		t.Run(map[bool]string{true: "anti-spoofing", false: "guard only"}[antiSpoofing], func(t *testing.T) {
			node := nettest.NewNS(t)
			cfg := Config{Network: "kubenet-test", AntiSpoofing: antiSpoofing}
			a := Port{Name: "veth0123456789a", Owner: "a/eth0", MAC: net.HardwareAddr{0x0a, 0x58, 0x0a, 0xf4, 0x01, 0x02},
				Addrs: []netip.Addr{netip.MustParseAddr("10.244.1.2"), netip.MustParseAddr("fd00:10:244:1::2")}}
			b := Port{Name: "veth0123456789b", Owner: "b/eth0", MAC: net.HardwareAddr{0x0a, 0x58, 0x0a, 0xf4, 0x01, 0x03},
				Addrs: []netip.Addr{netip.MustParseAddr("10.244.1.3")}}
			ctx := context.Background()
			ensure := func(ports ...Port) (rebuilt bool) {
				nettest.Do(t, node, func() (err error) {
					rebuilt, err = EnsureEbtables(ctx, &ipt.State{}, cfg, ports...)
					return err
				})
				return rebuilt
			}
			if !ensure(a, b) {
				t.Error("first Ensure did not report a rebuild")
			}
			before := nettest.Run(t, node, "ebtables-save", "-t", "nat")
			if ensure(a, b) {
				t.Error("second Ensure reported a rebuild")
			}
			if after := nettest.Run(t, node, "ebtables-save", "-t", "nat"); stripComments(after) != stripComments(before) {
				t.Errorf("a second Ensure changed the table:\nbefore\n%s\nafter\n%s", before, after)
			}
			nettest.Do(t, node, func() error {
				for _, p := range []Port{a, b} {
					if err := CheckEbtables(ctx, &ipt.State{}, cfg, p); err != nil {
						t.Errorf("CHECK of %s: %v\n%s", p.Name, err, before)
					}
				}
				return RemoveEbtables(ctx, &ipt.State{}, cfg.Network, a)
			})
			out := nettest.Run(t, node, "ebtables-save", "-t", "nat")
			if strings.Contains(out, a.Name) || strings.Contains(out, ebtablesPod(cfg.Network, a.Name)) || !strings.Contains(out, b.Name) {
				t.Errorf("after removing %s:\n%s", a.Name, out)
			}
			// An orphan pod chain (a crash between its creation and its dispatch rule).
			nettest.Run(t, node, "ebtables", "-t", "nat", "-N", ebtablesPod(cfg.Network, "vethorphan"))
			nettest.Do(t, node, func() error {
				stale, err := GCEbtables(ctx, &ipt.State{}, cfg.Network, func(port, _ string) bool { return port != b.Name })
				if len(stale) != 1 || stale[0] != b.Name {
					t.Errorf("GC removed %v, want [%s]", stale, b.Name)
				}
				return err
			})
			out = nettest.Run(t, node, "ebtables-save", "-t", "nat")
			if strings.Contains(out, "KNP-") || strings.Contains(out, b.Name) || !strings.Contains(out, ebtablesGuard(cfg.Network)) {
				t.Errorf("after GC:\n%s", out)
			}
		})
	}
}

// stripComments drops the tool's "# Generated ... on <time>" lines.
func stripComments(s string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
