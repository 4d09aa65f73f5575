package core

import (
	"fmt"

	"github.com/kubenet-dev/kubenet/hostport"
)

// delHostPorts removes every host-port rule of the attachment and returns the entries it removed,
// whose flows the caller forgets (hostport.Unmap). rec may be nil (no record on disk) and
// h.cfg.Runtime.PortMappings may be empty (runtime sent nothing on DEL). The mappings are the union
// of both; without pod addresses every family of the network is tried. Only reservations this
// attachment holds are removed, so trying too many keys is harmless. With unknown (a record that
// cannot be read) the whole index and the maps are searched for the attachment's reservations.
func (h *handle) delHostPorts(k attachmentKey, rec *Record, unknown bool) ([]hostport.Entry, error) {
	owner := k.owner()
	var removed []hostport.Entry
	var err error
	if unknown {
		err = h.dir.withLock(func() (err error) {
			hp, err := h.hostportsNow()
			if err != nil {
				return err
			}
			removed, err = hostport.UnmapOwner(hp, owner)
			return err
		})
		if err != nil {
			return removed, fmt.Errorf("host ports: %w", err)
		}
		return removed, nil
	}
	mappings := h.cfg.Runtime.PortMappings
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
	for _, p := range h.cfg.PodCIDRs() {
		families = append(families, p.Addr().Is6())
	}
	if len(families) == 0 {
		families = []bool{false, true}
	}
	err = h.dir.withLock(func() (err error) {
		hp, err := h.hostportsNow()
		if err != nil {
			return err
		}
		removed, err = hostport.Unmap(hp, owner, hostport.Keys(toMappings(mappings), families))
		return err
	})
	if err != nil {
		return removed, fmt.Errorf("host ports: %w", err)
	}
	return removed, nil
}

// hostportsNow is the host ports of the network in the backend that holds its rules now, for a
// verb that removes host ports under the network lock (called under it). A verb that holds the
// backend lock (ADD, the node's healing) has the backend in use: none can switch it meanwhile.
// One that opened as found (DEL, GC) reads the record again: an ADD may have switched the backend
// since this verb read it, and the switch, under the same lock, put the index's host ports into
// the new backend, this verb's pod's too while its reservations were still indexed; removing
// them from the old backend only would leave them leading the port to an address the next pod
// is given.
func (h *handle) hostportsNow() (hostport.Config, error) {
	hp := h.hostportConfig()
	if h.backend != nil {
		return hp, nil
	}
	rec, err := readChoice(h.dir.root())
	if err != nil {
		return hostport.Config{}, err
	}
	if now := backendOf(h.cfg, rec); now != h.nf.backend {
		hp.Backend, hp.Known = backendFor(h.cfg, now, h.dir).hostPorts, nil
	}
	return hp, nil
}

// checkHostPorts verifies the attachment's host-port reservations, map elements and rules
// against its record (CHECK).
func (h *handle) checkHostPorts(k attachmentKey, rec *Record) error {
	if len(rec.PortMappings) == 0 {
		return nil
	}
	entries, err := hostport.Plan(toMappings(rec.PortMappings), prefixAddrs(rec.IPs))
	if err != nil {
		return fmt.Errorf("host ports of the record: %w", err)
	}
	if err := hostport.Check(h.hostportConfig(), k.owner(), entries); err != nil {
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
