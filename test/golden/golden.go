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

	"github.com/google/go-cmp/cmp"

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
		t.Errorf("%s differs from what the code renders (-want +got):\n%s", path, diff)
	}
}

// Diff is a line diff of want and got (-want +got), "" when they are equal.
func Diff(want, got string) string {
	return cmp.Diff(strings.Split(want, "\n"), strings.Split(got, "\n"))
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
