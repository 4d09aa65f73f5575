package hostport

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
)

// damage is one way a reservation file (here: A's tcp/80 on 0.0.0.0) can be broken.
type damage struct {
	name  string
	apply func(t *testing.T, portDir, file, victim string)
}

func damages() []damage {
	write := func(content string) func(t *testing.T, _, file, _ string) {
		return func(t *testing.T, _, file, _ string) {
			if err := os.WriteFile(file, []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	return []damage{
		{"truncated", write(`{"containerID":"aaa","ifN`)},
		{"garbage", write("\x00\xff{")},
		{"empty", write("")},
		{"owner with a path", write(`{"containerID":"../../x","ifName":"eth0","podIP":"10.244.1.2","containerPort":8080}`)},
		{"owner without interface", write(`{"containerID":"aaa","podIP":"10.244.1.2","containerPort":8080}`)},
		{"destination of the other family", write(`{"containerID":"aaa","ifName":"eth0","podIP":"fd00::2","containerPort":8080}`)},
		{"destination port 0", write(`{"containerID":"aaa","ifName":"eth0","podIP":"10.244.1.2","containerPort":0}`)},
		{"symlink to a file outside", func(t *testing.T, _, file, victim string) {
			rm(t, file)
			if err := os.Symlink(victim, file); err != nil {
				t.Fatal(err)
			}
		}},
		{"directory in its place", func(t *testing.T, _, file, _ string) {
			rm(t, file)
			if err := os.MkdirAll(filepath.Join(file, "x"), 0o755); err != nil {
				t.Fatal(err)
			}
		}},
		{"fifo in its place", func(t *testing.T, _, file, _ string) {
			rm(t, file)
			if err := syscall.Mkfifo(file, 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{"file in place of the port directory", func(t *testing.T, portDir, _, _ string) {
			if err := os.RemoveAll(portDir); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(portDir, []byte("junk"), 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{"port directory is a symlink out", func(t *testing.T, portDir, _, victim string) {
			if err := os.RemoveAll(portDir); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(filepath.Dir(victim), portDir); err != nil {
				t.Fatal(err)
			}
		}},
	}
}

func rm(t *testing.T, p string) {
	t.Helper()
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
}

// damagedIndex reserves A's tcp/80 (any IPv4) and B's udp/53, damages A's file, and returns the
// index, the directory and a file outside that must stay untouched.
func damagedIndex(t *testing.T, d damage, dir string) (Index, Entry, Entry, string) {
	t.Helper()
	ix := NewIndex(dir)
	mine, other := entry("tcp", 80, any4, pod4, 8080), entry("udp", 53, any4, pod4, 53)
	if err := ix.Reserve(ownerA, []Entry{mine}); err != nil {
		t.Fatal(err)
	}
	if err := ix.Reserve(ownerB, []Entry{other}); err != nil {
		t.Fatal(err)
	}
	outside := t.TempDir()
	victim := filepath.Join(outside, "secret")
	if err := os.WriteFile(victim, []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	portDir := filepath.Join(dir, IndexDirName, "tcp-80")
	d.apply(t, portDir, filepath.Join(portDir, "0.0.0.0"), victim)
	return ix, mine, other, victim
}

func victimIntact(t *testing.T, victim string) {
	t.Helper()
	if b, err := os.ReadFile(victim); err != nil || string(b) != "secret" {
		t.Fatalf("a file outside the index was touched: %q %v", b, err)
	}
	if _, err := os.Stat(filepath.Dir(victim)); err != nil {
		t.Fatal(err)
	}
}

// TestIndexDamagedFiles: a damaged file refuses its key to others (fails closed), is reported by
// Damaged, and never makes an operation on another key, or a scan of the whole index, fail.
func TestIndexDamagedFiles(t *testing.T) {
	for _, d := range damages() {
		t.Run(d.name, func(t *testing.T) {
			dir := t.TempDir()
			ix, mine, other, victim := damagedIndex(t, d, dir)

			var ce *ConflictError
			if err := ix.Reserve(ownerB, []Entry{entry("tcp", 80, ip4, pod4, 8080)}); !errors.As(err, &ce) || ce.Held.Owner != (Owner{}) {
				t.Errorf("Reserve of an overlapping key = %v, want a conflict with the damaged file", err)
			}
			if err := ix.Reserve(ownerB, []Entry{entry("tcp", 81, any4, pod4, 8080)}); err != nil {
				t.Errorf("Reserve of another port: %v", err)
			}
			all, err := ix.All()
			if err != nil {
				t.Fatalf("All: %v", err)
			}
			if !slices.Contains(all, Reservation{Entry: other, Owner: ownerB}) || slices.ContainsFunc(all, func(r Reservation) bool { return r.Key == mine.Key }) {
				t.Errorf("All = %v, want B's reservations and not the damaged one", all)
			}
			if damaged, err := ix.Damaged(); err != nil || !slices.Contains(damaged, mine.Key) {
				t.Errorf("Damaged = %v, %v; want %v", damaged, err, mine.Key)
			}
			if owned, err := ix.Owned(ownerA, []Key{mine.Key, other.Key}); err != nil || len(owned) != 0 {
				t.Errorf("Owned(A) = %v, %v; want nothing and no error", owned, err)
			}
			if _, _, err := ix.Lookup(mine.Key); !errors.As(err, new(*DamagedError)) {
				t.Errorf("Lookup = %v, want a *DamagedError", err)
			}
			if err := ix.remove([]Reservation{{Entry: mine}}); err != nil {
				t.Fatalf("remove: %v", err)
			}
			if err := ix.Reserve(ownerB, []Entry{entry("tcp", 80, ip4, pod4, 8080)}); err != nil {
				t.Errorf("Reserve after the damaged file went: %v", err)
			}
			victimIntact(t, victim)
		})
	}
}

// podB is B's pod address (IPv4, another pod than A's).
func podB() netip.Addr { return pod4.Next() }
