package shaping

import (
	"errors"
	"fmt"
	"net"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Check verifies that the pod behind the host veth host is shaped exactly as Apply(host, ifb, l)
// left it: a tbf with l's numbers where a direction is limited, none of kubenet's where it is
// not, the ifb up with its tbf and the redirect to it when egress is limited, and no ifb
// otherwise. It reports every difference it finds.
func Check(host netlink.Link, ifb string, l Limits) error {
	mtu := host.Attrs().MTU
	var errs []error
	errs = append(errs, checkRoot(host, l.Ingress, mtu))

	dev, err := lookupIFB(ifb)
	switch {
	case err != nil:
		errs = append(errs, err)
	case l.Egress.Rate == 0:
		if dev != nil {
			errs = append(errs, fmt.Errorf("shaping: ifb %q exists but egress is not limited", ifb))
		}
		errs = append(errs, checkNoRedirect(host))
	case dev == nil:
		errs = append(errs, fmt.Errorf("shaping: ifb %q is missing", ifb))
	default:
		if dev.Attrs().Flags&net.FlagUp == 0 {
			errs = append(errs, fmt.Errorf("shaping: ifb %q is down", ifb))
		}
		errs = append(errs, checkRoot(dev, l.Egress, mtu), checkRedirect(host, dev))
	}
	return errors.Join(errs...)
}

// checkRoot compares link's root qdisc with the tbf that l asks for (or its absence).
func checkRoot(link netlink.Link, l Limit, mtu int) error {
	name := link.Attrs().Name
	qdiscs, err := netlinksafe.QdiscList(link)
	if err != nil {
		return fmt.Errorf("shaping: qdiscs of %q: %w", name, err)
	}
	var got *netlink.Tbf
	for _, q := range qdiscs {
		if t, ok := q.(*netlink.Tbf); ok && isOurs(q) {
			got = t
		}
	}
	if l.Rate == 0 {
		if got != nil {
			return fmt.Errorf("shaping: %q has a tbf (%d bytes/s) but is not limited", name, got.Rate)
		}
		return nil
	}
	want := params(l, mtu)
	switch {
	case got == nil:
		return fmt.Errorf("shaping: %q has no tbf root qdisc", name)
	case got.Rate != want.rate || got.Buffer != want.buffer || got.Limit != want.limit:
		return fmt.Errorf("shaping: tbf on %q has rate %d B/s, buffer %d ticks, limit %d B; want %d, %d, %d",
			name, got.Rate, got.Buffer, got.Limit, want.rate, want.buffer, want.limit)
	}
	return nil
}

// checkRedirect verifies that frames arriving on host are redirected to ifb by a match-all filter.
func checkRedirect(host, ifb netlink.Link) error {
	for _, f := range redirects(host) {
		if f.Ifindex == ifb.Attrs().Index {
			return nil
		}
	}
	return fmt.Errorf("shaping: no filter on %q redirects to %q", host.Attrs().Name, ifb.Attrs().Name)
}

func checkNoRedirect(host netlink.Link) error {
	if len(redirects(host)) > 0 {
		return fmt.Errorf("shaping: %q redirects to an ifb but egress is not limited", host.Attrs().Name)
	}
	return nil
}

// redirects returns the mirred redirects of match-all u32 filters on host's ingress: under its
// clsact qdisc, or an older kubenet's ingress qdisc.
func redirects(host netlink.Link) []*netlink.MirredAction {
	var out []*netlink.MirredAction
	for _, parent := range []uint32{clsactIngress, ingressHandle} {
		filters, err := netlinksafe.FilterList(host, parent)
		if err != nil {
			continue // no such qdisc: nothing is redirected there
		}
		for _, f := range filters {
			u, ok := f.(*netlink.U32)
			if !ok || !isRedirect(u) {
				continue
			}
			for _, a := range u.Actions {
				if m, ok := a.(*netlink.MirredAction); ok && m.MirredAction == netlink.TCA_EGRESS_REDIR {
					out = append(out, m)
				}
			}
		}
	}
	return out
}

// isRedirect tells whether u is a match-all u32 filter for every protocol: a "protocol ip"
// filter would let IPv6 bypass the shaper.
func isRedirect(u *netlink.U32) bool {
	return u.Protocol == unix.ETH_P_ALL && matchesAll(u)
}

func matchesAll(u *netlink.U32) bool {
	if u.Sel == nil {
		return false
	}
	for _, k := range u.Sel.Keys {
		if k.Mask != 0 {
			return false
		}
	}
	return true
}
