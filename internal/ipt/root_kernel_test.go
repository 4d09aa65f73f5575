package ipt

import (
	"context"
	"strings"
	"testing"

	"github.com/kubenet-dev/kubenet/test/nettest"
)

// TestToolRoot: with a tool root, the tools are found under it and run chrooted into it, as
// kubenet-agent runs the node's own tools from its container. /proc/self/root is this machine's
// root seen through a link: the same tools, reached the way a mounted node root is.
func TestToolRoot(t *testing.T) {
	n := nettest.NewNS(t)
	st := &State{Root: "/proc/self/root"}
	ctx := context.Background()
	nettest.Do(t, n, func() error {
		for _, f := range []Family{IPv4, IPv6, Bridge} {
			if err := st.Available(f); err != nil {
				t.Errorf("%s under the root: %v", f, err)
			}
		}
		if err := st.Restore(ctx, Bridge, "nat", []string{":KN-ROOT RETURN", "-A KN-ROOT -p IPv4 -j DROP"}); err != nil {
			return err
		}
		if err := st.Restore(ctx, IPv4, "nat", []string{":KN-ROOT - [0:0]", "-A KN-ROOT -j RETURN"}); err != nil {
			return err
		}
		ebt, err := st.Chains(ctx, Bridge, "nat", "KN-ROOT")
		if err != nil || len(ebt.Chains["KN-ROOT"]) != 1 {
			t.Errorf("ebtables chain read under the root: %v, %v", ebt, err)
		}
		ipt, err := st.Table(ctx, IPv4, "nat")
		if err != nil || len(ipt.Chains["KN-ROOT"]) != 1 {
			t.Errorf("iptables table read under the root: %v, %v", ipt, err)
		}
		return nil
	})
	// What the chrooted tools wrote is in the test's namespace, read without a root.
	if out := nettest.Run(t, n, "iptables-save", "-t", "nat"); !strings.Contains(out, "-A KN-ROOT -j RETURN") {
		t.Errorf("the node's namespace lacks the rule:\n%s", out)
	}
	if _, err := toolPath(t.TempDir(), "iptables"); err == nil {
		t.Error("a root without the tools found them")
	}
}

// TestSentinelsCheckOnly: a State for STATUS (Sentinels) makes Check read only the plan's own
// chains, but Ensure through it still sees the jumps: run twice, it leaves one jump per hook.
func TestSentinelsCheckOnly(t *testing.T) {
	n := nettest.NewNS(t)
	plan := Plan{
		Chains: []Chain{{Name: "KN-SENT", Rules: []string{"-j RETURN"}}},
		Jumps:  []Jump{{From: "POSTROUTING", Rule: "-j KN-SENT"}},
	}
	ctx := context.Background()
	nettest.Do(t, n, func() error {
		for i := range 2 {
			if _, err := plan.Ensure(ctx, &State{Sentinels: true}, IPv4, "nat"); err != nil {
				return err
			}
			if err := plan.Check(ctx, &State{}, IPv4, "nat"); err != nil {
				t.Errorf("after Ensure %d through a Sentinels State, Check = %v", i+1, err)
			}
		}
		return nil
	})
	if out := nettest.Run(t, n, "iptables-save", "-t", "nat"); strings.Count(out, "-A POSTROUTING -j KN-SENT") != 1 {
		t.Errorf("want one jump:\n%s", out)
	}
}
