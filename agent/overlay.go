package agent

import (
	"context"
	"fmt"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"

	"github.com/kubenet-dev/kubenet/agent/routes"
	"github.com/kubenet-dev/kubenet/core"
)

// overlayPlan is what the sync decided about the overlay before writing anything.
type overlayPlan struct {
	// device: the node keeps its overlay device. A peer needs it, --routing=vxlan, or auto mode
	// with any peer at all: a peer may see this node as off its networks while this node sees
	// it on-link (a second link on one side), and then only a device here can receive.
	device  bool
	sends   bool       // some peer is reached through the overlay: the pods' MTU leaves room
	local   netip.Addr // this node's underlay address
	mtu     int        // the device's MTU (0: unknown)
	podMTU  int        // the largest MTU the pods may have (0: no limit from the overlay)
	planErr error      // why the overlay cannot be set up (its routes are refused)
}

// planOverlay decides whether the node needs its overlay device and at which MTU. When the
// underlay's MTU cannot be read (this node's InternalIP is not one of its addresses) the overlay
// cannot work: every route through it is refused with the reason.
func (a *Agent) planOverlay(want *Want, local netip.Addr) overlayPlan {
	p := overlayPlan{local: local, sends: len(want.Overlay) > 0 || a.cfg.Routing == RoutingVXLAN}
	p.device = p.sends || (a.cfg.Routing == RoutingAuto && len(want.Peers) > 0)
	if !p.device {
		return p
	}
	if !local.IsValid() {
		p.planErr = fmt.Errorf("this node has no InternalIP to carry the overlay")
	} else if mtu, err := core.OverlayMTU(local); err != nil {
		p.planErr = err
	} else {
		p.mtu = mtu
		if p.sends {
			p.podMTU = mtu
		}
	}
	if p.planErr != nil {
		refuseOverlay(want, func(string) error { return p.planErr })
	}
	return p
}

// refuseOverlay moves the overlay routes whose peer errOf names an error from the routes to the
// refused ones.
func refuseOverlay(want *Want, errOf func(node string) error) {
	kept := want.Routes[:0]
	for _, r := range want.Routes {
		path := want.Paths[r.Dst]
		if path.Via != ViaVXLAN {
			kept = append(kept, r)
			continue
		}
		if err := errOf(r.Node); err != nil {
			want.Unusable = append(want.Unusable, routes.Failure{Route: r, Err: fmt.Errorf("through the overlay: %w", err)})
			path.Error = err.Error()
			want.Paths[r.Dst] = path
			continue
		}
		kept = append(kept, r)
	}
	want.Routes = kept
	want.Overlay = slices.DeleteFunc(want.Overlay, func(p core.OverlayPeer) bool { return errOf(p.Node) != nil })
}

// syncOverlay converges the overlay device, its entries and firewall with the plan, and points
// the overlay routes of want at the device. The firewall stays on every node that manages
// routes, with or without a device: its forward rules keep this node's pods (and containers of
// other bridges) from sending VXLAN to the Nodes that have one.
func (a *Agent) syncOverlay(want *Want, p overlayPlan, nodes []*corev1.Node, cl *claims) {
	spec := core.Overlay{
		Device: a.cfg.VXLANDevice, VNI: a.cfg.VXLANVNI, Port: a.cfg.VXLANPort, Local: p.local, MTU: p.mtu,
		Bridge: bridgeName(a.cfg), Peers: want.Overlay, Nodes: nodeAddresses(nodes, cl),
		PodNetworks: podNetworks(a.cfg.Conflist.NonMasqueradeCIDRs, want, cl.byNode[a.cfg.NodeName]),
		NoDevice:    !p.device || p.planErr != nil,
	}
	st, err := core.SyncOverlay(spec)
	if err != nil {
		a.log.Error("overlay not in place", "err", err)
		refuseOverlay(want, func(string) error { return err })
		a.setOverlayDev(0)
		return
	}
	if st.FirewallWritten {
		a.log.Info("overlay firewall written", "port", a.cfg.VXLANPort, "nodes", len(spec.Nodes))
	}
	a.setOverlayDev(st.Device)
	refuseOverlay(want, func(node string) error { return st.Failed[node] })
	own := cl.byNode[a.cfg.NodeName]
	for i, r := range want.Routes {
		if want.Paths[r.Dst].Via != ViaVXLAN {
			continue
		}
		want.Routes[i].Dev = st.Device
		// The node's own packets leave from its pod gateway (the bridge's address), so answers
		// come back through the overlay.
		if j := slices.IndexFunc(own, func(c netip.Prefix) bool { return c.Addr().Is4() == r.Dst.Addr().Is4() }); j >= 0 {
			want.Routes[i].Src = own[j].Masked().Addr().Next()
		}
	}
}

// programmablePaths are the paths of the routes still wanted after the overlay's refusals.
func programmablePaths(want Want) map[netip.Prefix]Path {
	out := make(map[netip.Prefix]Path, len(want.Routes))
	for _, r := range want.Routes {
		out[r.Dst] = want.Paths[r.Dst]
	}
	return out
}

func (a *Agent) setOverlayDev(index int) {
	a.mu.Lock()
	a.overlayDev = index
	a.mu.Unlock()
}

// nodeAddresses are the InternalIPs of every Node whose addresses are usable: the only senders
// the overlay accepts. A Node with an InternalIP inside a pod or service CIDR is left out.
func nodeAddresses(nodes []*corev1.Node, cl *claims) []netip.Addr {
	var out []netip.Addr
	for _, n := range nodes {
		if cl.addressError(n) != nil {
			continue
		}
		for _, a := range n.Status.Addresses {
			if a.Type != corev1.NodeInternalIP {
				continue
			}
			if ip, err := netip.ParseAddr(a.Address); err == nil && ip.Zone() == "" {
				out = append(out, ip.Unmap())
			}
		}
	}
	return out
}

// podNetworks are the cluster's pod addresses: the cluster CIDRs, every routed peer CIDR and the
// node's own.
func podNetworks(cluster []netip.Prefix, want *Want, own []netip.Prefix) []netip.Prefix {
	out := slices.Concat(cluster, own)
	for p := range want.Paths {
		out = append(out, p)
	}
	slices.SortFunc(out, comparePrefix)
	return slices.Compact(out)
}

// recordPaths keeps the paths of the last sync for /peers, with the error of each route that
// is not in place.
func (a *Agent) recordPaths(want Want, failures []routes.Failure) {
	out := make([]Path, 0, len(want.Paths)+len(failures))
	failed := map[netip.Prefix]error{}
	for _, f := range failures {
		if _, ok := want.Paths[f.Route.Dst]; ok && f.Route.Dst.IsValid() {
			failed[f.Route.Dst] = f.Err
			continue
		}
		out = append(out, Path{Node: f.Route.Node, PodCIDR: f.Route.Dst, Error: f.Err.Error()})
	}
	for _, p := range want.Paths {
		if err := failed[p.PodCIDR]; err != nil && p.Error == "" {
			p.Error = err.Error()
		}
		out = append(out, p)
	}
	slices.SortFunc(out, func(x, y Path) int {
		if x.Node != y.Node {
			if x.Node < y.Node {
				return -1
			}
			return 1
		}
		return comparePrefix(x.PodCIDR, y.PodCIDR)
	})
	a.mu.Lock()
	a.paths = out
	a.mu.Unlock()
}

// watchKernel asks for a sync whenever the kernel loses something the sync keeps: the overlay
// device, one of its entries, or one of the agent's routes (`ip link del`, `bridge fdb del`,
// `ip neigh flush`, `ip route del`). The agent's own changes come back as events too; the sync
// they cause finds nothing to do and writes nothing, so this never loops. The subscriptions are
// made on the calling goroutine, in its network namespace (the sync loop's); when one ends (its
// socket overflowed: events were lost) all are closed, a sync is asked for, and the sync
// subscribes again (resubscribeKernel).
func (a *Agent) watchKernel(ctx context.Context) error {
	links := make(chan netlink.LinkUpdate, 64)
	neighs := make(chan netlink.NeighUpdate, 256)
	routeUpdates := make(chan netlink.RouteUpdate, 256)
	done := make(chan struct{})
	subscribe := []func() error{
		func() error { return netlink.LinkSubscribeWithOptions(links, done, netlink.LinkSubscribeOptions{}) },
		func() error { return netlink.NeighSubscribeWithOptions(neighs, done, netlink.NeighSubscribeOptions{}) },
		func() error {
			return netlink.RouteSubscribeWithOptions(routeUpdates, done, netlink.RouteSubscribeOptions{})
		},
	}
	for _, sub := range subscribe {
		if err := sub(); err != nil {
			close(done)
			return fmt.Errorf("kernel events: %w", err)
		}
	}
	a.mu.Lock()
	a.watching = true
	a.mu.Unlock()
	go func() {
		defer close(done)
		for {
			var lost, ended bool
			select {
			case <-ctx.Done():
				return
			case u, ok := <-links:
				ended = !ok
				// By index too: a device renamed away announces its new name.
				lost = ok && u.Link != nil && (u.Link.Attrs().Name == a.cfg.VXLANDevice || a.isOverlayDev(u.Link.Attrs().Index))
			case u, ok := <-neighs:
				ended = !ok
				lost = ok && a.isOverlayDev(u.LinkIndex) && (u.Type == unix.RTM_DELNEIGH || u.State&netlink.NUD_PERMANENT != 0)
			case u, ok := <-routeUpdates:
				ended = !ok
				lost = ok && u.Type == unix.RTM_DELROUTE && int(u.Protocol) == a.cfg.RouteProtocol
			}
			if ended {
				a.mu.Lock()
				a.watching = false
				a.mu.Unlock()
			}
			if lost || ended {
				a.loops.sync.Fire(syncKernel)
			}
			if ended {
				return
			}
		}
	}()
	return nil
}

// resubscribeKernel subscribes again to the kernel's events after a subscription ended.
func (a *Agent) resubscribeKernel(ctx context.Context) {
	a.mu.Lock()
	watching := a.watching
	a.mu.Unlock()
	if watching || ctx.Err() != nil {
		return
	}
	if err := a.watchKernel(ctx); err != nil {
		a.log.Warn("kernel events unavailable: routes and overlay entries removed behind the agent's back wait for the resync", "err", err, "period", a.cfg.ResyncPeriod)
	}
}

func (a *Agent) isOverlayDev(index int) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.overlayDev != 0 && a.overlayDev == index
}
