package ipam

import (
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// prefill reserves the first n addresses of set[0] by writing the files directly (as fast as the
// disk allows, without the allocator's fsyncs) and points the cursor at the last of them, as a
// long-running node would look after n round-robin allocations.
func prefill(b *testing.B, s *testStore, set RangeSet, n int) {
	b.Helper()
	a := set[0].Start
	for i := 0; i < n; a = a.Next() {
		if set[0].excluded(a) {
			continue
		}
		content := owner{"prefill-" + strconv.Itoa(i), "eth0"}.content()
		if err := os.WriteFile(filepath.Join(s.Path(), a.String()), content, 0o600); err != nil {
			b.Fatal(err)
		}
		i++
	}
	if err := s.writeCursor(0, a.Prev()); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkAllocateRelease measures one Allocate plus one hinted Release in a /16 that already
// holds 1, 1000 or 60000 reservations: neither may grow with the number of reservations.
// Run it with TMPDIR on a tmpfs to see the cost of the algorithm without the fsync.
func BenchmarkAllocateRelease(b *testing.B) {
	set := rangeSet(b, "10.1.0.0/16")
	for _, n := range []int{1, 1000, 60000} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			s := openStore(b)
			prefill(b, s, set, n) // b.Loop keeps this out of the timing
			hint := make([]netip.Addr, 1)
			for b.Loop() {
				a, _, err := s.Allocate(0, set, "bench", "eth0")
				if err != nil {
					b.Fatal(err)
				}
				hint[0] = a
				if _, err := s.Release("bench", "eth0", hint); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkStatusFree compares what STATUS asks of the store, whether each pod CIDR has a free
// address, answered by HasFree and by counting (Free), in a /22 holding 1 or 500 reservations.
func BenchmarkStatusFree(b *testing.B) {
	set := rangeSet(b, "10.2.0.0/22")
	for _, n := range []int{1, 500} {
		s := openStore(b)
		prefill(b, s, set, n)
		for name, free := range map[string]func() (bool, error){
			"HasFree": func() (bool, error) { f, err := s.HasFree(set); return f[0], err },
			"Free":    func() (bool, error) { f, err := s.Free(set); return f[0] > 0, err },
		} {
			b.Run(name+"/"+strconv.Itoa(n), func(b *testing.B) {
				for b.Loop() {
					if ok, err := free(); err != nil || !ok {
						b.Fatalf("free = %v, %v", ok, err)
					}
				}
			})
		}
	}
}
