package nettest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// BuildCommand compiles ./cmd/<name> of this module with the given build tags into dir and
// returns the binary's path.
func BuildCommand(dir, name string, tags ...string) (string, error) {
	return BuildPackage(dir, "./cmd/"+name, name, tags...)
}

// BuildPackage compiles the main package pkg (a path relative to the module root, such as
// ./test/fakecni) into dir/name and returns the binary's path. It builds without cgo, as `make
// build` and the agent image do: a binary linked against the C library starts the dynamic
// loader and libc in every process (about 0.7 ms of CPU per plugin run on a 2-core VM), so tests
// and benchmarks would otherwise time a plugin that nobody ships.
func BuildPackage(dir, pkg, name string, tags ...string) (string, error) {
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, name)
	cmd := exec.Command("go", "build", "-tags", strings.Join(tags, ","), "-o", out, pkg)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build %s: %v\n%s", name, err, b)
	}
	return out, nil
}
