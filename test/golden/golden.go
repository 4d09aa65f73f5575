// Package golden compares text that a test renders (a mechanism's rules, per backend) with the
// file that holds what it must be, under the test package's testdata/golden. The files are read
// and reviewed as text: a change in what a mechanism programs shows in the diff of its commit.
// `go test ./pkg/ -update` rewrites them from what the code renders now.
package golden

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kubenet-dev/kubenet/internal/ipt"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/golden from what the code renders")

// Path is the golden file of name in the test package's directory.
func Path(name string) string { return filepath.Join("testdata", "golden", name) }

// Check fails t, with a line diff, when got differs from the golden file name
// (testdata/golden/<name>); with -update it writes got there instead.
func Check(t testing.TB, name, got string) {
	t.Helper()
	path := Path(name)
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run the test with -update to write it)", err)
	}
	if diff := Diff(string(want), got); diff != "" {
		t.Errorf("%s differs from what the code renders (-golden +rendered, with line numbers):\n%s", path, diff)
	}
}

// Diff is a line diff of want and got, "" when they are equal: the lines only want has
// ("-"), those only got has ("+"), each with the line before it for context. (go-cmp's diff
// elides long lines, and a rule is one long line.)
func Diff(want, got string) string {
	a, b := strings.Split(want, "\n"), strings.Split(got, "\n")
	// lcs[i][j] is the length of the longest common subsequence of a[i:] and b[j:].
	lcs := make([][]int, len(a)+1)
	for i := range lcs {
		lcs[i] = make([]int, len(b)+1)
	}
	for i := len(a) - 1; i >= 0; i-- {
		for j := len(b) - 1; j >= 0; j-- {
			if a[i] == b[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	var out strings.Builder
	changed, shown := false, -1
	context := func(i int) {
		if i > 0 && shown < i-1 {
			fmt.Fprintf(&out, "  %d: %s\n", i, a[i-1])
		}
		shown = i
	}
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		switch {
		case i < len(a) && j < len(b) && a[i] == b[j]:
			i, j = i+1, j+1
		case i < len(a) && (j == len(b) || lcs[i+1][j] >= lcs[i][j+1]):
			context(i)
			fmt.Fprintf(&out, "- %d: %s\n", i+1, a[i])
			i, changed = i+1, true
		default:
			context(i)
			fmt.Fprintf(&out, "+ %d: %s\n", j+1, b[j])
			j, changed = j+1, true
		}
	}
	if !changed {
		return ""
	}
	return out.String()
}

// IPTables renders what a plan keeps in one table of one family, in the -restore syntax it is
// written in: a header naming the family and table, each chain's declaration and rules, then
// each jump as it is inserted (first in the chain it hangs from).
func IPTables(f ipt.Family, table string, p ipt.Plan) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# %s\n*%s\n", f, table)
	for _, c := range p.Chains {
		b.WriteString(ipt.Declare(f, c) + "\n")
	}
	for _, c := range p.Chains {
		for _, r := range c.Rules {
			fmt.Fprintf(&b, "-A %s %s\n", c.Name, r)
		}
	}
	for _, j := range p.Jumps {
		fmt.Fprintf(&b, "-I %s 1 %s\n", j.From, j.Rule)
	}
	b.WriteString("COMMIT\n")
	return b.String()
}
