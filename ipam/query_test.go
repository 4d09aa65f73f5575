package ipam

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
)

func TestHoldsAndFree(t *testing.T) {
	s := openStore(t)
	set := rangeSet(t, "10.0.0.0/29") // .2 to .6 allocatable: 5
	if free, err := s.Free(set); err != nil || free[0] != 5 {
		t.Fatalf("Free on empty store = %v, %v; want 5", free, err)
	}
	a := allocate(t, s, 0, set, "c1", "eth0")
	for _, tc := range []struct {
		id, ifname string
		want       bool
	}{{"c1", "eth0", true}, {"c1", "eth1", false}, {"c2", "eth0", false}} {
		if got, err := s.Holds(a, tc.id, tc.ifname); err != nil || got != tc.want {
			t.Errorf("Holds(%s, %s, %s) = %v, %v; want %v", a, tc.id, tc.ifname, got, err, tc.want)
		}
	}
	if got, err := s.Holds(netip.MustParseAddr("10.0.0.6"), "c1", "eth0"); err != nil || got {
		t.Errorf("Holds on a free address = %v, %v", got, err)
	}
	for _, id := range []string{"c2", "c3", "c4", "c5"} {
		allocate(t, s, 0, set, id, "eth0")
	}
	if free, err := s.Free(set); err != nil || free[0] != 0 {
		t.Errorf("Free on a full store = %v, %v; want 0", free, err)
	}
}

// TestHasFree: HasFree agrees with Free (some address free or none), whether the free address is
// among the candidates after the cursor or only found by counting.
func TestHasFree(t *testing.T) {
	set := rangeSet(t, "10.0.0.0/27") // .2 to .30 allocatable: 29
	for _, tc := range []struct {
		name     string
		reserved int    // allocated one after the other from .2
		cursor   string // last_reserved_ip.0 afterwards ("": as Allocate left it)
		freed    string // released again afterwards ("": none)
		want     bool
	}{
		{name: "empty store", want: true},
		{name: "some reserved", reserved: 5, want: true},
		{name: "full", reserved: 29, want: false},
		{name: "full but one, far behind the cursor", reserved: 29, freed: "10.0.0.3", want: true},
		{name: "full but one, right after the cursor", reserved: 29, cursor: "10.0.0.9", freed: "10.0.0.10", want: true},
		{name: "full, cursor outside the set", reserved: 29, cursor: "192.0.2.1", want: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := openStore(t)
			for i := range tc.reserved {
				allocate(t, s, 0, set, fmt.Sprintf("c%d", i), "eth0")
			}
			if tc.cursor != "" {
				writeFiles(t, s.Path(), map[string]string{"last_reserved_ip.0": tc.cursor})
			}
			if tc.freed != "" {
				if err := os.Remove(filepath.Join(s.Path(), tc.freed)); err != nil {
					t.Fatal(err)
				}
			}
			got, err := s.HasFree(set, rangeSet(t, "10.0.1.0/30"))
			if err != nil {
				t.Fatal(err)
			}
			free, err := s.Free(set)
			if err != nil {
				t.Fatal(err)
			}
			if got[0] != tc.want || got[0] != (free[0] > 0) {
				t.Errorf("HasFree = %v, want %v (Free counts %d)", got[0], tc.want, free[0])
			}
			if !got[1] {
				t.Error("HasFree of an empty second set = false")
			}
		})
	}
}
