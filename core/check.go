package core

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/kubenet-dev/kubenet/bridge"
	"github.com/kubenet-dev/kubenet/hairpin"
	"github.com/kubenet-dev/kubenet/ipam"
	"github.com/kubenet-dev/kubenet/shaping"
)

// Check verifies everything the attachment owns and returns the first difference: the
// reservation against prevResult, the bridge and its gateways, the host veth on the bridge and
// its hairpin flag, the pod interface with addresses, routes and MTU, its isolation elements, the
// node-wide rules it depends on (SNAT, dedup, isolation, the host-port chains and maps with the
// localnet guard), its host ports and shaping.
func Check(ctx context.Context, cfg *Config, att Attachment) (err error) {
	if err := att.Validate(); err != nil {
		return err
	}
	if cfg.PrevResult == nil {
		return types.NewError(types.ErrInvalidNetworkConfig, "CHECK needs prevResult (the result of ADD)", "")
	}
	fromPrev, err := prevAddrs(cfg.PrevResult, att)
	if err != nil {
		return err
	}
	podNS, err := openPodNS(att.NetNS)
	if err != nil {
		return err
	}
	defer podNS.Close()
	// The attachment lock, shared: an ADD or DEL of the attachment in progress would make the
	// comparison meaningless; the node's healing, which reads the attachment too, may run.
	h, err := openToRead(cfg, att)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, h.Close()) }()
	k := att.key()
	rec, err := h.dir.records.Load(att)
	if err != nil {
		return err
	}
	if rec == nil {
		return fmt.Errorf("kubenet has no attachment of container %q interface %q on network %q", att.ContainerID, att.IfName, cfg.Network)
	}
	if err := checkReservation(h.dir.store, fromPrev, att, rec); err != nil {
		return err
	}
	br, err := bridge.CheckBridge(bridgeConfig(cfg, cfg.MTU))
	if err != nil {
		return err
	}
	names := k.names(cfg.Network)
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
	if err := bridge.CheckPod(podNS, bridge.Pod{IfName: att.IfName, Addrs: rec.IPs, Gateways: prefixAddrs(cfg.Gateways()), MAC: k.podMAC(cfg.Network)}, host, br.MTU); err != nil {
		return err
	}
	if err := h.nf.checkIsolation(h.isolationConfig(), h.portOf(k, rec.IPs)); err != nil {
		return err
	}
	if err := checkPolicy(cfg, br, host); err != nil {
		return err
	}
	// The node-wide rules by their expressions, not only their comments: a rule changed in
	// place keeps its comment.
	if err := h.checkNode(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := h.checkHostPorts(k, rec); err != nil {
		return err
	}
	// Against the limits the record holds: those are what ADD applied, after resolving the
	// capability and the annotations.
	return shaping.Check(host, names.IFB, rec.Bandwidth.limits())
}

// prevAddrs returns prevResult's addresses of the attachment's interface (those that name no
// interface count too). prevResult comes from the runtime's cache and is checked like any input:
// an entry that names an interface prevResult does not have, or holds no address, is an error.
func prevAddrs(prev *current.Result, att Attachment) ([]netip.Addr, error) {
	var out []netip.Addr
	for i, ip := range prev.IPs {
		key := fmt.Sprintf("prevResult.ips[%d]", i)
		if ip == nil {
			return nil, configError(key, "null", "not an IP configuration")
		}
		if ip.Interface != nil {
			n := *ip.Interface
			if n < 0 || n >= len(prev.Interfaces) || prev.Interfaces[n] == nil {
				return nil, configError(key+".interface", n, "prevResult has %d interfaces", len(prev.Interfaces))
			}
			if prev.Interfaces[n].Name != att.IfName {
				continue
			}
		}
		a, ok := netip.AddrFromSlice(ip.Address.IP)
		if !ok {
			return nil, configError(key+".address", ip.Address.String(), "not an IP address")
		}
		out = append(out, a.Unmap())
	}
	return out, nil
}

// checkReservation compares prevResult's pod addresses with kubenet's record and the address
// store: all three must name the same addresses, reserved for this attachment.
func checkReservation(store *ipam.Store, fromPrev []netip.Addr, att Attachment, rec *Record) error {
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
