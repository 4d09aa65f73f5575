package core

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"strings"
	"time"

	"github.com/kubenet-dev/kubenet/hostport"
	"github.com/kubenet-dev/kubenet/ipam"
	"github.com/kubenet-dev/kubenet/isolation"
)

type attachmentKey struct{ id, ifname string }

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

// GC removes every attachment of this network that is not in valid (CNI GC): see Collect.
func GC(ctx context.Context, cfg *Config, valid []ValidAttachment) error {
	_, err := Collect(ctx, cfg, Keeper{InUse: validAttachments(valid)})
	return err
}

// validAttachments is the InUse of a cni.dev/valid-attachments list. A legacy reservation
// (container ID only) is in use while any interface of its container is.
func validAttachments(valid []ValidAttachment) func(id, ifName string) bool {
	keep := map[attachmentKey]bool{}
	keepID := map[string]bool{}
	for _, v := range valid {
		keep[attachmentKey{v.ContainerID, v.IfName}] = true
		keepID[v.ContainerID] = true
	}
	return func(id, ifName string) bool {
		if ifName == "" {
			return keepID[id]
		}
		return keep[attachmentKey{id, ifName}]
	}
}

// Collect removes every attachment of this network that k does not keep: for each attachment
// record the full DEL (veth, host ports, shaping, conntrack, reservations, record); then
// reservations without a record (made by host-local, or by a kubenet crashed before its record),
// host-port reservations and map elements of owners not kept, and left-over temporary files.
// Lock and cursor files and other networks are never touched. It tries everything and reports
// all errors together, with what it removed.
func Collect(ctx context.Context, cfg *Config, k Keeper) (GCReport, error) {
	var report GCReport
	store, err := ipam.Open(cfg.DataDir, cfg.Network)
	if err != nil {
		return report, fmt.Errorf("address store: %w", err)
	}
	defer store.Close()
	records := NewRecords(store.Dir())
	list, err := records.List()
	var errs []error
	if err != nil {
		errs = append(errs, err)
	}
	for _, rec := range list {
		if k.InUse(rec.ContainerID, rec.IfName) {
			continue
		}
		if err := ctx.Err(); err != nil {
			return report, errors.Join(append(errs, err)...)
		}
		att := Attachment{ContainerID: rec.ContainerID, IfName: rec.IfName}
		young, err := recordSpared(store, records, att, k)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if young {
			continue
		}
		// From here the attachment cannot come back to life: while its record exists no ADD of
		// the same container and interface gets past the reservation.
		if err := del(ctx, cfg, store, att, &rec); err != nil {
			errs = append(errs, fmt.Errorf("collect container %q interface %q: %w", rec.ContainerID, rec.IfName, err))
			continue
		}
		report.Attachments = append(report.Attachments, rec)
	}
	released, err := gcReservations(store, k)
	report.Addresses = released
	errs = append(errs, err, gcHostPorts(cfg, store, records, k), gcIsolation(cfg, records, k))
	return report, errors.Join(errs...)
}

// recordSpared reports, under the network lock, whether att's record is too young to collect or
// already gone (a DEL ran meanwhile).
func recordSpared(store *ipam.Store, records Records, att Attachment, k Keeper) (bool, error) {
	if k.WrittenBefore.IsZero() {
		return false, nil
	}
	spared := false
	err := withNetworkLock(store, func() error {
		written, err := records.Written(att)
		if errors.Is(err, fs.ErrNotExist) {
			spared = true
			return nil
		}
		spared = err == nil && k.spares(written)
		return err
	})
	return spared, err
}

// gcReservations releases reservations whose holder k does not keep, under the lock so no ADD
// can be handed an address between the listing and the release, and none that an ADD made
// after k's cutoff is taken from it.
func gcReservations(store *ipam.Store, k Keeper) ([]netip.Addr, error) {
	var released []netip.Addr
	err := withNetworkLock(store, func() error {
		var err error
		released, err = gcReservationsLocked(store, k)
		return err
	})
	return released, err
}

func gcReservationsLocked(store *ipam.Store, k Keeper) ([]netip.Addr, error) {
	allocs, err := store.List()
	if err != nil {
		return nil, err
	}
	var errs []error
	var released []netip.Addr
	for _, a := range allocs {
		if a.ContainerID != "" && k.InUse(a.ContainerID, a.IfName) {
			continue
		}
		if !k.WrittenBefore.IsZero() {
			written, err := store.Written(a.Addr)
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
		if err := store.ReleaseAddr(a.Addr); err != nil {
			errs = append(errs, err)
			continue
		}
		released = append(released, a.Addr)
	}
	errs = append(errs, flushConntrack(released))
	if _, err := store.RemoveTemp(); err != nil {
		errs = append(errs, err)
	}
	return released, errors.Join(errs...)
}

// gcHostPorts removes host-port reservations and map elements whose owner k does not keep: the
// records' DELs removed those they knew; this catches what no record describes. ADD writes the
// record before any host port, so an owner whose record is younger than k's cutoff is kept.
func gcHostPorts(cfg *Config, store *ipam.Store, records Records, k Keeper) error {
	keep := func(o hostport.Owner) bool {
		return k.keeps(records, Attachment{ContainerID: o.ContainerID, IfName: o.IfName})
	}
	err := withNetworkLock(store, func() error {
		_, err := hostport.GC(hostportConfig(cfg, store.Dir()), keep)
		return err
	})
	if err != nil {
		return fmt.Errorf("host ports: %w", err)
	}
	return nil
}

// gcIsolation removes the isolation elements of every bridge port whose attachment k does not
// keep: the records' DELs removed those they knew; this catches what no record describes. An
// element names its attachment in its comment; one whose comment does not lead back to its port
// (none, or garbled) is removed, since an element is a permission to send.
func gcIsolation(cfg *Config, records Records, k Keeper) error {
	_, err := isolation.GC(cfg.Network, func(port, owner string) bool {
		id, ifName, ok := strings.Cut(owner, "/")
		att := Attachment{ContainerID: id, IfName: ifName}
		return ok && NamesFor(cfg.Network, att).HostVeth == port && k.keeps(records, att)
	})
	if err != nil {
		return fmt.Errorf("isolation: %w", err)
	}
	return nil
}
