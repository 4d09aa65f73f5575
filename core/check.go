package core

import (
	"context"
	"fmt"
	"net/netip"
	"slices"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/kubenet-dev/kubenet/bridge"
	"github.com/kubenet-dev/kubenet/hairpin"
	"github.com/kubenet-dev/kubenet/ipam"
	"github.com/kubenet-dev/kubenet/isolation"
	"github.com/kubenet-dev/kubenet/masq"
	"github.com/kubenet-dev/kubenet/shaping"
)

// Check verifies everything the attachment owns and returns the first difference: the
// reservation against prevResult, the bridge and its gateways, the host veth on the bridge and
// its hairpin flag, the pod interface with addresses, routes and MTU, the SNAT and dedup rules,
// host ports and shaping.
func Check(ctx context.Context, cfg *Config, att Attachment) error {
	if cfg.PrevResult == nil {
		return types.NewError(types.ErrInvalidNetworkConfig, "CHECK needs prevResult (the result of ADD)", "")
	}
	podNS, err := openPodNS(att.NetNS)
	if err != nil {
		return err
	}
	defer podNS.Close()
	store, err := ipam.Open(cfg.DataDir, cfg.Network)
	if err != nil {
		return fmt.Errorf("address store: %w", err)
	}
	defer store.Close()
	rec, err := NewRecords(store.Dir()).Load(att)
	if err != nil {
		return err
	}
	if rec == nil {
		return fmt.Errorf("kubenet has no attachment of container %q interface %q on network %q", att.ContainerID, att.IfName, cfg.Network)
	}
	if err := checkReservation(store, cfg.PrevResult, att, rec); err != nil {
		return err
	}
	br, err := bridge.CheckBridge(bridgeConfig(cfg, cfg.MTU))
	if err != nil {
		return err
	}
	names := NamesFor(cfg.Network, att)
	// With mtu 0 the MTU was detected at ADD time; the bridge holds it, and every end must agree.
	host, err := bridge.CheckVeth(bridge.Veth{HostName: names.HostVeth, Bridge: br, MTU: br.MTU})
	if err != nil {
		return err
	}
	if flag, err := hairpin.PortHairpin(host); err != nil {
		return err
	} else if flag != cfg.Hairpin.PortFlag() {
		return fmt.Errorf("host veth %q hairpin flag is %v, want %v in mode %s", names.HostVeth, flag, cfg.Hairpin.PortFlag(), cfg.Hairpin)
	}
	if err := bridge.CheckPod(podNS, bridge.Pod{IfName: att.IfName, Addrs: rec.IPs, Gateways: prefixAddrs(cfg.Gateways()), MAC: podMAC(cfg.Network, att)}, host, br.MTU); err != nil {
		return err
	}
	if err := isolation.Check(isolationConfig(cfg), portOf(cfg, att, rec.IPs)); err != nil {
		return err
	}
	if err := masq.Check(masqConfig(cfg)); err != nil {
		return err
	}
	if err := hairpin.CheckDedup(cfg.Hairpin, dedupFor(cfg)); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := checkHostPorts(cfg, att, rec, store.Dir()); err != nil {
		return err
	}
	// Against the limits the record holds: those are what ADD applied, after resolving the
	// capability and the annotations.
	return shaping.Check(host, names.IFB, rec.Bandwidth.limits())
}

// checkReservation compares prevResult's pod addresses with kubenet's record and the address
// store: all three must name the same addresses, reserved for this attachment.
func checkReservation(store *ipam.Store, prev *current.Result, att Attachment, rec *Record) error {
	var fromPrev []netip.Addr
	for _, ip := range prev.IPs {
		if ip.Interface != nil && *ip.Interface < len(prev.Interfaces) && prev.Interfaces[*ip.Interface].Name != att.IfName {
			continue
		}
		a, _ := netip.AddrFromSlice(ip.Address.IP)
		fromPrev = append(fromPrev, a.Unmap())
	}
	recorded := prefixAddrs(rec.IPs)
	slices.SortFunc(fromPrev, netip.Addr.Compare)
	slices.SortFunc(recorded, netip.Addr.Compare)
	if !slices.Equal(fromPrev, recorded) {
		return fmt.Errorf("prevResult addresses %v differ from kubenet's record %v for container %q", fromPrev, recorded, att.ContainerID)
	}
	for _, a := range recorded {
		held, err := store.Holds(a, att.ContainerID, att.IfName)
		if err != nil {
			return err
		}
		if !held {
			return fmt.Errorf("address %s is not reserved for container %q interface %q", a, att.ContainerID, att.IfName)
		}
	}
	return nil
}
