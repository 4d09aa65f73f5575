package core

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"

	cnins "github.com/containernetworking/cni/pkg/ns"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/kubenet-dev/kubenet/bridge"
	"github.com/kubenet-dev/kubenet/hairpin"
	"github.com/kubenet-dev/kubenet/hostport"
	"github.com/kubenet-dev/kubenet/internal/ipnet"
	"github.com/kubenet-dev/kubenet/ipam"
	"github.com/kubenet-dev/kubenet/netpol"
	"github.com/kubenet-dev/kubenet/shaping"
)

// undoStack collects the undo of each per-attachment step of ADD, run in reverse on failure.
type undoStack []func() error

func (u *undoStack) push(f func() error) { *u = append(*u, f) }

func (u undoStack) run() error {
	var errs []error
	for i := len(u) - 1; i >= 0; i-- {
		errs = append(errs, u[i]())
	}
	return errors.Join(errs...)
}

// addition holds what ADD has learned so far, step by step.
type addition struct {
	*handle
	att    Attachment
	key    attachmentKey
	podNS  ns.NetNS
	ips    []netip.Prefix // pod addresses, one per family, with the pod CIDR's prefix length
	mtu    int
	bridge *netlink.Bridge
	host   netlink.Link
	podMAC net.HardwareAddr
	// keepReservation is set by a step that failed in a way that may leave kernel state
	// leading to the pod's addresses: the rollback then keeps the record and the reservations,
	// so that DEL or GC removes that state before the addresses go to another pod.
	keepReservation bool
	// isolated is the isolation step, which runs alongside the steps after it
	isolated *pending
	// snat and hostPortChains are the node-wide SNAT and host-port chains' steps, which run
	// alongside the pod's own
	snat, hostPortChains *pending
}

// Add attaches the pod in att.NetNS to the network and returns the CNI result. On any error
// everything this call created for the attachment is removed again.
//
// It holds the attachment lock from before the first change to after the last (or the rollback),
// so a DEL of the same attachment runs wholly before or wholly after it: the end state is the
// attachment fully set up with its record, or nothing of it.
func Add(ctx context.Context, cfg *Config, att Attachment) (result *current.Result, err error) {
	if err := att.Validate(); err != nil {
		return nil, err
	}
	if err := checkMappingCount(cfg.Runtime); err != nil {
		return nil, err
	}
	podNS, err := openPodNS(att.NetNS)
	if err != nil {
		return nil, err
	}
	defer podNS.Close()
	h, err := openToApply(cfg, &att)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, h.Close()) }()

	k := att.key()
	a := &addition{handle: h, att: att, key: k, podNS: podNS}
	var undo undoStack
	defer func() {
		if err != nil {
			if uerr := undo.run(); uerr != nil {
				err = fmt.Errorf("%w (and rolling back failed: %v)", err, uerr)
			}
		}
	}()
	for _, s := range a.steps() {
		if err := ctx.Err(); err != nil {
			return nil, types.NewError(types.ErrTryAgainLater, fmt.Sprintf("ADD interrupted before %s: %v", s.name, err), "")
		}
		crashPoint("before " + s.name)
		if err := s.run(&undo); err != nil {
			return nil, err
		}
	}
	crashPoint("before result")
	return a.result(), nil
}

type step struct {
	name string
	run  func(*undoStack) error
}

// steps are ADD's steps in order: the pod's story.
func (a *addition) steps() []step {
	return []step{
		{"reserve addresses", a.reserve},
		{"isolation", a.isolate},
		{"SNAT", a.startSNAT},
		{"bridge", a.bringUpBridge},
		{"host-port chains", a.startHostPortChains},
		{"veth", a.addVeth},
		{"policy guard", a.guardPort},
		{"pod interface", a.configurePod},
		{"hairpin", a.hairpin},
		{"node rules in place", a.awaitNodeRules},
		{"host ports", a.hostPorts},
		{"shaping", a.shaping},
		{"isolation in place", a.awaitIsolation},
	}
}

// CrashPoints names every place where a binary built with -tags kubenet_crashtest kills itself
// when KUBENET_CRASH_AT names it, in the order ADD passes them. The crash-safety test walks them
// all: whatever instruction a real crash hits lies between two of them.
func CrashPoints() []string {
	var out []string
	for _, s := range (&addition{}).steps() {
		out = append(out, "before "+s.name)
		if s.name == "reserve addresses" {
			out = append(out, "address 0 reserved", "address 1 reserved", "record written")
		}
	}
	return append(out, "before result")
}

// checkMappingCount refuses more port mappings than hostport.MaxMappings before ADD changes
// anything: their index files and map elements are written under the network lock, which every
// other ADD and DEL of the node waits for.
func checkMappingCount(rc RuntimeConfig) error {
	if n := len(rc.PortMappings); n > hostport.MaxMappings {
		return configError("runtimeConfig.portMappings", n, "a pod may have at most %d port mappings (hostPorts); this one has %d", hostport.MaxMappings, n)
	}
	return nil
}

// names are the attachment's link names.
func (a *addition) names() Names { return a.key.names(a.cfg.Network) }

// openPodNS opens CNI_NETNS and refuses the plugin's own namespace: configuring "the pod" there
// would move the node's addresses and routes around.
func openPodNS(path string) (ns.NetNS, error) {
	if path == "" {
		return nil, envError("CNI_NETNS is empty; ADD needs the pod's network namespace")
	}
	podNS, err := ns.GetNS(path)
	if err != nil {
		return nil, envError("CNI_NETNS %q: %v", path, err)
	}
	// ns.GetNS accepts any file on procfs (to allow /proc/<pid>/ns/net), so ask the kernel what
	// the file really is before anything is changed on the node.
	if kind, err := unix.IoctlRetInt(int(podNS.Fd()), unix.NS_GET_NSTYPE); err != nil || kind != unix.CLONE_NEWNET {
		podNS.Close()
		return nil, envError("CNI_NETNS %q is not a network namespace", path)
	}
	own, nsErr := cnins.CheckNetNS(path)
	if nsErr != nil {
		podNS.Close()
		return nil, nsErr
	}
	if own {
		podNS.Close()
		return nil, types.NewError(types.ErrInvalidNetNS, fmt.Sprintf("CNI_NETNS %q is the plugin's own network namespace", path), "")
	}
	return podNS, nil
}

// reserve reserves one address per family and writes the attachment record, under the network's
// lock (the same lock file host-local uses).
func (a *addition) reserve(undo *undoStack) error {
	return a.dir.withLock(func() error { return a.reserveLocked(undo) })
}

func (a *addition) reserveLocked(undo *undoStack) error {
	existing, err := a.dir.records.Load(a.att)
	var corrupt *CorruptRecordError
	if errors.As(err, &corrupt) {
		return types.NewError(ErrAttachmentExists,
			fmt.Sprintf("container %q interface %q on network %q: %v; DEL it first", a.att.ContainerID, a.att.IfName, a.cfg.Network, corrupt), "")
	}
	if err != nil {
		return err
	}
	if existing != nil {
		return types.NewError(ErrAttachmentExists,
			fmt.Sprintf("container %q already has interface %q on network %q (addresses %v); DEL it first", a.att.ContainerID, a.att.IfName, a.cfg.Network, existing.IPs), "")
	}
	undo.push(func() error {
		if a.keepReservation {
			return nil
		}
		return a.dir.withLock(func() error {
			if _, err := a.dir.store.Release(a.att.ContainerID, a.att.IfName, prefixAddrs(a.ips)); err != nil {
				return err
			}
			return a.dir.records.Remove(a.att)
		})
	})
	for i, set := range a.cfg.Ranges {
		addr, r, err := a.dir.store.Allocate(i, set, a.att.ContainerID, a.att.IfName)
		if err != nil {
			if errors.Is(err, ipam.ErrExhausted) {
				return types.NewError(ErrNoAddresses, err.Error(), "")
			}
			return fmt.Errorf("reserve address: %w", err)
		}
		a.ips = append(a.ips, netip.PrefixFrom(addr, r.Subnet.Bits()))
		crashPoint(fmt.Sprintf("address %d reserved", i))
	}
	// The record follows the reservations: the reservation files already name the container, so
	// a crash before this line leaves nothing DEL or GC cannot find. From here on every object
	// ADD creates is findable from the record or from names derived from the attachment.
	err = a.dir.records.Save(&Record{
		ContainerID:  a.att.ContainerID,
		IfName:       a.att.IfName,
		NetNS:        a.att.NetNS,
		Pod:          a.att.Pod,
		IPs:          a.ips,
		PortMappings: a.cfg.Runtime.PortMappings,
		Bandwidth:    a.cfg.Runtime.Bandwidth,
	})
	crashPoint("record written")
	return err
}

// bringUpBridge brings the forwarding sysctls and the bridge up to date (handle.ensureBridge).
func (a *addition) bringUpBridge(*undoStack) (err error) {
	a.bridge, a.mtu, err = a.handle.ensureBridge(a.seen)
	return err
}

func (a *addition) addVeth(undo *undoStack) error {
	host, err := bridge.AddVeth(bridge.Veth{
		HostName:  a.names().HostVeth,
		PodIfName: a.att.IfName,
		PodMAC:    a.key.podMAC(a.cfg.Network),
		MTU:       a.mtu,
		Bridge:    a.bridge,
	}, a.podNS)
	if errors.Is(err, bridge.ErrInterfaceExists) {
		return types.NewError(ErrAttachmentExists, fmt.Sprintf("pod netns %q: %v", a.att.NetNS, err), "")
	}
	if err != nil {
		return err
	}
	undo.push(func() error {
		// The agent may have released the port meanwhile: its elements go with it.
		return errors.Join(a.forgetPolicies(host.Attrs().Index), delLinks(a.names()))
	})
	a.host = host
	return nil
}

func (a *addition) configurePod(*undoStack) error {
	mac, err := bridge.ConfigurePod(a.podNS, bridge.Pod{IfName: a.att.IfName, Addrs: a.ips, Gateways: prefixAddrs(a.cfg.Gateways())})
	a.podMAC = mac
	return err
}

// isolate brings the bridge's isolation chains up to date and adds the pod's port to them: no
// pod may act as a router, and with anti-spoofing none may send as another. It needs only the
// names and addresses, so its kernel round trips run alongside the steps that follow instead of
// adding to every ADD; awaitIsolation collects the outcome before the result.
func (a *addition) isolate(undo *undoStack) error {
	port := a.portOf(a.key, a.ips)
	a.isolated = &pending{done: alongside(func() error {
		_, err := a.handle.ensureIsolation(false, &a.key, port)
		return err
	})}
	undo.push(func() error {
		_ = a.isolated.wait() // whatever it did, remove the port's elements after it
		return a.nf.removeIsolation(a.cfg.Network, port)
	})
	return nil
}

func (a *addition) awaitIsolation(*undoStack) error {
	return a.isolated.wait()
}

func (a *addition) hairpin(*undoStack) error {
	if err := hairpin.SetPort(a.cfg.Hairpin, a.host); err != nil {
		return err
	}
	return a.ensureDedup()
}

// The node-wide steps run alongside the pod's links and addresses: on a node's first ADD they
// write the SNAT chain and the host-port chains and maps (the localnet guard among them protects
// the node from every pod, with or without mappings), on a later one they read them back, and
// they need only the configuration (and the host-port chains the bridge, whose route_localnet
// they may set). awaitNodeRules collects both before the pod's own port mappings go into those
// maps. Each pushes an undo that waits for it, so that nothing writes on behalf of an ADD after
// it returned.

// startSNAT brings the SNAT chain up to date alongside.
func (a *addition) startSNAT(undo *undoStack) error {
	a.snat = a.runAlongside(undo, a.ensureMasquerade)
	return nil
}

// startHostPortChains brings the node-wide host-port chains and maps up to date alongside.
func (a *addition) startHostPortChains(undo *undoStack) error {
	a.hostPortChains = a.runAlongside(undo, func() error {
		_, err := a.ensureHostPortNode(false)
		return err
	})
	return nil
}

// runAlongside runs f alongside the steps that follow and pushes an undo that waits for it (its
// error is the await's, or the failed step's).
func (a *addition) runAlongside(undo *undoStack, f func() error) *pending {
	p := &pending{done: alongside(f)}
	undo.push(func() error {
		_ = p.wait()
		return nil
	})
	return p
}

func (a *addition) awaitNodeRules(*undoStack) error {
	return errors.Join(a.snat.wait(), a.hostPortChains.wait())
}

// guardPort gives the new pod's bridge port its policy guard before the pod's interface comes
// up, when the node enforces NetworkPolicy: the pod receives nothing the policy rules did not
// grant, and the bridge guard (handle.ensureBridge) holds what it sends, until the agent has installed
// its policies. Nothing is written into the policy tables: a port without elements is denied.
func (a *addition) guardPort(*undoStack) error {
	if !a.cfg.NetworkPolicy {
		return nil
	}
	return netpol.GuardPort(a.host.Attrs().Index)
}

// hostPorts programs the attachment's port mappings (a.cfg.Runtime.PortMappings) for its
// addresses (a.ips) into the node-wide host-port maps (startHostPortChains) and pushes their removal
// onto undo. The conflict check, the reservation and the nftables transaction happen under the
// network lock, so two pods racing for one hostPort cannot both get it.
func (a *addition) hostPorts(undo *undoStack) error {
	if len(a.cfg.Runtime.PortMappings) == 0 {
		return nil
	}
	entries, err := hostport.Plan(toMappings(a.cfg.Runtime.PortMappings), prefixAddrs(a.ips))
	var dup *hostport.DuplicateError
	if errors.As(err, &dup) {
		return configError("runtimeConfig.portMappings", dup.Key.String(), "mapped twice, to %s and to %s", dup.First, dup.Second)
	}
	if err != nil {
		return configError("runtimeConfig.portMappings", fmt.Sprint(a.cfg.Runtime.PortMappings), "%v", err)
	}
	owner := a.key.owner()
	// In the backend this ADD chose: it holds the backend lock, so no other ADD has switched the
	// node away from it.
	err = a.dir.withLock(func() error { return hostport.Add(a.hostportConfig(), owner, entries) })
	var conflict *hostport.ConflictError
	if errors.As(err, &conflict) {
		return types.NewError(ErrPortConflict, conflict.Error(), "")
	}
	var leftover *hostport.LeftoverError
	if errors.As(err, &leftover) {
		// Elements that may lead to the pod's addresses are still in the kernel: the record and
		// the reservations stay, so the runtime's DEL (or GC) removes them before the addresses
		// can go to another pod.
		a.keepReservation = true
	}
	if err != nil {
		return fmt.Errorf("host ports: %w", err)
	}
	undo.push(func() error {
		return a.dir.withLock(func() error { return hostport.Remove(a.hostportConfig(), owner, hostport.KeysOf(entries)) })
	})
	return nil
}

// shaping applies the attachment's bandwidth limits.
func (a *addition) shaping(*undoStack) error {
	l := a.cfg.Runtime.Bandwidth.limits()
	if l.IsZero() {
		return nil
	}
	// No undo of its own: shaping is the last step, Apply cleans up after itself, and the veth's
	// undo (delLinks) takes a leftover ifb with it.
	return shaping.Apply(a.host, a.names().IFB, l)
}

// result is the CNI result: interfaces [bridge, host veth, pod interface], every address on the
// pod interface (index 2) with its gateway, a default route per family, and the MTU.
func (a *addition) result() *current.Result {
	r := &current.Result{
		CNIVersion: current.ImplementedSpecVersion,
		Interfaces: []*current.Interface{
			{Name: a.bridge.Name, Mac: bridge.MAC(a.cfg.Gateways()).String(), Mtu: a.mtu},
			{Name: a.host.Attrs().Name, Mac: a.host.Attrs().HardwareAddr.String(), Mtu: a.mtu},
			{Name: a.att.IfName, Mac: a.podMAC.String(), Mtu: a.mtu, Sandbox: a.att.NetNS},
		},
	}
	gws := a.cfg.Gateways()
	for i, p := range a.ips {
		gw := gws[i].Addr()
		r.IPs = append(r.IPs, &current.IPConfig{
			Interface: current.Int(2),
			Address:   *ipnet.FromPrefix(p),
			Gateway:   gw.AsSlice(),
		})
		dst := netip.PrefixFrom(netip.IPv4Unspecified(), 0)
		if gw.Is6() {
			dst = netip.PrefixFrom(netip.IPv6Unspecified(), 0)
		}
		r.Routes = append(r.Routes, &types.Route{Dst: *ipnet.FromPrefix(dst), GW: gw.AsSlice()})
	}
	return r
}
