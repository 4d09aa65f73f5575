package hostport

import (
	"errors"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

var (
	ownerA = Owner{ContainerID: "aaa", IfName: "eth0"}
	ownerB = Owner{ContainerID: "bbb", IfName: "eth0"}
)

// indexFiles lists the files below the index, relative to it.
func indexFiles(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	root := filepath.Join(dir, IndexDirName)
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel(root, p)
			out = append(out, rel)
		}
		return nil
	})
	slices.Sort(out)
	return out
}

func TestIndexReserveConflicts(t *testing.T) {
	other4 := entry("tcp", 80, ip4, pod4, 8080)
	cases := []struct {
		name     string
		held     Entry
		want     Entry
		conflict bool
	}{
		{"same wildcard", entry("tcp", 80, any4, pod4, 8080), entry("tcp", 80, any4, pod4, 9090), true},
		{"wildcard held, hostIP wanted", entry("tcp", 80, any4, pod4, 8080), other4, true},
		{"hostIP held, wildcard wanted", other4, entry("tcp", 80, any4, pod4, 8080), true},
		{"same hostIP", other4, other4, true},
		{"IPv6 wildcard held, IPv6 hostIP wanted", entry("udp", 53, any6, pod6, 53), entry("udp", 53, ip6, pod6, 53), true},
		{"two hostIPs", other4, entry("tcp", 80, netip.MustParseAddr("10.200.0.1"), pod4, 8080), false},
		{"other protocol", entry("tcp", 80, any4, pod4, 8080), entry("udp", 80, any4, pod4, 8080), false},
		{"other port", entry("tcp", 80, any4, pod4, 8080), entry("tcp", 81, any4, pod4, 8080), false},
		{"other family", entry("tcp", 80, any4, pod4, 8080), entry("tcp", 80, any6, pod6, 8080), false},
		{"IPv4 wildcard, IPv6 hostIP", entry("tcp", 80, any4, pod4, 8080), entry("tcp", 80, ip6, pod6, 8080), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			ix := NewIndex(dir)
			if err := ix.Reserve(ownerA, []Entry{tc.held}); err != nil {
				t.Fatal(err)
			}
			before := indexFiles(t, dir)
			// The conflicting entry comes second: a refusal must not leave the first behind.
			free := entry("sctp", 1, any4, pod4, 1)
			err := ix.Reserve(ownerB, []Entry{free, tc.want})
			var ce *ConflictError
			if !tc.conflict {
				if err != nil {
					t.Fatalf("Reserve: %v", err)
				}
				r, ok, err := ix.Lookup(tc.want.Key)
				if err != nil || !ok || r != (Reservation{Entry: tc.want, Owner: ownerB}) {
					t.Errorf("Lookup = %v, %v, %v, want the reservation of %v", r, ok, err, ownerB)
				}
				return
			}
			if !errors.As(err, &ce) || ce.Want != tc.want.Key || ce.Held != (Reservation{Entry: tc.held, Owner: ownerA}) {
				t.Fatalf("Reserve = %v, want a conflict of %v with A's %v", err, tc.want.Key, tc.held)
			}
			if msg := ce.Error(); !strings.Contains(msg, `"aaa"`) || !strings.Contains(msg, "hostPort "+strings.Split(tc.want.Key.String(), " ")[1]) {
				t.Errorf("message %q does not name the port and the holder", msg)
			}
			if after := indexFiles(t, dir); !slices.Equal(before, after) {
				t.Errorf("refused Reserve changed the index: %v -> %v", before, after)
			}
		})
	}
}

func TestIndexOwnerRules(t *testing.T) {
	dir := t.TempDir()
	ix := NewIndex(dir)
	a := []Entry{entry("tcp", 80, any4, pod4, 8080), entry("tcp", 80, any6, pod6, 8080)}
	if err := ix.Reserve(ownerA, a); err != nil {
		t.Fatal(err)
	}
	// A retried ADD of the same attachment may rewrite what it holds.
	if err := ix.Reserve(ownerA, a); err != nil {
		t.Errorf("Reserve of own keys: %v", err)
	}
	if got := indexFiles(t, dir); !slices.Equal(got, []string{"tcp-80/0.0.0.0", "tcp-80/::"}) {
		t.Errorf("index files %v", got)
	}
	// B cannot release A's keys; Owned shows B holds nothing.
	if owned, err := ix.Owned(ownerB, KeysOf(a)); err != nil || len(owned) != 0 {
		t.Errorf("Owned(B) = %v, %v", owned, err)
	}
	if err := ix.Release(ownerB, KeysOf(a)); err != nil {
		t.Fatal(err)
	}
	if all, err := ix.All(); err != nil || len(all) != 2 {
		t.Errorf("after B's Release: %v, %v; want A's 2 reservations", all, err)
	}
	// A's release removes the files and the now empty port directory.
	if err := ix.Release(ownerA, KeysOf(a)); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(filepath.Join(dir, IndexDirName))
	if err != nil || len(entries) != 0 {
		t.Errorf("index after release: %v, %v", entries, err)
	}
	// Releasing again is fine.
	if err := ix.Release(ownerA, KeysOf(a)); err != nil {
		t.Errorf("second Release: %v", err)
	}
}

// TestIndexIgnoresStrayFiles: temporary files of an interrupted write, non-canonical names and
// foreign directories are not reservations.
func TestIndexIgnoresStrayFiles(t *testing.T) {
	dir := t.TempDir()
	ix := NewIndex(dir)
	held := entry("udp", 53, ip4, pod4, 53)
	if err := ix.Reserve(ownerA, []Entry{held}); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(dir, IndexDirName)
	for _, p := range []string{"udp-53/.0.0.0.0.tmp-123", "udp-53/0000::", "README", "tcp-x/0.0.0.0"} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, p), []byte(`{"containerID":"zzz"}`), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	all, err := ix.All()
	if err != nil || len(all) != 1 || all[0] != (Reservation{Entry: held, Owner: ownerA}) {
		t.Errorf("All = %v, %v; want only A's reservation", all, err)
	}
	// A wildcard for the same port still sees A's hostIP reservation, and nothing else.
	err = ix.Reserve(ownerB, []Entry{entry("udp", 53, any4, pod4, 53)})
	var ce *ConflictError
	if !errors.As(err, &ce) || ce.Held.Owner != ownerA {
		t.Errorf("Reserve = %v, want a conflict with A", err)
	}
}
