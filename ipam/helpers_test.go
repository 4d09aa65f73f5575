package ipam

import (
	"github.com/kubenet-dev/kubenet/internal/statedir"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// openStore opens a store in a fresh temporary data dir and closes it when the test ends.
func openStore(t testing.TB) *testStore {
	t.Helper()
	return openStoreAt(t, t.TempDir())
}

// testStore is a Store with the state dir it lives in: the tests take the network lock around
// changes, as the core does.
type testStore struct {
	*Store
	*statedir.Dir
}

// openTestStore opens the network's state dir in dataDir and the store in it.
func openTestStore(dataDir, network string) (*testStore, error) {
	d, err := statedir.Open(dataDir, network)
	if err != nil {
		return nil, err
	}
	return &testStore{Store: New(d.Root()), Dir: d}, nil
}

func openStoreAt(t testing.TB, dataDir string) *testStore {
	t.Helper()
	s, err := openTestStore(dataDir, "kubenet")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// rangeSet builds a set of whole-subnet ranges.
func rangeSet(t testing.TB, subnets ...string) RangeSet {
	t.Helper()
	var set RangeSet
	for _, sub := range subnets {
		r, err := NewRange(netip.MustParsePrefix(sub))
		if err != nil {
			t.Fatal(err)
		}
		set = append(set, r)
	}
	return set
}

func addrs(ss ...string) []netip.Addr {
	out := make([]netip.Addr, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParseAddr(s)
	}
	return out
}

// dirNames lists a directory, sorted, the way a person would compare it before and after.
func dirNames(t testing.TB, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	names := make([]string, len(entries))
	for i, e := range entries {
		names[i] = e.Name()
	}
	return names
}

// writeFiles writes files by hand, as host-local (or a crash) would have left them.
func writeFiles(t testing.TB, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

func readFile(t testing.TB, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// allocate calls Allocate under the lock and fails the test on error.
func allocate(t testing.TB, s *testStore, setIndex int, set RangeSet, id, ifname string) netip.Addr {
	t.Helper()
	if err := s.Lock(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Unlock() }()
	a, _, err := s.Allocate(setIndex, set, id, ifname)
	if err != nil {
		t.Fatalf("Allocate(%d, %s, %s, %s): %v", setIndex, set, id, ifname, err)
	}
	return a
}

func release(t testing.TB, s *testStore, id, ifname string, hint []netip.Addr) []netip.Addr {
	t.Helper()
	got, err := s.Release(id, ifname, hint)
	if err != nil {
		t.Fatalf("Release(%s, %s, %v): %v", id, ifname, hint, err)
	}
	return got
}

func list(t testing.TB, s *testStore) []Allocation {
	t.Helper()
	all, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	return all
}

func equalAddrs(t testing.TB, what string, got, want []netip.Addr) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("%s = %v, want %v", what, got, want)
	}
}

// handRange builds a Range as a caller would by hand; an empty string leaves the field zero, that
// is, to its default.
func handRange(subnet, gateway, start, end string) Range {
	var r Range
	if subnet != "" {
		r.Subnet = netip.MustParsePrefix(subnet)
	}
	for _, f := range []struct {
		s   string
		dst *netip.Addr
	}{{gateway, &r.Gateway}, {start, &r.Start}, {end, &r.End}} {
		if f.s != "" {
			*f.dst = netip.MustParseAddr(f.s)
		}
	}
	return r
}

// wantErrorMentions fails unless err is non-nil and names every one of parts.
func wantErrorMentions(t testing.TB, what string, err error, parts ...string) {
	t.Helper()
	if err == nil {
		t.Errorf("%s succeeded, want an error about %q", what, parts)
		return
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("%s: error %q does not mention %q", what, err, p)
		}
	}
}

// checkExclusion checks that s cannot take the lock between lock and unlock of another holder,
// and can afterwards; it returns with s holding the lock.
func checkExclusion(t testing.TB, s *testStore, lock, unlock func() error) {
	t.Helper()
	if err := lock(); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.TryLock(); ok || err != nil {
		t.Fatalf("TryLock while another holds the lock = %v, %v", ok, err)
	}
	if err := unlock(); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.TryLock(); !ok || err != nil {
		t.Fatalf("TryLock on a free lock = %v, %v", ok, err)
	}
}
