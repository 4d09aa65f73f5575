// Package overlay is the node's VXLAN overlay: one kernel VXLAN device that carries pod traffic
// to the nodes this node shares no link with. It has no control plane of its own: every entry is
// static (no multicast, no learning, no ARP or ND across the overlay) and everything a node needs
// of a peer is derived from the peer's address on the underlay (its Node's InternalIP):
//
//   - the peer's VTEP MAC is MAC(underlay address), which the peer gives its own device;
//   - the next hop of each of the peer's pod CIDRs is the CIDR's first address, a neighbour entry
//     of the device that resolves to that MAC;
//   - the forwarding entry sends that MAC to the peer's underlay address.
//
// So a restarted agent rebuilds exactly what was there (no traffic stops), and nothing has to be
// published on the Node. The routes themselves are the agent's (agent/routes); this package keeps
// the device, its forwarding and neighbour entries, and the firewall that lets the device accept
// encapsulated packets only from the cluster's nodes (firewall.go).
package overlay

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/kubenet-dev/kubenet/internal/links"
)

// Defaults of a Device.
const (
	DefaultDevice = "kubenet-vxlan"
	// DefaultPort is the Linux kernel's and flannel's VXLAN port (IANA's is 4789).
	DefaultPort = 8472
	DefaultVNI  = 1
)

// Overhead is what VXLAN adds to every inner frame on an underlay of the family of a: outer IP
// header, UDP (8), VXLAN (8) and the inner Ethernet header (14).
func Overhead(a netip.Addr) int {
	if a.Unmap().Is4() {
		return 20 + 8 + 8 + 14
	}
	return 40 + 8 + 8 + 14
}

// MAC is the VTEP MAC of the node whose underlay address is a: locally administered and unicast
// (first byte 0x0e), the IPv4 address itself for IPv4, a hash of the address for IPv6. Every node
// computes every other node's MAC the same way, so none has to be published.
func MAC(a netip.Addr) net.HardwareAddr {
	a = a.Unmap()
	if a.Is4() {
		b := a.As4()
		return net.HardwareAddr{0x0e, 0x4b, b[0], b[1], b[2], b[3]}
	}
	b := a.As16()
	sum := sha256.Sum256(b[:])
	return net.HardwareAddr{0x0e, sum[0], sum[1], sum[2], sum[3], sum[4]}
}

// NextHop is the overlay next hop of a peer's pod CIDR: its first address. The peer need not own
// it: the neighbour entry resolves it to the peer's MAC, and the peer routes the inner packet by
// its destination.
func NextHop(podCIDR netip.Prefix) netip.Addr { return podCIDR.Masked().Addr() }

// Device is the overlay device as this node needs it.
type Device struct {
	Name  string
	VNI   uint32
	Port  uint16
	Local netip.Addr // this node's underlay address (its InternalIP): the source of every encapsulated packet
	MTU   int
}

// Peer is another node reached through the overlay.
type Peer struct {
	Node     string
	Underlay netip.Addr     // the peer's InternalIP, of the family of Device.Local
	PodCIDRs []netip.Prefix // the CIDRs routed to it through the device
}

// OwnerAlias is the alias (IFLA_IFALIAS) of the device Ensure makes: a VXLAN link that carries it
// is the agent's whatever its name (renamed by another tool, or made under another --vxlan-device).
const OwnerAlias = "kubenet-agent overlay"

// removeStrays deletes every VXLAN link with OwnerAlias but not named name: renamed away, or left
// by an earlier --vxlan-device, it would keep decapsulating outside the firewall's device rules
// (and on its own port), and hold its VNI and port against the device Ensure makes.
func removeStrays(name string) error {
	ls, err := netlinksafe.LinkList()
	if err != nil {
		return fmt.Errorf("overlay: list links: %w", err)
	}
	for _, l := range ls {
		if _, ok := l.(*netlink.Vxlan); !ok || l.Attrs().Alias != OwnerAlias || l.Attrs().Name == name {
			continue
		}
		if err := netlink.LinkDel(l); err != nil && !links.IsNotFound(err) {
			return fmt.Errorf("overlay: delete %s, an earlier overlay device: %w", l.Attrs().Name, err)
		}
	}
	return nil
}

// Ensure makes the device exist as d says, up, with MAC(d.Local), and returns its index. A device
// of another kind, VNI, port or local address is replaced (its routes, neighbour and forwarding
// entries go with it and are rebuilt by Sync and the agent's routes); MTU, MAC and state are
// fixed in place, so a device that is right is never touched.
func Ensure(d Device) (int, error) {
	mac := MAC(d.Local)
	if err := removeStrays(d.Name); err != nil {
		return 0, err
	}
	l, err := links.Find(d.Name)
	if err != nil {
		return 0, fmt.Errorf("overlay: %w", err)
	}
	if l != nil {
		v, ok := l.(*netlink.Vxlan)
		if ok && matches(v, d) {
			return l.Attrs().Index, fixInPlace(l, d, mac)
		}
		if !ok {
			// Not ours to delete: a link of another kind that happens to carry the name.
			return 0, fmt.Errorf("overlay: %s is a %s link, not a VXLAN device; left alone", d.Name, l.Type())
		}
		if err := netlink.LinkDel(l); err != nil && !links.IsNotFound(err) {
			return 0, fmt.Errorf("overlay: replace device %s: %w", d.Name, err)
		}
	}
	v := &netlink.Vxlan{
		LinkAttrs: netlink.LinkAttrs{Name: d.Name, MTU: d.MTU, HardwareAddr: mac},
		VxlanId:   int(d.VNI),
		SrcAddr:   d.Local.AsSlice(),
		Port:      int(d.Port),
		Learning:  false,
	}
	if err := netlink.LinkAdd(v); err != nil {
		return 0, fmt.Errorf("overlay: create device %s (vni %d, port %d, local %s): %w", d.Name, d.VNI, d.Port, d.Local, err)
	}
	l, err = links.Find(d.Name)
	if err != nil || l == nil {
		return 0, fmt.Errorf("overlay: device %s vanished after its creation: %v", d.Name, err)
	}
	return l.Attrs().Index, fixInPlace(l, d, mac)
}

// matches reports whether v is the device d describes in what cannot be changed in place.
func matches(v *netlink.Vxlan, d Device) bool {
	local, _ := netip.AddrFromSlice(v.SrcAddr)
	// TTL and TOS 0: inherited from the inner packet, "auto" (a TTL of 1 set by somebody would
	// cut off every peer behind a router).
	return v.VxlanId == int(d.VNI) && v.Port == int(d.Port) && local.Unmap() == d.Local.Unmap() &&
		!v.Learning && v.Group == nil && !v.FlowBased && v.TTL == 0 && v.TOS == 0
}

func fixInPlace(l netlink.Link, d Device, mac net.HardwareAddr) error {
	a := l.Attrs()
	if a.MTU != d.MTU {
		if err := netlink.LinkSetMTU(l, d.MTU); err != nil {
			return fmt.Errorf("overlay: set MTU %d of %s: %w", d.MTU, d.Name, err)
		}
	}
	if a.HardwareAddr.String() != mac.String() {
		if err := netlink.LinkSetHardwareAddr(l, mac); err != nil {
			return fmt.Errorf("overlay: set MAC %s of %s: %w", mac, d.Name, err)
		}
	}
	if a.Alias != OwnerAlias {
		if err := netlink.LinkSetAlias(l, OwnerAlias); err != nil {
			return fmt.Errorf("overlay: set alias of %s: %w", d.Name, err)
		}
	}
	if a.Flags&net.FlagUp == 0 {
		if err := netlink.LinkSetUp(l); err != nil {
			return fmt.Errorf("overlay: set %s up: %w", d.Name, err)
		}
	}
	return nil
}

// Remove deletes the device (with its entries and the routes through it); absent is fine.
func Remove(name string) error {
	if err := removeStrays(name); err != nil {
		return err
	}
	l, err := links.Find(name)
	if err != nil {
		return fmt.Errorf("overlay: %w", err)
	}
	if l == nil {
		return nil
	}
	if _, ok := l.(*netlink.Vxlan); !ok {
		// Not ours to delete: a link of another kind that happens to carry the name.
		return fmt.Errorf("overlay: %s is a %s link, not the overlay's VXLAN device; left alone", name, l.Type())
	}
	if err := netlink.LinkDel(l); err != nil && !links.IsNotFound(err) {
		return fmt.Errorf("overlay: delete %s: %w", name, err)
	}
	return nil
}

// entry is one static entry Sync keeps: a forwarding entry (MAC → underlay address) or a
// neighbour entry (next hop → MAC).
type entry struct {
	ip  netip.Addr
	mac string
}

// Sync makes the device at index dev hold exactly the forwarding and neighbour entries of peers:
// missing or wrong ones are written (NLM_F_REPLACE: no moment without an entry), others removed.
// A peer whose MAC another peer already has is refused (a hash collision of IPv6 addresses, or two
// Nodes with one InternalIP): sending its traffic to either would be wrong. It returns the peers
// it could not program and why; one failure does not stop the others.
func Sync(dev int, peers []Peer) map[string]error {
	failed := map[string]error{}
	var fdb, neigh []entry
	// One MAC, one underlay address. Two peers with one address (a Node that copied another's
	// InternalIP) share its VTEP, as direct routes via that address would: the copy's traffic
	// ends at the node that owns the address, which drops it. A MAC derived from two different
	// addresses (an IPv6 hash collision) cannot say where either is: both are refused.
	byMAC := map[string]Peer{}
	for _, p := range peers {
		mac := MAC(p.Underlay).String()
		if other, ok := byMAC[mac]; ok && other.Underlay.Unmap() != p.Underlay.Unmap() {
			failed[p.Node] = fmt.Errorf("its VTEP MAC %s (from InternalIP %s) is also node %s's (from %s)", mac, p.Underlay, other.Node, other.Underlay)
			failed[other.Node] = fmt.Errorf("its VTEP MAC %s is also node %s's", mac, p.Node)
			continue
		}
		byMAC[mac] = p
	}
	for _, p := range peers {
		if failed[p.Node] != nil {
			continue
		}
		mac := MAC(p.Underlay).String()
		if !slices.ContainsFunc(fdb, func(e entry) bool { return e.ip == p.Underlay.Unmap() }) {
			fdb = append(fdb, entry{p.Underlay.Unmap(), mac})
		}
		for _, c := range p.PodCIDRs {
			neigh = append(neigh, entry{NextHop(c), mac})
		}
	}
	if err := syncFDB(dev, fdb, failed, peers); err != nil {
		for _, p := range peers {
			failed[p.Node] = err
		}
		return failed
	}
	if err := syncNeighbours(dev, neigh, failed, peers); err != nil {
		for _, p := range peers {
			failed[p.Node] = err
		}
	}
	return failed
}

// owner finds the peer an entry belongs to, for the failure report.
func owner(peers []Peer, e entry) string {
	for _, p := range peers {
		if p.Underlay.Unmap() == e.ip || slices.ContainsFunc(p.PodCIDRs, func(c netip.Prefix) bool { return NextHop(c) == e.ip }) {
			return p.Node
		}
	}
	return ""
}

func syncFDB(dev int, want []entry, failed map[string]error, peers []Peer) error {
	have, err := neighList(dev, unix.AF_BRIDGE)
	if err != nil {
		return fmt.Errorf("overlay: list forwarding entries: %w", err)
	}
	return converge(dev, have, want, failed, peers, func(n netlink.Neigh) (entry, bool) {
		ip, ok := netip.AddrFromSlice(n.IP)
		// The kernel lists the device's own address and entries of other kinds too; only static
		// unicast entries with a destination are the agent's.
		if !ok || n.HardwareAddr == nil || n.HardwareAddr[0]&1 == 1 {
			return entry{}, false
		}
		return entry{ip.Unmap(), n.HardwareAddr.String()}, true
	}, func(e entry) *netlink.Neigh {
		mac, _ := net.ParseMAC(e.mac)
		return &netlink.Neigh{LinkIndex: dev, Family: unix.AF_BRIDGE, State: netlink.NUD_PERMANENT,
			Flags: netlink.NTF_SELF, IP: e.ip.AsSlice(), HardwareAddr: mac}
	})
}

func syncNeighbours(dev int, want []entry, failed map[string]error, peers []Peer) error {
	have, err := neighList(dev, netlink.FAMILY_ALL)
	if err != nil {
		return fmt.Errorf("overlay: list neighbour entries: %w", err)
	}
	have = slices.DeleteFunc(have, func(n netlink.Neigh) bool { return n.Family == unix.AF_BRIDGE })
	return converge(dev, have, want, failed, peers, func(n netlink.Neigh) (entry, bool) {
		ip, ok := netip.AddrFromSlice(n.IP)
		if !ok {
			return entry{}, false
		}
		if n.State&netlink.NUD_PERMANENT == 0 {
			// An entry the kernel made for an address nothing routes here (it can never
			// resolve: nothing answers ARP or ND across the overlay); removing it costs nothing.
			return entry{ip.Unmap(), ""}, true
		}
		return entry{ip.Unmap(), n.HardwareAddr.String()}, true
	}, func(e entry) *netlink.Neigh {
		mac, _ := net.ParseMAC(e.mac)
		family := unix.AF_INET
		if e.ip.Is6() {
			family = unix.AF_INET6
		}
		return &netlink.Neigh{LinkIndex: dev, Family: family, State: netlink.NUD_PERMANENT, IP: e.ip.AsSlice(), HardwareAddr: mac}
	})
}

// converge writes the entries of want that have lacks (or has with another MAC) and deletes the
// ones it has that want lacks.
func converge(dev int, have []netlink.Neigh, want []entry, failed map[string]error, peers []Peer,
	read func(netlink.Neigh) (entry, bool), build func(entry) *netlink.Neigh) error {
	wanted := map[netip.Addr]string{}
	for _, e := range want {
		wanted[e.ip] = e.mac
	}
	present := map[netip.Addr]string{}
	var errs []error
	for _, n := range have {
		e, ok := read(n)
		if !ok {
			continue
		}
		if mac, keep := wanted[e.ip]; keep && mac == e.mac {
			present[e.ip] = e.mac
			continue
		}
		if _, keep := wanted[e.ip]; keep {
			continue // replaced below, in one request
		}
		n.LinkIndex = dev
		if err := netlink.NeighDel(&n); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("overlay: delete entry %s %s: %w", e.ip, e.mac, err))
		}
	}
	for _, e := range want {
		if present[e.ip] == e.mac {
			continue
		}
		if err := netlink.NeighSet(build(e)); err != nil {
			if node := owner(peers, e); node != "" {
				failed[node] = fmt.Errorf("overlay entry %s → %s: %w", e.ip, e.mac, err)
				continue
			}
			errs = append(errs, fmt.Errorf("overlay: entry %s %s: %w", e.ip, e.mac, err))
		}
	}
	return errors.Join(errs...)
}

// UnderlayMTU is the MTU of the link that holds local, the largest an encapsulated packet may be
// on its first hop.
func UnderlayMTU(local netip.Addr) (int, error) {
	addrs, err := netlinksafe.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return 0, fmt.Errorf("overlay: list addresses: %w", err)
	}
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok || ip.Unmap() != local.Unmap() {
			continue
		}
		l, err := netlink.LinkByIndex(a.LinkIndex)
		if err != nil {
			return 0, fmt.Errorf("overlay: link of %s: %w", local, err)
		}
		return l.Attrs().MTU, nil
	}
	return 0, fmt.Errorf("overlay: %s (this node's InternalIP) is not an address of this node: encapsulated packets could not carry it as their source", local)
}

// neighList lists the device's entries of family, again when the kernel says a concurrent change
// interrupted the dump (the plugins' netlinksafe has no wrapper for neighbours).
func neighList(dev, family int) ([]netlink.Neigh, error) {
	for range 5 {
		ns, err := netlink.NeighList(dev, family)
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			return ns, err
		}
	}
	return nil, fmt.Errorf("dump of link %d's entries interrupted 5 times in a row", dev)
}
