package ipt

import (
	"context"
	"os"
	"path/filepath"
	"testing"
)

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
