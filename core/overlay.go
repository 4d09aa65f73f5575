package core

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/kubenet-dev/kubenet/overlay"
)

// Defaults of the overlay (the agent's --vxlan-* flags).
const (
	DefaultOverlayDevice = overlay.DefaultDevice
	DefaultOverlayVNI    = overlay.DefaultVNI
	DefaultOverlayPort   = overlay.DefaultPort
)

// Overlay is the node's VXLAN overlay as the agent wants it (overlay/): the device, the peers
// reached through it and the firewall in front of its port. The CNI binary never touches it.
type Overlay struct {
	Device string // default overlay.DefaultDevice
	VNI    uint32
	Port   uint16
	// Local is this node's underlay address (its InternalIP); every peer's is of its family.
	Local netip.Addr
	// MTU is the device's: the underlay link's less the encapsulation (OverlayMTU).
	MTU    int
	Bridge string // the pods' bridge: the only link the overlay delivers to
	Peers  []OverlayPeer
	// Nodes are the InternalIPs of every Node of the cluster, the only senders accepted; the
	// PodNetworks are the cluster's pod CIDRs (overlay.Firewall).
	Nodes       []netip.Addr
	PodNetworks []netip.Prefix
	// NoDevice keeps the firewall without the device (--routing=direct, or no underlay
	// address): the node then receives no VXLAN, but its forward rules still keep its pods from
	// sending VXLAN to the Nodes that do.
	NoDevice bool
}

// OverlayPeer is another node reached through the overlay.
type OverlayPeer struct {
	Node     string
	Underlay netip.Addr
	PodCIDRs []netip.Prefix
}

// OverlayState is what SyncOverlay did: the device's index (for the routes through it), the peers
// it could not program, and whether the firewall had to be written (it was missing or changed).
type OverlayState struct {
	Device          int
	Failed          map[string]error
	FirewallWritten bool
}

// OverlayNextHop is the next hop of the route to a peer's pod CIDR through the overlay.
func OverlayNextHop(podCIDR netip.Prefix) netip.Addr { return overlay.NextHop(podCIDR) }

// OverlayMTU returns the MTU the overlay device (and the pods, when any peer is reached through
// it) must have: that of the link holding local, less the encapsulation.
func OverlayMTU(local netip.Addr) (int, error) {
	mtu, err := overlay.UnderlayMTU(local)
	if err != nil {
		return 0, err
	}
	return mtu - overlay.Overhead(local), nil
}

// SyncOverlay converges the overlay: the firewall first (the device decapsulates whatever reaches
// its port, so it never exists without the rules that filter its senders), then the device, then
// its forwarding and neighbour entries. With NoDevice only the firewall stays.
func SyncOverlay(o Overlay) (OverlayState, error) {
	if o.Device == "" {
		o.Device = overlay.DefaultDevice
	}
	if !o.Local.IsValid() && !o.NoDevice {
		return OverlayState{}, errors.New("overlay: this node has no underlay address (no InternalIP)")
	}
	fw := overlay.Firewall{Port: o.Port, Device: o.Device, Bridge: o.Bridge, Local: o.Local, Nodes: o.Nodes, PodNetworks: o.PodNetworks}
	written, err := fw.Sync()
	if err != nil {
		return OverlayState{}, err
	}
	if o.NoDevice {
		return OverlayState{FirewallWritten: written}, overlay.Remove(o.Device)
	}
	dev, err := overlay.Ensure(overlay.Device{Name: o.Device, VNI: o.VNI, Port: o.Port, Local: o.Local, MTU: o.MTU})
	if err != nil {
		return OverlayState{FirewallWritten: written}, err
	}
	peers := make([]overlay.Peer, 0, len(o.Peers))
	for _, p := range o.Peers {
		peers = append(peers, overlay.Peer{Node: p.Node, Underlay: p.Underlay, PodCIDRs: p.PodCIDRs})
	}
	return OverlayState{Device: dev, Failed: overlay.Sync(dev, peers), FirewallWritten: written}, nil
}

// RemoveOverlay deletes the overlay device (with the routes through it), then its firewall: for an
// agent that manages no routes (--manage-routes=false), whose overlay would otherwise decapsulate
// with an allowlist nobody keeps.
func RemoveOverlay(device string) error {
	if device == "" {
		device = overlay.DefaultDevice
	}
	if err := overlay.Remove(device); err != nil {
		return err
	}
	if err := overlay.RemoveFirewall(); err != nil {
		return fmt.Errorf("overlay: %w", err)
	}
	return nil
}
