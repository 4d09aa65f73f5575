package ipam

import (
	"net/netip"
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
