package nettest

import (
	"fmt"
	"os/exec"
	"path/filepath"
)

// BuildCommand compiles ./cmd/<name> of this module into dir and returns the binary's path.
func BuildCommand(dir, name string) (string, error) {
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, name)
	cmd := exec.Command("go", "build", "-o", out, "./cmd/"+name)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build %s: %v\n%s", name, err, b)
	}
	return out, nil
}
