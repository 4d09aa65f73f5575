package core

import (
	"crypto/sha256"
	"net"
	"net/netip"

	"github.com/kubenet-dev/kubenet/bridge"
	"github.com/kubenet-dev/kubenet/hairpin"
	"github.com/kubenet-dev/kubenet/hostport"
	"github.com/kubenet-dev/kubenet/isolation"
	"github.com/kubenet-dev/kubenet/masq"
	"github.com/kubenet-dev/kubenet/shaping"
)

// This file is the one place that turns the core's Config (and an attachment's record) into each
// mechanism's own configuration. The mechanisms know nothing of the core or of each other.

func dedupFor(cfg *Config) hairpin.Dedup {
	gws := cfg.Gateways()
	return hairpin.Dedup{Network: cfg.Network, Bridge: cfg.Bridge, BridgeMAC: bridge.MAC(gws), PodCIDRs: cfg.PodCIDRs(), Gateways: prefixAddrs(gws), Known: cfg.known}
}

// bridgeConfig is the bridge cfg asks for with MTU mtu (CHECK passes cfg.MTU: 0 accepts any).
func bridgeConfig(cfg *Config, mtu int) bridge.Config {
	return bridge.Config{Name: cfg.Bridge, MTU: mtu, Gateways: cfg.Gateways(), Promisc: cfg.Hairpin.PromiscuousBridge(), Owner: cfg.Network, NetfilterCall: cfg.NetworkPolicy}
}

func masqConfig(cfg *Config) masq.Config {
	return masq.Config{Network: cfg.Network, PodCIDRs: cfg.PodCIDRs(), NonMasqueradeCIDRs: cfg.NonMasqueradeCIDRs, Known: cfg.known}
}

func hostportConfig(cfg *Config, networkDir string) hostport.Config {
	return hostportConfigWith(cfg, cfg.filter().hostPorts(), networkDir)
}

func hostportConfigWith(cfg *Config, b hostport.Backend, networkDir string) hostport.Config {
	return hostport.Config{Network: cfg.Network, Dir: networkDir, Bridge: cfg.Bridge, PodCIDRs: cfg.PodCIDRs(), Backend: b, Known: cfg.known}
}

func isolationConfig(cfg *Config) isolation.Config {
	return isolation.Config{Network: cfg.Network, AntiSpoofing: cfg.AntiSpoofing, Known: cfg.known}
}

// podMAC is the MAC of the attachment's pod interface: bridge gives it to the pod end of the
// veth, isolation keys the pod's anti-spoofing elements by it. Derived from the attachment like
// the host veth's name, so DEL finds those elements without the pod: a locally administered
// unicast address from a hash of (network, container ID, interface).
func podMAC(network string, att Attachment) net.HardwareAddr {
	sum := sha256.Sum256([]byte("pod-mac\x00" + network + "\x00" + att.ContainerID + "\x00" + att.IfName))
	mac := net.HardwareAddr(sum[:6])
	mac[0] = mac[0]&^0x01 | 0x02
	return mac
}

// portOf is the attachment's bridge port as isolation sees it, with the pod's addresses.
func portOf(cfg *Config, att Attachment, ips []netip.Prefix) isolation.Port {
	return isolation.Port{
		Name:  NamesFor(cfg.Network, att).HostVeth,
		Owner: ownerOf(att).String(),
		MAC:   podMAC(cfg.Network, att),
		Addrs: prefixAddrs(ips),
	}
}

func ownerOf(att Attachment) hostport.Owner {
	return hostport.Owner{ContainerID: att.ContainerID, IfName: att.IfName}
}

// toMappings converts validated mappings (validateRuntime checked ranges, protocol and hostIP).
func toMappings(pms []PortMapping) []hostport.Mapping {
	out := make([]hostport.Mapping, 0, len(pms))
	for _, pm := range pms {
		m := hostport.Mapping{HostPort: uint16(pm.HostPort), ContainerPort: uint16(pm.ContainerPort), Protocol: protocolOf(pm.Protocol)}
		if pm.HostIP != "" {
			m.HostIP, _ = netip.ParseAddr(pm.HostIP)
		}
		out = append(out, m)
	}
	return out
}

// limits converts a validated Bandwidth (nil: none) to the shaper's terms.
func (b *Bandwidth) limits() shaping.Limits {
	if b == nil {
		return shaping.Limits{}
	}
	return shaping.Limits{
		Ingress: shaping.Limit{Rate: b.IngressRate, Burst: b.IngressBurst},
		Egress:  shaping.Limit{Rate: b.EgressRate, Burst: b.EgressBurst},
	}
}
