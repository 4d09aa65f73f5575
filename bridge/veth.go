package bridge

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/kubenet-dev/kubenet/internal/links"
)

// ErrInterfaceExists is returned when the pod already has an interface of the requested name.
// The CNI spec requires ADD to fail then, and to leave the existing interface alone.
var ErrInterfaceExists = errors.New("interface already exists in the pod")

// Veth describes one pod's veth pair.
type Veth struct {
	HostName  string // host end, on the bridge; derived from the attachment so DEL finds it without the pod
	PodIfName string // pod end, inside the pod's netns (CNI_IFNAME)
	MTU       int
	Bridge    *netlink.Bridge
}

// AddVeth creates the pair with the pod end directly inside podNS and the host end on the bridge,
// and brings the host end up. A leftover host end of the same name (from a crashed ADD of this
// attachment) is removed first.
func AddVeth(v Veth, podNS ns.NetNS) (netlink.Link, error) {
	err := podNS.Do(func(ns.NetNS) error {
		if _, err := netlinksafe.LinkByName(v.PodIfName); err == nil {
			return fmt.Errorf("%q: %w", v.PodIfName, ErrInterfaceExists)
		} else if !links.IsNotFound(err) {
			return err
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if err := DelVeth(v.HostName); err != nil {
		return nil, err
	}
	attrs := netlink.NewLinkAttrs()
	attrs.Name = v.HostName
	attrs.MTU = v.MTU
	attrs.MasterIndex = v.Bridge.Index
	veth := &netlink.Veth{
		LinkAttrs:     attrs,
		PeerName:      v.PodIfName,
		PeerNamespace: netlink.NsFd(int(podNS.Fd())),
		PeerTxQLen:    -1,
		PeerMTU:       uint32(v.MTU),
	}
	if err := netlink.LinkAdd(veth); err != nil {
		// LinkAdd may have created the pair and failed to enslave it.
		_ = DelVeth(v.HostName)
		return nil, fmt.Errorf("veth %q: create: %w", v.HostName, err)
	}
	host, err := netlinksafe.LinkByName(v.HostName)
	if err != nil {
		return nil, fmt.Errorf("veth %q: %w", v.HostName, err)
	}
	if err := netlink.LinkSetUp(host); err != nil {
		return nil, fmt.Errorf("veth %q: set up: %w", v.HostName, err)
	}
	return host, nil
}

// DelVeth removes the host end (which removes the pod end with it). A missing link is success:
// DEL must be repeatable and must work after the pod's netns is gone.
func DelVeth(hostName string) error {
	l, err := links.Find(hostName)
	if err != nil {
		return fmt.Errorf("veth: %w", err)
	}
	return links.DeleteTogether(l)
}

// Pod is the addressing of a pod interface.
type Pod struct {
	IfName   string
	Addrs    []netip.Prefix // pod address with the pod CIDR's prefix length
	Gateways []netip.Addr   // one per family: the default route's next hop
}

// ConfigurePod runs inside the pod's netns: sysctls, addresses (without DAD, so IPv6 works the
// moment the pod starts), link up, loopback up and a default route per family. It returns the
// interface's MAC for the CNI result.
func ConfigurePod(podNS ns.NetNS, p Pod) (net.HardwareAddr, error) {
	var mac net.HardwareAddr
	err := podNS.Do(func(ns.NetNS) error {
		link, err := netlinksafe.LinkByName(p.IfName)
		if err != nil {
			return err
		}
		if err := podSysctls(p); err != nil {
			return err
		}
		for _, a := range p.Addrs {
			addr := &netlink.Addr{IPNet: PrefixToIPNet(a), Flags: unix.IFA_F_NODAD}
			if err := netlink.AddrAdd(link, addr); err != nil {
				return fmt.Errorf("add address %s: %w", a, err)
			}
		}
		if err := netlink.LinkSetUp(link); err != nil {
			return fmt.Errorf("set %s up: %w", p.IfName, err)
		}
		if err := setLoopbackUp(); err != nil {
			return err
		}
		for _, gw := range p.Gateways {
			dst := netip.PrefixFrom(netip.IPv4Unspecified(), 0)
			if gw.Is6() {
				dst = netip.PrefixFrom(netip.IPv6Unspecified(), 0)
			}
			r := &netlink.Route{LinkIndex: link.Attrs().Index, Dst: PrefixToIPNet(dst), Gw: gw.AsSlice()}
			if err := netlink.RouteAdd(r); err != nil {
				return fmt.Errorf("add default route via %s: %w", gw, err)
			}
		}
		mac = link.Attrs().HardwareAddr
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("pod interface %q: %w", p.IfName, err)
	}
	return mac, nil
}

func podSysctls(p Pod) error {
	// arp_notify: announce the new address at once, so the bridge and the gateway learn it before
	// the first packet instead of after a failed ARP round.
	if err := ensureSysctl(fmt.Sprintf("net/ipv4/conf/%s/arp_notify", p.IfName), "1"); err != nil {
		return err
	}
	for _, a := range p.Addrs {
		if !a.Addr().Is6() {
			continue
		}
		for _, kv := range [][2]string{
			{"net/ipv6/conf/" + p.IfName + "/disable_ipv6", "0"},
			{"net/ipv6/conf/" + p.IfName + "/accept_dad", "0"},
			{"net/ipv6/conf/" + p.IfName + "/dad_transmits", "0"},
			{"net/ipv6/conf/lo/disable_ipv6", "0"},
		} {
			if err := ensureSysctl(kv[0], kv[1]); err != nil {
				return err
			}
		}
		break
	}
	return nil
}

func setLoopbackUp() error {
	lo, err := netlinksafe.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("loopback: %w", err)
	}
	if lo.Attrs().Flags&net.FlagUp != 0 {
		return nil
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return fmt.Errorf("loopback up: %w", err)
	}
	return nil
}
