package core

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/kubenet-dev/kubenet/ipam"
)

type attachmentKey struct{ id, ifname string }

// GC removes every attachment of this network that is not in valid: for each attachment record
// the full DEL (veth, host ports, shaping, conntrack, reservations, record); then reservations
// without a record (made by host-local, or by a kubenet crashed before its record) and left-over
// temporary files. Lock and cursor files and other networks are never touched. It tries
// everything and reports all errors together.
func GC(ctx context.Context, cfg *Config, valid []ValidAttachment) error {
	keep := map[attachmentKey]bool{}
	keepID := map[string]bool{}
	for _, v := range valid {
		keep[attachmentKey{v.ContainerID, v.IfName}] = true
		keepID[v.ContainerID] = true
	}
	store, err := ipam.Open(cfg.DataDir, cfg.Network)
	if err != nil {
		return fmt.Errorf("address store: %w", err)
	}
	defer store.Close()
	records, err := NewRecords(store.Dir()).List()
	var errs []error
	if err != nil {
		errs = append(errs, err)
	}
	for _, rec := range records {
		if keep[attachmentKey{rec.ContainerID, rec.IfName}] {
			continue
		}
		if err := ctx.Err(); err != nil {
			return errors.Join(append(errs, err)...)
		}
		att := Attachment{ContainerID: rec.ContainerID, IfName: rec.IfName}
		if err := del(ctx, cfg, store, att, &rec); err != nil {
			errs = append(errs, fmt.Errorf("collect container %q interface %q: %w", rec.ContainerID, rec.IfName, err))
		}
	}
	errs = append(errs, gcReservations(store, keep, keepID))
	errs = append(errs, gcHostPorts(cfg, store, valid))
	return errors.Join(errs...)
}

// gcReservations releases reservations whose holder is not valid, under the lock so no ADD can
// be handed an address between the listing and the release.
func gcReservations(store *ipam.Store, keep map[attachmentKey]bool, keepID map[string]bool) error {
	return withNetworkLock(store, func() error { return gcReservationsLocked(store, keep, keepID) })
}

func gcReservationsLocked(store *ipam.Store, keep map[attachmentKey]bool, keepID map[string]bool) error {
	allocs, err := store.List()
	if err != nil {
		return err
	}
	var errs []error
	var released []netip.Addr
	for _, a := range allocs {
		// Legacy files hold only a container ID: keep them while any interface of it is valid.
		if a.ContainerID != "" && (keep[attachmentKey{a.ContainerID, a.IfName}] || (a.IfName == "" && keepID[a.ContainerID])) {
			continue
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
	return errors.Join(errs...)
}
