package ipam

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestCrashLeftovers: what a crash can leave behind — our temp file, host-local's empty or torn
// file — never breaks allocation, never gets an address handed out twice, and is visible to GC.
func TestCrashLeftovers(t *testing.T) {
	s := openStore(t)
	set := rangeSet(t, "10.0.0.0/29") // .2 to .6
	writeFiles(t, s.Path(), map[string]string{
		".kubenet-ip-1234": "dead\r\neth0", // we died between writing the temp file and link(2)
		"10.0.0.2":         "",             // host-local died between create and write
		"10.0.0.3":         " \r\n ",       // whitespace only
		"10.0.0.4":         "a\r\nb\r\nc",  // no writer produces three lines
	})

	if got := allocate(t, s, 0, set, "live", "eth0"); got.String() != "10.0.0.5" {
		t.Errorf("allocated %s, want 10.0.0.5", got)
	}
	allocate(t, s, 0, set, "live2", "eth0")
	if _, _, err := s.Allocate(0, set, "late", "eth0"); !errors.Is(err, ErrExhausted) {
		t.Fatalf("want exhaustion, got %v", err)
	}
	equalAddrs(t, "release of the temp file's owner", release(t, s, "dead", "eth0", nil), nil)

	// GC sees the broken files as owned by nobody and may remove them.
	var garbage []Allocation
	for _, al := range list(t, s) {
		if al.ContainerID == "" {
			garbage = append(garbage, al)
		}
	}
	want := []Allocation{{Addr: addrs("10.0.0.2")[0]}, {Addr: addrs("10.0.0.3")[0]}, {Addr: addrs("10.0.0.4")[0]}}
	if !slices.Equal(garbage, want) {
		t.Fatalf("garbage = %v, want %v", garbage, want)
	}
	for _, al := range garbage {
		if err := s.ReleaseAddr(al.Addr); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := s.RemoveTemp(); n != 1 || err != nil {
		t.Errorf("RemoveTemp = %d, %v; want 1", n, err)
	}
	if names := dirNames(t, s.Path()); !slices.Equal(names, []string{"10.0.0.5", "10.0.0.6", "last_reserved_ip.0", "lock"}) {
		t.Errorf("directory after GC = %v", names)
	}
	if got := allocate(t, s, 0, set, "after-gc", "eth0"); got.String() != "10.0.0.2" {
		t.Errorf("allocated %s after GC, want 10.0.0.2", got)
	}
	if c := readFile(t, filepath.Join(s.Path(), "10.0.0.2")); c != "after-gc\r\neth0" {
		t.Errorf("reused file holds %q", c)
	}
}

// TestNoTempFilesLeft: successful and failed allocations both clean up their temp names.
func TestNoTempFilesLeft(t *testing.T) {
	s := openStore(t)
	set := rangeSet(t, "10.0.0.0/30") // one address
	a := allocate(t, s, 0, set, "a", "eth0")
	if _, _, err := s.Allocate(0, set, "b", "eth0"); !errors.Is(err, ErrExhausted) {
		t.Fatal(err)
	}
	if _, err := s.AllocateAddr(0, set, a, "b", "eth0"); !errors.Is(err, ErrInUse) {
		t.Fatal(err)
	}
	if names := dirNames(t, s.Path()); !slices.Equal(names, []string{a.String(), "last_reserved_ip.0", "lock"}) {
		t.Errorf("directory = %v", names)
	}
}

// TestCursorFailureRollsBack: when the cursor cannot be written, the fresh reservation is removed
// again, since the caller gets an error and would never release the address.
func TestCursorFailureRollsBack(t *testing.T) {
	s := openStore(t)
	// A directory where the cursor file belongs makes rename(2) fail, even for root.
	if err := os.Mkdir(filepath.Join(s.Path(), "last_reserved_ip.0"), 0o755); err != nil {
		t.Fatal(err)
	}
	before := dirNames(t, s.Path())
	_, _, err := s.Allocate(0, rangeSet(t, "10.0.0.0/24"), "a", "eth0")
	wantErrorMentions(t, "Allocate", err, "reserve 10.0.0.2", "cursor 0")
	_, err = s.AllocateAddr(0, rangeSet(t, "10.0.0.0/24"), netip.MustParseAddr("10.0.0.7"), "a", "eth0")
	wantErrorMentions(t, "AllocateAddr", err, "reserve 10.0.0.7", "cursor 0")
	if after := dirNames(t, s.Path()); !slices.Equal(before, after) {
		t.Errorf("failed allocations changed the directory: %v -> %v", before, after)
	}
}
