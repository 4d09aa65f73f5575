package statedir

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestNetfilterLockAmongGoroutines: two goroutines of one Dir take the netfilter lock one after
// the other, and while the second holds it no other Dir (another process) gets it. The OFD lock
// alone lets the second in at once when it asks while the first holds it, and the first one's
// release then frees it for everyone; many rounds make the second ask in time in some of them.
func TestNetfilterLockAmongGoroutines(t *testing.T) {
	dir := t.TempDir()
	one, err := Open(dir, "net")
	if err != nil {
		t.Fatal(err)
	}
	defer one.Close()
	other, err := Open(dir, "net")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	for round := range 2000 {
		unlockA, err := one.LockNetfilter()
		if err != nil {
			t.Fatal(err)
		}
		asking, held := make(chan struct{}), make(chan func() error)
		go func() {
			close(asking)
			unlockB, err := one.LockNetfilter()
			if err != nil {
				t.Error(err)
			}
			held <- unlockB
		}()
		<-asking
		if err := unlockA(); err != nil {
			t.Fatal(err)
		}
		unlockB := <-held
		if unlockC, ok, err := other.lockByte(netfilterByte, "netfilter", false); err != nil || ok {
			if ok {
				_ = unlockC()
			}
			t.Fatalf("round %d: another Dir took the netfilter lock while a goroutine of the first held it (ok %v, err %v)", round, ok, err)
		}
		if err := unlockB(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestLockNotInherited: unlike go-filemutex's descriptor, ours is closed on exec, so a process the
// plugin starts cannot keep the node's lock after the plugin exits.
func TestLockNotInherited(t *testing.T) {
	s, err := Open(t.TempDir(), "kubenet")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	flags, err := unix.FcntlInt(s.lock.Fd(), unix.F_GETFD, 0)
	if err != nil {
		t.Fatal(err)
	}
	if flags&unix.FD_CLOEXEC == 0 {
		t.Error("lock descriptor lacks FD_CLOEXEC")
	}
}

// TestBackendLock: verbs share the backend lock; one that asks for it exclusively waits for every
// sharer to let go, and a verb that asks to share it after that waits behind the exclusive one
// (the turnstile), so a stream of sharers cannot keep a switch waiting forever. Downgrading lets
// the waiting sharer in.
func TestBackendLock(t *testing.T) {
	dir := t.TempDir()
	open := func() *Dir {
		d, err := Open(dir, "net")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		return d
	}
	a, b, w, late := open(), open(), open(), open()
	la, err := a.ShareBackend()
	if err != nil {
		t.Fatal(err)
	}
	lb, err := b.ShareBackend() // shared: does not wait for a
	if err != nil {
		t.Fatal(err)
	}
	events := make(chan string, 4)
	lw := &BackendLock{d: w, held: unix.F_UNLCK}
	go func() {
		if err := lw.Exclusive(); err != nil {
			t.Error(err)
		}
		events <- "exclusive"
	}()
	waitForBlockedLock(t, backendByte)
	var llate *BackendLock
	go func() {
		l, err := late.ShareBackend()
		if err != nil {
			t.Error(err)
		}
		llate = l
		events <- "late share"
	}()
	waitForBlockedLock(t, turnstileByte)
	if err := la.Release(); err != nil {
		t.Fatal(err)
	}
	if err := lb.Release(); err != nil {
		t.Fatal(err)
	}
	if got := <-events; got != "exclusive" {
		t.Fatalf("first after the sharers let go: %q, want the exclusive holder", got)
	}
	// While w holds it exclusively, nobody else may have it in any way.
	for _, kind := range []int16{unix.F_RDLCK, unix.F_WRLCK} {
		if unlock, ok, err := a.lockRange(backendByte, kind, "probe", false); err != nil || ok {
			if ok {
				_ = unlock()
			}
			t.Fatalf("another Dir took the backend lock (type %d) while it was held exclusively (err %v)", kind, err)
		}
	}
	if err := lw.Share(); err != nil { // the downgrade
		t.Fatal(err)
	}
	if got := <-events; got != "late share" {
		t.Fatalf("after the downgrade: %q", got)
	}
	if unlock, ok, err := a.lockRange(backendByte, unix.F_WRLCK, "probe", false); err != nil || ok {
		if ok {
			_ = unlock()
		}
		t.Fatalf("the backend lock was free for an exclusive holder while two shared it (err %v)", err)
	}
	if err := errors.Join(lw.Release(), llate.Release()); err != nil {
		t.Fatal(err)
	}
	unlock, ok, err := a.lockRange(backendByte, unix.F_WRLCK, "probe", false)
	if err != nil || !ok {
		t.Fatalf("the backend lock is still held after every holder released it (err %v)", err)
	}
	_ = unlock()
}

// waitForBlockedLock polls /proc/locks until some process waits for a lock on byte offset of a
// lock file (a line "N: -> OFDLCK ..." ending in "offset offset").
func waitForBlockedLock(t *testing.T, offset int64) {
	t.Helper()
	suffix := fmt.Sprintf(" %d %d", offset, offset)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		data, err := os.ReadFile("/proc/locks")
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(data), "\n") {
			if strings.Contains(line, "-> OFDLCK") && strings.HasSuffix(line, suffix) {
				return
			}
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("nobody waits for byte %d of a lock file (/proc/locks)", offset)
}

// TestAttachmentLockShared: readers of an attachment (CHECK, the node's healing) share its lock;
// a holder of it exclusive (ADD, DEL) keeps every other out, and a reader keeps an ADD or DEL
// out. The node's healing takes it without waiting, so it must get it while a CHECK holds it.
func TestAttachmentLockShared(t *testing.T) {
	dir := t.TempDir()
	one, err := Open(dir, "net")
	if err != nil {
		t.Fatal(err)
	}
	defer one.Close()
	other, err := Open(dir, "net")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	for _, tc := range []struct {
		name         string
		held, asked  int16
		wantAcquired bool
	}{
		{"reader while a reader holds it", unix.F_RDLCK, unix.F_RDLCK, true},
		{"writer while a reader holds it", unix.F_RDLCK, unix.F_WRLCK, false},
		{"reader while a writer holds it", unix.F_WRLCK, unix.F_RDLCK, false},
		{"writer while a writer holds it", unix.F_WRLCK, unix.F_WRLCK, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var unlock func() error
			if tc.held == unix.F_RDLCK {
				unlock, err = one.LockAttachmentShared("pod", "eth0")
			} else {
				unlock, err = one.LockAttachment("pod", "eth0")
			}
			if err != nil {
				t.Fatal(err)
			}
			defer unlock() //nolint:errcheck // closing the Dirs releases it anyway
			try := other.TryLockAttachment
			if tc.asked == unix.F_RDLCK {
				try = other.TryLockAttachmentShared
			}
			u, ok, err := try("pod", "eth0")
			if err != nil {
				t.Fatal(err)
			}
			if ok {
				if err := u(); err != nil {
					t.Fatal(err)
				}
			}
			if ok != tc.wantAcquired {
				t.Errorf("acquired = %v, want %v", ok, tc.wantAcquired)
			}
		})
	}
}
