package policy

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kubenet-dev/kubenet/core"
)

// TestWatchRecordsWakes: every way a record changes wakes the controller, a record damaged in
// place too (its pod must be held at once, not at the resync).
func TestWatchRecordsWakes(t *testing.T) {
	networkDir := t.TempDir()
	kicks := make(chan struct{}, 100)
	w, err := watchRecords(networkDir, func() { kicks <- struct{}{} })
	if err != nil {
		t.Fatal(err)
	}
	defer w.close()
	records := filepath.Join(networkDir, core.RecordDirName)
	record := filepath.Join(records, "c1@eth0.json")
	for _, tc := range []struct {
		name   string
		change func() error
	}{
		{"records directory made", func() error { return os.Mkdir(records, 0o755) }},
		{"record written", func() error { return os.WriteFile(record, []byte(`{"containerID":"c1","ifName":"eth0"}`), 0o644) }},
		{"record cut in half", func() error { return os.Truncate(record, 10) }},
		{"record truncated to nothing", func() error { return os.Truncate(record, 0) }},
		{"record removed", func() error { return os.Remove(record) }},
	} {
		for len(kicks) > 0 {
			<-kicks
		}
		if err := tc.change(); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		select {
		case <-kicks:
		case <-time.After(5 * time.Second):
			t.Errorf("%s: no wake-up", tc.name)
		}
	}
}

// inotifyEvent is an inotify event as read(2) returns it.
func inotifyEvent(wd int32, mask uint32, name string) []byte {
	b := binary.NativeEndian.AppendUint32(nil, uint32(wd))
	b = binary.NativeEndian.AppendUint32(b, mask)
	b = binary.NativeEndian.AppendUint32(b, 0) // cookie
	padded := 0
	if name != "" {
		padded = (len(name) + 1 + 15) &^ 15
	}
	b = binary.NativeEndian.AppendUint32(b, uint32(padded))
	return append(b, append([]byte(name), make([]byte, padded-len(name))...)...)
}

// TestRecordsChanged: events of the records directory, and of the network directory about the
// records directory, wake the controller; the network directory's other files (the policy state
// each pass writes, host-local's address files) do not: a pass no longer asks for the next.
func TestRecordsChanged(t *testing.T) {
	const networkWatch, recordsWatch = 1, 2
	state := slices.Concat(inotifyEvent(networkWatch, unix.IN_CREATE, ".kubenet-policy.json.tmp1"), inotifyEvent(networkWatch, unix.IN_MOVED_TO, "kubenet-policy.json"))
	for _, tc := range []struct {
		name   string
		events []byte
		want   bool
		gone   bool // the network directory's watch ended
	}{
		{"policy state written", state, false, false},
		{"address file written", inotifyEvent(networkWatch, unix.IN_CREATE, "10.244.1.7"), false, false},
		{"records directory made", inotifyEvent(networkWatch, unix.IN_CREATE|unix.IN_ISDIR, core.RecordDirName), true, false},
		{"records directory removed", inotifyEvent(networkWatch, unix.IN_DELETE|unix.IN_ISDIR, core.RecordDirName), true, false},
		{"record written", inotifyEvent(recordsWatch, unix.IN_CLOSE_WRITE, "c1@eth0.json"), true, false},
		{"record written after the policy state", slices.Concat(state, inotifyEvent(recordsWatch, unix.IN_MOVED_TO, "c1@eth0.json")), true, false},
		{"queue overflowed", inotifyEvent(-1, unix.IN_Q_OVERFLOW, ""), true, true},
		{"event cut short", inotifyEvent(networkWatch, unix.IN_CREATE, "kubenet-policy.json")[:20], true, false},
		{"network directory removed", slices.Concat(inotifyEvent(networkWatch, unix.IN_DELETE_SELF, ""), inotifyEvent(networkWatch, unix.IN_IGNORED, "")), false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, gone := recordsChanged(tc.events, networkWatch)
			if got != tc.want {
				t.Errorf("recordsChanged = %v, want %v", got, tc.want)
			}
			if gone != tc.gone {
				t.Errorf("recordsChanged: network directory gone %v, want %v", gone, tc.gone)
			}
		})
	}
}

// TestWatchRecordsIgnoresPolicyState: the policy state a pass writes into the network directory
// (replaced whole: a temporary file renamed) wakes nothing; the next record change wakes once.
func TestWatchRecordsIgnoresPolicyState(t *testing.T) {
	networkDir := t.TempDir()
	var kicks atomic.Int32
	woken := make(chan struct{}, 100)
	w, err := watchRecords(networkDir, func() { kicks.Add(1); woken <- struct{}{} })
	if err != nil {
		t.Fatal(err)
	}
	defer w.close()
	records := filepath.Join(networkDir, core.RecordDirName)
	if err := os.Mkdir(records, 0o755); err != nil {
		t.Fatal(err)
	}
	select {
	case <-woken:
	case <-time.After(5 * time.Second):
		t.Fatal("records directory made: no wake-up")
	}
	kicks.Store(0)
	for i := range 3 { // three passes
		tmp := filepath.Join(networkDir, fmt.Sprintf(".%s.%d", core.PolicyStateFile, i))
		if err := os.WriteFile(tmp, []byte("{}"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(networkDir, core.PolicyStateFile)); err != nil {
			t.Fatal(err)
		}
	}
	// The record arrives whole (one event: renamed into the records directory).
	elsewhere := filepath.Join(t.TempDir(), "record")
	if err := os.WriteFile(elsewhere, []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(elsewhere, filepath.Join(records, "c1@eth0.json")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-woken:
	case <-time.After(5 * time.Second):
		t.Fatal("record written: no wake-up")
	}
	if n := kicks.Load(); n != 1 {
		t.Errorf("%d wake-ups for three policy states and a record, want the record's only", n)
	}
}

// TestWatchRecordsNetworkDirRemade: the network directory removed (a node's state cleaned up by
// hand, or by a tool) and made again by the next ADD (host-local's MkdirAll) with the records
// directory and a record in it: the record still wakes the controller. Its watch had ended
// with the directory, and nothing watched the new one: the pod stayed held until the resync.
func TestWatchRecordsNetworkDirRemade(t *testing.T) {
	networkDir := filepath.Join(t.TempDir(), "kubenet")
	records := filepath.Join(networkDir, core.RecordDirName)
	record := filepath.Join(records, "c2@eth0.json")
	woken := make(chan bool, 100) // whether the record existed when the controller was woken
	w, err := watchRecords(networkDir, func() {
		_, err := os.Stat(record)
		woken <- err == nil
	})
	if err != nil {
		t.Fatal(err)
	}
	defer w.close()
	if err := os.MkdirAll(records, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(records, "c1@eth0.json"), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(networkDir); err != nil {
		t.Fatal(err)
	}
	quiet(t, woken) // the removal's wake-ups are all in
	if err := os.MkdirAll(records, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(record, []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	deadline := time.After(5 * time.Second)
	for {
		select {
		case sawRecord := <-woken:
			if sawRecord {
				return
			}
		case <-deadline:
			t.Fatal("the record written into the remade network directory woke nothing")
		}
	}
}

// quiet waits until woken has had nothing for a while (the events of a change are in), within a
// deadline.
func quiet(t *testing.T, woken <-chan bool) {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case <-woken:
		case <-time.After(300 * time.Millisecond):
			return
		case <-deadline:
			t.Fatal("wake-ups did not stop")
		}
	}
}
