package cnidir

import (
	"fmt"
	"os"
	"path/filepath"
)

// InstallBinary copies the file src to dir/name with mode 0755 unless dir/name already has the
// same content, and reports whether it copied. The copy is renamed into place, so a runtime
// executing the plugin at that moment runs either the old binary or the new one, whole.
func InstallBinary(src, dir, name string) (bool, error) {
	data, err := os.ReadFile(src)
	if err != nil {
		return false, fmt.Errorf("install %s: %w", name, err)
	}
	return WriteFile(filepath.Join(dir, name), data, 0o755)
}
