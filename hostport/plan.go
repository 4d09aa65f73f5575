package hostport

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// Protocols a mapping may use (lower case, as runtimes send them after validation).
func Protocols() []string { return []string{"tcp", "udp", "sctp"} }

// protoNumber is the IP protocol number of each supported protocol.
func protoNumber(p string) (byte, bool) {
	switch p {
	case "tcp":
		return 6, true
	case "udp":
		return 17, true
	case "sctp":
		return 132, true
	}
	return 0, false
}

// Mapping is one entry of the portMappings capability, validated by the caller.
type Mapping struct {
	HostPort      uint16
	ContainerPort uint16
	Protocol      string // tcp, udp or sctp
	// HostIP is the zero Addr when the runtime sent none: the mapping then applies to every
	// family the pod has. 0.0.0.0 or :: mean any local address of that family only; any other
	// address means that address only.
	HostIP netip.Addr
}

// Owner is the attachment that holds a reservation: (container ID, interface), the key of all
// kubenet host-side state.
type Owner struct {
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifName"`
}

// String is the form used in error messages and in the nftables element comments.
func (o Owner) String() string { return o.ContainerID + "/" + o.IfName }

// Key identifies one hostPort reservation of the node: a protocol and port on one local address,
// or on any local address of one family.
type Key struct {
	Protocol string
	HostPort uint16
	// HostIP is never the zero Addr: 0.0.0.0 and :: stand for "any local address" of their family.
	HostIP netip.Addr
}

// Any tells whether the key covers every local address of its family.
func (k Key) Any() bool { return k.HostIP.IsUnspecified() }

// Is6 tells the key's family.
func (k Key) Is6() bool { return k.HostIP.Is6() }

// overlaps tells whether two keys claim some common (address, protocol, port): a wildcard of a
// family overlaps every key of that family with the same protocol and port.
func (k Key) overlaps(o Key) bool {
	if k.Protocol != o.Protocol || k.HostPort != o.HostPort || k.Is6() != o.Is6() {
		return false
	}
	return k.Any() || o.Any() || k.HostIP == o.HostIP
}

func (k Key) String() string {
	where := "on " + k.HostIP.String()
	if k.Any() {
		where = "on any local IPv4 address"
		if k.Is6() {
			where = "on any local IPv6 address"
		}
	}
	return fmt.Sprintf("hostPort %d/%s %s", k.HostPort, k.Protocol, where)
}

// Entry is one translation: traffic for Key goes to PodIP:ContainerPort. It is one element of
// one nftables map and one reservation file.
type Entry struct {
	Key
	PodIP         netip.Addr
	ContainerPort uint16
}

func (e Entry) String() string {
	return fmt.Sprintf("%s -> %s", e.Key, netip.AddrPortFrom(e.PodIP, e.ContainerPort))
}

// DuplicateError reports two mappings of one attachment that claim the same key for different
// destinations; no translation could honour both.
type DuplicateError struct {
	Key    Key
	First  netip.AddrPort
	Second netip.AddrPort
}

func (e *DuplicateError) Error() string {
	return fmt.Sprintf("%s is mapped twice, to %s and to %s", e.Key, e.First, e.Second)
}

// Plan turns mappings into entries for the pod's addresses (at most one per family). A mapping
// without hostIP gives one entry per pod address; a mapping with hostIP gives one entry for the
// pod address of that family, or none when the pod has no address of that family (the old
// kubenet and the portmap plugin skip those too, so a dual-stack pod spec works on a
// single-stack node). Identical entries are merged; one key with two destinations is a
// DuplicateError. The result is sorted, so plans compare and apply deterministically.
func Plan(mappings []Mapping, podIPs []netip.Addr) ([]Entry, error) {
	var out []Entry
	for _, m := range mappings {
		if _, ok := protoNumber(m.Protocol); !ok {
			return nil, fmt.Errorf("hostPort %d: unsupported protocol %q (want %s)", m.HostPort, m.Protocol, strings.Join(Protocols(), ", "))
		}
		if m.HostPort == 0 || m.ContainerPort == 0 {
			return nil, fmt.Errorf("hostPort %d -> containerPort %d: ports must be 1-65535", m.HostPort, m.ContainerPort)
		}
		for _, ip := range podIPs {
			k, ok := m.keyFor(ip.Is6())
			if !ok {
				continue
			}
			e := Entry{Key: k, PodIP: ip.Unmap(), ContainerPort: m.ContainerPort}
			i := slices.IndexFunc(out, func(o Entry) bool { return o.Key == e.Key })
			switch {
			case i < 0:
				out = append(out, e)
			case out[i] != e:
				return nil, &DuplicateError{Key: e.Key, First: netip.AddrPortFrom(out[i].PodIP, out[i].ContainerPort), Second: netip.AddrPortFrom(e.PodIP, e.ContainerPort)}
			}
		}
	}
	slices.SortFunc(out, compareEntries)
	return out, nil
}

// Keys returns every key the mappings could have produced for a pod with addresses of the given
// families (true = IPv6), for removal when the pod's addresses are no longer known. Removing a
// key only ever touches a reservation the attachment itself holds, so a superset is safe.
func Keys(mappings []Mapping, families []bool) []Key {
	var out []Key
	seen := map[Key]bool{}
	for _, m := range mappings {
		for _, is6 := range families {
			k, ok := m.keyFor(is6)
			if ok && !seen[k] {
				seen[k] = true
				out = append(out, k)
			}
		}
	}
	slices.SortFunc(out, compareKeys)
	return out
}

// keyFor is m's key on the family is6: its hostIP, or the family's unspecified address when m
// has none; false when m's hostIP is of the other family.
func (m Mapping) keyFor(is6 bool) (Key, bool) {
	hostIP := m.HostIP.Unmap()
	switch {
	case !hostIP.IsValid():
		hostIP = unspecified(is6)
	case hostIP.Is6() != is6:
		return Key{}, false
	}
	return Key{Protocol: m.Protocol, HostPort: m.HostPort, HostIP: hostIP}, true
}

// KeysOf returns the keys of entries.
func KeysOf(entries []Entry) []Key {
	out := make([]Key, len(entries))
	for i, e := range entries {
		out[i] = e.Key
	}
	return out
}

func unspecified(is6 bool) netip.Addr {
	if is6 {
		return netip.IPv6Unspecified()
	}
	return netip.IPv4Unspecified()
}

func compareKeys(a, b Key) int {
	if c := a.HostIP.Compare(b.HostIP); c != 0 {
		return c
	}
	if c := strings.Compare(a.Protocol, b.Protocol); c != 0 {
		return c
	}
	return int(a.HostPort) - int(b.HostPort)
}

func compareEntries(a, b Entry) int { return compareKeys(a.Key, b.Key) }
