package ipam

import (
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
)

// ErrExhausted is wrapped by Allocate when every address of the range set is reserved.
var ErrExhausted = errors.New("no IP addresses available")

// ErrInUse is wrapped by AllocateAddr when the requested address is reserved already.
var ErrInUse = errors.New("address already reserved")

// Allocate reserves one free address of the set for (id, ifname) and returns it with its range.
// The caller holds the lock. The search is host-local's round robin: it starts after the address in
// last_reserved_ip.<setIndex>, wraps across the ranges of the set, skips gateway, network and
// broadcast, and gives up after one full cycle with an error wrapping ErrExhausted.
//
// Every candidate costs one link(2); the cursor makes the first candidate free in the common case.
func (s *Store) Allocate(setIndex int, set RangeSet, id, ifname string) (netip.Addr, Range, error) {
	set, err := prepare(setIndex, set, id, ifname)
	if err != nil {
		return netip.Addr{}, Range{}, fmt.Errorf("allocate: %w", err)
	}
	tmp, err := s.writeTemp("ip", owner{id, ifname}.content(), true)
	if err != nil {
		return netip.Addr{}, Range{}, fmt.Errorf("allocate in range set %s: %w", set, err)
	}
	defer s.removeTemp(tmp)

	start := set.after(s.readCursor(setIndex))
	for p := start; ; {
		if r := set[p.i]; !r.excluded(p.addr) {
			err := s.claim(tmp, p.addr)
			if err == nil {
				if err := s.commit(setIndex, p.addr); err != nil {
					return netip.Addr{}, Range{}, err
				}
				return p.addr, r, nil
			}
			if !errors.Is(err, fs.ErrExist) {
				return netip.Addr{}, Range{}, fmt.Errorf("reserve %s: %w", p.addr, err)
			}
		}
		if p = set.next(p); p == start {
			// Same words as host-local, which users and scripts grep for.
			return netip.Addr{}, Range{}, fmt.Errorf("%w in range set %s", ErrExhausted, set)
		}
	}
}

// AllocateAddr reserves the requested address addr of the set for (id, ifname). The caller holds
// the lock. Like host-local it also moves the set's cursor to addr.
func (s *Store) AllocateAddr(setIndex int, set RangeSet, addr netip.Addr, id, ifname string) (Range, error) {
	set, err := prepare(setIndex, set, id, ifname)
	if err != nil {
		return Range{}, fmt.Errorf("allocate %s: %w", addr, err)
	}
	i := set.indexOf(addr)
	if i < 0 {
		return Range{}, fmt.Errorf("requested address %s is not in range set %s", addr, set)
	}
	r := set[i]
	if r.excluded(addr) {
		return Range{}, fmt.Errorf("requested address %s is the gateway, network or broadcast address of %s", addr, r)
	}
	tmp, err := s.writeTemp("ip", owner{id, ifname}.content(), true)
	if err != nil {
		return Range{}, fmt.Errorf("reserve %s: %w", addr, err)
	}
	defer s.removeTemp(tmp)

	if err := s.claim(tmp, addr); errors.Is(err, fs.ErrExist) {
		return Range{}, fmt.Errorf("reserve %s: %w (%s)", addr, ErrInUse, s.describe(addr))
	} else if err != nil {
		return Range{}, fmt.Errorf("reserve %s: %w", addr, err)
	}
	if err := s.commit(setIndex, addr); err != nil {
		return Range{}, err
	}
	return r, nil
}

// prepare checks the arguments shared by both allocation calls and normalizes the set.
func prepare(setIndex int, set RangeSet, id, ifname string) (RangeSet, error) {
	if setIndex < 0 {
		return nil, fmt.Errorf("invalid range set index %d", setIndex)
	}
	if err := checkOwner(id, ifname); err != nil {
		return nil, err
	}
	return set.normalize()
}

// commit moves the cursor to a fresh reservation. On failure the reservation is removed again:
// the caller never learns the address, so nobody would ever release it.
//
// The directory is deliberately not fsynced: a reservation lost with the page cache in a power
// failure belonged to a pod that died with that kernel too. What must never reach the disk is a
// name without its content, and the synced temp file already rules that out.
func (s *Store) commit(setIndex int, a netip.Addr) error {
	if err := s.writeCursor(setIndex, a); err != nil {
		_ = s.root.Remove(a.String())
		return fmt.Errorf("reserve %s: %w", a, err)
	}
	return nil
}

// describe says who holds a, for error messages.
func (s *Store) describe(a netip.Addr) string {
	o, ok, err := s.readOwner(a)
	switch {
	case err != nil:
		return err.Error()
	case !ok:
		return "held by an unreadable reservation"
	}
	return "held by " + o.String()
}
