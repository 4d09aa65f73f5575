package policy

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kubenet-dev/kubenet/core"
)

// recordWatcher calls kick when an attachment record of the network is written or removed
// (inotify): ADD writes the record, with the pod's addresses pending, before the pod's interface
// exists, and the controller's next pass releases them. The records directory comes and goes
// with the node's first and last pod, so the network directory is watched too and the records
// directory's watch is added again whenever something happens there.
type recordWatcher struct {
	f *os.File
}

// recordEvents are what happens to records: ADD's and DEL's writes, renames and removals, and
// IN_MODIFY for a record damaged in place (truncate(2) closes nothing), whose pod the next pass
// holds.
const recordEvents = unix.IN_CREATE | unix.IN_MOVED_TO | unix.IN_DELETE | unix.IN_MOVED_FROM | unix.IN_CLOSE_WRITE | unix.IN_MODIFY

func watchRecords(networkDir string, kick func()) (*recordWatcher, error) {
	if err := os.MkdirAll(networkDir, 0o755); err != nil {
		return nil, fmt.Errorf("watch %s: %w", networkDir, err)
	}
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("inotify: %w", err)
	}
	// A non-blocking descriptor goes to the runtime's poller, so Close wakes the reader.
	w := &recordWatcher{f: os.NewFile(uintptr(fd), "inotify")}
	networkWatch, err := unix.InotifyAddWatch(fd, networkDir, unix.IN_CREATE|unix.IN_MOVED_TO|unix.IN_DELETE|unix.IN_MOVED_FROM)
	if err != nil {
		w.close()
		return nil, fmt.Errorf("watch %s: %w", networkDir, err)
	}
	recordsDir := filepath.Join(networkDir, core.RecordDirName)
	addRecords := func() { _, _ = unix.InotifyAddWatch(fd, recordsDir, recordEvents) }
	addRecords()
	go func() {
		buf := make([]byte, 64<<10)
		for {
			n, err := w.f.Read(buf)
			if err != nil {
				if errors.Is(err, os.ErrClosed) {
					return
				}
				continue
			}
			if recordsChanged(buf[:n], int32(networkWatch)) {
				addRecords()
				kick()
			}
		}
	}()
	return w, nil
}

// recordsChanged tells whether inotify events (as read) say that a record, or the records
// directory, changed. Other names in the network directory are not the records': the address
// files of host-local's ADD and DEL, and the policy state (core.PolicyStateFile) each pass writes
// there, which woke the controller for another pass after every pass. A queue overflow may have
// lost anything.
func recordsChanged(events []byte, networkWatch int32) bool {
	for len(events) >= unix.SizeofInotifyEvent {
		wd := int32(binary.NativeEndian.Uint32(events[0:4]))
		mask := binary.NativeEndian.Uint32(events[4:8])
		nameLen := int(binary.NativeEndian.Uint32(events[12:16]))
		end := unix.SizeofInotifyEvent + nameLen
		if end > len(events) {
			return true // cut short: cannot tell, so look
		}
		name, _, _ := strings.Cut(string(events[unix.SizeofInotifyEvent:end]), "\x00")
		events = events[end:]
		if mask&unix.IN_Q_OVERFLOW != 0 || wd != networkWatch || name == core.RecordDirName {
			return true
		}
	}
	return false
}

func (w *recordWatcher) close() { _ = w.f.Close() }
