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
