package nettest

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
)

// BuildCommand compiles ./cmd/<name> of this module with the given build tags into dir and
// returns the binary's path.
func BuildCommand(dir, name string, tags ...string) (string, error) {
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, name)
	cmd := exec.Command("go", "build", "-tags", strings.Join(tags, ","), "-o", out, "./cmd/"+name)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build %s: %v\n%s", name, err, b)
	}
	return out, nil
}
