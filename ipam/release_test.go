package ipam

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestRelease: hints are a shortcut, never a source of truth. A hint naming a free address or
// someone else's falls back to reading the directory, and never removes the other's file.
func TestRelease(t *testing.T) {
	tests := []struct {
		name       string
		id, ifname string
		hint       []string
		want       []string // released
		again      []string // released by a second, identical call
	}{
		{"exact hint", "a", "eth0", []string{"10.0.0.2", "fd00::2"}, []string{"10.0.0.2", "fd00::2"}, nil},
		{"no hint", "a", "eth0", nil, []string{"10.0.0.2", "fd00::2"}, nil},
		// A hint that matches is trusted to be complete; the rest goes on the next call.
		{"partial hint", "a", "eth0", []string{"fd00::2"}, []string{"fd00::2"}, []string{"10.0.0.2"}},
		{"hint of another container", "a", "eth0", []string{"10.0.0.3"}, []string{"10.0.0.2", "fd00::2"}, nil},
		{"hint of a free address", "a", "eth0", []string{"10.0.0.2", "10.0.0.99"}, []string{"10.0.0.2", "fd00::2"}, nil},
		{"hint of the same container's other interface", "a", "eth0", []string{"10.0.0.4"}, []string{"10.0.0.2", "fd00::2"}, nil},
		{"other interface", "a", "eth1", nil, []string{"10.0.0.4"}, nil},
		{"unknown id", "zzz", "eth0", nil, nil, nil},
		{"unknown id with hint", "zzz", "eth0", []string{"10.0.0.2"}, nil, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := openStore(t)
			v4, v6 := rangeSet(t, "10.0.0.0/24"), rangeSet(t, "fd00::/64")
			allocate(t, s, 0, v4, "a", "eth0") // 10.0.0.2
			allocate(t, s, 1, v6, "a", "eth0") // fd00::2
			allocate(t, s, 0, v4, "b", "eth0") // 10.0.0.3
			allocate(t, s, 0, v4, "a", "eth1") // 10.0.0.4
			before := list(t, s)

			got := release(t, s, tc.id, tc.ifname, addrs(tc.hint...))
			equalAddrs(t, "released", got, addrs(tc.want...))
			remaining := slices.DeleteFunc(before, func(al Allocation) bool { return slices.Contains(got, al.Addr) })
			if after := list(t, s); !slices.Equal(after, remaining) {
				t.Errorf("left %v, want %v", after, remaining)
			}
			// DEL is repeated by runtimes: the second time the hint is stale, so it reads the directory.
			equalAddrs(t, "released again", release(t, s, tc.id, tc.ifname, addrs(tc.hint...)), addrs(tc.again...))
		})
	}
}

func TestReleaseRejectsEmptyID(t *testing.T) {
	s := openStore(t)
	writeFiles(t, s.Path(), map[string]string{"10.0.0.2": ""})
	if _, err := s.Release("", "eth0", nil); err == nil {
		t.Error("Release with an empty ID succeeded")
	}
	if len(list(t, s)) != 1 {
		t.Error("Release with an empty ID removed a file")
	}
}

// TestListSkipsNonReservations: List returns reservations, and as garbage (no owner) whatever
// else stands under an address's name: a symlink or a directory there takes the address from the
// allocator (link(2) fails on it), so GC must see it to give the address back.
func TestListSkipsNonReservations(t *testing.T) {
	s := openStore(t)
	writeFiles(t, s.Path(), map[string]string{
		"last_reserved_ip.0":     "10.0.0.2",
		"last_reserved_ip.1":     "fd00::2",
		".kubenet-ip-123":        "x\r\neth0",
		".kubenet-cursor-456":    "10.0.0.9",
		".hidden":                "y\r\neth0",
		"README":                 "z",
		"fd00:0::5":              "w\r\neth0", // not canonical: the allocator never looks at it
		"10.0.0.2":               "a\r\neth0",
		"fd00::2":                "a\r\neth0",
		"last_reserved_ip.0.tmp": "10.0.0.2",
	})
	if err := os.Mkdir(filepath.Join(s.Path(), "10.0.0.9"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("10.0.0.2", filepath.Join(s.Path(), "10.0.0.8")); err != nil {
		t.Fatal(err)
	}
	want := []Allocation{{addrs("10.0.0.2")[0], "a", "eth0"}, {Addr: addrs("10.0.0.8")[0]}, {Addr: addrs("10.0.0.9")[0]}, {addrs("fd00::2")[0], "a", "eth0"}}
	if got := list(t, s); !slices.Equal(got, want) {
		t.Errorf("List = %v, want %v", got, want)
	}
	// GC's release removes the symlink and the directory, never what the symlink points to.
	for _, a := range addrs("10.0.0.8", "10.0.0.9") {
		if err := s.ReleaseAddr(a); err != nil {
			t.Fatal(err)
		}
	}
	want = []Allocation{{addrs("10.0.0.2")[0], "a", "eth0"}, {addrs("fd00::2")[0], "a", "eth0"}}
	if got := list(t, s); !slices.Equal(got, want) {
		t.Errorf("List after releasing the garbage = %v, want %v", got, want)
	}
}

func TestReleaseAddr(t *testing.T) {
	s := openStore(t)
	set := rangeSet(t, "10.0.0.0/24")
	a := allocate(t, s, 0, set, "a", "eth0")
	b := allocate(t, s, 0, set, "b", "eth0")
	if err := s.ReleaseAddr(a); err != nil {
		t.Fatal(err)
	}
	if err := s.ReleaseAddr(a); err != nil {
		t.Errorf("ReleaseAddr of a free address: %v", err)
	}
	if err := s.ReleaseAddr(netip.Addr{}); err == nil {
		t.Error("ReleaseAddr of the zero Addr succeeded")
	}
	if got := list(t, s); !slices.Equal(got, []Allocation{{b, "b", "eth0"}}) {
		t.Errorf("List = %v", got)
	}
	// The cursor and lock are untouched.
	if names := dirNames(t, s.Path()); !slices.Equal(names, []string{b.String(), "last_reserved_ip.0", "lock"}) {
		t.Errorf("directory = %v", names)
	}
}
