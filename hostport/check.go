package hostport

import (
	"errors"
	"fmt"
	"slices"

	"github.com/google/nftables"

	"github.com/kubenet-dev/kubenet/internal/nft"
)

// Check verifies that owner's entries are in place: reserved in the index, present in the
// kernel maps with the right destination, and the fixed rules as planned (by expressions, not
// only by comment). It reads the maps
// (CHECK may cost what the node holds; ADD and DEL may not) and changes nothing.
func Check(cfg Config, owner Owner, entries []Entry) error {
	if len(entries) == 0 {
		return nil
	}
	ix := NewIndex(cfg.Dir)
	for _, e := range entries {
		r, ok, err := ix.Lookup(e.Key)
		switch {
		case err != nil:
			return err
		case !ok:
			return fmt.Errorf("%s is not reserved", e.Key)
		case r.Owner != owner:
			return fmt.Errorf("%s is held by container %q interface %q, not by this attachment", e.Key, r.Owner.ContainerID, r.Owner.IfName)
		case r.Entry != e:
			return fmt.Errorf("%s is reserved for %s, want %s", e.Key, r.Entry, e)
		}
	}
	kernel, err := cfg.backend().list(cfg, KeysOf(entries))
	if err != nil {
		return err
	}
	for _, e := range entries {
		if !slices.ContainsFunc(kernel, func(r Reservation) bool { return r.Entry == e && r.Owner == owner }) {
			return fmt.Errorf("%s: %s", e, cfg.backend().home(cfg, e.Key))
		}
	}
	return checkRules(cfg)
}

// checkRules compares the fixed chains with Rules, by comment and by expressions.
func checkRules(cfg Config) error {
	if err := CheckNode(cfg); err != nil {
		return fmt.Errorf("hostport rules of network %q: %w", cfg.Network, err)
	}
	return nil
}

// listElements returns the elements of the named maps of the network; missing maps are empty.
// Owner is read from the element comment (zero when the element has none).
func listElements(c *nftables.Conn, network string, maps ...string) ([]Reservation, error) {
	table := nft.InetTable(network)
	var out []Reservation
	for _, name := range maps {
		s, err := c.GetSetByName(table, name)
		if err != nil {
			continue // no such map (yet): nothing in it
		}
		els, err := c.GetSetElements(s)
		if err != nil {
			return nil, fmt.Errorf("hostport map %s of network %q: %w", name, network, err)
		}
		for _, el := range els {
			e, ok := decodeElement(name, el)
			if !ok {
				continue
			}
			// An element without a comment kubenet could have written has no owner (GC leaves it).
			o, _ := parseOwner(el.Comment)
			if o.Valid() != nil {
				o = Owner{}
			}
			out = append(out, Reservation{Entry: e, Owner: o})
		}
	}
	return out, nil
}

// List returns what the network holds: the index's reservations and the kernel's elements.
// In a consistent state both list the same reservations.
func List(cfg Config) (index, kernel []Reservation, err error) {
	if index, err = NewIndex(cfg.Dir).All(); err != nil {
		return nil, nil, err
	}
	kernel, err = cfg.backend().list(cfg, nil)
	return index, kernel, err
}

// GC removes every reservation and map element whose owner keep rejects, and returns them. An
// element that carries no owner comment was not made by kubenet and stays. Damaged index files
// are repaired from the kernel's element of their key when its owner is kept, else removed; an
// element whose owner is kept gets its index file back if it lost it, so the key stays refused
// to others. Temporary files of killed writers go.
func GC(cfg Config, keep func(Owner) bool) ([]Reservation, error) {
	ix := NewIndex(cfg.Dir)
	index, damaged, err := ix.scan()
	if err != nil {
		return nil, err
	}
	kernel, err := cfg.backend().list(cfg, nil)
	if err != nil {
		return nil, err
	}
	var stale, staleIndex []Reservation
	for i, r := range append(index, kernel...) {
		if r.Owner.ContainerID == "" || keep(r.Owner) || slices.Contains(stale, r) {
			continue
		}
		stale = append(stale, r)
		if i < len(index) {
			// Only files found as stale are removed: a kernel element left behind by X must not
			// take the file of Y, who holds the key now.
			staleIndex = append(staleIndex, r)
		}
	}
	// A damaged file cannot say whose it is: it is rewritten from the kernel's element of its key
	// when that element's owner is kept (in place: the key is never without a file, should GC
	// be killed here), and removed otherwise. A kept element whose file is missing gets it back.
	errs := []error{ix.RemoveTemp()}
	for _, k := range damaged {
		i := slices.IndexFunc(kernel, func(r Reservation) bool { return r.Key == k && r.Owner.ContainerID != "" && keep(r.Owner) })
		if i < 0 {
			errs = append(errs, ix.remove([]Reservation{{Entry: Entry{Key: k}}}))
			continue
		}
		errs = append(errs, ix.rewrite(kernel[i]))
		index = append(index, kernel[i])
	}
	errs = append(errs, repairIndex(ix, index, kernel, keep))
	if len(stale) == 0 {
		return nil, errors.Join(append(errs, ix.remove(staleIndex))...)
	}
	entries, err := unmap(cfg, stale, staleIndex)
	if entries == nil {
		return nil, errors.Join(append(errs, err)...)
	}
	return stale, errors.Join(append(errs, FlushUDP(entries), err)...)
}

// repairIndex rewrites the index file of every element whose owner is kept and whose key has no
// readable file (lost, or damaged and removed), so the key stays refused to other attachments.
func repairIndex(ix Index, index, kernel []Reservation, keep func(Owner) bool) error {
	var errs []error
	for _, r := range kernel {
		if r.Owner.ContainerID == "" || !keep(r.Owner) || slices.ContainsFunc(index, func(i Reservation) bool { return i.Key == r.Key }) {
			continue
		}
		errs = append(errs, ix.Reserve(r.Owner, []Entry{r.Entry}))
	}
	return errors.Join(errs...)
}
