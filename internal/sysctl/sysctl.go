// Package sysctl sets /proc/sys values only when they differ, so repeated and concurrent plugin
// runs do not write (and race on) the same file for nothing.
package sysctl

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
)

// Ensure sets /proc/sys/<key> to value unless it already has it: reads are cheap, and
// skipping the write keeps repeated ADDs from racing each other on the same file.
func Ensure(key, value string) error {
	return EnsureIn(path.Dir(key), [][2]string{{path.Base(key), value}})
}

// EnsureIn is Ensure for several keys of the directory /proc/sys/<dir>, which is looked
// up once. That matters for a pod's interface: all namespaces share the sysctl directory entries,
// so looking up "eth0" compares against the eth0 of every pod on the node.
func EnsureIn(dir string, values [][2]string) error {
	return eachIn(dir, values, ensureIn)
}

// SetIn writes each of values in the directory /proc/sys/<dir> without reading it first: for
// settings that are known to differ, as in a pod's new network namespace, where the read would
// only cost a syscall (two for the pod's defaults, on every ADD).
func SetIn(dir string, values [][2]string) error {
	return eachIn(dir, values, setIn)
}

// eachIn looks the directory /proc/sys/<dir> up once and applies apply to each of values in it.
func eachIn(dir string, values [][2]string, apply func(root *os.Root, name, value string) error) error {
	root, err := os.OpenRoot("/proc/sys/" + dir)
	if err != nil {
		return fmt.Errorf("sysctl %s: %w", dir, err)
	}
	defer root.Close()
	for _, kv := range values {
		if err := apply(root, kv[0], kv[1]); err != nil {
			return fmt.Errorf("sysctl %s/%s=%s: %w", dir, kv[0], kv[1], err)
		}
	}
	return nil
}

func setIn(root *os.Root, name, value string) error {
	f, err := root.OpenFile(name, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.Write([]byte(value))
	return errors.Join(err, f.Close())
}

func ensureIn(root *os.Root, name, value string) error {
	f, err := root.OpenFile(name, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	cur := make([]byte, 64)
	n, err := f.Read(cur)
	if err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	if string(bytes.TrimSpace(cur[:n])) == value {
		return nil
	}
	_, err = f.WriteAt([]byte(value), 0)
	return err
}

// IsAbsent tells whether err only says that the sysctl does not exist (IPv6 disabled, no br_netfilter).
func IsAbsent(err error) bool { return errors.Is(err, fs.ErrNotExist) }
