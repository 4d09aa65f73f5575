package nft

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/kubenet-dev/kubenet/test/nettest"
)

// TestDumpDigest: the digest of a dump follows every byte of the named chains' rules but their
// handles: rewriting the same rules keeps it, and a rule changed in place (same handle, same
// comment), a comment changed, a rule added or a chain emptied each changes it; chains not named
// do not count, and a missing chain digests as an empty one.
func TestDumpDigest(t *testing.T) {
	n := nettest.NewNS(t)
	table := InetTable("digest")
	names := []string{"a", "b", "empty"}
	digest := func() Digest {
		t.Helper()
		var d Digest
		nettest.Do(t, n, func() error {
			dump, err := DumpRules(table)
			if err != nil {
				return err
			}
			d, err = dump.Digest(names)
			return err
		})
		return d
	}
	write := func(aRules []Rule) {
		t.Helper()
		nettest.Do(t, n, func() error {
			c, err := nftables.New()
			if err != nil {
				return err
			}
			c.AddTable(table)
			ReplaceChain(c, &nftables.Chain{Name: "a", Table: table}, aRules)
			ReplaceChain(c, &nftables.Chain{Name: "b", Table: table}, planned()[:1])
			return c.Flush()
		})
	}
	missing := digest()
	write(planned())
	base := digest()
	if base == missing {
		t.Fatal("the digest of the written chains equals that of a missing table")
	}
	write(planned())
	if got := digest(); got != base {
		t.Error("the same rules written again (new handles) digest differently")
	}
	nettest.Run(t, n, "nft", "add chain inet kubenet-digest other; add rule inet kubenet-digest other accept; add chain inet kubenet-digest empty")
	if got := digest(); got != base {
		t.Error("a chain not named, or an empty chain that was missing, changed the digest")
	}
	changes := []struct {
		name string
		edit func()
	}{
		{"a rule changed in place", func() { testEditRule(t, n, "a", "drop", "accept") }},
		{"a comment changed", func() { testEditRule(t, n, "a", `comment "drop"`, `comment "dropped"`) }},
		{"a rule added", func() { nettest.Run(t, n, "nft", "add rule inet kubenet-digest b accept") }},
		{"a chain emptied", func() { nettest.Run(t, n, "nft", "flush chain inet kubenet-digest b") }},
		{"a rule in an empty chain", func() { nettest.Run(t, n, "nft", "add rule inet kubenet-digest empty accept") }},
	}
	for _, c := range changes {
		write(planned())
		nettest.Run(t, n, "nft", "flush chain inet kubenet-digest empty")
		c.edit()
		if got := digest(); got == base {
			t.Errorf("%s: the digest did not change", c.name)
		}
	}
}

// testEditRule replaces the rule of chain (table inet kubenet-digest) whose comment is "drop"
// by the same rule with old replaced by repl, keeping its handle (nft replace rule).
func testEditRule(t *testing.T, n ns.NetNS, chain, old, repl string) {
	t.Helper()
	listing := nettest.Run(t, n, "nft", "-a", "list", "chain", "inet", "kubenet-digest", chain)
	re := regexp.MustCompile(`^\s*(.*comment "drop") # handle (\d+)$`)
	for _, line := range strings.Split(listing, "\n") {
		if m := re.FindStringSubmatch(line); m != nil {
			nettest.Run(t, n, "nft", "replace", "rule", "inet", "kubenet-digest", chain, "handle", m[2], strings.Replace(m[1], old, repl, 1))
			return
		}
	}
	t.Fatalf("no rule commented drop in\n%s", listing)
}

// TestPlanDigest: the plan's digest follows the comments, the expressions and the chains they
// are in.
func TestPlanDigest(t *testing.T) {
	names := []string{"a", "b"}
	digest := func(plan map[string][]Rule) Digest {
		d, err := PlanDigest(nftables.TableFamilyINet, names, plan)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	base := digest(map[string][]Rule{"a": planned()})
	if again := digest(map[string][]Rule{"a": planned()}); again != base {
		t.Error("the same plan digests differently")
	}
	comment := planned()
	comment[1].Comment = "other"
	verdict := planned()
	verdict[1].Exprs = append(MatchLocalDestination(false), &expr.Verdict{Kind: expr.VerdictAccept})
	for name, plan := range map[string]map[string][]Rule{
		"another comment":    {"a": comment},
		"another expression": {"a": verdict},
		"another chain":      {"b": planned()},
		"a rule fewer":       {"a": planned()[:2]},
	} {
		if digest(plan) == base {
			t.Errorf("%s: the plan digests as before", name)
		}
	}
}

// TestBuildID: BuildID reads the running executable's Go build ID as the go command does.
func TestBuildID(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("go", "tool", "buildid", exe).Output()
	if err != nil {
		t.Fatalf("go tool buildid: %v", err)
	}
	if got, want := BuildID(), strings.TrimSpace(string(out)); got != want || got == "" {
		t.Errorf("BuildID() = %q, go tool buildid says %q", got, want)
	}
}
