package ipam

import (
	"errors"
	"net/netip"
	"path/filepath"
	"slices"
	"testing"
)

// TestAllocateUntilExhausted hands out a whole set and checks the order, that gateway, network and
// broadcast never come out, the files written, and the exhaustion error.
func TestAllocateUntilExhausted(t *testing.T) {
	custom := func(subnet, gateway, start, end string) RangeSet {
		r, err := handRange(subnet, gateway, start, end).Normalize()
		if err != nil {
			t.Fatal(err)
		}
		return RangeSet{r}
	}
	tests := []struct {
		name string
		set  RangeSet
		want []string
	}{
		{"ipv4", rangeSet(t, "10.0.0.0/29"),
			[]string{"10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5", "10.0.0.6"}},
		{"ipv6", rangeSet(t, "fd00:10:244:1::/125"),
			[]string{"fd00:10:244:1::2", "fd00:10:244:1::3", "fd00:10:244:1::4", "fd00:10:244:1::5", "fd00:10:244:1::6", "fd00:10:244:1::7"}},
		{"gateway in the middle", custom("10.0.0.0/29", "10.0.0.3", "10.0.0.1", "10.0.0.6"),
			[]string{"10.0.0.1", "10.0.0.2", "10.0.0.4", "10.0.0.5", "10.0.0.6"}},
		{"bounds on network and broadcast", custom("10.0.0.0/29", "10.0.0.1", "10.0.0.0", "10.0.0.7"),
			[]string{"10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5", "10.0.0.6"}},
		{"ipv6 network address", custom("fd00::/126", "fd00::3", "fd00::", "fd00::3"),
			[]string{"fd00::1", "fd00::2"}},
		{"two ranges", rangeSet(t, "10.0.0.0/30", "10.0.1.0/30"),
			[]string{"10.0.0.2", "10.0.1.2"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := openStore(t)
			var got []string
			for i := range tc.want {
				id := "c" + string(rune('a'+i))
				a, r, err := s.Allocate(0, tc.set, id, "eth0")
				if err != nil {
					t.Fatalf("allocation %d: %v", i, err)
				}
				if !r.Contains(a) || !slices.Contains(tc.set, r) {
					t.Errorf("%s returned with range %s", a, r)
				}
				if c := readFile(t, filepath.Join(s.Path(), a.String())); c != id+"\r\neth0" {
					t.Errorf("file %s holds %q", a, c)
				}
				if c := readFile(t, filepath.Join(s.Path(), "last_reserved_ip.0")); c != a.String() {
					t.Errorf("cursor holds %q after allocating %s", c, a)
				}
				got = append(got, a.String())
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("allocated %v, want %v", got, tc.want)
			}

			before := dirNames(t, s.Path())
			_, _, err := s.Allocate(0, tc.set, "late", "eth0")
			if !errors.Is(err, ErrExhausted) {
				t.Fatalf("Allocate on a full set: %v, want ErrExhausted", err)
			}
			if want := "no IP addresses available in range set " + tc.set.String(); err.Error() != want {
				t.Errorf("error %q, want %q", err, want)
			}
			if after := dirNames(t, s.Path()); !slices.Equal(before, after) {
				t.Errorf("failed Allocate changed the directory: %v -> %v", before, after)
			}
		})
	}
}

// TestRoundRobin: a released address is not handed out again until the cursor comes round.
func TestRoundRobin(t *testing.T) {
	s := openStore(t)
	set := rangeSet(t, "10.0.0.0/29") // .2 to .6
	a := allocate(t, s, 0, set, "a", "eth0")
	allocate(t, s, 0, set, "b", "eth0")
	release(t, s, "a", "eth0", []netip.Addr{a})

	var got []netip.Addr
	for _, id := range []string{"c", "d", "e", "f"} {
		got = append(got, allocate(t, s, 0, set, id, "eth0"))
	}
	equalAddrs(t, "after release", got, addrs("10.0.0.4", "10.0.0.5", "10.0.0.6", "10.0.0.2"))
}

func TestCursor(t *testing.T) {
	set := rangeSet(t, "10.0.0.0/30", "10.0.1.0/29")
	tests := []struct {
		name, cursor, want string
	}{
		{"end of first range moves to next range", "10.0.0.2", "10.0.1.2"},
		{"middle of a range", "10.0.1.3", "10.0.1.4"},
		{"end of last range wraps", "10.0.1.6", "10.0.0.2"},
		{"outside the set starts at the first range", "192.168.0.5", "10.0.0.2"},
		{"other family starts at the first range", "fd00::5", "10.0.0.2"},
		{"garbage starts at the first range", "not an address", "10.0.0.2"},
		{"empty starts at the first range", "", "10.0.0.2"},
		{"whitespace is ignored", " 10.0.1.3\n", "10.0.1.4"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := openStore(t)
			writeFiles(t, s.Path(), map[string]string{"last_reserved_ip.0": tc.cursor})
			if got := allocate(t, s, 0, set, "a", "eth0"); got.String() != tc.want {
				t.Errorf("allocated %s, want %s", got, tc.want)
			}
		})
	}
}

// TestCursorPerSet: every range set index has its own cursor, as in host-local.
func TestCursorPerSet(t *testing.T) {
	s := openStore(t)
	v4, v6 := rangeSet(t, "10.0.0.0/24"), rangeSet(t, "fd00::/64")
	allocate(t, s, 0, v4, "a", "eth0")
	allocate(t, s, 1, v6, "a", "eth0")
	allocate(t, s, 0, v4, "b", "eth0")
	if c := readFile(t, filepath.Join(s.Path(), "last_reserved_ip.0")); c != "10.0.0.3" {
		t.Errorf("cursor 0 = %q", c)
	}
	if c := readFile(t, filepath.Join(s.Path(), "last_reserved_ip.1")); c != "fd00::2" {
		t.Errorf("cursor 1 = %q", c)
	}
}

func TestAllocateAddr(t *testing.T) {
	set := rangeSet(t, "10.0.0.0/24", "10.0.1.0/24")
	tests := []struct {
		name, addr string
		wantRange  int      // index in set, when it succeeds
		wantErr    []string // all in the error, when it fails
		inUse      bool
	}{
		{"free", "10.0.0.50", 0, nil, false},
		{"second range", "10.0.1.7", 1, nil, false},
		{"taken", "10.0.0.9", 0, []string{"10.0.0.9", "already reserved", "container other eth1"}, true},
		{"outside the set", "10.0.2.1", 0, []string{"10.0.2.1", "not in range set 10.0.0.0/24, 10.0.1.0/24"}, false},
		{"gateway", "10.0.1.1", 0, []string{"10.0.1.1", "gateway"}, false},
		{"broadcast", "10.0.0.255", 0, []string{"10.0.0.255", "not in range set"}, false},
		{"other family", "fd00::9", 0, []string{"fd00::9", "not in range set"}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := openStore(t)
			writeFiles(t, s.Path(), map[string]string{"10.0.0.9": "other\r\neth1"})
			before := dirNames(t, s.Path())
			addr := netip.MustParseAddr(tc.addr)
			r, err := s.AllocateAddr(0, set, addr, "mine", "eth0")
			if tc.wantErr == nil {
				if err != nil {
					t.Fatal(err)
				}
				if r != set[tc.wantRange] {
					t.Errorf("range %s, want %s", r, set[tc.wantRange])
				}
				if c := readFile(t, filepath.Join(s.Path(), tc.addr)); c != "mine\r\neth0" {
					t.Errorf("file holds %q", c)
				}
				// host-local moves the cursor on requested addresses too.
				if c := readFile(t, filepath.Join(s.Path(), "last_reserved_ip.0")); c != tc.addr {
					t.Errorf("cursor %q", c)
				}
				return
			}
			wantErrorMentions(t, "AllocateAddr("+tc.addr+")", err, tc.wantErr...)
			if errors.Is(err, ErrInUse) != tc.inUse {
				t.Errorf("errors.Is(%v, ErrInUse) = %v", err, !tc.inUse)
			}
			if after := dirNames(t, s.Path()); !slices.Equal(before, after) {
				t.Errorf("failed AllocateAddr changed the directory: %v -> %v", before, after)
			}
		})
	}
}

func TestAllocateBadArguments(t *testing.T) {
	good := rangeSet(t, "10.0.0.0/24")
	mixed := append(rangeSet(t, "10.0.0.0/24"), rangeSet(t, "fd00::/64")...)
	overlap := append(rangeSet(t, "10.0.0.0/24"), rangeSet(t, "10.0.0.0/25")...)
	tests := []struct {
		name       string
		setIndex   int
		set        RangeSet
		id, ifname string
		want       string
	}{
		{"empty id", 0, good, "", "eth0", `container ID ""`},
		{"id with line break", 0, good, "a\r\nb", "eth0", "container ID"},
		{"id with spaces around", 0, good, " a", "eth0", "container ID"},
		{"ifname with line break", 0, good, "a", "eth0\n", "interface name"},
		{"negative index", -1, good, "a", "eth0", "index -1"},
		{"empty set", 0, nil, "a", "eth0", "empty range set"},
		{"mixed families", 0, mixed, "a", "eth0", "mixes IPv4 and IPv6"},
		{"overlap", 0, overlap, "a", "eth0", "overlap"},
		{"bad range", 0, RangeSet{{Subnet: netip.MustParsePrefix("10.0.0.1/24")}}, "a", "eth0", "host bits"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := openStore(t)
			before := dirNames(t, s.Path())
			_, _, err := s.Allocate(tc.setIndex, tc.set, tc.id, tc.ifname)
			wantErrorMentions(t, "Allocate", err, tc.want)
			_, err = s.AllocateAddr(tc.setIndex, tc.set, netip.MustParseAddr("10.0.0.5"), tc.id, tc.ifname)
			wantErrorMentions(t, "AllocateAddr", err, tc.want)
			if after := dirNames(t, s.Path()); !slices.Equal(before, after) {
				t.Errorf("directory changed: %v -> %v", before, after)
			}
		})
	}
}

// TestAllocateFillsDefaults: a hand-built range without Start/End works and comes back completed.
func TestAllocateFillsDefaults(t *testing.T) {
	s := openStore(t)
	a, r, err := s.Allocate(0, RangeSet{{Subnet: netip.MustParsePrefix("10.0.0.0/24")}}, "a", "eth0")
	if err != nil {
		t.Fatal(err)
	}
	if a.String() != "10.0.0.2" || r != rangeSet(t, "10.0.0.0/24")[0] {
		t.Errorf("got %s in %+v", a, r)
	}
}

func TestOpenRejectsBadNetworkNames(t *testing.T) {
	for _, name := range []string{"", ".", "..", "a/b", "../x"} {
		if s, err := openTestStore(t.TempDir(), name); err == nil {
			_ = s.Close()
			t.Errorf("openTestStore(%q) succeeded", name)
		}
	}
}
