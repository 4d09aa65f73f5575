package core

import (
	"net/netip"

	"github.com/kubenet-dev/kubenet/bridge"
	"github.com/kubenet-dev/kubenet/hairpin"
	"github.com/kubenet-dev/kubenet/hostport"
	"github.com/kubenet-dev/kubenet/isolation"
	"github.com/kubenet-dev/kubenet/masq"
)

// This file is the one place that turns the core's Config (and an attachment's record) into each
// mechanism's own configuration (the bridge's: bridgeConfig, beside the bridge steps). The mechanisms know nothing of the core or of each other.

// nodeRules are the plans of the network's node-wide rules, for the handle's backend.
func (h *handle) nodeRules() nodeRules {
	hp := h.hostportConfig()
	hp.Dir = "" // the node-wide chains and maps: no index is read
	return nodeRules{
		network:   h.cfg.Network,
		masq:      h.masqConfig(),
		hairpin:   h.cfg.Hairpin,
		dedup:     h.dedup(),
		isolation: h.isolationConfig(),
		hostPorts: hp,
	}
}

func (h *handle) dedup() hairpin.Dedup {
	gws := h.cfg.Gateways()
	return hairpin.Dedup{Network: h.cfg.Network, Bridge: h.cfg.Bridge, BridgeMAC: bridge.MAC(gws), PodCIDRs: h.cfg.PodCIDRs(), Gateways: prefixAddrs(gws), Known: h.known}
}

func (h *handle) masqConfig() masq.Config {
	return masq.Config{Network: h.cfg.Network, PodCIDRs: h.cfg.PodCIDRs(), NonMasqueradeCIDRs: h.cfg.NonMasqueradeCIDRs, Known: h.known}
}

// hostportConfig is the host ports of the network in the handle's backend, with the ownership
// index in the network's directory.
func (h *handle) hostportConfig() hostport.Config {
	return hostport.Config{Network: h.cfg.Network, Dir: h.dir.path(), Bridge: h.cfg.Bridge, PodCIDRs: h.cfg.PodCIDRs(), Backend: h.nf.hostPorts, Known: h.known}
}

func (h *handle) isolationConfig() isolation.Config {
	return isolation.Config{Network: h.cfg.Network, AntiSpoofing: h.cfg.AntiSpoofing, Known: h.known}
}

// portOf is the attachment's bridge port as isolation sees it, with the pod's addresses.
func (h *handle) portOf(k attachmentKey, ips []netip.Prefix) isolation.Port {
	return isolation.Port{
		Name:  k.names(h.cfg.Network).HostVeth,
		Owner: k.owner().String(),
		MAC:   k.podMAC(h.cfg.Network),
		Addrs: prefixAddrs(ips),
	}
}

func prefixAddrs(ps []netip.Prefix) []netip.Addr {
	out := make([]netip.Addr, len(ps))
	for i, p := range ps {
		out[i] = p.Addr()
	}
	return out
}
