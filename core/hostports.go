package core

import (
	"errors"
	"fmt"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/kubenet-dev/kubenet/hostport"
	"github.com/kubenet-dev/kubenet/ipam"
)

// checkMappingCount refuses more port mappings than hostport.MaxMappings before ADD changes
// anything: their index files and map elements are written under the network lock, which every
// other ADD and DEL of the node waits for.
func checkMappingCount(rc RuntimeConfig) error {
	if n := len(rc.PortMappings); n > hostport.MaxMappings {
		return configError("runtimeConfig.portMappings", n, "a pod may have at most %d port mappings (hostPorts); this one has %d", hostport.MaxMappings, n)
	}
	return nil
}

// hostPorts brings the node-wide host-port rules and maps up to date (every ADD, with or without
// mappings: the localnet guard among them protects the node from every pod), then programs the
// attachment's port mappings (a.cfg.Runtime.PortMappings) for its addresses (a.ips) and pushes
// their removal onto undo. The conflict check, the reservation and the nftables transaction
// happen under the network lock, so two pods racing for one hostPort cannot both get it.
func (a *addition) hostPorts(undo *undoStack) error {
	hp := hostportConfig(a.cfg, a.store.Dir())
	if err := ensureHostPortNode(a.store, hp, nil); err != nil {
		return err
	}
	if len(a.cfg.Runtime.PortMappings) == 0 {
		return nil
	}
	entries, err := hostport.Plan(toMappings(a.cfg.Runtime.PortMappings), prefixAddrs(a.ips))
	var dup *hostport.DuplicateError
	if errors.As(err, &dup) {
		return configError("runtimeConfig.portMappings", dup.Key.String(), "mapped twice, to %s and to %s", dup.First, dup.Second)
	}
	if err != nil {
		return configError("runtimeConfig.portMappings", fmt.Sprint(a.cfg.Runtime.PortMappings), "%v", err)
	}
	owner := ownerOf(a.att)
	err = withNetworkLock(a.store, func() error { return hostport.Add(hp, owner, entries) })
	var conflict *hostport.ConflictError
	if errors.As(err, &conflict) {
		return types.NewError(ErrPortConflict, conflict.Error(), "")
	}
	var leftover *hostport.LeftoverError
	if errors.As(err, &leftover) {
		// Elements that may lead to the pod's addresses are still in the kernel: the record and
		// the reservations stay, so the runtime's DEL (or GC) removes them before the addresses
		// can go to another pod.
		a.keepReservation = true
	}
	if err != nil {
		return fmt.Errorf("host ports: %w", err)
	}
	undo.push(func() error {
		return withNetworkLock(a.store, func() error { return hostport.Remove(hp, owner, hostport.KeysOf(entries)) })
	})
	return nil
}

// ensureHostPortNode checks the node-wide host-port state without the lock (one dump of the
// network's table: what a healthy node pays) and repairs it under the lock when it is not as
// planned. repair, when not nil, receives what was changed.
func ensureHostPortNode(store *ipam.Store, hp hostport.Config, repair *hostport.Repair) error {
	if hostport.CheckNode(hp) == nil {
		return nil
	}
	err := withNetworkLock(store, func() error {
		rep, err := hostport.EnsureNode(hp, false)
		if repair != nil {
			*repair = rep
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("host-port rules: %w", err)
	}
	return nil
}

// delHostPorts removes every host-port rule of the attachment and returns the entries it removed,
// whose flows the caller forgets (hostport.Unmap). rec may be nil (no record on disk) and
// cfg.Runtime.PortMappings may be empty (runtime sent nothing on DEL). The mappings are the union
// of both; without pod addresses every family of the network is tried. Only reservations this
// attachment holds are removed, so trying too many keys is harmless. With unknown (a record that
// cannot be read) the whole index and the maps are searched for the attachment's reservations.
func delHostPorts(cfg *Config, att Attachment, rec *Record, unknown bool, store *ipam.Store) ([]hostport.Entry, error) {
	hp, owner := hostportConfig(cfg, store.Dir()), ownerOf(att)
	var removed []hostport.Entry
	var err error
	if unknown {
		err = withNetworkLock(store, func() (err error) {
			removed, err = hostport.UnmapOwner(hp, owner)
			return err
		})
		if err != nil {
			return removed, fmt.Errorf("host ports: %w", err)
		}
		return removed, nil
	}
	mappings := cfg.Runtime.PortMappings
	var families []bool
	if rec != nil {
		mappings = append(append([]PortMapping{}, mappings...), rec.PortMappings...)
		for _, p := range rec.IPs {
			families = append(families, p.Addr().Is6())
		}
	}
	if len(mappings) == 0 {
		return nil, nil
	}
	for _, p := range cfg.PodCIDRs() {
		families = append(families, p.Addr().Is6())
	}
	if len(families) == 0 {
		families = []bool{false, true}
	}
	err = withNetworkLock(store, func() (err error) {
		removed, err = hostport.Unmap(hp, owner, hostport.Keys(toMappings(mappings), families))
		return err
	})
	if err != nil {
		return removed, fmt.Errorf("host ports: %w", err)
	}
	return removed, nil
}

// checkHostPorts verifies the attachment's host-port reservations, map elements and rules
// against its record (CHECK).
func checkHostPorts(cfg *Config, att Attachment, rec *Record, networkDir string) error {
	if len(rec.PortMappings) == 0 {
		return nil
	}
	entries, err := hostport.Plan(toMappings(rec.PortMappings), prefixAddrs(rec.IPs))
	if err != nil {
		return fmt.Errorf("host ports of the record: %w", err)
	}
	if err := hostport.Check(hostportConfig(cfg, networkDir), ownerOf(att), entries); err != nil {
		return fmt.Errorf("host ports: %w", err)
	}
	return nil
}

// HostPortKey is one (protocol, local address, port) that a pod's host ports claim on the node;
// the address is its family's unspecified address for "every local address of that family". It
// is the hostport mechanism's key, named here so that the layers above core can use it.
type HostPortKey = hostport.Key

// HostPortKeys checks mappings (NormalizePortMappings) and returns the keys ADD would give them
// for a pod with addresses of the given families (true: IPv6), sorted: exactly the keys of the
// DNAT entries ADD installs. A hostIP of a family the pod lacks claims nothing; 0.0.0.0 or ::
// claims every local address of its own family only; no hostIP claims the unspecified address
// of each of the pod's families.
func HostPortKeys(mappings []PortMapping, families []bool) ([]HostPortKey, error) {
	pms, err := NormalizePortMappings(mappings)
	if err != nil {
		return nil, err
	}
	return hostport.Keys(toMappings(pms), families), nil
}
