package ipam

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/kubenet-dev/kubenet/internal/safedir"
)

// TestHostileDataDir: what someone with write access to the data dir could plant never makes the
// store read, write or remove anything outside it, and a data dir others may write is refused.
func TestHostileDataDir(t *testing.T) {
	cases := []struct {
		name    string
		plant   func(t *testing.T, dataDir, victim string) // before Open
		openErr error                                      // nil: Open must succeed
		after   func(t *testing.T, s *testStore)           // checks on the open store
	}{
		{name: "world-writable data dir", plant: func(t *testing.T, dataDir, _ string) { chmod(t, dataDir, 0o777) }, openErr: safedir.ErrUntrusted},
		{name: "group-writable network dir", plant: func(t *testing.T, dataDir, _ string) {
			mkdirMode(t, filepath.Join(dataDir, "kubenet"), 0o775)
		}, openErr: safedir.ErrUntrusted},
		{name: "network dir is a symlink out (replaced)", plant: func(t *testing.T, dataDir, victim string) {
			symlink(t, filepath.Dir(victim), filepath.Join(dataDir, "kubenet"))
		}, after: func(t *testing.T, s *testStore) {
			if st, err := os.Lstat(s.Path()); err != nil || !st.IsDir() {
				t.Errorf("network dir %v %v, want a directory", st, err)
			}
			allocate(t, s, 0, rangeSet(t, "10.0.0.0/29"), "a", "eth0")
			if entries, _ := os.ReadDir(filepath.Join(filepath.Dir(s.Path()), "..", "outside")); len(entries) != 1 {
				t.Errorf("the store wrote outside: %v", entries)
			}
		}},
		{name: "lock is a symlink to a file outside", plant: func(t *testing.T, dataDir, victim string) {
			mkdirMode(t, filepath.Join(dataDir, "kubenet"), 0o755)
			symlink(t, victim, filepath.Join(dataDir, "kubenet", "lock"))
		}, after: func(t *testing.T, s *testStore) { lockIsRegular(t, s) }},
		{name: "lock is a symlink to a missing file outside", plant: func(t *testing.T, dataDir, victim string) {
			mkdirMode(t, filepath.Join(dataDir, "kubenet"), 0o755)
			symlink(t, victim+"-new", filepath.Join(dataDir, "kubenet", "lock"))
		}, after: func(t *testing.T, s *testStore) {
			lockIsRegular(t, s)
			if _, err := os.Lstat(filepath.Join(filepath.Dir(s.Path()), "..", "outside", "secret-new")); err == nil {
				t.Error("the lock's symlink target was created")
			}
		}},
		{name: "lock is a fifo", plant: func(t *testing.T, dataDir, _ string) {
			mkdirMode(t, filepath.Join(dataDir, "kubenet"), 0o755)
			if err := syscall.Mkfifo(filepath.Join(dataDir, "kubenet", "lock"), 0o600); err != nil {
				t.Fatal(err)
			}
		}, after: func(t *testing.T, s *testStore) { lockIsRegular(t, s) }},
		{name: "lock is a directory", plant: func(t *testing.T, dataDir, _ string) {
			mkdirMode(t, filepath.Join(dataDir, "kubenet", "lock", "x"), 0o755)
		}, after: func(t *testing.T, s *testStore) { lockIsRegular(t, s) }},
		{name: "reservation and cursor are symlinks out", plant: func(t *testing.T, dataDir, victim string) {
			mkdirMode(t, filepath.Join(dataDir, "kubenet"), 0o755)
			symlink(t, victim, filepath.Join(dataDir, "kubenet", "10.0.0.2"))
			symlink(t, victim, filepath.Join(dataDir, "kubenet", "last_reserved_ip.0"))
		}, after: func(t *testing.T, s *testStore) {
			set := rangeSet(t, "10.0.0.0/29")
			// The cursor is not followed (the search starts at the beginning) and the symlinked
			// address is taken by nobody; allocation goes on, and GC reclaims the name.
			if got := allocate(t, s, 0, set, "a", "eth0"); got.String() != "10.0.0.3" {
				t.Errorf("allocated %s, want 10.0.0.3", got)
			}
			if held, err := s.Holds(addrs("10.0.0.2")[0], "secret", ""); held || err != nil {
				t.Errorf("the symlink's target counts as a reservation: %v %v", held, err)
			}
			if released := release(t, s, "secret", "", nil); len(released) != 0 {
				t.Errorf("Release followed the symlink: %v", released)
			}
			if err := s.ReleaseAddr(addrs("10.0.0.2")[0]); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			dataDir := filepath.Join(root, "data")
			mkdirMode(t, dataDir, 0o755)
			mkdirMode(t, filepath.Join(root, "outside"), 0o755)
			victim := filepath.Join(root, "outside", "secret")
			if err := os.WriteFile(victim, []byte("secret"), 0o600); err != nil {
				t.Fatal(err)
			}
			tc.plant(t, dataDir, victim)
			s, err := openTestStore(dataDir, "kubenet")
			switch {
			case tc.openErr == nil && err != nil:
				t.Fatalf("Open: %v", err)
			case tc.openErr == errAny && err == nil, tc.openErr != nil && tc.openErr != errAny && !errors.Is(err, tc.openErr):
				t.Fatalf("Open: got %v, want %v", err, tc.openErr)
			}
			if err == nil {
				if tc.after != nil {
					tc.after(t, s)
				}
				if err := s.Close(); err != nil {
					t.Fatal(err)
				}
			}
			if b, err := os.ReadFile(victim); err != nil || string(b) != "secret" {
				t.Fatalf("the file outside the data dir was touched: %q %v", b, err)
			}
		})
	}
}

var errAny = errors.New("any error")

func lockIsRegular(t *testing.T, s *testStore) {
	t.Helper()
	st, err := os.Lstat(filepath.Join(s.Path(), "lock"))
	if err != nil || !st.Mode().IsRegular() {
		t.Fatalf("lock is %v %v, want a regular file", st, err)
	}
	if err := s.Lock(); err != nil {
		t.Fatal(err)
	}
	if err := s.Unlock(); err != nil {
		t.Fatal(err)
	}
}

func chmod(t *testing.T, p string, mode os.FileMode) {
	t.Helper()
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
}

func mkdirMode(t *testing.T, p string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(p, 0o755); err != nil {
		t.Fatal(err)
	}
	chmod(t, p, mode)
}

func symlink(t *testing.T, target, name string) {
	t.Helper()
	if err := os.Symlink(target, name); err != nil {
		t.Fatal(err)
	}
}

// TestAttachmentLock: the attachment lock excludes other Stores (processes or goroutines) of the
// same attachment, lets other attachments through, and goes with Close (as with a dying process).
func TestAttachmentLock(t *testing.T) {
	dataDir := t.TempDir()
	a, b := openStoreAt(t, dataDir), openStoreAt(t, dataDir)
	unlock, err := a.LockAttachment("pod", "eth0")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		id, ifname string
		blocked    bool
	}{
		{"pod", "eth0", true},
		{"pod", "eth1", false},
		{"pod2", "eth0", false},
		{"po", "deth0", false}, // the key is not the concatenation
	}
	for _, tc := range cases {
		got := make(chan func() error, 1)
		go func() {
			u, err := b.LockAttachment(tc.id, tc.ifname)
			if err != nil {
				t.Error(err)
			}
			got <- u
		}()
		if tc.blocked {
			// A negative: the waiter has not got the lock within a window, and gets it as soon as
			// the holder lets go.
			select {
			case <-got:
				t.Fatalf("%s/%s: a second store took the lock pod/eth0 holds", tc.id, tc.ifname)
			case <-time.After(200 * time.Millisecond):
			}
			if err := unlock(); err != nil {
				t.Fatal(err)
			}
		}
		select {
		case u := <-got:
			if err := u(); err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s/%s never got its lock", tc.id, tc.ifname)
		}
		if tc.blocked {
			if unlock, err = a.LockAttachment("pod", "eth0"); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Closing the holder (a process dying) frees the lock.
	released := make(chan struct{})
	go func() {
		u, err := b.LockAttachment("pod", "eth0")
		if err == nil {
			_ = u()
		}
		close(released)
	}()
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-released:
	case <-time.After(10 * time.Second):
		t.Fatal("the lock outlived the store that held it")
	}
	if names := dirNames(t, filepath.Join(dataDir, "kubenet")); !slices.Equal(names, []string{"lock"}) {
		t.Errorf("attachment locks left files: %v", names)
	}
}

// TestParseOwnerRefusesWhatNoWriterWrites: a reservation file names an owner only when a writer
// could have written it; anything else (the bytes of a damaged block, an ID CNI never passes) is
// garbage that holds its address for nobody, so GC can tell it from a legacy ID-only file.
func TestParseOwnerRefusesWhatNoWriterWrites(t *testing.T) {
	cases := []struct {
		content string
		want    owner
		ok      bool
	}{
		{"abc\r\neth0", owner{"abc", "eth0"}, true},
		{"abc", owner{"abc", ""}, true}, // host-local's legacy format
		{"abc\n", owner{"abc", ""}, true},
		{"", owner{}, false},
		{" \r\n ", owner{}, false},
		{"\x00\xffnot json{", owner{}, false},
		{"../x\r\neth0", owner{}, false},
		{"abc\r\neth 0/x", owner{}, false},
		{"a\r\nb\r\nc", owner{}, false},
		{"-abc", owner{}, false},
	}
	for _, tc := range cases {
		got, ok := parseOwner([]byte(tc.content))
		if ok != tc.ok || got != tc.want {
			t.Errorf("parseOwner(%q) = %v, %v; want %v, %v", tc.content, got, ok, tc.want, tc.ok)
		}
	}
}

// TestTryLockAttachment: a second store gets no lock that another holds, and gets it at once
// when it is free; the holder's release frees it for the next try.
func TestTryLockAttachment(t *testing.T) {
	dataDir := t.TempDir()
	a, b := openStoreAt(t, dataDir), openStoreAt(t, dataDir)
	unlock, err := a.LockAttachment("pod", "eth0")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		id, ifname string
		want       bool
	}{
		{"pod", "eth0", false},
		{"pod", "eth1", true},
		{"po", "deth0", true},
	}
	for _, tc := range cases {
		u, ok, err := b.TryLockAttachment(tc.id, tc.ifname)
		if err != nil {
			t.Fatal(err)
		}
		if ok != tc.want {
			t.Errorf("%s/%s: TryLockAttachment = %v while pod/eth0 is held, want %v", tc.id, tc.ifname, ok, tc.want)
		}
		if ok {
			if err := u(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := unlock(); err != nil {
		t.Fatal(err)
	}
	u, ok, err := b.TryLockAttachment("pod", "eth0")
	if err != nil || !ok {
		t.Fatalf("TryLockAttachment after the holder let go = %v, %v; want the lock", ok, err)
	}
	if err := u(); err != nil {
		t.Fatal(err)
	}
}

// TestNetfilterLock: the netfilter lock excludes a second store, and is independent of the
// network lock and of attachment locks held meanwhile.
func TestNetfilterLock(t *testing.T) {
	dataDir := t.TempDir()
	a, b := openStoreAt(t, dataDir), openStoreAt(t, dataDir)
	if err := a.Lock(); err != nil {
		t.Fatal(err)
	}
	ua, err := a.LockAttachment("pod", "eth0")
	if err != nil {
		t.Fatal(err)
	}
	unlock, err := a.LockNetfilter()
	if err != nil {
		t.Fatalf("netfilter lock while holding the network and an attachment lock: %v", err)
	}
	got := make(chan error, 1)
	go func() {
		u, err := b.LockNetfilter()
		if err == nil {
			err = u()
		}
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("a second store took the netfilter lock while it was held (%v)", err)
	case <-time.After(200 * time.Millisecond):
	}
	if err := unlock(); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if _, ok, err := b.TryLockAttachment("pod", "eth0"); err != nil || ok {
		t.Errorf("the attachment lock went with the netfilter lock: %v %v", ok, err)
	}
	if err := errors.Join(ua(), a.Unlock()); err != nil {
		t.Fatal(err)
	}
}
