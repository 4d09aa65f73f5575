package ipam

import (
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
)

// Holds reports whether a is reserved for (id, ifname); legacy ID-only files count. It reads one
// file, so CHECK can confirm an attachment's reservations without scanning the directory.
func (s *Store) Holds(a netip.Addr, id, ifname string) (bool, error) {
	o, ok, err := s.readOwner(a)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("reservation %s: %w", a, err)
	}
	return ok && o.holds(id, ifname), nil
}

// Free returns how many addresses of set are not reserved. It lists file names only (no file is
// read), so readiness checks that poll it stay cheap.
func (s *Store) Free(set RangeSet) (uint64, error) {
	set, err := set.normalize()
	if err != nil {
		return 0, err
	}
	var size uint64
	for _, r := range set {
		size += r.Size()
	}
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return 0, fmt.Errorf("list %s: %w", s.dir, err)
	}
	var used uint64
	for _, e := range entries {
		if a, ok := reservationAddr(e); ok && set.indexOf(a) >= 0 {
			used++
		}
	}
	if used >= size {
		return 0, nil
	}
	return size - used, nil
}
