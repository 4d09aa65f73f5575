package nettest

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
)

// Underlay is one L2 segment shared by simulated hosts: a bridge inside a namespace of its own,
// to which each host's interface is attached by a veth. Hosts on it reach each other directly,
// as nodes on one LAN do.
type Underlay struct {
	NS    ns.NetNS
	mtu   int
	ports int
}

// underlayBridge is the bridge's name inside the underlay namespace.
const underlayBridge = "br0"

// NewUnderlay makes the segment; it is removed with its namespace at cleanup. mtu is the
// segment's MTU (0: the kernel's default), given to the bridge and to both ends of every
// attachment. addrs go on the bridge itself, for a router on the segment in the underlay
// namespace.
func NewUnderlay(t testing.TB, mtu int, addrs ...netip.Prefix) *Underlay {
	t.Helper()
	return NewUnderlayIn(t, NewNS(t), mtu, addrs...)
}

// NewUnderlayIn is NewUnderlay in a namespace the caller made (and removes).
func NewUnderlayIn(t testing.TB, n ns.NetNS, mtu int, addrs ...netip.Prefix) *Underlay {
	t.Helper()
	u := &Underlay{NS: n, mtu: mtu}
	Do(t, u.NS, func() error {
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: underlayBridge, MTU: mtu}}
		if err := netlink.LinkAdd(br); err != nil {
			return fmt.Errorf("add underlay bridge: %w", err)
		}
		return configureLink(underlayBridge, addrs)
	})
	return u
}

// Attach gives host an interface ifName on the segment with addrs (no DAD, up).
func (u *Underlay) Attach(t testing.TB, host ns.NetNS, ifName string, addrs ...netip.Prefix) {
	t.Helper()
	u.ports++
	port := fmt.Sprintf("port%d", u.ports)
	Link(t, Endpoint{NS: u.NS, IfName: port}, Endpoint{NS: host, IfName: ifName, Addrs: addrs})
	if u.mtu > 0 {
		Do(t, host, func() error { return setMTU(ifName, u.mtu) })
	}
	Do(t, u.NS, func() error {
		l, err := netlink.LinkByName(port)
		if err != nil {
			return err
		}
		if u.mtu > 0 {
			if err := setMTU(port, u.mtu); err != nil {
				return err
			}
		}
		br, err := netlink.LinkByName(underlayBridge)
		if err != nil {
			return err
		}
		if err := netlink.LinkSetMaster(l, br); err != nil {
			return fmt.Errorf("attach %s to the underlay bridge: %w", port, err)
		}
		return nil
	})
}

func setMTU(name string, mtu int) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return err
	}
	if err := netlink.LinkSetMTU(l, mtu); err != nil {
		return fmt.Errorf("mtu %d on %s: %w", mtu, name, err)
	}
	return nil
}
