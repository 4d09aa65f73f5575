package masq

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"github.com/kubenet-dev/kubenet/internal/ipt"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

// TestIPTablesPlanReadsBack writes the plan into a fresh namespace's nat tables and reads it
// back: the plan is in the tools' canonical form (every rule compares equal, so a healthy node's
// ADD writes nothing), a second Ensure writes nothing, and a rule changed in place is found.
func TestIPTablesPlanReadsBack(t *testing.T) {
	node := nettest.NewNS(t)
	cfg := Config{
		Network:            "kubenet-test",
		PodCIDRs:           []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd00:10:244:1::/64")},
		NonMasqueradeCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")},
	}
	ctx := context.Background()
	nettest.Do(t, node, func() error { return EnsureIPTables(ctx, &ipt.State{}, cfg) })
	nettest.Do(t, node, func() error { return CheckIPTables(ctx, &ipt.State{}, cfg) })
	for f, p := range PlanIPTables(cfg) {
		nettest.Do(t, node, func() error {
			diffs, err := p.Ensure(ctx, &ipt.State{}, f, "nat")
			if len(diffs) > 0 {
				t.Errorf("%s: a second Ensure found %v", f, diffs)
			}
			return err
		})
	}
	chain := IPTablesChain(cfg.Network)
	if out := nettest.Run(t, node, "iptables-save", "-t", "nat"); !strings.Contains(out, "-A POSTROUTING -m comment --comment \"kubenet kubenet-test: pod SNAT\" -j "+chain) {
		t.Fatalf("the node's nat table has no jump to %s:\n%s", chain, out)
	}
	nettest.Run(t, node, "iptables", "-t", "nat", "-R", chain, "4", "-s", "10.244.1.0/24",
		"-m", "comment", "--comment", "pod 10.244.1.0/24 to outside: SNAT to the node", "-j", "RETURN")
	nettest.Do(t, node, func() error {
		if err := CheckIPTables(ctx, &ipt.State{}, cfg); err == nil {
			t.Error("CheckIPTables passed with the SNAT rule changed in place")
		}
		return EnsureIPTables(ctx, &ipt.State{}, cfg)
	})
	nettest.Do(t, node, func() error { return CheckIPTables(ctx, &ipt.State{}, cfg) })
}
