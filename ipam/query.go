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

// freeProbes bounds the candidates HasFree looks at before it counts.
const freeProbes = 8

// HasFree tells, for each set (in the order of sets; set i is Allocate's setIndex i), whether an
// address of it is free. It looks first where Allocate looks next, after the set's cursor, one
// lstat per candidate: on a node that is not nearly full the first candidate is free, and the
// answer costs no listing of the directory, whose size grows with the pods (Free lists it). Only
// a set whose first freeProbes candidates are all reserved is counted.
func (s *Store) HasFree(sets ...RangeSet) ([]bool, error) {
	out := make([]bool, len(sets))
	var undecided []int
	for i := range sets {
		set, err := sets[i].normalize()
		if err != nil {
			return nil, err
		}
		found, err := s.probeFree(i, set)
		if err != nil {
			return nil, err
		}
		if out[i] = found; !found {
			undecided = append(undecided, i)
		}
	}
	if len(undecided) == 0 {
		return out, nil
	}
	free, err := s.Free(sets...)
	if err != nil {
		return nil, err
	}
	for _, i := range undecided {
		out[i] = free[i] > 0
	}
	return out, nil
}

// probeFree tells whether one of the first freeProbes candidates Allocate would try for set
// (setIndex) is free; false says nothing about the others.
func (s *Store) probeFree(setIndex int, set RangeSet) (bool, error) {
	start := set.after(s.readCursor(setIndex))
	for p, n := start, 0; n < freeProbes; n++ {
		if !set[p.i].excluded(p.addr) {
			_, err := s.root.Lstat(p.addr.String())
			if errors.Is(err, fs.ErrNotExist) {
				return true, nil
			}
			if err != nil {
				return false, fmt.Errorf("reservation %s: %w", p.addr, err)
			}
		}
		if p = set.next(p); p == start {
			break
		}
	}
	return false, nil
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
		return nil, fmt.Errorf("list %s: %w", s.root.Path(), err)
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
