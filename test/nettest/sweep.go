package nettest

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"
)

// Test namespaces are named kubenet-test-<pid>-<start>-<random>: the pid of the process that
// made them and that process's start time (in clock ticks since boot, from /proc/<pid>/stat),
// so a sweep can tell a namespace whose creator is gone (a test binary killed by SIGKILL, a
// timeout or a crash, whose t.Cleanup never ran) from one whose creator still runs (other test
// runs on the same machine), also after the pid was reused. Namespaces named otherwise are never
// touched.
const (
	nsRunDir = "/var/run/netns"
	nsPrefix = "kubenet-test-"
)

// creatorTag is "<pid>-<start>" of process pid, or an error when the process does not exist.
func creatorTag(pid int) (string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", err
	}
	// The command name (field 2) may contain spaces and parentheses: count from the last ')'.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return "", fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	fields := strings.Fields(string(b[i+1:]))
	const startTimeField = 22 - 3 // field 22 of stat, counted after pid and comm
	if len(fields) <= startTimeField {
		return "", fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	return fmt.Sprintf("%d-%s", pid, fields[startTimeField]), nil
}

// newMarkedNS creates a persistent network namespace named after this process (see above) and
// returns it, without switching the caller's thread into it.
func newMarkedNS() (ns.NetNS, error) {
	tag, err := creatorTag(os.Getpid())
	if err != nil {
		return nil, err
	}
	random := make([]byte, 6)
	if _, err := rand.Read(random); err != nil {
		return nil, err
	}
	return newNamedNS(nsPrefix + tag + "-" + hex.EncodeToString(random))
}

// namedByThisRun holds the paths of the namespaces this process made by name (the e2e
// clusters' "kubenet-k8s-<pid>-…"): the marked ones are found by their name, these are not, and
// an interrupted run must remove them too (sweepOwn). Process-wide like the signal it serves.
var namedByThisRun sync.Map

// newNamedNS creates the persistent network namespace /var/run/netns/<name>.
func newNamedNS(name string) (ns.NetNS, error) {
	if err := sharedRunDir(); err != nil {
		return nil, err
	}
	path := filepath.Join(nsRunDir, name)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil {
		return nil, err
	}
	f.Close()
	var wg sync.WaitGroup
	wg.Add(1)
	// A thread of its own that is never unlocked: it unshares into the new namespace, bind
	// mounts it, and dies with its goroutine, so no other goroutine ever runs in it.
	go func() {
		defer wg.Done()
		runtime.LockOSThread()
		if err = unix.Unshare(unix.CLONE_NEWNET); err != nil {
			err = fmt.Errorf("unshare: %w", err)
			return
		}
		self := fmt.Sprintf("/proc/%d/task/%d/ns/net", os.Getpid(), unix.Gettid())
		if err = unix.Mount(self, path, "none", unix.MS_BIND, ""); err != nil {
			err = fmt.Errorf("bind mount %s: %w", path, err)
		}
	}()
	wg.Wait()
	if err != nil {
		_ = os.Remove(path)
		return nil, fmt.Errorf("create netns: %w", err)
	}
	if !strings.HasPrefix(name, nsPrefix) {
		namedByThisRun.Store(name, true)
	}
	return ns.GetNS(path)
}

// sharedRunDir makes /var/run/netns a shared mount point (as ip-netns does), so namespaces
// mounted there are visible to mount namespaces that runtimes under test create.
func sharedRunDir() error {
	if err := os.MkdirAll(nsRunDir, 0o755); err != nil {
		return err
	}
	err := unix.Mount("", nsRunDir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if errors.Is(err, unix.EINVAL) { // not a mount point yet: bind it onto itself first
		if err = unix.Mount(nsRunDir, nsRunDir, "none", unix.MS_BIND|unix.MS_REC, ""); err == nil {
			err = unix.Mount("", nsRunDir, "none", unix.MS_SHARED|unix.MS_REC, "")
		}
	}
	if err != nil {
		return fmt.Errorf("make %s a shared mount: %w", nsRunDir, err)
	}
	return nil
}

// staleCreator tells whether the test namespace called name was made by a process that is gone:
// no process has its pid, or the one that has it started at another time. Names that are not
// test namespaces, or not well formed, are never stale.
func staleCreator(name string) bool {
	rest, ok := strings.CutPrefix(name, nsPrefix)
	if !ok {
		return false
	}
	parts := strings.Split(rest, "-")
	if len(parts) != 3 {
		return false
	}
	pid, err := strconv.Atoi(parts[0])
	if err != nil || pid <= 0 {
		return false
	}
	if _, err := strconv.ParseUint(parts[1], 10, 64); err != nil {
		return false
	}
	tag, err := creatorTag(pid)
	if errors.Is(err, fs.ErrNotExist) {
		return true
	}
	return err == nil && tag != parts[0]+"-"+parts[1]
}

// SweepStaleNamespaces removes the test namespaces whose creating process is gone, and only
// those: other test runs on the machine keep theirs. It reports each removal on log.
func SweepStaleNamespaces(log io.Writer) error {
	return sweep(log, staleCreator, "its creator is gone")
}

// sweepOwn removes this process's test namespaces (it is about to exit on a signal, and the
// tests' cleanups will not run).
func sweepOwn(log io.Writer) error {
	tag, err := creatorTag(os.Getpid())
	if err != nil {
		return err
	}
	return sweep(log, func(name string) bool {
		_, named := namedByThisRun.Load(name)
		return named || strings.HasPrefix(name, nsPrefix+tag+"-")
	}, "this run was interrupted")
}

func sweep(log io.Writer, doomed func(name string) bool, reason string) error {
	entries, err := os.ReadDir(nsRunDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		if !doomed(e.Name()) {
			continue
		}
		if err := RemoveNS(filepath.Join(nsRunDir, e.Name())); err != nil {
			errs = append(errs, err)
			continue
		}
		fmt.Fprintf(log, "nettest: removed test namespace %s (%s)\n", e.Name(), reason)
	}
	return errors.Join(errs...)
}

// sweepOnSignal removes this process's test namespaces when SIGINT or SIGTERM arrives (an
// interrupted `make test` or `make demo`), then exits: the tests' cleanups would not run.
// The returned function stops watching.
func sweepOnSignal() func() {
	sigs := make(chan os.Signal, 1)
	done := make(chan struct{})
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		select {
		case sig := <-sigs:
			if err := sweepOwn(os.Stderr); err != nil {
				fmt.Fprintln(os.Stderr, "nettest:", err)
			}
			fmt.Fprintf(os.Stderr, "nettest: interrupted by %s\n", sig)
			os.Exit(130)
		case <-done:
		}
	}()
	return func() { signal.Stop(sigs); close(done) }
}
