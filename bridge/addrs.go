package bridge

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"syscall"

	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// rtnl is one route-netlink socket for the dumps of one call, with the kernel's strict checking
// of dump requests on (NETLINK_GET_STRICT_CHK, Linux 4.20 for IPv4 and 5.0 for IPv6), so the
// kernel filters what it can. Older kernels ignore the filter and send everything, so every
// dump also checks in user space what it asked the kernel to filter. Messages are decoded here,
// only as far as the checks need: netlink.AddrList and RouteList decode every attribute of every
// entry, and a node with 500 pods has over 1000 addresses and IPv6 routes (each host veth has a
// link-local address and its fe80::/64 route).
type rtnl struct {
	sockets map[int]*nl.SocketHandle
}

func openRtnl() (*rtnl, error) {
	s, err := nl.GetNetlinkSocketAt(netns.None(), netns.None(), unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("netlink socket: %w", err)
	}
	// An old kernel without the option still answers, unfiltered.
	_ = unix.SetsockoptInt(s.GetFd(), unix.SOL_NETLINK, unix.NETLINK_GET_STRICT_CHK, 1)
	return &rtnl{sockets: map[int]*nl.SocketHandle{unix.NETLINK_ROUTE: {Socket: s}}}, nil
}

func (r *rtnl) Close() { r.sockets[unix.NETLINK_ROUTE].Socket.Close() }

// dump sends the dump request msgType with header and returns the answers of type resType. A
// dump that a change interrupts is repeated, like netlinksafe does.
func (r *rtnl) dump(msgType int, header nl.NetlinkRequestData, resType uint16) ([][]byte, error) {
	for attempt := 0; ; attempt++ {
		req := nl.NewNetlinkRequest(msgType, unix.NLM_F_DUMP)
		req.Sockets = r.sockets
		req.AddData(header)
		msgs, err := req.Execute(unix.NETLINK_ROUTE, resType)
		if !errors.Is(err, nl.ErrDumpInterrupted) || attempt == 4 {
			return msgs, err
		}
	}
}

// linkInfo is what Preflight needs of a link: its index, its kind (IFLA_INFO_KIND; "" for a
// link without one, such as a physical device) and its alias; and what Ensure looks at of a
// bridge: MTU, MAC, promiscuity and whether it is up.
type linkInfo struct {
	Index       int
	Kind, Alias string
	MTU         int
	MAC         net.HardwareAddr
	Promisc     int
	Up          bool
	// NetfilterCall: the bridge's own nf_call_iptables and nf_call_ip6tables options are both on
	// (IFLA_BR_NF_CALL_IPTABLES/IP6TABLES).
	NetfilterCall bool
}

// rtextFilterSkipStats asks the kernel to leave a link's IPv6 statistics out of its answer
// (RTEXT_FILTER_SKIP_STATS of linux/rtnetlink.h, which x/sys/unix lacks); kernels that do not
// know the flag ignore it.
const rtextFilterSkipStats = 1 << 3

// link looks up the link called name; found is false when there is none. Only the attributes
// above are decoded: netlink.LinkByName, on a socket of its own, decodes all of them, which cost
// a STATUS more than the node's address and route dumps together.
func (r *rtnl) link(name string) (info linkInfo, found bool, err error) {
	req := nl.NewNetlinkRequest(unix.RTM_GETLINK, unix.NLM_F_ACK)
	req.Sockets = r.sockets
	req.AddData(nl.NewIfInfomsg(unix.AF_UNSPEC))
	req.AddData(nl.NewRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated(name)))
	req.AddData(nl.NewRtAttr(unix.IFLA_EXT_MASK, nl.Uint32Attr(rtextFilterSkipStats)))
	msgs, err := req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWLINK)
	switch {
	case errors.Is(err, unix.ENODEV):
		return linkInfo{}, false, nil
	case err != nil:
		return linkInfo{}, false, fmt.Errorf("look up link %q: %w", name, err)
	case len(msgs) != 1 || len(msgs[0]) < unix.SizeofIfInfomsg:
		return linkInfo{}, false, fmt.Errorf("look up link %q: %d answers", name, len(msgs))
	}
	m := msgs[0]
	ifi := nl.DeserializeIfInfomsg(m)
	info.Index, info.Up = int(ifi.Index), ifi.Flags&unix.IFF_UP != 0
	attrs, err := nl.ParseRouteAttr(m[unix.SizeofIfInfomsg:])
	if err != nil {
		return linkInfo{}, false, fmt.Errorf("look up link %q: %w", name, err)
	}
	for _, a := range attrs {
		switch a.Attr.Type {
		case unix.IFLA_MTU, unix.IFLA_PROMISCUITY:
			if len(a.Value) == 4 {
				v := int(nl.NativeEndian().Uint32(a.Value))
				if a.Attr.Type == unix.IFLA_MTU {
					info.MTU = v
				} else {
					info.Promisc = v
				}
			}
		case unix.IFLA_ADDRESS:
			info.MAC = net.HardwareAddr(a.Value)
		case unix.IFLA_IFALIAS:
			info.Alias = cString(a.Value)
		case unix.IFLA_LINKINFO:
			nested, err := nl.ParseRouteAttr(a.Value)
			if err != nil {
				return linkInfo{}, false, fmt.Errorf("look up link %q: link info: %w", name, err)
			}
			for _, n := range nested {
				switch n.Attr.Type {
				case unix.IFLA_INFO_KIND:
					info.Kind = cString(n.Value)
				case unix.IFLA_INFO_DATA:
					if info.NetfilterCall, err = netfilterCall(n.Value); err != nil {
						return linkInfo{}, false, fmt.Errorf("look up link %q: bridge options: %w", name, err)
					}
				}
			}
		}
	}
	return info, true, nil
}

// netfilterCall tells whether a bridge's IFLA_INFO_DATA has both nf_call_iptables and
// nf_call_ip6tables on.
func netfilterCall(data []byte) (bool, error) {
	attrs, err := nl.ParseRouteAttr(data)
	if err != nil {
		return false, err
	}
	on := 0
	for _, a := range attrs {
		if (a.Attr.Type == unix.IFLA_BR_NF_CALL_IPTABLES || a.Attr.Type == unix.IFLA_BR_NF_CALL_IP6TABLES) && len(a.Value) == 1 && a.Value[0] == 1 {
			on++
		}
	}
	return on == 2, nil
}

// cString is a string attribute without its terminating NUL.
func cString(b []byte) string {
	if i := slices.Index(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}

// linkPrefix is an address or a route's destination on the link with index Index.
type linkPrefix struct {
	Index  int
	Prefix netip.Prefix
}

// addrs returns the addresses of the link with index ifindex, or of every link for 0, of family
// (unix.AF_INET, AF_INET6, or AF_UNSPEC for both).
func (r *rtnl) addrs(ifindex, family int) ([]linkPrefix, error) {
	header := nl.NewIfAddrmsg(family)
	header.Index = uint32(ifindex)
	msgs, err := r.dump(unix.RTM_GETADDR, header, unix.RTM_NEWADDR)
	if err != nil {
		return nil, fmt.Errorf("list addresses: %w", err)
	}
	var out []linkPrefix
	for _, m := range msgs {
		if len(m) < unix.SizeofIfAddrmsg {
			return nil, fmt.Errorf("list addresses: short message (%d bytes)", len(m))
		}
		ifa := nl.DeserializeIfAddrmsg(m)
		if ifindex != 0 && int(ifa.Index) != ifindex {
			continue
		}
		attrs, err := nl.ParseRouteAttr(m[ifa.Len():])
		if err != nil {
			return nil, fmt.Errorf("list addresses: %w", err)
		}
		var ip []byte
		for _, a := range attrs {
			// IFA_LOCAL is the address itself; IFA_ADDRESS is the peer on point-to-point
			// links and the same address elsewhere, and the only one IPv6 sends.
			switch {
			case a.Attr.Type == unix.IFA_LOCAL:
				ip = a.Value
			case a.Attr.Type == unix.IFA_ADDRESS && ip == nil:
				ip = a.Value
			}
		}
		if addr, ok := netip.AddrFromSlice(ip); ok {
			out = append(out, linkPrefix{int(ifa.Index), netip.PrefixFrom(addr.Unmap(), int(ifa.Prefixlen))})
		}
	}
	return out, nil
}

// connectedRoutes returns the main table's connected routes of family (as for addrs): unicast
// routes with a destination other than the default, no gateway and a single path, the networks a
// link of the node reaches directly. Their scope does not matter: IPv6 reports every route as
// universe, and an IPv4 route added with a device alone is on-link whatever scope it was given.
func (r *rtnl) connectedRoutes(family int) ([]linkPrefix, error) {
	header := &nl.RtMsg{RtMsg: unix.RtMsg{Family: uint8(family), Table: unix.RT_TABLE_MAIN}}
	msgs, err := r.dump(unix.RTM_GETROUTE, header, unix.RTM_NEWROUTE)
	if err != nil {
		return nil, fmt.Errorf("list routes: %w", err)
	}
	var out []linkPrefix
	for _, m := range msgs {
		if len(m) < unix.SizeofRtMsg {
			return nil, fmt.Errorf("list routes: short message (%d bytes)", len(m))
		}
		rtm := nl.DeserializeRtMsg(m)
		if rtm.Type != unix.RTN_UNICAST || rtm.Dst_len == 0 {
			continue
		}
		attrs, err := nl.ParseRouteAttr(m[rtm.Len():])
		if err != nil {
			return nil, fmt.Errorf("list routes: %w", err)
		}
		if p, ok := connectedRoute(rtm, attrs); ok {
			out = append(out, p)
		}
	}
	return out, nil
}

// connectedRoute is the destination and output link of a unicast route of the main table with a
// destination, or false when the route has a gateway, several paths or no output link (a nexthop
// object, with the kernel's compat mode off: no link's network, as kubenet-agent also judges).
func connectedRoute(rtm *nl.RtMsg, attrs []syscall.NetlinkRouteAttr) (linkPrefix, bool) {
	table, index := uint32(rtm.Table), 0
	var dst []byte
	for _, a := range attrs {
		switch a.Attr.Type {
		case unix.RTA_TABLE:
			if len(a.Value) == 4 {
				table = nl.NativeEndian().Uint32(a.Value)
			}
		case unix.RTA_DST:
			dst = a.Value
		case unix.RTA_OIF:
			if len(a.Value) == 4 {
				index = int(nl.NativeEndian().Uint32(a.Value))
			}
		case unix.RTA_GATEWAY, unix.RTA_VIA, unix.RTA_MULTIPATH:
			return linkPrefix{}, false
		}
	}
	addr, ok := netip.AddrFromSlice(dst)
	if table != unix.RT_TABLE_MAIN || index == 0 || !ok {
		return linkPrefix{}, false
	}
	return linkPrefix{index, netip.PrefixFrom(addr.Unmap(), int(rtm.Dst_len))}, true
}

// linkAddrs returns the addresses of the link with index ifindex, with a dump the kernel filters
// (see rtnl): netlink.AddrList asks for every address of the namespace and keeps the link's in
// user space, so its cost grows with the pods on the node (about 1 ms per ADD with 500 pods).
func linkAddrs(ifindex int) ([]netip.Prefix, error) {
	r, err := openRtnl()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	addrs, err := r.addrs(ifindex, unix.AF_UNSPEC)
	if err != nil {
		return nil, err
	}
	return prefixesOf(addrs), nil
}

func prefixesOf(addrs []linkPrefix) []netip.Prefix {
	out := make([]netip.Prefix, len(addrs))
	for i, a := range addrs {
		out[i] = a.Prefix
	}
	return out
}

// familyOf is the address family of prefixes for a dump: AF_INET or AF_INET6 when they are all
// of one, else AF_UNSPEC (both).
func familyOf(prefixes []netip.Prefix) int {
	has4 := slices.ContainsFunc(prefixes, func(p netip.Prefix) bool { return p.Addr().Is4() })
	has6 := slices.ContainsFunc(prefixes, func(p netip.Prefix) bool { return p.Addr().Is6() })
	switch {
	case has4 && !has6:
		return unix.AF_INET
	case has6 && !has4:
		return unix.AF_INET6
	}
	return unix.AF_UNSPEC
}
