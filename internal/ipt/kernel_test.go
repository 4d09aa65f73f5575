package ipt

import (
	"context"
	"fmt"
	"maps"
	"os/exec"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/kubenet-dev/kubenet/test/nettest"
)

// TestMayHaveTable: a new namespace has no nat table of either family, and MayHaveTable says so;
// a chain made in one family's nat table, by iptables-nft or by iptables-legacy, makes it say
// maybe for that family only. The bridge family, which it cannot tell, is always maybe.
func TestMayHaveTable(t *testing.T) {
	cases := []struct {
		name   string
		tool   string // makes a chain in its nat table; "" makes nothing
		v4, v6 bool
	}{
		{"nothing made", "", false, false},
		{"iptables-nft", "iptables-nft", true, false},
		{"ip6tables-nft", "ip6tables-nft", false, true},
		{"iptables-legacy", "iptables-legacy", true, false},
		{"ip6tables-legacy", "ip6tables-legacy", false, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			n := nettest.NewNS(t)
			nettest.Do(t, n, func() error {
				if c.tool != "" {
					if out, err := exec.Command(c.tool, "-t", "nat", "-N", "KUBENET-TEST").CombinedOutput(); err != nil {
						t.Fatalf("%s: %v: %s", c.tool, err, out)
					}
				}
				if got := IPv4.MayHaveTable("nat"); got != c.v4 {
					t.Errorf("IPv4 nat: %v, want %v", got, c.v4)
				}
				if got := IPv6.MayHaveTable("nat"); got != c.v6 {
					t.Errorf("IPv6 nat: %v, want %v", got, c.v6)
				}
				if !Bridge.MayHaveTable("nat") {
					t.Error("bridge nat: false, want maybe")
				}
				return nil
			})
		})
	}
}

// TestRuleCounts: where only iptables-nft can hold a table, RuleCounts counts the chains over
// netlink and agrees with what the tool lists (rules, an empty chain, a missing one, either
// family); the State's root there is an empty directory, so a tool run would fail. Once the
// legacy module holds a table of that name, nftables cannot speak for the tool, and RuleCounts
// runs it (and fails here for the missing tool).
func TestRuleCounts(t *testing.T) {
	ctx := context.Background()
	chains := []string{"KN-THREE", "KN-EMPTY", "KN-NONE"}
	for _, f := range []Family{IPv4, IPv6} {
		t.Run(f.String(), func(t *testing.T) {
			n := nettest.NewNS(t)
			nettest.Do(t, n, func() error {
				lines := []string{":KN-THREE - [0:0]", ":KN-EMPTY - [0:0]",
					"-A KN-THREE -j RETURN", "-A KN-THREE -p tcp -j RETURN", "-A KN-THREE -p udp -j RETURN"}
				if err := (&State{}).Restore(ctx, f, "nat", lines); err != nil {
					return err
				}
				want := map[string]int{"KN-THREE": 3, "KN-EMPTY": 0}
				listed, err := (&State{}).RuleCounts(ctx, f, "nat", chains...)
				if err != nil {
					t.Fatalf("through the tool: %v", err)
				}
				if !maps.Equal(listed, want) {
					t.Errorf("through the tool: %v, want %v", listed, want)
				}
				noTools := &State{Root: t.TempDir()}
				got, err := noTools.RuleCounts(ctx, f, "nat", chains...)
				if err != nil {
					t.Fatalf("over netlink: %v", err)
				}
				if !maps.Equal(got, want) {
					t.Errorf("over netlink: %v, want %v", got, want)
				}

				legacy := map[Family]string{IPv4: "iptables-legacy", IPv6: "ip6tables-legacy"}[f]
				if out, err := exec.Command(legacy, "-t", "nat", "-N", "KN-LEGACY").CombinedOutput(); err != nil {
					t.Fatalf("%s: %v: %s", legacy, err, out)
				}
				if got, err := noTools.RuleCounts(ctx, f, "nat", chains...); err == nil {
					t.Errorf("with a legacy nat table: %v from nftables, want the tool run (and fail)", got)
				}
				return nil
			})
		})
	}
}

// TestRuleCountsBigTable: on a node whose nat table is large (kube-proxy's thousands of rules),
// the count of each chain over netlink is that chain's alone, also where the dump of the chain
// itself spans several replies, and chains whose names prefix each other are told apart.
func TestRuleCountsBigTable(t *testing.T) {
	ctx := context.Background()
	n := nettest.NewNS(t)
	want := map[string]int{"KN-HP": 1, "KN-HPSNAT": 2500, "KN-HPS": 0, "KUBE-SERVICES": 4000}
	lines := []string{":KN-HP - [0:0]", ":KN-HPSNAT - [0:0]", ":KN-HPS - [0:0]", ":KUBE-SERVICES - [0:0]", "-A KN-HP -j RETURN"}
	for i := range want["KN-HPSNAT"] {
		lines = append(lines, fmt.Sprintf("-A KN-HPSNAT -s 10.%d.%d.0/24 -j RETURN", i/256, i%256))
	}
	for i := range want["KUBE-SERVICES"] {
		lines = append(lines, fmt.Sprintf("-A KUBE-SERVICES -d 10.96.%d.%d/32 -p tcp --dport 80 -j RETURN", i/256, i%256))
	}
	nettest.Do(t, n, func() error {
		if err := (&State{}).Restore(ctx, IPv4, "nat", lines); err != nil {
			return err
		}
		names := []string{"KN-HP", "KN-HPSNAT", "KN-HPS", "KUBE-SERVICES", "KN-H"}
		listed, err := (&State{}).RuleCounts(ctx, IPv4, "nat", names...)
		if err != nil || !maps.Equal(listed, want) {
			t.Errorf("through the tool: %v, %v, want %v", listed, err, want)
		}
		got, err := (&State{Root: t.TempDir()}).RuleCounts(ctx, IPv4, "nat", names...)
		if err != nil || !maps.Equal(got, want) {
			t.Errorf("over netlink: %v, %v, want %v", got, err, want)
		}
		return nil
	})
}

// TestRuleCountsDuringRewrites: a restore that declares kubenet's chain again (what every ADD
// that finds it changed writes, and the agent) empties and refills it in one transaction: a
// count over netlink meanwhile never sees it missing or empty.
func TestRuleCountsDuringRewrites(t *testing.T) {
	ctx := context.Background()
	n := nettest.NewNS(t)
	lines := []string{":KN-RW - [0:0]", "-A KN-RW -j RETURN", "-A KN-RW -p tcp -j RETURN"}
	nettest.Do(t, n, func() error { return (&State{}).Restore(ctx, IPv4, "nat", lines) })
	done := make(chan error, 1)
	go func() {
		var err error
		for range 30 {
			if err = n.Do(func(ns.NetNS) error { return (&State{}).Restore(ctx, IPv4, "nat", lines) }); err != nil {
				break
			}
		}
		done <- err
	}()
	nettest.Do(t, n, func() error {
		noTools := &State{Root: t.TempDir()}
		for {
			select {
			case err := <-done:
				return err
			default:
			}
			got, err := noTools.RuleCounts(ctx, IPv4, "nat", "KN-RW")
			if err != nil {
				return err
			}
			if got["KN-RW"] != 2 {
				return fmt.Errorf("counted %v during a rewrite, want KN-RW's 2 rules", got)
			}
		}
	})
}
