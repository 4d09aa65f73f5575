// Package verblog appends one JSON line per plugin call to a log file that an operator can read
// when a pod hangs in ContainerCreating, bounded in size: when a line would take the file past
// its limit, the file is renamed to <file>.1 (replacing the previous one) and a new one begun, so
// the log never holds more than twice the limit. Many plugin processes append at once: each
// append (and rotation) happens under an flock on <file>.lock, so lines never interleave and no
// rotation loses another process's line.
package verblog

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
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

// maxMsg bounds an error message in the log: a line stays small whatever the error says.
const maxMsg = 4096

// Append writes e as one line to path, rotating first when the line would take the file past
// maxBytes.
func Append(path string, maxBytes int64, e Entry) error {
	if len(e.Error.msg()) > maxMsg {
		e.Error.Msg = e.Error.Msg[:maxMsg] + "..."
	}
	line, err := json.Marshal(e)
	if err != nil {
		return err
	}
	line = append(line, '\n')
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	lock, err := os.OpenFile(path+".lock", os.O_CREATE|os.O_RDONLY|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	defer lock.Close() // releases the flock
	if err := flock(lock); err != nil {
		return fmt.Errorf("lock %s: %w", lock.Name(), err)
	}
	if st, err := os.Stat(path); err == nil && st.Size() > 0 && st.Size()+int64(len(line)) > maxBytes {
		if err := os.Rename(path, path+".1"); err != nil {
			return fmt.Errorf("rotate %s: %w", path, err)
		}
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND|unix.O_CLOEXEC, 0o640)
	if err != nil {
		return err
	}
	_, werr := f.Write(line)
	return errors.Join(werr, f.Close())
}

func (e *Error) msg() string {
	if e == nil {
		return ""
	}
	return e.Msg
}

// flock takes the exclusive lock, retrying when a signal interrupts the wait.
func flock(f *os.File) error {
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX)
		if err != unix.EINTR {
			return err
		}
	}
}
