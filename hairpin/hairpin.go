// Package hairpin lets a pod reach itself through an address that is translated back to it (its
// own Service IP, or the node's address on its own hostPort). The packet then has to leave the
// bridge through the port it came in on, which a Linux bridge only does when told to. kubelet
// offered three modes, kept here with their names:
//
//   - hairpin-veth: set the hairpin flag on the pod's bridge port (the modern, cheap way);
//   - promiscuous-bridge: put the bridge in promiscuous mode, and drop the duplicate frames this
//     makes the bridge send to pods (old kubenet's ebtables KUBE-DEDUP chain, here an nftables
//     bridge-family chain for both families). Since Linux 6.8 a promiscuous bridge no longer
//     carries a pod's translated packet back to it (Azure/AgentBaker#8426), so this mode sets the
//     port's hairpin flag as well: the mode keeps its promiscuous bridge and dedup rules, which
//     node tooling may look for, and pods can still reach themselves;
//   - none: neither; a pod cannot reach itself through a translated address.
package hairpin

import (
	"fmt"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
)

// Mode is a kubelet --hairpin-mode value.
type Mode string

// The modes kubelet accepts.
const (
	HairpinVeth       Mode = "hairpin-veth"
	PromiscuousBridge Mode = "promiscuous-bridge"
	None              Mode = "none"
)

// Modes lists the valid modes, for validation messages.
func Modes() []Mode { return []Mode{HairpinVeth, PromiscuousBridge, None} }

// Parse validates s; "" means the default, hairpin-veth.
func Parse(s string) (Mode, error) {
	if s == "" {
		return HairpinVeth, nil
	}
	for _, m := range Modes() {
		if Mode(s) == m {
			return m, nil
		}
	}
	return "", fmt.Errorf("unknown hairpin mode %q (valid: %s, %s, %s)", s, HairpinVeth, PromiscuousBridge, None)
}

// PromiscuousBridge tells whether the bridge must be in promiscuous mode.
func (m Mode) PromiscuousBridge() bool { return m == PromiscuousBridge }

// PortFlag tells whether a pod's bridge port gets the hairpin flag in mode m.
func (m Mode) PortFlag() bool { return m == HairpinVeth || m == PromiscuousBridge }

// SetPort sets or clears the hairpin flag of a pod's bridge port according to the mode.
func SetPort(m Mode, port netlink.Link) error {
	if err := netlink.LinkSetHairpin(port, m.PortFlag()); err != nil {
		return fmt.Errorf("hairpin flag on %q: %w", port.Attrs().Name, err)
	}
	return nil
}

// protinfoAttempts bounds the re-reads of an interrupted bridge-port dump.
const protinfoAttempts = 5

// PortHairpin reads the hairpin flag of a bridge port (for CHECK and tests).
//
// The kernel only reports port flags in a dump of every bridge port, and a dump that runs while
// other pods' veths come and go is interrupted. netlink then keeps the partial answer and, when
// this port is missing from it, reports "Device with index N not found" instead of the
// interruption. So a port that is still there by its index is read again.
func PortHairpin(port netlink.Link) (bool, error) {
	var err error
	for range protinfoAttempts {
		var info netlink.Protinfo
		info, err = netlinksafe.LinkGetProtinfo(port)
		if err == nil {
			return info.Hairpin, nil
		}
		if _, gone := netlink.LinkByIndex(port.Attrs().Index); gone != nil {
			break
		}
	}
	return false, fmt.Errorf("bridge port %q: %w", port.Attrs().Name, err)
}
