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
	ports int
}

// underlayBridge is the bridge's name inside the underlay namespace.
const underlayBridge = "br0"

// NewUnderlay makes the segment; it is removed with its namespace at cleanup.
func NewUnderlay(t testing.TB) *Underlay {
	t.Helper()
	u := &Underlay{NS: NewNS(t)}
	Do(t, u.NS, func() error {
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: underlayBridge}}
		if err := netlink.LinkAdd(br); err != nil {
			return fmt.Errorf("add underlay bridge: %w", err)
		}
		return netlink.LinkSetUp(br)
	})
	return u
}

// Attach gives host an interface ifName on the segment with addrs (no DAD, up).
func (u *Underlay) Attach(t testing.TB, host ns.NetNS, ifName string, addrs ...netip.Prefix) {
	t.Helper()
	u.ports++
	port := fmt.Sprintf("port%d", u.ports)
	Link(t, Endpoint{NS: u.NS, IfName: port}, Endpoint{NS: host, IfName: ifName, Addrs: addrs})
	Do(t, u.NS, func() error {
		l, err := netlink.LinkByName(port)
		if err != nil {
			return err
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
