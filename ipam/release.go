package ipam

import (
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"slices"
	"strings"

	"github.com/kubenet-dev/kubenet/internal/safedir"
)

// Allocation is one reservation file. ContainerID is empty for a file no writer could have made
// complete (empty or garbled, e.g. left by host-local crashing mid-write); GC should remove those.
// IfName is empty for legacy files that hold only the container ID.
type Allocation struct {
	Addr        netip.Addr
	ContainerID string
	IfName      string
}

// Release removes the reservations of (id, ifname), including legacy files holding only the id,
// and returns the released addresses. The caller holds the lock. hint lists the addresses the caller
// believes it holds (from its own record): when every one of them belongs to (id, ifname) they
// are released without reading the directory; otherwise, or with no hint, the directory is
// scanned. An id with no reservation is not an error (DEL must be repeatable).
func (s *Store) Release(id, ifname string, hint []netip.Addr) ([]netip.Addr, error) {
	if err := checkOwner(id, ifname); err != nil {
		return nil, fmt.Errorf("release: %w", err)
	}
	doomed, complete := []netip.Addr(nil), len(hint) > 0
	for _, a := range hint {
		o, ok, err := s.readOwner(a)
		if err != nil || !ok || !o.holds(id, ifname) {
			// Free, someone else's now, or unreadable: the record is stale, so look everywhere.
			complete = false
			break
		}
		if !slices.Contains(doomed, a) {
			doomed = append(doomed, a)
		}
	}
	if !complete {
		var err error
		if doomed, err = s.owned(id, ifname); err != nil {
			return nil, fmt.Errorf("release: %w", err)
		}
	}
	var released []netip.Addr
	var errs []error
	for _, a := range doomed {
		if err := s.remove(a); err != nil {
			errs = append(errs, err)
			continue
		}
		released = append(released, a)
	}
	return released, errors.Join(errs...)
}

// Lookup returns the addresses reserved for (id, ifname), legacy ID-only files included. It reads
// the whole directory.
func (s *Store) Lookup(id, ifname string) ([]netip.Addr, error) {
	if err := checkOwner(id, ifname); err != nil {
		return nil, fmt.Errorf("lookup: %w", err)
	}
	owned, err := s.owned(id, ifname)
	if err != nil {
		return nil, fmt.Errorf("lookup: %w", err)
	}
	return owned, nil
}

// owned reads the whole directory for the reservations of (id, ifname).
func (s *Store) owned(id, ifname string) ([]netip.Addr, error) {
	all, err := s.List()
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, al := range all {
		if al.ContainerID != "" && (owner{al.ContainerID, al.IfName}).holds(id, ifname) {
			out = append(out, al.Addr)
		}
	}
	return out, nil
}

// List returns every reservation, sorted by address. It never returns the lock, the cursors,
// temporary files or directories. Hold the lock across List and ReleaseAddr when collecting
// garbage, or an address may be handed out again in between.
func (s *Store) List() ([]Allocation, error) {
	entries, err := s.root.ReadDir()
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", s.root.Path(), err)
	}
	var out []Allocation
	for _, e := range entries {
		a, ok := reservationAddr(e)
		if !ok {
			continue
		}
		o, _, err := s.readOwner(a)
		if errors.Is(err, fs.ErrNotExist) {
			continue // released while we were reading
		}
		if err != nil {
			return nil, fmt.Errorf("list %s: %w", s.root.Path(), err)
		}
		out = append(out, Allocation{Addr: a, ContainerID: o.id, IfName: o.ifname})
	}
	slices.SortFunc(out, func(x, y Allocation) int { return x.Addr.Compare(y.Addr) })
	return out, nil
}

// ReleaseAddr removes the reservation of a, whoever holds it; for garbage collection. The caller
// holds the lock. A free address is not an error.
func (s *Store) ReleaseAddr(a netip.Addr) error {
	if !a.IsValid() || a.Zone() != "" {
		return fmt.Errorf("release %q: not a reservation address", a)
	}
	return s.remove(a)
}

// RemoveTemp removes the temporary files that an allocation killed halfway left behind, and
// returns how many it removed. The caller holds the lock, so no live writer owns such a file.
// Left-over files are harmless (nothing reads them); this only reclaims their space.
func (s *Store) RemoveTemp() (int, error) {
	entries, err := s.root.ReadDir()
	if err != nil {
		return 0, fmt.Errorf("remove temporary files in %s: %w", s.root.Path(), err)
	}
	n := 0
	var errs []error
	for _, e := range entries {
		if !e.Type().IsRegular() || !strings.HasPrefix(e.Name(), tempPrefix) {
			continue
		}
		if err := s.root.Remove(e.Name()); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove temporary file: %w", err))
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}

// remove deletes a's reservation file (or whatever else stands under a's name, never what a
// symlink there points to); a file already gone counts as removed.
func (s *Store) remove(a netip.Addr) error {
	if err := s.root.RemoveAll(a.String()); err != nil {
		return fmt.Errorf("release %s: %w", a, err)
	}
	return nil
}

// Damaged tells whether a's reservation exists but names no owner: content no writer produces
// (garbage, truncated, empty), or a symlink or a directory under a's name.
func (s *Store) Damaged(a netip.Addr) (bool, error) {
	_, ok, err := s.readOwner(a)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("reservation %s: %w", a, err)
	}
	return !ok, nil
}

// Torn tells whether a's reservation file is damaged (see Damaged) or holds a proper prefix of
// what a reservation of (id, ifname) holds: what a write of it cut short leaves (host-local
// creates the file and then writes it), which may parse as another owner ("id\r\ne").
func (s *Store) Torn(a netip.Addr, id, ifname string) (bool, error) {
	data, err := s.root.ReadFile(a.String())
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	case errors.Is(err, safedir.ErrNotRegular):
		return true, nil
	case err != nil:
		return false, fmt.Errorf("reservation %s: %w", a, err)
	}
	want := owner{id, ifname}.content()
	if len(data) < len(want) && strings.HasPrefix(string(want), string(data)) {
		return true, nil
	}
	_, ok := parseOwner(data)
	return !ok, nil
}

// Repair makes a's reservation a reservation of (id, ifname), whatever it says now: the caller
// knows from its own records whose the address is (a damaged or torn file). The caller holds the
// lock.
func (s *Store) Repair(a netip.Addr, id, ifname string) error {
	if err := checkOwner(id, ifname); err != nil {
		return fmt.Errorf("repair %s: %w", a, err)
	}
	if o, ok, err := s.readOwner(a); err == nil && ok && o == (owner{id, ifname}) {
		return nil
	}
	tmp, err := s.writeTemp("ip", owner{id, ifname}.content(), true)
	if err != nil {
		return fmt.Errorf("repair %s: %w", a, err)
	}
	defer s.removeTemp(tmp)
	if err := s.remove(a); err != nil {
		return err
	}
	if err := s.claim(tmp, a); err != nil {
		return fmt.Errorf("repair %s: %w", a, err)
	}
	return nil
}
