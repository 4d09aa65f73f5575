// Package hostport maps a node's host ports to pods (the portMappings capability): DNAT of
// traffic addressed to a local address of the node, for TCP, UDP and SCTP, IPv4 and IPv6, on one
// hostIP or on any local address; reachable from other hosts, from the node itself, from
// 127.0.0.1 on the node, and from pods of the node including the target pod itself.
//
// Layout, in the network's inet table (see rules.go for the names):
//
//   - four maps (per family: by protocol . port, and by hostIP . protocol . port) whose values are
//     pod address . container port. A pod's mappings are map elements, so ADD and DEL are one
//     netlink transaction whose size depends on that pod's mappings only: no per-pod chain, no
//     rewrite of anything that grows with the node's pods;
//   - a fixed set of rules (at most 16, from the node's pod CIDRs): nat prerouting and output
//     chains that jump to the DNAT chain only for `fib daddr type local` (never for traffic that
//     merely passes the node, cf. GHSA-jv3w-x3r3-g6rm); the DNAT chain, which marks connections
//     that may need SNAT with the bit Mark; a postrouting chain that masquerades the marked
//     packets of a pod reaching its own hostPort (the hairpin sets: one "pod . pod" element per
//     pod with mappings) and of localhost, and leaves every other client's address alone; and
//     the localnet guard, because localhost access needs route_localnet=1 on the bridge
//     (plugins#729): a NAT chain that drops connections from or to 127.0.0.0/8 and ::1 not
//     arriving on lo before any dstnat, and a filter chain on input that drops 127.0.0.0/8 in
//     whatever the node receives from the bridge. Neither runs for the packets of an
//     established pod-to-pod connection, which the bridge forwards.
//
// Reservations are also kept on disk (Index), one file per key, so a conflicting mapping is
// refused without reading other attachments' state, and DEL knows what an attachment holds
// without its netns, its pod address or prevResult.
//
// Every function that changes state expects the caller to hold the network's lock (the IPAM
// store lock), which makes the conflict check and the reservation one atomic step.
package hostport

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/kubenet-dev/kubenet/internal/conntrack"
	"github.com/kubenet-dev/kubenet/internal/nft"
	"github.com/kubenet-dev/kubenet/internal/sysctl"
)

// Config is what the host-port rules of one network depend on.
type Config struct {
	Network  string         // CNI network name: selects the nftables table
	Dir      string         // the network's data directory; the index lives below it
	Bridge   string         // gets route_localnet=1 for localhost access (IPv4)
	PodCIDRs []netip.Prefix // the node's pod CIDRs: their sources get SNAT on hostPorts
	// Backend is where the mappings and the fixed rules live: nil is nftables.
	Backend Backend
	// Known remembers the nftables chains' dumps found as planned (nil: compare every dump in
	// full).
	Known nft.Verified
}

func (c Config) hasIPv4() bool {
	for _, p := range c.PodCIDRs {
		if p.Addr().Is4() {
			return true
		}
	}
	return false
}

// MaxMappings is the most port mappings one attachment may have. It bounds the work ADD and
// DEL do under the network lock (one index file and one map element per entry, at most two
// entries per mapping) and keeps an ADD's map elements inside one nftables transaction
// (MaxEntriesPerTransaction). docs: README "Host ports".
const MaxMappings = 128

// LeftoverError reports a failure after which map elements of the attachment may still be in
// the kernel (their removal failed too). Their index files are kept, so DEL or GC can find and
// remove them, and the caller must not hand the pod's addresses to another pod before that.
type LeftoverError struct{ Err error }

func (e *LeftoverError) Error() string {
	return e.Err.Error() + " (its hostPort map elements may remain; DEL or GC removes them)"
}

func (e *LeftoverError) Unwrap() error { return e.Err }

// Add reserves entries for owner and installs them as map elements in one nftables
// transaction, then clears stale UDP conntrack entries of the new ports. The fixed rules are
// EnsureNode's job. A conflict returns a *ConflictError and changes nothing; any other failure
// undoes what Add did, or returns a *LeftoverError when that undo failed too. No entries:
// nothing is touched at all.
func Add(cfg Config, owner Owner, entries []Entry) error {
	if len(entries) == 0 {
		return nil
	}
	if len(entries) > MaxEntriesPerTransaction {
		return fmt.Errorf("%d hostPort entries for one attachment: at most %d fit one transaction", len(entries), MaxEntriesPerTransaction)
	}
	ix := NewIndex(cfg.Dir)
	if err := ix.Reserve(owner, entries); err != nil {
		return err
	}
	if err := install(cfg, owner, entries); err != nil {
		return undoAdd(cfg, owner, entries, err)
	}
	// After the rules are in place, so no new stale entry can appear: a client that kept
	// sending to the port before (to nobody, or to an old pod) would otherwise stay pinned to
	// that entry for as long as it keeps sending (kubernetes#58336, plugins#123).
	if err := FlushUDP(entries); err != nil {
		return undoAdd(cfg, owner, entries, err)
	}
	return nil
}

// undoAdd removes what Add installed for owner after cause. The index files go only once the
// elements are known to be gone: a file whose element stayed in the kernel is what lets DEL and
// GC find that element later.
func undoAdd(cfg Config, owner Owner, entries []Entry, cause error) error {
	rs := reservations(owner, entries)
	if err := cfg.backend().uninstall(cfg, rs); err != nil {
		return &LeftoverError{Err: errors.Join(cause, err)}
	}
	return errors.Join(cause, NewIndex(cfg.Dir).remove(rs))
}

func reservations(owner Owner, entries []Entry) []Reservation {
	rs := make([]Reservation, len(entries))
	for i, e := range entries {
		rs[i] = Reservation{Entry: e, Owner: owner}
	}
	return rs
}

// install adds owner's entries to the kernel (the backend's one transaction per family), after
// the checks every backend needs: each entry's family is the network's, and IPv4 host ports
// reach 127.0.0.1 through route_localnet on the bridge.
func install(cfg Config, owner Owner, entries []Entry) error {
	for _, e := range entries {
		if !slices.Contains(cfg.families(), e.Is6()) {
			return fmt.Errorf("%s: the network has no pod CIDR of that family", e)
		}
	}
	if cfg.hasIPv4() {
		if err := enableRouteLocalnet(cfg.Bridge); err != nil {
			return err
		}
	}
	return cfg.backend().install(cfg, reservations(owner, entries))
}

func (c Config) families() []bool {
	var out []bool
	for _, p := range c.PodCIDRs {
		out = append(out, p.Addr().Is6())
	}
	return out
}

// Remove deletes owner's reservations among keys: map elements, UDP conntrack entries and index
// files. Keys that another attachment holds now, or nobody, are left alone, so a repeated or late
// DEL never removes someone else's mapping. It needs neither the pod's netns nor its address.
func Remove(cfg Config, owner Owner, keys []Key) error {
	entries, err := Unmap(cfg, owner, keys)
	return errors.Join(err, FlushUDP(entries))
}

// Unmap is Remove without the conntrack walk: it returns the entries it removed, and the caller
// forgets their flows. DEL does that in the walk that forgets every flow of the pod's addresses
// (a walk costs ~10 ms whatever it looks for, and a translated flow of a host port has the pod's
// address as its reply source), and calls FlushUDP only for entries whose address is not the
// pod's any more.
//
// A key whose index file is damaged or missing is owner's when the kernel's element of the key
// says so (its comment); then the element (and the file) go. An element of someone else, or
// none, leaves the key alone. The maps are read only when some key has no readable file.
func Unmap(cfg Config, owner Owner, keys []Key) ([]Entry, error) {
	ix := NewIndex(cfg.Dir)
	owned, unresolved, err := ix.owned(owner, keys)
	if err != nil {
		return nil, err
	}
	if len(unresolved) > 0 {
		kernel, err := cfg.backend().list(cfg, unresolved)
		if err != nil {
			return nil, err
		}
		for _, r := range kernel {
			if r.Owner == owner && slices.Contains(unresolved, r.Key) {
				owned = append(owned, r)
			}
		}
	}
	if len(owned) == 0 {
		return nil, nil
	}
	return unmap(cfg, owned, owned)
}

// UnmapOwner removes every reservation and element of owner wherever it is, reading the whole
// index and the maps: DEL of an attachment whose record is unreadable, which therefore does not
// know its keys.
func UnmapOwner(cfg Config, owner Owner) ([]Entry, error) {
	stale, err := GC(cfg, func(o Owner) bool { return o != owner })
	entries := make([]Entry, 0, len(stale))
	for _, r := range stale {
		entries = append(entries, r.Entry)
	}
	return entries, err
}

// unmap deletes the map elements of rs in one transaction, then the index files of files, and
// returns rs's entries (none if the elements stay).
func unmap(cfg Config, rs, files []Reservation) ([]Entry, error) {
	if err := cfg.backend().uninstall(cfg, rs); err != nil {
		return nil, err
	}
	entries := make([]Entry, 0, len(rs))
	for _, r := range rs {
		entries = append(entries, r.Entry)
	}
	return entries, NewIndex(cfg.Dir).remove(files)
}

// enableRouteLocalnet lets the bridge route packets whose source or destination is in
// 127.0.0.0/8: the node's connection to 127.0.0.1:hostPort leaves through the bridge (before
// postrouting masquerades it) and its replies come back to 127.0.0.1. The localnet guard
// (ChainLocalnetNAT, ChainLocalnetInput) drops such packets from pods.
func enableRouteLocalnet(bridge string) error {
	return sysctl.Ensure("net/ipv4/conf/"+bridge+"/route_localnet", "1")
}

// FlushUDP deletes the stale UDP conntrack entries of the UDP entries' host ports (over
// netlink; no conntrack binary needed): UDP flows whose original destination is one of those
// ports on a local address (for a specific hostIP: that address). Flows to other destinations
// that happen to use the same port (the node's own DNS lookups to port 53, say) are none of
// our business and stay.
//
// Each (address, port) is one filtered flush in the kernel (one dump instead when there are many of
// them: conntrack.DeleteSelected). The local addresses are the node's own and the loopback's,
// without IPv6 link-local ones: every host veth has one, and a hostPort cannot answer on one (the
// pod's reply to a link-local source has no route). The rest of 127.0.0.0/8 is local too, and an
// untranslated entry to 127.0.0.2:port made before the mapping keeps its sender away from the pod
// just as one to 127.0.0.1 does; a filter cannot name a prefix, but only the node sends to
// 127.0.0.0/8, from 127.0.0.1 unless it binds another address (the loopback route's preferred
// source), and a flow from 127.0.0.1 to the port anywhere else has no answer to lose (127.0.0.0/8
// does not leave the node): so an IPv4 "any address" port's flows from 127.0.0.1 go as well.
func FlushUDP(entries []Entry) error {
	var keys []Key
	for _, e := range entries {
		if e.Protocol == "udp" {
			keys = append(keys, e.Key)
		}
	}
	if len(keys) == 0 {
		return nil
	}
	var local map[bool][]netip.Addr // by Is6
	var sels []conntrack.Selector
	for _, k := range keys {
		dsts := []netip.Addr{k.HostIP}
		if k.Any() {
			if local == nil {
				var err error
				if local, err = localAddrs(keys); err != nil {
					return fmt.Errorf("clear UDP conntrack entries of %v: %w", keys, err)
				}
			}
			dsts = local[k.Is6()]
		}
		for _, dst := range dsts {
			sels = append(sels, conntrack.Selector{Dst: dst, Proto: unix.IPPROTO_UDP, DstPort: k.HostPort})
		}
		if k.Any() && !k.Is6() {
			sels = append(sels, conntrack.Selector{Src: localhost4(), Proto: unix.IPPROTO_UDP, DstPort: k.HostPort})
		}
	}
	if err := conntrack.DeleteSelected(sels); err != nil {
		return fmt.Errorf("clear UDP conntrack entries of %v: %w", keys, err)
	}
	return nil
}

// localhost4 is the IPv4 loopback address, 127.0.0.1.
func localhost4() netip.Addr { return netip.AddrFrom4([4]byte{127, 0, 0, 1}) }

// localAddrs lists the node's addresses of the keys' families, without IPv6 link-local ones, and
// the loopback address of each. netlinksafe retries the dump: on a node with hundreds of pods
// some host veth's IPv6 link-local address changes state (DAD) during almost every dump, and the
// kernel then flags the dump as interrupted.
func localAddrs(keys []Key) (map[bool][]netip.Addr, error) {
	out := map[bool][]netip.Addr{}
	for _, is6 := range []bool{false, true} {
		if !slices.ContainsFunc(keys, func(k Key) bool { return k.Is6() == is6 }) {
			continue
		}
		family, loopback := netlink.FAMILY_V4, localhost4()
		if is6 {
			family, loopback = netlink.FAMILY_V6, netip.IPv6Loopback()
		}
		addrs, err := netlinksafe.AddrList(nil, family)
		if err != nil {
			return nil, fmt.Errorf("list local addresses: %w", err)
		}
		seen := map[netip.Addr]bool{loopback: true}
		out[is6] = append(out[is6], loopback)
		for _, a := range addrs {
			ip, ok := netip.AddrFromSlice(a.IP)
			// Only IPv6's: IsLinkLocalUnicast also takes IPv4's 169.254.0.0/16, which
			// answers a hostPort like any address (NodeLocal DNSCache's 169.254.20.10).
			if ip = ip.Unmap(); ok && !(ip.Is6() && ip.IsLinkLocalUnicast()) && !seen[ip] {
				seen[ip] = true
				out[is6] = append(out[is6], ip)
			}
		}
	}
	return out, nil
}
