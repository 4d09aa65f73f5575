package ipt

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"

	"github.com/kubenet-dev/kubenet/test/nettest"
)

// legacyRoot builds a root file system whose iptables and ip6tables (with -save and -restore)
// are the legacy ones: this machine's xtables-legacy-multi, its libraries and extensions copied
// (nothing mounted), as on a node whose alternatives chose legacy.
func legacyRoot(t *testing.T) string {
	t.Helper()
	multi, err := exec.LookPath("xtables-legacy-multi")
	if err != nil {
		t.Skipf("no legacy iptables: %v", err)
	}
	root := t.TempDir()
	copyFile := func(from, to string) {
		t.Helper()
		to = filepath.Join(root, to)
		if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
			t.Fatal(err)
		}
		in, err := os.Open(from)
		if err != nil {
			t.Fatal(err)
		}
		defer in.Close()
		st, err := in.Stat()
		if err != nil {
			t.Fatal(err)
		}
		out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, st.Mode().Perm())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(out, in); err != nil {
			t.Fatal(err)
		}
		if err := out.Close(); err != nil {
			t.Fatal(err)
		}
	}
	copyFile(multi, "/usr/sbin/xtables-legacy-multi")
	for _, tool := range []string{"iptables", "ip6tables"} {
		for _, suffix := range []string{"", "-save", "-restore"} {
			if err := os.Symlink("xtables-legacy-multi", filepath.Join(root, "usr/sbin", tool+suffix)); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The libraries the tool links, found as the dynamic loader finds them here.
	out, err := exec.Command("ldd", multi).Output()
	if err != nil {
		t.Skipf("ldd %s: %v", multi, err)
	}
	for _, f := range strings.Fields(string(out)) {
		if filepath.IsAbs(f) {
			real, err := filepath.EvalSymlinks(f)
			if err != nil {
				t.Fatal(err)
			}
			copyFile(real, f)
			if real != f {
				copyFile(real, real)
			}
		}
	}
	ext, _ := filepath.Glob("/usr/lib/*/xtables/*.so")
	for _, f := range ext {
		copyFile(f, f)
	}
	copyFile("/etc/protocols", "/etc/protocols")
	if err := os.MkdirAll(filepath.Join(root, "run"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := run(context.Background(), root, IPv4, "", nil, "--version"); err != nil {
		t.Fatalf("the legacy root's iptables: %v", err)
	}
	return root
}

// TestRuleCountsLegacyTool: where the node's tools are the legacy ones and kubenet's chains are
// in the legacy tables, RuleCounts counts what the tool lists (the legacy table of the name
// exists), also with nftables holding nothing of it, and an emptied chain reads as empty.
func TestRuleCountsLegacyTool(t *testing.T) {
	ctx := context.Background()
	st := &State{Root: legacyRoot(t)}
	n := nettest.NewNS(t)
	nettest.Do(t, n, func() error {
		for _, f := range []Family{IPv4, IPv6} {
			if err := st.Restore(ctx, f, "nat", []string{":KN-LEG - [0:0]", "-A KN-LEG -j RETURN", "-A KN-LEG -p tcp -j RETURN"}); err != nil {
				return err
			}
			if got, err := st.RuleCounts(ctx, f, "nat", "KN-LEG"); err != nil || !maps.Equal(got, map[string]int{"KN-LEG": 2}) {
				t.Errorf("%s: %v, %v, want KN-LEG's 2 rules", f, got, err)
			}
			if _, err := run(ctx, st.Root, f, "", nil, "-t", "nat", "-F", "KN-LEG"); err != nil {
				return err
			}
			// A State of its own, as each STATUS has: st remembers what it read.
			if got, err := (&State{Root: st.Root}).RuleCounts(ctx, f, "nat", "KN-LEG"); err != nil || !maps.Equal(got, map[string]int{"KN-LEG": 0}) {
				t.Errorf("%s after the legacy flush: %v, %v, want KN-LEG empty", f, got, err)
			}
		}
		return nil
	})
}

// TestRuleCountsWithoutThreadSelf: where /proc/thread-self does not resolve (no procfs at
// /proc, or one of a pid namespace the process is not in), which tables the legacy module holds
// cannot be told, and RuleCounts must not take the legacy table's absence for granted: here the
// node's tools are legacy and hold the chain, nftables holds nothing, and counting nftables would
// report the chain missing for good (STATUS 50 that no ADD repairs).
func TestRuleCountsWithoutThreadSelf(t *testing.T) {
	ctx := context.Background()
	st := &State{Root: legacyRoot(t)}
	n := nettest.NewNS(t)
	nettest.Do(t, n, func() error {
		return st.Restore(ctx, IPv4, "nat", []string{":KN-LEG - [0:0]", "-A KN-LEG -j RETURN", "-A KN-LEG -p tcp -j RETURN"})
	})
	var (
		got map[string]int
		err error
	)
	hiddenProc(t, n, func() { got, err = (&State{Root: st.Root}).RuleCounts(ctx, IPv4, "nat", "KN-LEG") })
	if err != nil || !maps.Equal(got, map[string]int{"KN-LEG": 2}) {
		t.Errorf("without /proc/thread-self: %v, %v, want the legacy tool's KN-LEG with 2 rules", got, err)
	}
}

// hiddenProc runs f on a thread of its own in n, in a mount namespace of its own where /proc is
// an empty file system. The thread is never unlocked, so it ends with f and no other goroutine
// runs in its namespaces; the tools f runs are forked from it and see the same.
func hiddenProc(t *testing.T, n ns.NetNS, f func()) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
		done <- func() error {
			if err := n.Set(); err != nil {
				return err
			}
			if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
				return fmt.Errorf("unshare the mount namespace: %w", err)
			}
			if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
				return fmt.Errorf("make the mounts private: %w", err)
			}
			if err := unix.Mount("tmpfs", "/proc", "tmpfs", 0, ""); err != nil {
				return fmt.Errorf("hide /proc: %w", err)
			}
			if _, err := os.Stat("/proc/thread-self/net"); !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("/proc/thread-self/net still there: %v", err)
			}
			f()
			return nil
		}()
	}()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestRuleCountsStaleNFTablesLegacyTool: a node whose tools were switched to legacy after
// kubenet wrote with iptables-nft keeps kubenet's chains in nftables, still in force; until the
// legacy tool first touches the table, RuleCounts counts those (as the kernel applies them), and
// from the first touch on, a read included, what the legacy tool lists: the answer follows the
// tool once the tool has a table, and nothing stale outlives the next ADD's read.
func TestRuleCountsStaleNFTablesLegacyTool(t *testing.T) {
	ctx := context.Background()
	root := legacyRoot(t)
	n := nettest.NewNS(t)
	nettest.Do(t, n, func() error {
		if err := (&State{}).Restore(ctx, IPv4, "nat", []string{":KN-S - [0:0]", "-A KN-S -j RETURN", "-A KN-S -p tcp -j RETURN"}); err != nil {
			return err
		}
		if got, err := (&State{Root: root}).RuleCounts(ctx, IPv4, "nat", "KN-S"); err != nil || !maps.Equal(got, map[string]int{"KN-S": 2}) {
			t.Errorf("before the legacy tool made its table: %v, %v; want nftables' KN-S with 2 rules", got, err)
		}
		if tb, err := (&State{Root: root}).Table(ctx, IPv4, "nat"); err != nil || tb.Has("KN-S") {
			t.Fatalf("the legacy tool's nat: %v, %v; want it read, without KN-S", tb, err)
		}
		if got, err := (&State{Root: root}).RuleCounts(ctx, IPv4, "nat", "KN-S"); err != nil || len(got) != 0 {
			t.Errorf("once the legacy tool read its table: %v, %v; want KN-S missing, as the tool sees it", got, err)
		}
		return nil
	})
}
