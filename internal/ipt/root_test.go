package ipt

import (
	"context"
	"os"
	"path/filepath"
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

// TestListWithBrokenTool: a tool that fails makes List fail, once: it never takes the failure
// for a missing chain, and never recurses (a root whose tool fails on every call).
func TestListWithBrokenTool(t *testing.T) {
	root := t.TempDir()
	for _, tool := range []string{"ebtables", "iptables"} {
		p := filepath.Join(root, "usr/sbin", tool)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		// Not a program the kernel can run: every exec of it fails.
		if err := os.WriteFile(p, []byte("not a program\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []Family{Bridge, IPv4} {
		for _, chain := range []string{"PREROUTING", "KUBENET-X"} {
			if tb, err := List(context.Background(), root, f, "nat", chain); err == nil {
				t.Errorf("%s -L %s with a broken tool = %v, want an error", f, chain, tb)
			}
		}
	}
}

// TestToolPathUnderRoot: a tool under a root is found by its entry, also when it is a symbolic
// link whose absolute target exists only inside that root (the node's /usr/sbin/ebtables ->
// /etc/alternatives/ebtables, seen from kubenet-agent's container, which has no /etc/alternatives).
func TestToolPathUnderRoot(t *testing.T) {
	root := t.TempDir()
	target := "/kubenet-test-alternatives/xyz-tool" // no such file on this machine
	for _, d := range []string{"usr/sbin", "kubenet-test-alternatives"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, target), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, filepath.Join(root, "usr/sbin/xyz-tool")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "usr/sbin/not-executable"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if p, err := toolPath(root, "xyz-tool"); err != nil || p != "/usr/sbin/xyz-tool" {
		t.Errorf("toolPath = %q, %v; want /usr/sbin/xyz-tool", p, err)
	}
	if _, err := toolPath(root, "not-executable"); err == nil {
		t.Error("a file that is not executable was taken for a tool")
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
