// Package atomicfile writes files so that a crash at any instruction leaves either the old
// content or the new one, never an empty or half-written file.
package atomicfile

import (
	"fmt"
	"os"
	"path/filepath"
)

// Write stores data at path through a temporary file in the same directory that is synced and
// then renamed over path. The temporary name starts with "." so directory scans skip it.
func Write(path string, data []byte, perm os.FileMode) error { return write(path, data, perm, true) }

// WriteNoSync is Write without the fsync: a killed process still leaves the old or the new
// content, but after a power loss the file may be empty. For state that can be rebuilt, where an
// fsync per write would dominate the cost of the operation.
func WriteNoSync(path string, data []byte, perm os.FileMode) error {
	return write(path, data, perm, false)
}

func write(path string, data []byte, perm os.FileMode, durable bool) error {
	dir, base := filepath.Split(path)
	tmp, err := os.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(tmp.Name()) // no-op after a successful rename
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Chmod(perm); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if durable {
		if err := tmp.Sync(); err != nil {
			tmp.Close()
			return fmt.Errorf("sync %s: %w", path, err)
		}
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
