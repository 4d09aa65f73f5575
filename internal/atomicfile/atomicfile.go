// Package atomicfile writes files so that a crash at any instruction leaves either the old
// content or the new one, never an empty or half-written file.
package atomicfile

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
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

// File is one file for WriteAll.
type File struct {
	Path string
	Data []byte
}

// syncWorkers bounds the concurrent fsyncs of WriteAll.
const syncWorkers = 32

// WriteAll stores every file as Write does, but syncs all the temporary files concurrently
// before it renames any: a journaling file system (ext4, xfs) commits concurrent syncs together,
// so n files cost a few journal commits instead of n. Each file on its own is old or new after a
// crash at any instruction; the set is not all-or-nothing (a caller that needs that writes
// records that are valid alone, as the hostPort index's are). On error, files already renamed
// stay and the rest keep their old content.
func WriteAll(files []File, perm os.FileMode) error {
	temps := make([]*os.File, 0, len(files))
	defer func() {
		for _, tmp := range temps {
			tmp.Close()
			os.Remove(tmp.Name()) // no-op after a successful rename
		}
	}()
	for _, f := range files {
		dir, base := filepath.Split(f.Path)
		tmp, err := os.CreateTemp(dir, "."+base+".tmp-*")
		if err != nil {
			return fmt.Errorf("write %s: %w", f.Path, err)
		}
		temps = append(temps, tmp)
		if _, err := tmp.Write(f.Data); err != nil {
			return fmt.Errorf("write %s: %w", f.Path, err)
		}
		if err := tmp.Chmod(perm); err != nil {
			return fmt.Errorf("write %s: %w", f.Path, err)
		}
	}
	errs := make([]error, len(temps))
	var wg sync.WaitGroup
	next := make(chan int)
	for range min(syncWorkers, len(temps)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := temps[i].Sync(); err != nil {
					errs[i] = fmt.Errorf("sync %s: %w", files[i].Path, err)
				}
			}
		}()
	}
	for i := range temps {
		next <- i
	}
	close(next)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for i, tmp := range temps {
		if err := tmp.Close(); err != nil {
			return fmt.Errorf("write %s: %w", files[i].Path, err)
		}
		if err := os.Rename(tmp.Name(), files[i].Path); err != nil {
			return fmt.Errorf("write %s: %w", files[i].Path, err)
		}
	}
	return nil
}
