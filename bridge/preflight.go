package bridge

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// aliasPrefix starts the alias (IFLA_IFALIAS, what `ip link` shows as "alias") by which a bridge
// names the kubenet network that uses it. Two networks on one bridge would each reconcile the
// bridge's addresses to their own gateways and remove the other's.
const aliasPrefix = "kubenet network "

// ownerAlias is the alias of a bridge used by network.
func ownerAlias(network string) string { return aliasPrefix + network }

// PreflightError says why cfg cannot be applied to this node: Key is the setting at fault
// ("bridge" or "gateway"), Value its value.
type PreflightError struct {
	Key, Value, Reason string
}

func (e *PreflightError) Error() string {
	return fmt.Sprintf("%s %q: %s", e.Key, e.Value, e.Reason)
}

// Preflight checks, before anything is changed, that Ensure can apply cfg without breaking the
// node: the name is free or a bridge's; no other kubenet network has pods on that bridge; and no
// gateway's subnet overlaps an address or a connected route of another link of the node (which
// would take that link's neighbours, or the node's own gateway, away from it). With full unset the
// overlap check is skipped when the bridge already carries every gateway: it was made when they
// were added, and a steady ADD should not dump the node's addresses. What it read of the bridge
// comes back (so STATUS need not look it up again, and ADD's Ensure need not read it again).
func Preflight(cfg Config, full bool) (Seen, error) {
	r, err := openRtnl()
	if err != nil {
		return Seen{}, err
	}
	defer r.Close()
	br, exists, err := r.link(cfg.Name)
	if err != nil {
		return Seen{}, fmt.Errorf("bridge %q: %w", cfg.Name, err)
	}
	if !exists {
		if len(cfg.Gateways) == 0 {
			return Seen{}, nil
		}
		return Seen{}, checkOverlaps(r, cfg, 0) // no link's addresses are the bridge's
	}
	if br.Kind != "bridge" {
		return Seen{}, &PreflightError{"bridge", cfg.Name, fmt.Sprintf("is an existing %s link of the node, not a bridge", kindName(br.Kind))}
	}
	seen := Seen{link: &br}
	if err := checkOwner(cfg.Name, br, cfg.Owner); err != nil {
		return seen, err
	}
	if len(cfg.Gateways) == 0 {
		return seen, nil
	}
	if !full {
		have, err := r.addrs(br.Index, unix.AF_UNSPEC)
		if err != nil {
			return seen, err
		}
		seen.addrs = prefixesOf(have)
		if !slices.ContainsFunc(cfg.Gateways, func(g netip.Prefix) bool { return !containsAddr(have, g) }) {
			return seen, nil
		}
	}
	return seen, checkOverlaps(r, cfg, br.Index)
}

// Seen is what Preflight read of the bridge: whether it exists, its attributes and, on a steady
// ADD, its addresses. Ensure starts from it instead of reading them again; should the bridge
// change in between, Ensure's writes are the same idempotent ones, and a bridge deleted in
// between fails the veth's attachment. The zero Seen knows nothing, as for a missing bridge.
type Seen struct {
	link  *linkInfo
	addrs []netip.Prefix // nil: not read
}

// Exists tells whether the bridge existed.
func (s Seen) Exists() bool { return s.link != nil }

// kindName names a link's kind as `ip -d link` does, "device" for a link without one.
func kindName(kind string) string {
	if kind == "" {
		return "device"
	}
	return kind
}

func containsAddr(addrs []linkPrefix, p netip.Prefix) bool {
	return slices.ContainsFunc(addrs, func(a linkPrefix) bool { return a.Prefix == p })
}

// checkOwner refuses a bridge that another kubenet network claims while pods are on it. A bridge
// without ports serves nobody: it may change hands (a network renamed after its node drained).
func checkOwner(name string, br linkInfo, owner string) error {
	claimed, ok := strings.CutPrefix(br.Alias, aliasPrefix)
	if !ok || owner == "" || claimed == owner {
		return nil
	}
	all, err := netlinksafe.LinkList()
	if err != nil {
		return fmt.Errorf("bridge %q: list links: %w", name, err)
	}
	ports := 0
	for _, l := range all {
		if l.Attrs().MasterIndex == br.Index {
			ports++
		}
	}
	if ports == 0 {
		return nil
	}
	return &PreflightError{"bridge", name, fmt.Sprintf("is used by kubenet network %q (%d pods on it); two networks on one bridge remove each other's gateways: give each network its own bridge", claimed, ports)}
}

// checkOverlaps compares each gateway's subnet with the addresses and the connected routes (see
// rtnl.connectedRoutes) of every link but the bridge (index brIndex, 0 when it does not exist
// yet). One dump of each answers for every gateway: of the gateways' family, or of both.
func checkOverlaps(r *rtnl, cfg Config, brIndex int) error {
	family := familyOf(cfg.Gateways) // on a single-stack node the other family cannot overlap
	addrs, err := r.addrs(0, family)
	if err != nil {
		return fmt.Errorf("the node's addresses: %w", err)
	}
	routes, err := r.connectedRoutes(family)
	if err != nil {
		return fmt.Errorf("the node's routes: %w", err)
	}
	for _, g := range cfg.Gateways {
		subnet := g.Masked()
		for _, a := range addrs {
			if a.Index == brIndex || !subnet.Overlaps(a.Prefix.Masked()) {
				continue
			}
			// The bridge may have appeared since it was looked up (a parallel first ADD).
			if name := linkName(a.Index); name != cfg.Name {
				return &PreflightError{"gateway", g.String(), fmt.Sprintf("its subnet %s overlaps the address %s of the node's link %s", subnet, a.Prefix, name)}
			}
		}
		for _, rt := range routes {
			if rt.Index == brIndex || !subnet.Overlaps(rt.Prefix) {
				continue
			}
			if name := linkName(rt.Index); name != cfg.Name {
				return &PreflightError{"gateway", g.String(), fmt.Sprintf("its subnet %s overlaps the node's connected route %s on %s", subnet, rt.Prefix, name)}
			}
		}
	}
	return nil
}

func linkName(index int) string {
	l, err := netlink.LinkByIndex(index)
	if err != nil {
		return fmt.Sprintf("#%d", index)
	}
	return l.Attrs().Name
}

// IsPreflight tells whether err is a refusal of Preflight (or of Ensure, which runs the same
// checks where it changes the bridge's addresses).
func IsPreflight(err error) (*PreflightError, bool) {
	var pe *PreflightError
	ok := errors.As(err, &pe)
	return pe, ok
}
