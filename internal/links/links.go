// Package links finds and deletes network interfaces of the current network namespace.
//
// Deleting an interface costs its caller one RCU grace period in the kernel (about 15 ms on a
// 2-core node, whatever the interface), paid by every RTM_DELLINK request. A shaped pod owns two
// interfaces (its veth pair and its ifb); deleting them in one request pays that wait once.
package links

import (
	"errors"
	"fmt"
	"net"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// Find returns the link named name, or nil when there is none.
func Find(name string) (netlink.Link, error) {
	l, err := netlinksafe.LinkByName(name)
	if IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("link %q: %w", name, err)
	}
	return l, nil
}

// IsNotFound reports whether err says that a link does not exist.
func IsNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf)
}

// groupTag marks the interface group that DeleteTogether gives the links it deletes. The low 24
// bits are the first link's ifindex, unique in the namespace while that link exists, so two
// deletions never share a group; nobody else is expected to number groups this high (ip-link's
// named groups live in /etc/iproute2/group and are small).
const groupTag = 0x4b000000

// DeleteTogether deletes every non-nil link in one kernel request: it puts them in an interface
// group of their own and deletes that group. A link that is already gone is not an error. A
// deletion interrupted between the two steps leaves links in that group, which a retry (given
// the same first link) deletes.
func DeleteTogether(links ...netlink.Link) error {
	var doomed []netlink.Link
	for _, l := range links {
		if l != nil {
			doomed = append(doomed, l)
		}
	}
	switch len(doomed) {
	case 0:
		return nil
	case 1:
		return deleteOne(doomed[0])
	}
	group := uint32(groupTag | doomed[0].Attrs().Index&0xffffff)
	var grouped []netlink.Link
	for _, l := range doomed {
		err := netlink.LinkSetGroup(l, int(group))
		switch {
		case err == nil:
			grouped = append(grouped, l)
		case errors.Is(err, unix.ENODEV):
		default:
			return fallback(fmt.Errorf("link %q: set group: %w", l.Attrs().Name, err), doomed)
		}
	}
	if len(grouped) == 0 {
		return nil
	}
	req := nl.NewNetlinkRequest(unix.RTM_DELLINK, unix.NLM_F_ACK)
	req.AddData(nl.NewIfInfomsg(unix.AF_UNSPEC))
	req.AddData(nl.NewRtAttr(unix.IFLA_GROUP, nl.Uint32Attr(group)))
	if _, err := req.Execute(unix.NETLINK_ROUTE, 0); err != nil && !errors.Is(err, unix.ENODEV) {
		return fallback(fmt.Errorf("delete link group %#x: %w", group, err), grouped)
	}
	return nil
}

// fallback deletes the links one by one, at the cost of one wait each, after the batch failed
// with cause; cause is reported only if that fails too.
func fallback(cause error, links []netlink.Link) error {
	var errs []error
	for _, l := range links {
		errs = append(errs, deleteOne(l))
	}
	if err := errors.Join(errs...); err != nil {
		return errors.Join(cause, err)
	}
	return nil
}

func deleteOne(l netlink.Link) error {
	if err := netlink.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("link %q: delete: %w", l.Attrs().Name, err)
	}
	return nil
}

// SetLoopbackUp brings lo of the calling thread's network namespace up (what the loopback plugin
// does), unless it is up already.
func SetLoopbackUp() error {
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
