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
// directory's watch is added again whenever something happens there; the network directory,
// removed, is made and watched again.
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
	addNetwork := func() (int32, error) {
		wd, err := unix.InotifyAddWatch(fd, networkDir, unix.IN_CREATE|unix.IN_MOVED_TO|unix.IN_DELETE|unix.IN_MOVED_FROM)
		return int32(wd), err
	}
	networkWatch, err := addNetwork()
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
			changed, networkGone := recordsChanged(buf[:n], networkWatch)
			if networkGone {
				// The network directory was removed: its watch ended with it, and the next ADD
				// makes it again (host-local's MkdirAll) with the records in it. It is made
				// here as at the start, and watched again (the directory still there: the
				// same watch); if that fails, the resync is left.
				if os.MkdirAll(networkDir, 0o755) == nil {
					if wd, err := addNetwork(); err == nil {
						networkWatch = wd
					}
				}
				changed = true
			}
			if changed {
				addRecords()
				kick()
			}
		}
	}()
	return w, nil
}

// recordsChanged tells whether inotify events (as read) say that a record, or the records
// directory, changed, and whether the network directory's watch ended (the directory was
// removed, or its file system unmounted: IN_IGNORED) or may have (a queue overflow). Other names
// in the network directory are not the records': the address files of host-local's ADD and
// DEL, and the policy state (core.PolicyStateFile) each pass writes there, which woke the
// controller for another pass after every pass. A queue overflow may have lost anything.
func recordsChanged(events []byte, networkWatch int32) (changed, networkGone bool) {
	for len(events) >= unix.SizeofInotifyEvent {
		wd := int32(binary.NativeEndian.Uint32(events[0:4]))
		mask := binary.NativeEndian.Uint32(events[4:8])
		nameLen := int(binary.NativeEndian.Uint32(events[12:16]))
		end := unix.SizeofInotifyEvent + nameLen
		if end > len(events) {
			return true, networkGone // cut short: cannot tell, so look
		}
		name, _, _ := strings.Cut(string(events[unix.SizeofInotifyEvent:end]), "\x00")
		events = events[end:]
		if (wd == networkWatch && mask&unix.IN_IGNORED != 0) || mask&unix.IN_Q_OVERFLOW != 0 {
			networkGone = true // or may be: the overflow may have lost its IN_IGNORED
		}
		if mask&unix.IN_Q_OVERFLOW != 0 || wd != networkWatch || name == core.RecordDirName {
			changed = true
		}
	}
	return changed, networkGone
}

func (w *recordWatcher) close() { _ = w.f.Close() }
