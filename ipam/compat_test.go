package ipam

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/alexflint/go-filemutex"
)

// hostLocalDir writes a network directory the way host-local leaves it: current and legacy
// reservation files, a cursor and the lock.
func hostLocalDir(t *testing.T) (dataDir, dir string) {
	t.Helper()
	dataDir = t.TempDir()
	dir = filepath.Join(dataDir, "kubenet")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFiles(t, dir, map[string]string{
		"lock":               "",
		"last_reserved_ip.0": "10.0.0.3",
		"last_reserved_ip.1": "fd00:10:244:1::2",
		"10.0.0.2":           "cid-a\r\neth0",
		"10.0.0.3":           "cid-legacy", // written by host-local before ifname was recorded
		"10.0.0.5":           "cid-c\r\neth0",
		"fd00:10:244:1::2":   "cid-a\r\neth0",
	})
	return dataDir, dir
}

func TestHostLocalDirectory(t *testing.T) {
	dataDir, dir := hostLocalDir(t)
	s := openStoreAt(t, dataDir)
	v4, v6 := rangeSet(t, "10.0.0.0/29"), rangeSet(t, "fd00:10:244:1::/64")

	want := []Allocation{
		{addrs("10.0.0.2")[0], "cid-a", "eth0"},
		{addrs("10.0.0.3")[0], "cid-legacy", ""},
		{addrs("10.0.0.5")[0], "cid-c", "eth0"},
		{addrs("fd00:10:244:1::2")[0], "cid-a", "eth0"},
	}
	if got := list(t, s); !slices.Equal(got, want) {
		t.Errorf("List = %v, want %v", got, want)
	}
	got, err := s.Lookup("cid-legacy", "eth0")
	if err != nil {
		t.Fatal(err)
	}
	equalAddrs(t, "Lookup(legacy)", got, addrs("10.0.0.3"))

	// The cursor (.3) is respected and existing reservations (.5) are skipped; then the set is full.
	equalAddrs(t, "allocated", []netip.Addr{
		allocate(t, s, 0, v4, "cid-d", "eth0"),
		allocate(t, s, 0, v4, "cid-e", "eth0"),
		allocate(t, s, 1, v6, "cid-d", "eth0"),
	}, addrs("10.0.0.4", "10.0.0.6", "fd00:10:244:1::3"))
	if _, _, err := s.Allocate(0, v4, "cid-f", "eth0"); !errors.Is(err, ErrExhausted) {
		t.Fatalf("Allocate on a full set: %v", err)
	}

	// What we wrote is what host-local writes.
	if c := readFile(t, filepath.Join(dir, "fd00:10:244:1::3")); c != "cid-d\r\neth0" {
		t.Errorf("IPv6 reservation holds %q", c)
	}
	if c := readFile(t, filepath.Join(dir, "last_reserved_ip.0")); c != "10.0.0.6" {
		t.Errorf("cursor holds %q", c)
	}

	// Release works for both formats, with and without a hint.
	equalAddrs(t, "release legacy", release(t, s, "cid-legacy", "eth0", nil), addrs("10.0.0.3"))
	equalAddrs(t, "release hinted", release(t, s, "cid-a", "eth0", addrs("10.0.0.2", "fd00:10:244:1::2")),
		addrs("10.0.0.2", "fd00:10:244:1::2"))
	// The cursor wraps round to the freed addresses.
	equalAddrs(t, "after release", []netip.Addr{allocate(t, s, 0, v4, "cid-g", "eth0"),
		allocate(t, s, 0, v4, "cid-h", "eth0")}, addrs("10.0.0.2", "10.0.0.3"))
}

// TestLockSharedWithHostLocal: host-local locks <dir>/lock with go-filemutex; while it holds the
// lock, a Store must not get it, and the other way round.
func TestLockSharedWithHostLocal(t *testing.T) {
	s := openStore(t)
	hostLocal, err := filemutex.New(filepath.Join(s.Path(), "lock"))
	if err != nil {
		t.Fatal(err)
	}
	defer hostLocal.Close()

	checkExclusion(t, s, hostLocal.Lock, hostLocal.Unlock)
	if err := hostLocal.TryLock(); !errors.Is(err, filemutex.AlreadyLocked) {
		t.Fatalf("host-local TryLock while the store holds the lock: %v", err)
	}
	if err := s.Unlock(); err != nil {
		t.Fatal(err)
	}
}
