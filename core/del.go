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
	"github.com/kubenet-dev/kubenet/shaping"
)

// Del removes every host-side trace of the attachment: host veth (and with it the pod end),
// conntrack entries of its addresses, its reservations and its record. It needs neither the pod's
// netns nor prevResult, and succeeds when repeated. It tries every step and reports all failures.
// It holds the attachment lock throughout, so it never interleaves with an ADD of the same
// attachment.
func Del(ctx context.Context, cfg *Config, att Attachment) (err error) {
	if err := att.Validate(); err != nil {
		return err
	}
	h, err := openAsFound(cfg, &att)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, h.Close()) }()
	k := att.key()
	rec, err := h.dir.records.Load(att)
	var corrupt *CorruptRecordError
	if err != nil && !errors.As(err, &corrupt) {
		return err
	}
	_, err = h.del(ctx, k, rec, corrupt != nil)
	return err
}

// del removes the attachment with its record rec (nil: none). unknown says that a record exists
// but cannot be read: then the host ports are found by owner in the whole index and the maps,
// and everything else from the attachment's key, as without a record.
//
// The reservations and the record go only when everything before them is gone: an address is
// free only once no veth, rule or flow of the attachment can still use it, and the record is what
// a retried DEL (or GC) needs to find the rest.
//
// It returns the addresses it released.
func (h *handle) del(ctx context.Context, k attachmentKey, rec *Record, unknown bool) ([]netip.Addr, error) {
	var hint []netip.Addr
	if rec != nil {
		hint = prefixAddrs(rec.IPs)
	}
	names := k.names(h.cfg.Network)
	// The host veth is looked up once: its index (its policy elements are keyed by it) is read
	// while it is there, and the same link is then deleted.
	veth, vethErr := links.Find(names.HostVeth)
	port := 0
	if veth != nil {
		port = veth.Attrs().Index
	}

	var errs []error
	// A transaction that removes set or map elements waits for an RCU grace period, and two of
	// them (isolation elements, host ports) wait one after the other: both run alongside the
	// link deletion instead of before it.
	isolated := alongside(func() error { return h.delIsolation(k, rec) })
	var unmapped []hostport.Entry
	hostPortsGone := alongside(func() (err error) {
		unmapped, err = h.delHostPorts(k, rec, unknown)
		return err
	})
	errs = append(errs, vethErr, delFoundLinks(veth, names.IFB), h.forgetPolicies(port))
	// The host ports are gone before the conntrack walk, so no new flow to the pod can appear
	// behind it.
	errs = append(errs, <-hostPortsGone)
	crashPoint("del: host ports removed")
	crashPoint("del: links removed")
	if err := ctx.Err(); err != nil {
		return nil, errors.Join(append(errs, <-isolated, err)...)
	}
	// Forget flows of the pod's addresses, so a new pod that gets the same address does not
	// inherit this pod's NAT bindings (UDP flows never time out while traffic continues). This
	// walks the whole conntrack table (~10 ms), so it runs before the lock is taken and while the
	// addresses are still reserved: no other pod can hold them yet. The host ports' translated
	// flows lead to the same addresses, so the one walk forgets them too.
	errs = append(errs, flushConntrack(hint))
	errs = append(errs, <-isolated)
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("%w (the addresses stay reserved and the record stays until a DEL gets everything)", err)
	}
	var released []netip.Addr
	err := h.dir.withLock(func() (err error) {
		released, err = h.dir.releaseLocked(k, hint, unmapped)
		return err
	})
	return released, err
}

// releaseLocked is DEL's part under the network lock: release the reservations, forget the flows
// of addresses only the release revealed and of host ports that led elsewhere, and remove the
// record once all of that succeeded.
func (d *networkDir) releaseLocked(k attachmentKey, hint []netip.Addr, unmapped []hostport.Entry) ([]netip.Addr, error) {
	released, err := d.store.Release(k.ContainerID, k.IfName, hint)
	if err != nil {
		return released, err
	}
	damaged, err := d.releaseDamaged(k, hint)
	released = append(released, damaged...)
	if err != nil {
		return released, err
	}
	crashPoint("del: addresses released")
	// Without a record the addresses are known only now; forget their flows under the lock.
	revealed := slices.DeleteFunc(slices.Clone(released), func(a netip.Addr) bool { return slices.Contains(hint, a) })
	errs := []error{flushConntrack(revealed)}
	// A host port that led to an address that is not the pod's (a DEL that lost record and
	// reservations; the address may be another pod's by now) has its port's flows forgotten
	// instead of the address's.
	ours := slices.Concat(hint, released)
	errs = append(errs, hostport.FlushUDP(slices.DeleteFunc(unmapped, func(e hostport.Entry) bool { return slices.Contains(ours, e.PodIP) })))
	if err := errors.Join(errs...); err != nil {
		return released, err
	}
	return released, d.records.Remove(k.attachment())
}

// releaseDamaged releases the addresses of hint (the attachment's record) whose reservation
// file is damaged or torn (ipam.Store.Torn): while a record lists an address, no other attachment
// can have been given it, so it is this attachment's. Should another record list it too, it
// stays for GC to sort out.
func (d *networkDir) releaseDamaged(k attachmentKey, hint []netip.Addr) ([]netip.Addr, error) {
	var scan *RecordScan
	var released []netip.Addr
	for _, a := range hint {
		damaged, err := d.store.Torn(a, k.ContainerID, k.IfName)
		if err != nil {
			return released, err
		}
		if !damaged {
			continue
		}
		if scan == nil {
			s, err := d.records.Scan()
			if err != nil {
				return released, err
			}
			scan = &s
		}
		if claimant, ok := scan.claimant(a); ok && claimant != k {
			continue
		}
		if err := d.store.ReleaseAddr(a); err != nil {
			return released, err
		}
		released = append(released, a)
	}
	return released, nil
}

// DelCrashPoints names the crash points of DEL (see CrashPoints), in the order DEL passes them.
func DelCrashPoints() []string {
	return []string{"del: host ports removed", "del: links removed", "del: addresses released"}
}

// delIsolation removes the pod's elements from the bridge's isolation sets. They are keyed by
// the host veth's name, the MAC derived from the attachment and the recorded addresses; without
// a record the sets are searched for the port (only then does DEL cost what the node holds).
func (h *handle) delIsolation(k attachmentKey, rec *Record) error {
	if rec != nil {
		return h.nf.removeIsolation(h.cfg.Network, h.portOf(k, rec.IPs))
	}
	port := k.names(h.cfg.Network).HostVeth
	_, err := h.nf.gcIsolation(h.cfg.Network, func(p, _ string) bool { return p != port })
	return err
}

// delLinks deletes the attachment's interfaces: the host veth (with it the pod end and the
// qdiscs of both) and the ifb of a shaped pod. One kernel request for both halves the time a
// shaped pod's DEL spends waiting for the kernel to let go of them.
func delLinks(names Names) error {
	veth, err := links.Find(names.HostVeth)
	return errors.Join(err, delFoundLinks(veth, names.IFB))
}

// delFoundLinks is delLinks for a caller that has looked the host veth up already (veth: nil
// when there is none).
func delFoundLinks(veth netlink.Link, ifbName string) error {
	ifb, err := shaping.FindIFB(ifbName)
	return errors.Join(err, links.DeleteTogether(veth, ifb))
}

// flushConntrack deletes conntrack entries whose original source or reply source is one of addrs.
func flushConntrack(addrs []netip.Addr) error {
	var sels []conntrack.Selector
	seen := map[netip.Addr]bool{}
	for _, a := range addrs {
		if a = a.Unmap(); a.IsValid() && !seen[a] {
			seen[a] = true
			sels = append(sels, conntrack.Selector{Src: a}, conntrack.Selector{Reply: true, Src: a})
		}
	}
	return conntrack.DeleteSelected(sels)
}
