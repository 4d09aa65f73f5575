package bridge

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/kubenet-dev/kubenet/internal/ipnet"
	"github.com/kubenet-dev/kubenet/internal/links"
	"github.com/kubenet-dev/kubenet/internal/sysctl"
)

// ErrInterfaceExists is returned when the pod already has an interface of the requested name.
// The CNI spec requires ADD to fail then, and to leave the existing interface alone.
var ErrInterfaceExists = errors.New("interface already exists in the pod")

// Veth describes one pod's veth pair.
type Veth struct {
	HostName  string // host end, on the bridge; derived from the attachment so DEL finds it without the pod
	PodIfName string // pod end, inside the pod's netns (CNI_IFNAME)
	// PodMAC is the pod end's MAC (nil: the kernel picks one). Derived from the attachment like
	// HostName, so that what is keyed by it can be found without the pod.
	PodMAC net.HardwareAddr
	MTU    int
	Bridge *netlink.Bridge
}

// AddVeth creates the pair with the pod end directly inside podNS and the host end on the bridge,
// and brings the host end up. A leftover host end of the same name (from a crashed ADD of this
// attachment) is removed first. The pod's defaults for new interfaces are set first (see
// podDefaults), so the pod end is born with them.
func AddVeth(v Veth, podNS ns.NetNS) (netlink.Link, error) {
	err := podNS.Do(func(ns.NetNS) error {
		if _, err := netlinksafe.LinkByName(v.PodIfName); err == nil {
			return fmt.Errorf("%q: %w", v.PodIfName, ErrInterfaceExists)
		} else if !links.IsNotFound(err) {
			return err
		}
		return podDefaults()
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
		LinkAttrs:        attrs,
		PeerName:         v.PodIfName,
		PeerNamespace:    netlink.NsFd(int(podNS.Fd())),
		PeerTxQLen:       -1,
		PeerMTU:          uint32(v.MTU),
		PeerHardwareAddr: v.PodMAC,
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
	Addrs    []netip.Prefix   // pod address with the pod CIDR's prefix length
	Gateways []netip.Addr     // one per family: the default route's next hop
	MAC      net.HardwareAddr // for CheckPod: the MAC AddVeth gave it (nil: not checked)
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
		if err := podSysctls(link, p); err != nil {
			return err
		}
		for _, a := range p.Addrs {
			addr := &netlink.Addr{IPNet: ipnet.FromPrefix(a), Flags: unix.IFA_F_NODAD}
			if err := netlink.AddrAdd(link, addr); err != nil {
				return fmt.Errorf("add address %s: %w", a, err)
			}
		}
		if err := netlink.LinkSetUp(link); err != nil {
			return fmt.Errorf("set %s up: %w", p.IfName, err)
		}
		if err := links.SetLoopbackUp(); err != nil {
			return err
		}
		for _, gw := range p.Gateways {
			dst := netip.PrefixFrom(netip.IPv4Unspecified(), 0)
			if gw.Is6() {
				dst = netip.PrefixFrom(netip.IPv6Unspecified(), 0)
			}
			r := &netlink.Route{LinkIndex: link.Attrs().Index, Dst: ipnet.FromPrefix(dst), Gw: gw.AsSlice()}
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

// podDefaults sets, inside the pod's netns, what every interface created there afterwards
// inherits (net.ipv6.conf.default) and what applies to all of them (conf.all): no pod accepts
// router advertisements, on an IPv4-only network too (the pod's IPv6 link-local stack is up);
// and IPv6 link-local addresses are derived from the MAC (EUI-64), which the bridge's
// anti-spoofing rules expect. Setting the defaults before the pod end exists spares a lookup of
// its name in /proc, whose cost grows with the pods on the node (see sysctl.EnsureIn), as does
// every directory looked up here: hence two, and redirects are left to the bridge, which drops
// every redirect a pod sends (a pod's only router is the node). They are written without being
// read first: the namespace is the pod's own and new (accept_ra is 1 there), and a read costs
// what the write it might spare costs (0.1 ms each under 100 parallel ADDs, perf). A kernel
// without IPv6 has nothing to set.
func podDefaults() error {
	for _, s := range []struct {
		dir    string
		values [][2]string
	}{
		{"net/ipv6/conf/all", [][2]string{{"accept_ra", "0"}}},
		{"net/ipv6/conf/default", [][2]string{{"accept_ra", "0"}, {"addr_gen_mode", "0"}}},
	} {
		if err := sysctl.SetIn(s.dir, s.values); err != nil && !sysctl.IsAbsent(err) {
			return fmt.Errorf("pod sysctls: %w", err)
		}
	}
	return nil
}

func podSysctls(link netlink.Link, p Pod) error {
	// arp_notify: announce the new address at once, so the bridge and the gateway learn it before
	// the first packet instead of after a failed ARP round.
	if err := setIPv4DevConf(link, ipv4DevConfArpNotify, 1); err != nil {
		return fmt.Errorf("arp_notify: %w", err)
	}
	for _, a := range p.Addrs {
		if !a.Addr().Is6() {
			continue
		}
		// IPv6 has no rtnetlink way to change these, so /proc it is, with one lookup of the
		// interface's directory for all three.
		if err := sysctl.EnsureIn("net/ipv6/conf/"+p.IfName, [][2]string{{"disable_ipv6", "0"}, {"accept_dad", "0"}, {"dad_transmits", "0"}}); err != nil {
			return err
		}
		return sysctl.Ensure("net/ipv6/conf/lo/disable_ipv6", "0")
	}
	return nil
}

// ipv4DevConfArpNotify is IPV4_DEVCONF_ARP_NOTIFY of linux/ip.h (x/sys/unix does not define it).
const ipv4DevConfArpNotify = 22

// setIPv4DevConf sets one IPv4 per-interface setting (what /proc/sys/net/ipv4/conf/<if>/ shows)
// over rtnetlink, without the /proc lookup of the interface's name that grows with the pods on
// the node (see sysctl.EnsureIn). perf on a node with 490 pods: proc_sys_compare went from 0.1% to
// 3% of an ADD's samples.
func setIPv4DevConf(link netlink.Link, id int, value uint32) error {
	req := nl.NewNetlinkRequest(unix.RTM_NEWLINK, unix.NLM_F_ACK)
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(link.Attrs().Index)
	req.AddData(msg)
	spec := nl.NewRtAttr(unix.IFLA_AF_SPEC, nil)
	conf := spec.AddRtAttr(unix.AF_INET, nil).AddRtAttr(unix.IFLA_INET_CONF, nil)
	conf.AddRtAttr(id, nl.Uint32Attr(value))
	req.AddData(spec)
	if _, err := req.Execute(unix.NETLINK_ROUTE, 0); err != nil {
		return fmt.Errorf("set IPv4 setting %d of %q: %w", id, link.Attrs().Name, err)
	}
	return nil
}
