package ipam

import (
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"time"
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

// Written returns when the reservation of a was made (its file's modification time: a
// reservation file is written once and never changed). The error wraps fs.ErrNotExist when a is
// free. Garbage collectors that spare young reservations call it under the lock.
func (s *Store) Written(a netip.Addr) (time.Time, error) {
	st, err := s.root.Lstat(a.String())
	if err != nil {
		return time.Time{}, fmt.Errorf("reservation %s: %w", a, err)
	}
	return time.Unix(st.Mtim.Unix()), nil
}

// Free returns how many addresses of each set are not reserved, in the order of sets. It lists
// the file names once for all of them (no file is read), so readiness checks that poll it stay
// cheap.
func (s *Store) Free(sets ...RangeSet) ([]uint64, error) {
	normal := make([]RangeSet, len(sets))
	size := make([]uint64, len(sets))
	for i := range sets {
		set, err := sets[i].normalize()
		if err != nil {
			return nil, err
		}
		normal[i] = set
		for _, r := range set {
			size[i] += r.Size()
		}
	}
	entries, err := s.root.ReadDir()
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", s.dir, err)
	}
	used := make([]uint64, len(sets))
	for _, e := range entries {
		a, ok := reservationAddr(e)
		if !ok {
			continue
		}
		for i, set := range normal {
			if set.indexOf(a) >= 0 {
				used[i]++
			}
		}
	}
	free := make([]uint64, len(sets))
	for i := range sets {
		if used[i] < size[i] {
			free[i] = size[i] - used[i]
		}
	}
	return free, nil
}
