// Package shaping limits a pod's bandwidth in both directions on the node side of its veth,
// over netlink (no tc exec), for every protocol (IPv4 and IPv6 alike).
//
// Layout for a pod whose host veth is V and whose ifb is I:
//
//	ingress (towards the pod):  V root  tbf 1:      - traffic to the pod leaves the node through V
//	egress (from the pod):      V       clsact ffff:, on its ingress hook a u32 match-all filter
//	                                    (protocol all, prio 1) with "mirred egress redirect dev I"
//	                            I root  tbf 1:      - the pod's traffic, redirected, leaves through I
//
// Traffic from the pod arrives on V's receive side, where the kernel has no queue to shape with;
// the ifb turns it into transmit traffic that a tbf can hold back. Old kubenet put one htb on the
// bridge and matched "protocol ip" on the pod's source, which saw only traffic towards pods and
// never IPv6 (kubernetes#44231); the filter here matches every frame.
//
// The clsact qdisc is shared with the NetworkPolicy guard on the veth's egress hook, so it stays
// when the shaping goes; pods of an older kubenet have an ingress qdisc instead, which Remove and
// Check still know.
//
// tbf parameters: rate = rate/8 bytes/s; burst = Limit.Burst or DefaultBurst (10 ms of rate, at
// least two full frames); limit (queue) = 25 ms of rate plus the burst, the same latency as the
// CNI bandwidth plugin, enough for a TCP stream to keep the bucket busy.
package shaping

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/kubenet-dev/kubenet/internal/links"
	"github.com/kubenet-dev/kubenet/internal/tcguard"
)

// queueLatency is how long a packet may wait in a tbf queue before it is dropped.
const queueLatency = 25 * time.Millisecond

// Handles of kubenet's qdiscs and filters: tbf as root (1:); the redirect's parent, clsact's
// ingress hook (ffff:fff2), or an older kubenet's ingress qdisc (ffff:).
var (
	tbfHandle     = netlink.MakeHandle(1, 0)
	ingressHandle = netlink.MakeHandle(0xffff, 0)
	clsactIngress = uint32(netlink.HANDLE_MIN_INGRESS)
)

// ErrNotIFB is returned when a link with the ifb's name exists but is not an ifb: it is not
// kubenet's and is left alone.
var ErrNotIFB = errors.New("exists and is not an ifb device")

// Apply shapes the pod behind the host veth host (in the current netns) with l, creating the
// ifb named ifb when egress is limited. A leftover ifb of that name (from a crashed ADD) is
// replaced. On error everything Apply created is removed again.
func Apply(host netlink.Link, ifb string, l Limits) (err error) {
	if l.IsZero() {
		return nil
	}
	hostVeth := host.Attrs().Name
	defer func() {
		if err != nil {
			if rerr := Remove(hostVeth, ifb); rerr != nil {
				err = fmt.Errorf("%w (and cleaning up failed: %v)", err, rerr)
			}
		}
	}()
	mtu := host.Attrs().MTU
	if l.Ingress.Rate > 0 {
		if err := netlink.QdiscAdd(tbf(host.Attrs().Index, l.Ingress, mtu)); err != nil {
			return fmt.Errorf("shaping: ingress tbf on %q: %w", hostVeth, err)
		}
	}
	if l.Egress.Rate == 0 {
		return nil
	}
	dev, err := addIFB(ifb, mtu)
	if err != nil {
		return err
	}
	if err := netlink.QdiscAdd(tbf(dev.Attrs().Index, l.Egress, mtu)); err != nil {
		return fmt.Errorf("shaping: egress tbf on %q: %w", ifb, err)
	}
	if err := tcguard.EnsureClsact(host.Attrs().Index); err != nil {
		return fmt.Errorf("shaping: %q: %w", hostVeth, err)
	}
	if err := netlink.FilterAdd(redirect(host.Attrs().Index, dev.Attrs().Index)); err != nil {
		return fmt.Errorf("shaping: redirect %q to %q: %w", hostVeth, ifb, err)
	}
	return nil
}

// Remove undoes Apply: kubenet's qdiscs on hostVeth (their filters go with them), the redirect
// under the clsact qdisc (which stays: the policy guard may use it) and the ifb.
// Missing pieces are fine, so DEL can run it any number of times, also after the veth is gone.
func Remove(hostVeth, ifb string) error {
	var errs []error
	host, err := links.Find(hostVeth)
	switch {
	case err != nil:
		errs = append(errs, fmt.Errorf("shaping: host veth: %w", err))
	case host != nil:
		qdiscs, err := netlinksafe.QdiscList(host)
		if err != nil {
			errs = append(errs, fmt.Errorf("shaping: qdiscs of %q: %w", hostVeth, err))
		}
		if err := removeRedirects(host); err != nil {
			errs = append(errs, err)
		}
		for _, q := range qdiscs {
			if !isOurs(q) {
				continue
			}
			if err := netlink.QdiscDel(q); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINVAL) {
				errs = append(errs, fmt.Errorf("shaping: delete %s qdisc of %q: %w", q.Type(), hostVeth, err))
			}
		}
	}
	dev, err := FindIFB(ifb)
	if err != nil {
		errs = append(errs, err)
	}
	if err := links.DeleteTogether(dev); err != nil {
		errs = append(errs, fmt.Errorf("shaping: ifb: %w", err))
	}
	return errors.Join(errs...)
}

// isOurs reports whether q is a qdisc Apply puts on a host veth and Remove deletes: the root
// tbf. The clsact qdisc is shared with the policy guard; an ingress qdisc is an older kubenet's
// (it goes with its veth) or another tool's.
func isOurs(q netlink.Qdisc) bool {
	a := q.Attrs()
	_, tbf := q.(*netlink.Tbf)
	return tbf && a.Parent == netlink.HANDLE_ROOT && a.Handle == tbfHandle
}

// lookupIFB returns the ifb named name, nil when there is none, and ErrNotIFB when the name is
// taken by another kind of link.
func lookupIFB(name string) (netlink.Link, error) {
	l, err := links.Find(name)
	if err != nil {
		return nil, fmt.Errorf("shaping: %w", err)
	}
	if l == nil {
		return nil, nil
	}
	if _, ok := l.(*netlink.Ifb); !ok {
		return nil, fmt.Errorf("shaping: ifb %q: %w (it is a %s)", name, ErrNotIFB, l.Type())
	}
	return l, nil
}

// FindIFB returns the pod's ifb for deletion: nil when there is none, or when the name belongs to
// a link of another kind, which is not kubenet's to delete.
func FindIFB(name string) (netlink.Link, error) {
	l, err := lookupIFB(name)
	if errors.Is(err, ErrNotIFB) {
		return nil, nil
	}
	return l, err
}

// addIFB creates the ifb with the host veth's MTU (so redirected frames fit) and brings it up.
func addIFB(name string, mtu int) (netlink.Link, error) {
	old, err := lookupIFB(name)
	if err != nil {
		return nil, err
	}
	if old != nil {
		if err := netlink.LinkDel(old); err != nil {
			return nil, fmt.Errorf("shaping: delete leftover ifb %q: %w", name, err)
		}
	}
	attrs := netlink.NewLinkAttrs()
	attrs.Name = name
	attrs.MTU = mtu
	if err := netlink.LinkAdd(&netlink.Ifb{LinkAttrs: attrs}); err != nil {
		return nil, fmt.Errorf("shaping: create ifb %q: %w", name, err)
	}
	dev, err := netlinksafe.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("shaping: ifb %q: %w", name, err)
	}
	if err := netlink.LinkSetUp(dev); err != nil {
		return nil, fmt.Errorf("shaping: set ifb %q up: %w", name, err)
	}
	return dev, nil
}

// tbf is the root tbf that shapes link to l.
func tbf(link int, l Limit, mtu int) *netlink.Tbf {
	p := params(l, mtu)
	return &netlink.Tbf{
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: link, Handle: tbfHandle, Parent: netlink.HANDLE_ROOT},
		Rate:       p.rate,
		Buffer:     p.buffer,
		Limit:      p.limit,
	}
}

// tbfParams are the numbers the kernel keeps for a tbf.
type tbfParams struct {
	rate   uint64 // bytes/s
	buffer uint32 // bucket size as transmit time at rate, in psched ticks
	limit  uint32 // queue size in bytes
}

func params(l Limit, mtu int) tbfParams {
	rate := (l.Rate + 7) / 8
	burst := (l.effectiveBurst(mtu) + 7) / 8
	ticks := float64(burst) / float64(rate) * float64(time.Second/time.Microsecond) * netlink.TickInUsec()
	queue := float64(rate)*queueLatency.Seconds() + float64(burst)
	return tbfParams{rate: rate, buffer: clampUint32(ticks), limit: clampUint32(queue)}
}

func clampUint32(f float64) uint32 {
	if f >= math.MaxUint32 {
		return math.MaxUint32
	}
	return uint32(math.Ceil(f))
}

// removeRedirects deletes the redirect filters under host's clsact ingress hook.
func removeRedirects(host netlink.Link) error {
	filters, err := netlinksafe.FilterList(host, clsactIngress)
	if err != nil {
		return nil // no clsact qdisc: nothing to remove
	}
	for _, f := range filters {
		if u, ok := f.(*netlink.U32); ok && isRedirect(u) {
			if err := netlink.FilterDel(f); err != nil && !errors.Is(err, unix.ENOENT) {
				return fmt.Errorf("shaping: remove the redirect of %q: %w", host.Attrs().Name, err)
			}
		}
	}
	return nil
}

// redirect is a u32 filter that matches every frame (one key with mask 0, any protocol) arriving
// on link and moves it to the ifb's transmit side.
func redirect(link, ifb int) *netlink.U32 {
	return &netlink.U32{
		FilterAttrs: netlink.FilterAttrs{LinkIndex: link, Parent: clsactIngress, Priority: 1, Protocol: unix.ETH_P_ALL},
		Sel:         &netlink.TcU32Sel{Flags: netlink.TC_U32_TERMINAL, Keys: []netlink.TcU32Key{{}}},
		Actions:     []netlink.Action{netlink.NewMirredAction(ifb)},
	}
}
