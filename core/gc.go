package core

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"slices"
	"time"

	"github.com/kubenet-dev/kubenet/hostport"
)

// Keeper tells GC which attachments to leave alone.
type Keeper struct {
	// InUse reports whether the attachment (containerID, ifName) is in use. ifName is "" for a
	// legacy reservation file that names only its container. GC calls it for every attachment
	// it finds, some of them under the network lock: it must not block.
	InUse func(containerID, ifName string) bool
	// WrittenBefore, when set, spares every attachment whose record or reservation was written
	// at or after it, judged from the files' modification times under the network lock. A
	// caller that learnt which attachments are in use at time T and passes T minus a grace
	// period never collects an attachment whose ADD was still running at T: ADD writes the
	// reservations and the record first, under the same lock.
	WrittenBefore time.Time
	// listed are the attachments InUse names, when the caller knows them (CNI GC's list).
	listed []attachmentKey
	// deciding, when set (tests), runs while GC decides under an attachment's shared lock
	// whether to spare it.
	deciding func(att Attachment)
}

// keeps reports whether att's host-side state (found without its record) stays: the attachment
// is in use, or its record is too young to collect. ADD writes the record before anything else.
func (k Keeper) keeps(records Records, att Attachment) bool {
	if k.InUse(att.ContainerID, att.IfName) {
		return true
	}
	if k.WrittenBefore.IsZero() {
		return false
	}
	written, err := records.Written(att)
	// Without a record the owner's ADD is over (crashed or rolled back); a record that cannot be
	// read is kept, collecting is never a guess.
	return !errors.Is(err, fs.ErrNotExist) && (err != nil || k.spares(written))
}

// spares reports whether a file written at written is too young to collect.
func (k Keeper) spares(written time.Time) bool {
	return !k.WrittenBefore.IsZero() && !written.Before(k.WrittenBefore)
}

// GCReport is what one GC removed.
type GCReport struct {
	Attachments []Record     // attachments collected through their record (the full DEL)
	Addresses   []netip.Addr // reservations released that no record described
}

// GC removes every attachment of this network that is not in valid (CNI GC): see Collect. A
// list with an entry that names no valid attachment is refused as a whole (code 7): read
// leniently, an entry without its interface name would protect nothing.
func GC(ctx context.Context, cfg *Config, valid []ValidAttachment) error {
	if err := ValidateAttachments(valid); err != nil {
		return err
	}
	k := Keeper{InUse: validAttachments(valid)}
	for _, v := range valid {
		k.listed = append(k.listed, v.key())
	}
	_, err := Collect(ctx, cfg, k)
	return err
}

// validAttachments is the InUse of a cni.dev/valid-attachments list. A legacy reservation
// (container ID only) is in use while any interface of its container is.
func validAttachments(valid []ValidAttachment) func(id, ifName string) bool {
	keep := map[attachmentKey]bool{}
	keepID := map[string]bool{}
	for _, v := range valid {
		keep[v.key()] = true
		keepID[v.ContainerID] = true
	}
	return func(id, ifName string) bool {
		if ifName == "" {
			return keepID[id]
		}
		return keep[attachmentKey{id, ifName}]
	}
}

// Collect removes every attachment of this network that k does not keep, in an order that never
// leaves a rule or a link of an attachment pointing at a free address: first host-port
// reservations and map elements of owners not kept; then, for each attachment record (readable
// or not) not kept, the full DEL under its attachment lock; then reservations without a record
// (made by host-local, or by a kubenet that crashed before its record: their holders' derived
// links go first), left-over temporary files and junk in the records directory. An attachment
// whose teardown failed keeps its addresses. Lock and cursor files and other networks are never
// touched. One broken file or failed attachment never stops the rest: Collect tries everything
// and reports all errors together, with what it removed.
func Collect(ctx context.Context, cfg *Config, k Keeper) (report GCReport, err error) {
	// The runtime's capability arguments would be taken for every attachment's host ports.
	gcCfg := *cfg
	gcCfg.Runtime = RuntimeConfig{}
	cfg = &gcCfg
	h, err := openAsFound(cfg, nil)
	if err != nil {
		return report, err
	}
	defer func() { err = errors.Join(err, h.Close()) }()
	records := h.dir.records

	errs := []error{h.gcHostPorts(k)}
	scan, err := records.Scan()
	errs = append(errs, err)
	failed := map[attachmentKey]bool{}
	collect := func(atts []Attachment) {
		for _, att := range atts {
			key := att.key()
			if k.InUse(att.ContainerID, att.IfName) || failed[key] {
				continue
			}
			if err := ctx.Err(); err != nil {
				errs = append(errs, err)
				return
			}
			rec, released, err := h.collectOne(ctx, att, k)
			if err != nil {
				failed[key] = true
				errs = append(errs, fmt.Errorf("collect container %q interface %q: %w", att.ContainerID, att.IfName, err))
				continue
			}
			if rec != nil {
				report.Attachments = append(report.Attachments, *rec)
			} else {
				report.Addresses = append(report.Addresses, released...)
			}
		}
	}
	collect(append(scan.attachments(), scan.Corrupt...))
	orphans, released, err := h.dir.gcReservations(scan, unrecorded(scan, k), k, failed)
	report.Addresses = append(report.Addresses, released...)
	errs = append(errs, err)
	collect(orphans)
	errs = append(errs, h.dir.withLock(func() error { return records.RemoveFiles(append(scan.Garbage, scan.Temp...)) }))
	// The isolation sweep works in the backend in use now, which an ADD may have switched
	// since GC opened.
	if err := h.findBackend(); err != nil {
		errs = append(errs, err)
	} else {
		errs = append(errs, h.gcIsolation(k))
	}
	return report, errors.Join(errs...)
}

// collectOne tears att down (Del's teardown) unless k spares it, and returns its record when it
// had a readable one, and the addresses it released. The attachment lock comes first: an ADD of
// att still running finishes before GC decides, and the age of what it wrote then spares it.
//
// With a cutoff, GC first decides under the lock taken shared. An attachment it spares stays
// as it is, and GC writes nothing for it; held exclusively, the lock would make a backend
// switch's rebuild (which takes it shared, without waiting) pass over a pod that stays,
// leaving it out of the new backend's isolation (TestGCSparedPodIsolatedAfterSwitch).
func (h *handle) collectOne(ctx context.Context, att Attachment, k Keeper) (rec *Record, released []netip.Addr, err error) {
	if !k.WrittenBefore.IsZero() {
		spared, err := h.decideShared(att, k)
		if err != nil || spared {
			return nil, nil, err
		}
	}
	unlock, err := h.dir.lockAttachment(att.key())
	if err != nil {
		return nil, nil, err
	}
	defer func() { err = errors.Join(err, unlock()) }()
	// Decided again: an ADD of att may have run since the shared lock was let go.
	if spared, err := h.dir.recordSpared(att, k); err != nil || spared {
		return nil, nil, err
	}
	// The backend is read again under the attachment lock, as DEL reads it: an ADD may have
	// switched the node since GC opened, and the switch's rebuild put this attachment's isolation
	// into the new backend while it was not locked; removing it from the backend GC opened with
	// would leave its permissions to send there (TestGCRacesBackendSwitch). A switch from now
	// on passes over the attachment, which GC holds.
	if err := h.findBackend(); err != nil {
		return nil, nil, err
	}
	rec, err = h.dir.records.Load(att)
	var corrupt *CorruptRecordError
	if err != nil && !errors.As(err, &corrupt) {
		return nil, nil, err
	}
	released, err = h.del(ctx, att.key(), rec, corrupt != nil)
	if err != nil {
		return nil, nil, err
	}
	return rec, released, nil
}

// decideShared reports whether k spares att, deciding under att's lock taken shared (an ADD or
// DEL of att in flight finishes first).
func (h *handle) decideShared(att Attachment, k Keeper) (spared bool, err error) {
	unlock, err := h.dir.lockAttachmentShared(att.key())
	if err != nil {
		return false, err
	}
	defer func() { err = errors.Join(err, unlock()) }()
	if k.deciding != nil {
		k.deciding(att)
	}
	return h.dir.recordSpared(att, k)
}

// recordSpared reports, under the network lock, whether att's record is too young to collect.
// Without a cutoff nothing is spared; without a record there is no age to judge (orphan
// reservations are judged by their own age in gcReservations).
func (d *networkDir) recordSpared(att Attachment, k Keeper) (bool, error) {
	if k.WrittenBefore.IsZero() {
		return false, nil
	}
	spared := false
	err := d.withLock(func() error {
		written, err := d.records.Written(att)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		spared = err == nil && k.spares(written)
		return err
	})
	return spared, err
}

// gcReservations releases, under the lock (so no ADD can be handed an address between the
// listing and the release, and none that an ADD made after k's cutoff is taken from it), the
// reservations whose holder k does not keep and from whose key no kubenet object derives
// (unreadable files, host-local's ID-only files), and returns the other holders that are not
// kept, for a full teardown (their derived links first), with the addresses it released.
// Holders in failed keep their addresses. A reservation whose address a record in scan lists
// belongs to that record's attachment, whatever the file says (damaged, torn): repaired when the
// attachment is kept, left alone when its teardown failed.
//
// Kept attachments without a readable record (unknown) may own reservations no record accounts
// for: a file torn from one of theirs ("id\r\ne" of "id\r\neth0") is repaired for it, and damaged
// files that name nobody stay while there are such attachments. Releasing one could hand a live
// pod's address to the next pod; a leaked address until the next GC is the price.
func (d *networkDir) gcReservations(scan RecordScan, unknown []attachmentKey, k Keeper, failed map[attachmentKey]bool) ([]Attachment, []netip.Addr, error) {
	var orphans []Attachment
	var released []netip.Addr
	err := d.withLock(func() error {
		allocs, err := d.store.List()
		if err != nil {
			return err
		}
		var errs []error
		seen := map[attachmentKey]bool{}
		for _, a := range allocs {
			key := attachmentKey{a.ContainerID, a.IfName}
			if a.ContainerID != "" && k.InUse(a.ContainerID, a.IfName) || failed[key] {
				continue
			}
			if claimant, ok := scan.claimant(a.Addr); ok && (k.InUse(claimant.ContainerID, claimant.IfName) || failed[claimant]) {
				if !failed[claimant] {
					errs = append(errs, d.store.Repair(a.Addr, claimant.ContainerID, claimant.IfName))
				}
				continue
			}
			if a.ContainerID == "" && len(unknown) > 0 {
				continue
			}
			if owner, ok, err := d.tornOf(a.Addr, unknown); err != nil || ok {
				errs = append(errs, err)
				if ok {
					errs = append(errs, d.store.Repair(a.Addr, owner.ContainerID, owner.IfName))
				}
				continue
			}
			if !k.WrittenBefore.IsZero() {
				written, err := d.store.Written(a.Addr)
				if errors.Is(err, fs.ErrNotExist) {
					continue
				}
				if err != nil {
					errs = append(errs, err)
					continue
				}
				if k.spares(written) {
					continue
				}
			}
			if att := (Attachment{ContainerID: a.ContainerID, IfName: a.IfName}); att.Validate() == nil {
				if !seen[key] {
					seen[key] = true
					orphans = append(orphans, att)
				}
				continue
			}
			if err := d.store.ReleaseAddr(a.Addr); err != nil {
				errs = append(errs, err)
				continue
			}
			released = append(released, a.Addr)
		}
		errs = append(errs, flushConntrack(released))
		if _, err := d.store.RemoveTemp(); err != nil {
			errs = append(errs, err)
		}
		return errors.Join(errs...)
	})
	return orphans, released, err
}

// unrecorded returns the kept attachments that have no readable record in scan: those the
// caller listed without one, and those kept whose record cannot be read (a Keeper without a list
// names no others).
func unrecorded(scan RecordScan, k Keeper) []attachmentKey {
	recorded := map[attachmentKey]bool{}
	for _, rec := range scan.Records {
		recorded[rec.key()] = true
	}
	var out []attachmentKey
	for _, key := range k.listed {
		if !recorded[key] {
			out = append(out, key)
		}
	}
	for _, a := range scan.Corrupt {
		if key := a.key(); k.InUse(a.ContainerID, a.IfName) && !slices.Contains(out, key) {
			out = append(out, key)
		}
	}
	return out
}

// tornOf returns the attachment among candidates whose reservation a's file is a torn write of.
func (d *networkDir) tornOf(a netip.Addr, candidates []attachmentKey) (attachmentKey, bool, error) {
	for _, c := range candidates {
		torn, err := d.store.Torn(a, c.ContainerID, c.IfName)
		if err != nil || torn {
			return c, torn, err
		}
	}
	return attachmentKey{}, false, nil
}

// gcHostPorts removes host-port reservations and map elements whose owner k does not keep: the
// records' DELs removed those they knew; this catches what no record describes. ADD writes the
// record before any host port, so an owner whose record is younger than k's cutoff is kept.
func (h *handle) gcHostPorts(k Keeper) error {
	keep := func(o hostport.Owner) bool {
		return k.keeps(h.dir.records, attachmentKey(o).attachment())
	}
	err := h.dir.withLock(func() error {
		hp, err := h.hostportsNow()
		if err != nil {
			return err
		}
		_, err = hostport.GC(hp, keep)
		return err
	})
	if err != nil {
		return fmt.Errorf("host ports: %w", err)
	}
	return nil
}

// gcIsolation removes the isolation of every bridge port whose attachment k does not keep: the
// records' DELs removed those they knew; this catches what no record describes. An nftables
// element names its attachment in its comment; one whose comment does not lead back to its port
// (none, or garbled) is removed, since an element is a permission to send. ebtables rules carry
// no comment: their port is looked up among the records' attachments.
func (h *handle) gcIsolation(k Keeper) error {
	records := h.dir.records
	var byPort map[string]Attachment
	_, err := h.nf.gcIsolation(h.cfg.Network, func(port, owner string) bool {
		if owner == "" {
			if byPort == nil {
				byPort = map[string]Attachment{}
				scan, err := records.Scan()
				if err != nil {
					return true // unknown: nothing is removed on a guess
				}
				for _, att := range append(scan.Corrupt, scan.attachments()...) {
					byPort[att.key().names(h.cfg.Network).HostVeth] = att
				}
			}
			att, ok := byPort[port]
			return ok && k.keeps(records, att)
		}
		key, ok := ownerKey(owner)
		return ok && key.names(h.cfg.Network).HostVeth == port && k.keeps(records, key.attachment())
	})
	if err != nil {
		return fmt.Errorf("isolation: %w", err)
	}
	return nil
}
