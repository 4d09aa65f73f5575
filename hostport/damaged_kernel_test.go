package hostport

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
)

// TestDamagedFileAgainstTheKernel: DEL (Unmap) of the element's owner removes element and file;
// DEL of anyone else leaves both; GC repairs the file of a kept owner from the element and
// removes a file whose element is gone or whose owner is not kept.
func TestDamagedFileAgainstTheKernel(t *testing.T) {
	for _, d := range damages() {
		t.Run(d.name, func(t *testing.T) {
			cases := []struct {
				name        string
				op          func(w *world) error
				wantElement bool // A's element of tcp/80 stays
				wantFile    bool // a readable file of A for tcp/80 exists afterwards
			}{
				{"DEL of the owner", func(w *world) error {
					_, err := Unmap(w.cfg, ownerA, []Key{entry("tcp", 80, any4, pod4, 8080).Key})
					return err
				}, false, false},
				{"DEL of another attachment naming the key", func(w *world) error {
					_, err := Unmap(w.cfg, ownerB, []Key{entry("tcp", 80, any4, pod4, 8080).Key})
					return err
				}, true, false},
				{"DEL of the owner without its keys", func(w *world) error { _, err := UnmapOwner(w.cfg, ownerA); return err }, false, false},
				{"GC keeping the owner", func(w *world) error {
					_, err := GC(w.cfg, func(o Owner) bool { return true })
					return err
				}, true, true},
				{"GC keeping nobody", func(w *world) error {
					_, err := GC(w.cfg, func(o Owner) bool { return false })
					return err
				}, false, false},
			}
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					w := newWorld(t)
					mine := entry("tcp", 80, any4, pod4, 8080)
					w.add(t, ownerA, mine)
					w.add(t, ownerB, entry("udp", 53, any4, podB(), 53))
					portDir := filepath.Join(w.cfg.Dir, IndexDirName, "tcp-80")
					victim := filepath.Join(t.TempDir(), "secret")
					if err := os.WriteFile(victim, []byte("secret"), 0o600); err != nil {
						t.Fatal(err)
					}
					d.apply(t, portDir, filepath.Join(portDir, "0.0.0.0"), victim)
					var err error
					_ = w.ns.Do(func(ns.NetNS) error { err = tc.op(w); return nil })
					if err != nil {
						t.Fatalf("%s: %v", tc.name, err)
					}
					kernel := w.kernelElements(t)
					if got := slices.Contains(kernel, Reservation{Entry: mine, Owner: ownerA}); got != tc.wantElement {
						t.Errorf("A's element present = %v, want %v (kernel %v)", got, tc.wantElement, kernel)
					}
					r, ok, _ := NewIndex(w.cfg.Dir).Lookup(mine.Key)
					if got := ok && r == (Reservation{Entry: mine, Owner: ownerA}); got != tc.wantFile {
						t.Errorf("A's readable file present = %v, want %v", got, tc.wantFile)
					}
					if !slices.ContainsFunc(kernel, func(r Reservation) bool { return r.Owner == ownerB }) && tc.name != "GC keeping nobody" {
						t.Errorf("B's element is gone: %v", kernel)
					}
					victimIntact(t, victim)
				})
			}
		})
	}
}

// TestLostIndexFile: an element whose index file is gone (a GC killed mid-repair, a hand) is
// removed by the DEL of the owner its comment names, kept by anyone else's, and gets its file
// back from GC when its owner is kept.
func TestLostIndexFile(t *testing.T) {
	mine := entry("udp", 53, any6, pod6, 53)
	cases := []struct {
		name              string
		op                func(w *world) error
		element, fileBack bool
	}{
		{"DEL of the owner", func(w *world) error { _, err := Unmap(w.cfg, ownerA, []Key{mine.Key}); return err }, false, false},
		{"DEL of another", func(w *world) error { _, err := Unmap(w.cfg, ownerB, []Key{mine.Key}); return err }, true, false},
		{"GC keeping the owner", func(w *world) error { _, err := GC(w.cfg, func(Owner) bool { return true }); return err }, true, true},
		{"GC keeping nobody", func(w *world) error { _, err := GC(w.cfg, func(Owner) bool { return false }); return err }, false, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t)
			w.add(t, ownerA, mine)
			rm(t, filepath.Join(w.cfg.Dir, IndexDirName, "udp-53", "::"))
			var err error
			_ = w.ns.Do(func(ns.NetNS) error { err = tc.op(w); return nil })
			if err != nil {
				t.Fatal(err)
			}
			if got := slices.Contains(w.kernelElements(t), Reservation{Entry: mine, Owner: ownerA}); got != tc.element {
				t.Errorf("element present = %v, want %v", got, tc.element)
			}
			r, ok, err := NewIndex(w.cfg.Dir).Lookup(mine.Key)
			if got := ok && err == nil && r.Owner == ownerA; got != tc.fileBack {
				t.Errorf("file back = %v (%v %v %v), want %v", got, r, ok, err, tc.fileBack)
			}
		})
	}
}
