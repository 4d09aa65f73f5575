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
	"strings"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
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

// PortHairpin reads the hairpin flag of a bridge port (for CHECK and tests).
//
// It asks for the port's own link message, where the kernel reports a bridge port's settings
// (IFLA_LINKINFO, slave data of kind "bridge"). netlink's LinkGetProtinfo reads the flag from a
// dump of every bridge port instead, which costs one entry per pod and, since the kernel dumps
// ports by position, misses a live port when another one goes away during the dump.
func PortHairpin(port netlink.Link) (bool, error) {
	name := port.Attrs().Name
	req := nl.NewNetlinkRequest(unix.RTM_GETLINK, unix.NLM_F_ACK)
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(port.Attrs().Index)
	req.AddData(msg)
	msgs, err := req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWLINK)
	if err != nil {
		return false, fmt.Errorf("bridge port %q: %w", name, err)
	}
	for _, m := range msgs {
		attrs, err := nl.ParseRouteAttr(m[unix.SizeofIfInfomsg:])
		if err != nil {
			return false, fmt.Errorf("bridge port %q: %w", name, err)
		}
		data, ok := bridgeSlaveData(attrs)
		if !ok {
			continue
		}
		for _, a := range data {
			if a.Attr.Type == nl.IFLA_BRPORT_MODE && len(a.Value) > 0 {
				return a.Value[0] != 0, nil
			}
		}
	}
	return false, fmt.Errorf("bridge port %q: the kernel reports no bridge port settings (not on a bridge?)", name)
}

// bridgeSlaveData returns the bridge-port attributes nested in a link message's IFLA_LINKINFO.
func bridgeSlaveData(attrs []syscall.NetlinkRouteAttr) ([]syscall.NetlinkRouteAttr, bool) {
	for _, a := range attrs {
		if a.Attr.Type&^unix.NLA_F_NESTED != unix.IFLA_LINKINFO {
			continue
		}
		info, err := nl.ParseRouteAttr(a.Value)
		if err != nil {
			return nil, false
		}
		var kind string
		var data []byte
		for _, i := range info {
			switch i.Attr.Type &^ unix.NLA_F_NESTED {
			case nl.IFLA_INFO_SLAVE_KIND:
				kind = strings.TrimRight(string(i.Value), "\x00")
			case nl.IFLA_INFO_SLAVE_DATA:
				data = i.Value
			}
		}
		if kind != "bridge" || data == nil {
			return nil, false
		}
		out, err := nl.ParseRouteAttr(data)
		return out, err == nil
	}
	return nil, false
}
