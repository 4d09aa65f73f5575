package kubenet

import (
	"encoding/json"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/kubenet-dev/kubenet"

// layer is where a package of the module sits. A package may import packages of lower layers
// and of its own group; docs/architecture.md draws the same picture.
type layer int

const (
	layerInternal  layer = iota + 1 // internal/: small shared helpers
	layerMechanism                  // one kernel mechanism each; never import each other
	layerCore                       // core/: composes the mechanisms
	layerFace                       // network/ and agent/: reach mechanisms only through core
	layerCommand                    // cmd/: binaries
	layerTest                       // test/ (tests and their helpers) and bench/: may use anything
)

// mechanisms are the mechanism packages. A new top-level package must be added here (and to
// docs/architecture.md), or TestLayers fails: where it sits is a decision, not an accident.
var mechanisms = []string{"bridge", "ipam", "hairpin", "masq", "hostport", "shaping", "isolation", "netpol", "overlay"}

// classify returns the layer of a package path relative to the module, and its group: packages
// of one group may import each other (network/cni imports network, agent imports agent/routes).
func classify(rel string) (layer, string, bool) {
	top, _, _ := strings.Cut(rel, "/")
	switch {
	case rel == "":
		return layerTest, "root", true // the package doc, and this test
	case top == "test" || top == "bench":
		return layerTest, top, true
	case top == "internal":
		return layerInternal, "internal", true
	case slices.Contains(mechanisms, top):
		return layerMechanism, top, true
	case top == "core":
		return layerCore, "core", true
	case top == "network" || top == "agent":
		return layerFace, top, true
	case top == "cmd":
		return layerCommand, rel, true
	}
	return 0, "", false
}

type listedPackage struct {
	ImportPath string
	Imports    []string
}

// modulePackages lists every package of the module with its direct imports (the non-test ones:
// tests may reach across layers to set up what they check).
func modulePackages(t *testing.T) []listedPackage {
	t.Helper()
	out, err := exec.Command("go", "list", "-e", "-json=ImportPath,Imports", "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	var pkgs []listedPackage
	for {
		var p listedPackage
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decode go list output: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) < 10 {
		t.Fatalf("go list found only %d packages; is the test running from the module root?", len(pkgs))
	}
	return pkgs
}

// TestLayers enforces the architecture: cmd → network, agent → core → mechanisms → internal.
// Imports go down the layers only; mechanisms never import each other; network/ and agent/
// reach mechanisms only through core; product code never imports test helpers.
func TestLayers(t *testing.T) {
	for _, p := range modulePackages(t) {
		rel := strings.TrimPrefix(strings.TrimPrefix(p.ImportPath, module), "/")
		from, fromGroup, ok := classify(rel)
		if !ok {
			t.Errorf("package %s has no layer: add it to classify (and docs/architecture.md)", p.ImportPath)
			continue
		}
		for _, imp := range p.Imports {
			if imp != module && !strings.HasPrefix(imp, module+"/") {
				continue
			}
			impRel := strings.TrimPrefix(strings.TrimPrefix(imp, module), "/")
			to, toGroup, ok := classify(impRel)
			if !ok {
				continue // reported as its own package
			}
			if why := forbidden(from, fromGroup, to, toGroup); why != "" {
				t.Errorf("%s imports %s: %s", rel, impRel, why)
			}
		}
	}
}

// TestInternalServesProduct keeps test support out of internal/: a package there that no product
// package reaches (directly or through another internal package) is only a test helper, and test
// helpers live under test/, where TestLayers keeps product code from importing them.
func TestInternalServesProduct(t *testing.T) {
	pkgs := modulePackages(t)
	for _, rel := range internalOnlyTestsUse(pkgs) {
		t.Errorf("%s is imported only by tests: move it under test/", rel)
	}
	// The check must be able to fail: a test-only package added under internal/ is reported.
	probe := append(slices.Clone(pkgs), listedPackage{ImportPath: module + "/internal/probehelper"},
		listedPackage{ImportPath: module + "/test/probe", Imports: []string{module + "/internal/probehelper"}})
	if got := internalOnlyTestsUse(probe); !slices.Contains(got, "internal/probehelper") {
		t.Errorf("internalOnlyTestsUse did not report a test-only internal package: %v", got)
	}
}

// internalOnlyTestsUse returns the internal/ packages (relative to the module) that no product
// package (mechanism, core, network, agent, cmd) reaches through its imports.
func internalOnlyTestsUse(pkgs []listedPackage) []string {
	imports := map[string][]string{}
	var queue []string
	for _, p := range pkgs {
		imports[p.ImportPath] = p.Imports
		rel := strings.TrimPrefix(strings.TrimPrefix(p.ImportPath, module), "/")
		if l, _, ok := classify(rel); ok && l != layerTest && l != layerInternal {
			queue = append(queue, p.ImportPath)
		}
	}
	reached := map[string]bool{}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if reached[p] {
			continue
		}
		reached[p] = true
		queue = append(queue, imports[p]...)
	}
	var unused []string
	for _, p := range pkgs {
		rel := strings.TrimPrefix(strings.TrimPrefix(p.ImportPath, module), "/")
		if l, _, ok := classify(rel); ok && l == layerInternal && !reached[p.ImportPath] {
			unused = append(unused, rel)
		}
	}
	return unused
}

// forbidden says why a package in (from, fromGroup) may not import one in (to, toGroup), or "".
func forbidden(from layer, fromGroup string, to layer, toGroup string) string {
	switch {
	case from == layerTest:
		return ""
	case to == layerTest:
		return "product code may not import test helpers"
	case fromGroup == toGroup:
		return ""
	case from == layerMechanism && to == layerMechanism:
		return "mechanisms never import each other; compose them in core"
	case from >= layerFace && to == layerMechanism:
		return "only core uses the mechanisms; add what is needed to core"
	case to >= from:
		return "imports go down the layers only"
	}
	return ""
}

// TestForbiddenCatchesViolations shows that the rule table rejects each kind of violation it
// exists for, so TestLayers passing means something.
func TestForbiddenCatchesViolations(t *testing.T) {
	cases := []struct {
		name          string
		from, to      string
		wantForbidden bool
	}{
		{"mechanism to mechanism", "hostport", "masq", true},
		{"network to mechanism", "network/cni", "bridge", true},
		{"agent to mechanism", "agent", "ipam", true},
		{"command to mechanism", "cmd/kubenetctl", "ipam", true},
		{"core up to network", "core", "network", true},
		{"mechanism up to core", "bridge", "core", true},
		{"internal up to mechanism", "internal/nft", "masq", true},
		{"product to test helper", "core", "test/nettest", true},
		{"mechanism to test helper", "bridge", "test/testkit", true},
		{"internal to test helper", "internal/nft", "test/nettest", true},
		{"command to test helper", "cmd/kubenet-agent", "test/nettest", true},
		{"network to core", "network/kubenet", "core", false},
		{"core to mechanism", "core", "hostport", false},
		{"mechanism to internal", "hostport", "internal/nft", false},
		{"network to internal", "network/cni", "internal/links", false},
		{"within a group", "network/cni", "network", false},
		{"command to network", "cmd/kubenetctl", "network", false},
		{"test to anything", "test", "bridge", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			from, fg, ok1 := classify(tc.from)
			to, tg, ok2 := classify(tc.to)
			if !ok1 || !ok2 {
				t.Fatalf("classify(%q)=%v, classify(%q)=%v", tc.from, ok1, tc.to, ok2)
			}
			if got := forbidden(from, fg, to, tg) != ""; got != tc.wantForbidden {
				t.Errorf("forbidden(%s -> %s) = %v, want %v", tc.from, tc.to, got, tc.wantForbidden)
			}
		})
	}
}

// TestDocsNameEveryMechanism ties docs/architecture.md and the package doc to the mechanisms
// list: a mechanism added here but not drawn there leaves a new engineer with a wrong map.
func TestDocsNameEveryMechanism(t *testing.T) {
	for _, doc := range []string{"docs/architecture.md", "doc.go"} {
		text, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range mechanisms {
			if !strings.Contains(string(text), m+"/") {
				t.Errorf("%s does not name the mechanism %s/", doc, m)
			}
		}
	}
}

// TestNoEmptyFiles finds Go files that declare nothing: a file is code (a declaration beyond
// its imports) or the package's documentation, never a leftover of a move.
func TestNoEmptyFiles(t *testing.T) {
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		empty, err := declaresNothing(path, src)
		if err != nil {
			return err
		}
		if empty {
			t.Errorf("%s declares nothing and documents no package: remove it or give it its code", path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The check must be able to fail.
	for src, want := range map[string]bool{
		"package x\n":                       true,
		"package x\n\nimport _ \"embed\"\n": true,
		"// Package x does y.\npackage x\n": false,
		"package x\n\nfunc f() {}\n":        false,
		"package x\n\nvar _ = 1\n":          false,
	} {
		if got, err := declaresNothing("probe.go", []byte(src)); err != nil || got != want {
			t.Errorf("declaresNothing(%q) = %v, %v; want %v", src, got, err, want)
		}
	}
}

// declaresNothing reports whether the Go source declares nothing beyond imports and carries no
// package documentation.
func declaresNothing(name string, src []byte) (bool, error) {
	f, err := parser.ParseFile(token.NewFileSet(), name, src, parser.ParseComments)
	if err != nil {
		return false, err
	}
	if f.Doc != nil {
		return false, nil
	}
	for _, d := range f.Decls {
		if g, ok := d.(*ast.GenDecl); !ok || g.Tok != token.IMPORT {
			return false, nil
		}
	}
	return true, nil
}
