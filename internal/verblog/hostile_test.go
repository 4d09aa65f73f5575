package verblog

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kubenet-dev/kubenet/test/nettest"
)

// hungAfter is how long a test waits for an Append before calling it hung: far longer than
// LockWait, the longest an Append may wait for anything.
const hungAfter = 10 * time.Second

// appendWithin runs Append and fails the test if it has not returned after hungAfter; it
// returns how long Append took and its error.
func appendWithin(t *testing.T, ctx context.Context, path string, maxBytes int64, e Entry) (time.Duration, error) {
	t.Helper()
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- Append(ctx, path, maxBytes, e) }()
	select {
	case err := <-done:
		return time.Since(start), err
	case <-time.After(hungAfter):
		t.Fatalf("Append to %s has not returned after %s", path, hungAfter)
		return 0, nil
	}
}

func entry(container string) Entry {
	return Entry{Time: time.Unix(1, 0).UTC(), Verb: "ADD", Container: container, Result: &Result{IPs: []string{"10.244.1.2/24"}}}
}

// bigLine writes one whole line of about size bytes to path, as a log that is nearly full.
func bigLine(t *testing.T, path string, size int) {
	t.Helper()
	e := entry("old")
	e.Network = strings.Repeat("n", size-150)
	line, err := encode(e, maxLine)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, line, 0o640); err != nil {
		t.Fatal(err)
	}
}

func isSymlink(t *testing.T, path string) {
	t.Helper()
	if st, err := os.Lstat(path); err != nil || st.Mode()&os.ModeSymlink == 0 {
		t.Errorf("%s is no longer the symlink: %v %v", path, st, err)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestLockHeldByAnother: a lock that another holder never releases delays Append by LockWait
// at most, or less when the call's deadline comes first, and an ended context (SIGTERM) ends
// the wait at once; the line is dropped, never written without the lock. A free lock is taken
// even after the context ended, so that a call cut short is still logged.
func TestLockHeldByAnother(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "kubenet.log")
	if err := Append(context.Background(), path, 1<<20, entry("first")); err != nil {
		t.Fatal(err)
	}
	// Another open file description: flock(2) locks conflict between them as between processes.
	holder, err := os.Open(path + ".lock")
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	must(t, unix.Flock(int(holder.Fd()), unix.LOCK_EX))

	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	shortDeadline, cancel2 := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel2()
	cases := []struct {
		name       string
		ctx        context.Context
		atLeast    time.Duration
		atMost     time.Duration
		wantReason string
	}{
		{"no deadline: LockWait", context.Background(), LockWait - 50*time.Millisecond, LockWait + 2*time.Second, "gave up after 1"},
		{"the call's deadline comes first", shortDeadline, 0, LockWait / 2, "deadline exceeded"},
		{"the call's context has ended: one try", cancelled, 0, LockWait / 4, "context canceled"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			took, err := appendWithin(t, tc.ctx, path, 1<<20, entry("dropped"))
			if !errors.Is(err, ErrLockBusy) || !strings.Contains(err.Error(), tc.wantReason) {
				t.Errorf("Append: %v, want %v saying %q", err, ErrLockBusy, tc.wantReason)
			}
			if took < tc.atLeast || took > tc.atMost {
				t.Errorf("Append returned after %s, want between %s and %s", took, tc.atLeast, tc.atMost)
			}
		})
	}

	t.Run("the context ends during the wait (SIGTERM)", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- Append(ctx, path, 1<<20, entry("dropped")) }()
		// Append has the lock file open once a second descriptor of it shows in /proc.
		err := nettest.Eventually(hungAfter, func() error {
			if n := openCount(t, path+".lock"); n < 2 {
				return fmt.Errorf("%d descriptors of the lock open", n)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		cancel()
		cancelledAt := time.Now()
		select {
		case err := <-done:
			if !errors.Is(err, ErrLockBusy) || !errors.Is(err, context.Canceled) {
				t.Errorf("Append: %v, want %v ended by the context", err, ErrLockBusy)
			}
			if took := time.Since(cancelledAt); took > LockWait/2 {
				t.Errorf("Append returned %s after its context ended", took)
			}
		case <-time.After(hungAfter):
			t.Fatal("Append did not return after its context ended")
		}
	})

	if got := lines(t, path); len(got) != 1 {
		t.Fatalf("log holds %+v: a line was written without the lock", got)
	}
	must(t, unix.Flock(int(holder.Fd()), unix.LOCK_UN))
	if err := Append(cancelled, path, 1<<20, entry("after-sigterm")); err != nil {
		t.Fatalf("Append with a free lock after the context ended: %v", err)
	}
	if got := lines(t, path); len(got) != 2 || got[1].Container != "after-sigterm" {
		t.Fatalf("log holds %+v, want the line of the call cut short", got)
	}
}

// openCount is how many descriptors of this process are open on path.
func openCount(t *testing.T, path string) int {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, fd := range fds {
		if target, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name())); err == nil && target == path {
			n++
		}
	}
	return n
}

// TestHugeLine: every string of an entry comes from the caller; however long (and however much
// JSON escaping blows it up), a line fits within the file's limit and maxLine, stays one whole
// line, and says where it was cut. The file never passes its limit.
func TestHugeLine(t *testing.T) {
	huge := strings.Repeat("<\x01é", 1<<19) // 2 MiB; each "<" and "\x01" is 6 bytes of JSON
	e := Entry{Time: time.Unix(1, 0).UTC(), Verb: "DEL", Network: huge, Container: huge, Interface: "eth0",
		NetNS: "/run/netns/" + huge, Pod: huge, Error: &Error{Code: 11, Msg: huge}}
	for _, limit := range []int64{4096, 10 << 20} {
		t.Run(fmt.Sprint(limit), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "kubenet.log")
			for range 3 {
				if err := Append(context.Background(), path, limit, e); err != nil {
					t.Fatal(err)
				}
				if st, err := os.Stat(path); err != nil || st.Size() > limit {
					t.Fatalf("log: %v, size %d over %d", err, st.Size(), limit)
				}
			}
			raw, err := os.ReadFile(path)
			must(t, err)
			for _, l := range strings.SplitAfter(strings.TrimSuffix(string(raw), "\n"), "\n") {
				if len(l) > int(min(limit, maxLine)) {
					t.Errorf("a line of %d bytes, over %d", len(l), min(limit, maxLine))
				}
			}
			got := lines(t, path)
			if len(got) == 0 {
				t.Fatal("nothing logged")
			}
			l := got[len(got)-1]
			if l.Verb != "DEL" || l.Interface != "eth0" || l.Error == nil || l.Error.Code != 11 ||
				!strings.HasSuffix(l.Pod, "...") || !strings.HasSuffix(l.Error.Msg, "...") || !strings.HasPrefix(l.NetNS, "/run/netns/") {
				t.Errorf("line %+v: want the short fields whole and the long ones cut with \"...\"", l)
			}
		})
	}
	if len(e.Error.Msg) != len(huge) || len(e.Pod) != len(huge) {
		t.Error("Append changed the caller's entry")
	}
}

func noSpace(t *testing.T, dir string) {
	must(t, unix.Mount("tmpfs", dir, "tmpfs", 0, "size=16k,mode=0755"))
	defer unix.Unmount(dir, 0) //nolint:errcheck // the namespace dies with the process
	path := filepath.Join(dir, "kubenet.log")
	// The log takes part of its first page; the filler takes every other page.
	if err := Append(context.Background(), path, 1<<20, entry("before")); err != nil {
		t.Fatal(err)
	}
	filler := filepath.Join(dir, "filler")
	f, err := os.Create(filler)
	must(t, err)
	page := make([]byte, 4096)
	for {
		if _, err := f.Write(page); err != nil {
			if !errors.Is(err, unix.ENOSPC) {
				t.Fatal(err)
			}
			break
		}
	}
	f.Close()
	// Lines fill the rest of the log's page; the one that crosses into the next page cannot.
	var failed error
	written := 1
	for i := range 100 {
		if failed = Append(context.Background(), path, 1<<20, entry(fmt.Sprintf("full-%02d", i))); failed != nil {
			break
		}
		written++
	}
	if !errors.Is(failed, unix.ENOSPC) {
		t.Fatalf("Append on a full file system: %v, want ENOSPC", failed)
	}
	must(t, os.Remove(filler))
	if err := Append(context.Background(), path, 1<<20, entry("after")); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d lines written before the file system was full: %v", written, failed)
	got := lines(t, path) // fails on a line that is not whole
	if len(got) != written+1 || got[len(got)-1].Container != "after" {
		t.Fatalf("log holds %d lines ending %+v, want %d ending with \"after\"", len(got), got[len(got)-1], written+1)
	}
}
