// Package verblog appends one JSON line per plugin call to a log file that an operator can read
// when a pod hangs in ContainerCreating, bounded in size: when a line would take the file past
// its limit, the file is renamed to <file>.1 (replacing the previous one) and a new one begun, so
// the log never holds more than twice the limit. Many plugin processes append at once: each
// append (and rotation) happens under an flock on <file>.lock, so lines never interleave and no
// rotation loses another process's line.
//
// The log is for the operator, the call is for the pod: nothing here may fail or wedge a call.
// The directory is opened through internal/safedir, with the rules of the data dir (it and every
// directory above it writable by nobody but its owner, sticky directories above it excepted);
// the log, <file>.1 and <file>.lock are reached relative to it and never through a symbolic
// link; the lock is waited for a second at most, never past the call's deadline, and not at all
// once the call's context has ended; a write that fails half-way (a full disk) is taken back, so
// that the next line does not continue a broken one.
package verblog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/kubenet-dev/kubenet/internal/safedir"
)

// Entry is one line: what was called, on what, how long it took, and the outcome.
type Entry struct {
	Time      time.Time `json:"time"`
	Verb      string    `json:"verb"`
	Network   string    `json:"network,omitempty"`
	Container string    `json:"container,omitempty"`
	Interface string    `json:"interface,omitempty"`
	NetNS     string    `json:"netns,omitempty"`
	Pod       string    `json:"pod,omitempty"`
	// CNIVersion is the version the runtime called the plugin with: the configuration's
	// cniVersion as libcni passed it (a conflist's cniVersions let newer runtimes pick 1.1.0).
	CNIVersion string `json:"cniVersion,omitempty"`
	// DurationMs is the call's wall time in milliseconds.
	DurationMs float64 `json:"durationMs"`
	// Result is set when the call succeeded (for ADD, the pod's addresses); Error when it failed.
	Result *Result `json:"result,omitempty"`
	Error  *Error  `json:"error,omitempty"`
}

// Result is a successful call's outcome.
type Result struct {
	IPs []string `json:"ips,omitempty"`
}

// Error is a failed call's CNI error.
type Error struct {
	Code uint   `json:"code"`
	Msg  string `json:"msg"`
}

const (
	// maxMsg bounds an error message in the log: a line stays small whatever the error says.
	maxMsg = 4096
	// maxLine bounds a whole line, and so does the file's limit: every string of an entry comes
	// from the caller (CNI_NETNS, CNI_ARGS, the network's name), and whatever they hold, a line
	// must fit in the file without taking it past its limit.
	maxLine = 16 << 10
	// LockWait is the longest a call waits for another process's lock on the log: a process
	// that holds it (a hung plugin, or any process of root's that opens the file) delays a call
	// by this at most, and the line is dropped.
	LockWait = time.Second
)

// ErrLockBusy is wrapped by Append when the lock was not free within LockWait (or the context
// ended first): the line was dropped.
var ErrLockBusy = errors.New("lock held by another process")

// Append writes e as one line to path, rotating first when the line would take the file past
// maxBytes. It waits for the log's lock until LockWait has passed or ctx ends, whichever is
// first, but tries it once even when ctx has ended: a call cut short by SIGTERM or its deadline
// is still logged when nobody holds the lock.
func Append(ctx context.Context, path string, maxBytes int64, e Entry) error {
	line, err := encode(e, int(min(maxBytes, maxLine)))
	if err != nil {
		return err
	}
	dir, err := safedir.MkdirAll(filepath.Dir(path), 0o755)
	if err != nil {
		return err
	}
	defer dir.Close()
	name := filepath.Base(path)
	lock, err := dir.OpenFile(name+".lock", os.O_CREATE|os.O_RDONLY, 0o600)
	if err != nil {
		return err
	}
	defer lock.Close() // releases the flock
	if err := lockWithin(ctx, lock, LockWait); err != nil {
		return fmt.Errorf("lock %s: %w", lock.Name(), err)
	}
	f, size, err := openLog(dir, name)
	if err != nil {
		return err
	}
	if size > 0 && size+int64(len(line)) > maxBytes {
		f.Close()
		// renameat(2) replaces whatever is at <name>.1 (a symlink included) without following it.
		if err := dir.Rename(name, name+".1"); err != nil {
			return fmt.Errorf("rotate %s: %w", path, err)
		}
		if f, size, err = openLog(dir, name); err != nil {
			return err
		}
	}
	defer f.Close()
	if _, err := f.Write(line); err != nil {
		// Part of the line may be in the file (ENOSPC half-way): cut it off, or the next line
		// would continue it and neither could be read.
		return errors.Join(err, f.Truncate(size))
	}
	return nil
}

// openLog opens (creates) the log for appending and returns its size; anything but a regular
// file under the name (a symlink, a fifo, a directory) is an error, never followed or waited on.
func openLog(dir *safedir.Dir, name string) (*os.File, int64, error) {
	f, err := dir.OpenFile(name, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		return nil, 0, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	return f, st.Size(), nil
}

// encode marshals e as one line (newline included) of at most limit bytes. The error message is
// cut to maxMsg and every string to limit; then, while the line is too long, the longest string
// is cut by half, each cut marked with "...". The caller's entry is not changed.
func encode(e Entry, limit int) ([]byte, error) {
	if e.Error != nil {
		cp := *e.Error
		cp.Msg = cut(cp.Msg, maxMsg)
		e.Error = &cp
	}
	fields := []*string{&e.Verb, &e.Network, &e.Container, &e.Interface, &e.NetNS, &e.Pod, &e.CNIVersion}
	if e.Error != nil {
		fields = append(fields, &e.Error.Msg)
	}
	if e.Result != nil {
		e.Result = &Result{IPs: slices.Clone(e.Result.IPs)}
		for i := range e.Result.IPs {
			fields = append(fields, &e.Result.IPs[i])
		}
	}
	for _, f := range fields {
		*f = cut(*f, limit) // no string can be longer than the line: cut before any marshalling
	}
	for {
		line, err := json.Marshal(e)
		if err != nil {
			return nil, err
		}
		if len(line) < limit {
			return append(line, '\n'), nil
		}
		longest := slices.MaxFunc(fields, func(a, b *string) int { return len(*a) - len(*b) })
		if len(*longest) <= 16 {
			return nil, fmt.Errorf("a line of %d bytes does not fit in %d", len(line)+1, limit)
		}
		*longest = cut(*longest, len(*longest)/2)
	}
}

// cut shortens s to at most n bytes, on a character boundary, marking the cut with "...".
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "..."
}

// lockWithin takes the exclusive flock of f, trying until limit has passed or ctx ends. A
// blocking flock could be ended by neither: a process holding the lock forever would wedge the
// call, and SIGTERM (which the plugin catches to end its context) with it.
func lockWithin(ctx context.Context, f *os.File, limit time.Duration) error {
	start := time.Now()
	deadline := start.Add(limit)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	for delay := time.Millisecond; ; delay = min(2*delay, 50*time.Millisecond) {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return nil
		}
		if err != unix.EWOULDBLOCK && err != unix.EINTR {
			return err
		}
		left := time.Until(deadline)
		if ctx.Err() != nil {
			return fmt.Errorf("%w: gave up after %s: %w", ErrLockBusy, time.Since(start).Round(time.Millisecond), context.Cause(ctx))
		}
		if left <= 0 {
			return fmt.Errorf("%w: gave up after %s", ErrLockBusy, time.Since(start).Round(time.Millisecond))
		}
		t := time.NewTimer(min(delay, left))
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
}
