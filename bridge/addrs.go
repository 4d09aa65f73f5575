package bridge

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// linkAddrs returns the addresses of the link with index ifindex. netlink.AddrList asks the
// kernel for every address of the namespace and keeps the link's in user space, so its cost
// grows with the pods on the node (each host veth carries an IPv6 link-local address): about
// 1 ms per ADD with 500 pods. This dump is filtered by the kernel instead
// (NETLINK_GET_STRICT_CHK, Linux 4.20 for IPv4 and 5.0 for IPv6). Older kernels ignore the
// filter and send everything, so the index is checked here as well.
func linkAddrs(ifindex int) ([]netip.Prefix, error) {
	s, err := nl.GetNetlinkSocketAt(netns.None(), netns.None(), unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("netlink socket: %w", err)
	}
	defer s.Close()
	// An old kernel without the option still answers, unfiltered.
	_ = unix.SetsockoptInt(s.GetFd(), unix.SOL_NETLINK, unix.NETLINK_GET_STRICT_CHK, 1)
	sockets := map[int]*nl.SocketHandle{unix.NETLINK_ROUTE: {Socket: s}}
	var msgs [][]byte
	// A dump that an address change interrupts is repeated, like netlinksafe does.
	for attempt := 0; ; attempt++ {
		req := nl.NewNetlinkRequest(unix.RTM_GETADDR, unix.NLM_F_DUMP)
		req.Sockets = sockets
		msg := nl.NewIfAddrmsg(unix.AF_UNSPEC)
		msg.Index = uint32(ifindex)
		req.AddData(msg)
		msgs, err = req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWADDR)
		if !errors.Is(err, nl.ErrDumpInterrupted) || attempt == 4 {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("list addresses: %w", err)
	}
	var out []netip.Prefix
	for _, m := range msgs {
		ifa := nl.DeserializeIfAddrmsg(m)
		if int(ifa.Index) != ifindex {
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
			out = append(out, netip.PrefixFrom(addr.Unmap(), int(ifa.Prefixlen)))
		}
	}
	return out, nil
}
