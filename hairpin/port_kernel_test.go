package hairpin

import (
	"fmt"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/kubenet-dev/kubenet/test/nettest"
)

// TestPortHairpinWhileOtherPortsGo reads one port's hairpin flag while bridge ports listed before
// it are deleted, as CHECK does on a busy node. The kernel dumps ports by position, so a read
// through a dump of every port (netlink's LinkGetProtinfo) loses the port when a deletion lands
// between two parts of the dump and reports "Device not found" for a port that is there.
func TestPortHairpinWhileOtherPortsGo(t *testing.T) {
	nettest.RequireRoot(t)
	const earlier = 300 // enough ports that a dump takes several messages
	node := nettest.NewNS(t)
	var port netlink.Link
	nettest.Do(t, node, func() error {
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br-hp"}}
		if err := netlink.LinkAdd(br); err != nil {
			return fmt.Errorf("bridge: %w", err)
		}
		for i := range earlier {
			if _, err := addPort(br, fmt.Sprintf("hp-early%d", i)); err != nil {
				return err
			}
		}
		var err error
		if port, err = addPort(br, "hp-port"); err != nil {
			return err
		}
		return SetPort(HairpinVeth, port)
	})

	deleted := make(chan error, 1)
	go func() {
		deleted <- node.Do(func(ns.NetNS) error {
			for i := range earlier {
				name := fmt.Sprintf("hp-early%d", i)
				if err := netlink.LinkDel(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}}); err != nil {
					return fmt.Errorf("delete %s: %w", name, err)
				}
			}
			return nil
		})
	}()

	reads := 0
	nettest.Do(t, node, func() error {
		for {
			select {
			case err := <-deleted:
				return err
			default:
			}
			reads++
			on, err := PortHairpin(port)
			if err != nil {
				return fmt.Errorf("read %d: %w", reads, err)
			}
			if !on {
				return fmt.Errorf("read %d: hairpin flag off, want on", reads)
			}
		}
	})
	t.Logf("%d reads while %d earlier ports were deleted", reads, earlier)
}

// addPort makes a veth pair and puts one end on br, up.
func addPort(br netlink.Link, name string) (netlink.Link, error) {
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name, MasterIndex: br.Attrs().Index}, PeerName: name + "p"}
	if err := netlink.LinkAdd(veth); err != nil {
		return nil, fmt.Errorf("veth %s: %w", name, err)
	}
	link, err := netlink.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("veth %s: %w", name, err)
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return nil, fmt.Errorf("veth %s up: %w", name, err)
	}
	return link, nil
}
