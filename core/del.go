package core

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"

	"github.com/kubenet-dev/kubenet/hostport"
	"github.com/kubenet-dev/kubenet/internal/conntrack"
	"github.com/kubenet-dev/kubenet/internal/links"
	"github.com/kubenet-dev/kubenet/ipam"
	"github.com/kubenet-dev/kubenet/isolation"
	"github.com/kubenet-dev/kubenet/shaping"
)

// Del removes every host-side trace of the attachment: host veth (and with it the pod end),
// conntrack entries of its addresses, its reservations and its record. It needs neither the pod's
// netns nor prevResult, and succeeds when repeated. It tries every step and reports all failures.
func Del(ctx context.Context, cfg *Config, att Attachment) error {
	store, err := ipam.Open(cfg.DataDir, cfg.Network)
	if err != nil {
		return fmt.Errorf("address store: %w", err)
	}
	defer store.Close()
	rec, err := NewRecords(store.Dir()).Load(att)
	if err != nil {
		return err
	}
	return del(ctx, cfg, store, att, rec)
}

// del is Del on an open store with the attachment's record (nil: none), so that GC, which has
// both already, does not open and read them again for every attachment it collects.
func del(ctx context.Context, cfg *Config, store *ipam.Store, att Attachment, rec *Record) error {
	records := NewRecords(store.Dir())
	var hint []netip.Addr
	if rec != nil {
		hint = prefixAddrs(rec.IPs)
	}
	names := NamesFor(cfg.Network, att)

	var errs []error
	// A transaction that removes set or map elements waits for an RCU grace period, and two of
	// them (isolation elements, host ports) wait one after the other: both run alongside the
	// link deletion instead of before it.
	isolated := alongside(func() error { return delIsolation(cfg, att, rec) })
	var unmapped []hostport.Entry
	hostPortsGone := alongside(func() (err error) {
		unmapped, err = delHostPorts(cfg, att, rec, store)
		return err
	})
	errs = append(errs, delLinks(names))
	// The host ports are gone before the conntrack walk, so no new flow to the pod can appear
	// behind it.
	errs = append(errs, <-hostPortsGone)
	if err := ctx.Err(); err != nil {
		return errors.Join(append(errs, <-isolated, err)...)
	}
	// Forget flows of the pod's addresses, so a new pod that gets the same address does not
	// inherit this pod's NAT bindings (UDP flows never time out while traffic continues). This
	// walks the whole conntrack table (~10 ms), so it runs before the lock is taken and while the
	// addresses are still reserved: no other pod can hold them yet. The host ports' translated
	// flows lead to the same addresses, so the one walk forgets them too.
	errs = append(errs, flushConntrack(hint))
	errs = append(errs, <-isolated)
	// The record is what a retried DEL (or GC) needs to find host ports and addresses when the
	// runtime sends nothing, so it goes only once everything before it is gone.
	removedAll := errors.Join(errs...) == nil

	errs = append(errs, withNetworkLock(store, func() error {
		return releaseLocked(store, records, att, hint, unmapped, removedAll)
	}))
	return errors.Join(errs...)
}

// releaseLocked is DEL's part under the network lock: release the reservations, forget the flows
// of addresses only the release revealed and of host ports that led elsewhere, and remove the
// record once everything before it succeeded (removedAll).
func releaseLocked(store *ipam.Store, records Records, att Attachment, hint []netip.Addr, unmapped []hostport.Entry, removedAll bool) error {
	var errs []error
	released, err := store.Release(att.ContainerID, att.IfName, hint)
	errs = append(errs, err)
	// Without a record the addresses are known only now; forget their flows under the lock.
	errs = append(errs, flushConntrack(slices.DeleteFunc(slices.Clone(released), func(a netip.Addr) bool { return slices.Contains(hint, a) })))
	// A host port that led to an address that is not the pod's (a DEL that lost record and
	// reservations; the address may be another pod's by now) has its port's flows forgotten
	// instead of the address's.
	ours := slices.Concat(hint, released)
	errs = append(errs, hostport.FlushUDP(slices.DeleteFunc(unmapped, func(e hostport.Entry) bool { return slices.Contains(ours, e.PodIP) })))
	if err == nil && removedAll {
		errs = append(errs, records.Remove(att))
	}
	return errors.Join(errs...)
}

// delIsolation removes the pod's elements from the bridge's isolation sets. They are keyed by
// the host veth's name, the MAC derived from the attachment and the recorded addresses; without
// a record the sets are searched for the port (only then does DEL cost what the node holds).
func delIsolation(cfg *Config, att Attachment, rec *Record) error {
	if rec != nil {
		return isolation.Remove(cfg.Network, portOf(cfg, att, rec.IPs))
	}
	port := NamesFor(cfg.Network, att).HostVeth
	_, err := isolation.GC(cfg.Network, func(p, _ string) bool { return p != port })
	return err
}

// delLinks deletes the attachment's interfaces: the host veth (with it the pod end and the
// qdiscs of both) and the ifb of a shaped pod. One kernel request for both halves the time a
// shaped pod's DEL spends waiting for the kernel to let go of them.
func delLinks(names Names) error {
	veth, vethErr := links.Find(names.HostVeth)
	ifb, ifbErr := shaping.FindIFB(names.IFB)
	return errors.Join(vethErr, ifbErr, links.DeleteTogether(veth, ifb))
}

// flushConntrack deletes conntrack entries whose original source or reply source is one of addrs.
func flushConntrack(addrs []netip.Addr) error {
	doomed := map[netip.Addr]bool{}
	for _, a := range addrs {
		if a.IsValid() {
			doomed[a.Unmap()] = true
		}
	}
	if len(doomed) == 0 {
		return nil
	}
	_, err := conntrack.Delete(func(f *netlink.ConntrackFlow) bool {
		from, _ := netip.AddrFromSlice(f.Forward.SrcIP)
		reply, _ := netip.AddrFromSlice(f.Reverse.SrcIP)
		return doomed[from.Unmap()] || doomed[reply.Unmap()]
	})
	return err
}
