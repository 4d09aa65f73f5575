package statedir

import (
	"testing"

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
