package core

import (
	"net/netip"

	"github.com/kubenet-dev/kubenet/bridge"
)

// bridgeConfig is the bridge cfg asks for with MTU mtu (CHECK passes cfg.MTU: 0 accepts any).
func bridgeConfig(cfg *Config, mtu int) bridge.Config {
	return bridge.Config{Name: cfg.Bridge, MTU: mtu, Gateways: cfg.Gateways(), Promisc: cfg.Hairpin.PromiscuousBridge(), Owner: cfg.Network, NetfilterCall: cfg.NetworkPolicy}
}

// preflight refuses, before anything changes, a configuration that would break the node (see
// bridge.Preflight): code 7 naming the bridge or the pod CIDR at fault. full also compares the
// pod CIDRs with the node's addresses and routes when the bridge already carries the gateways.
// What it read of the bridge comes back (bridge.Seen), for bridge.Ensure and STATUS.
func preflight(cfg *Config, full bool) (bridge.Seen, error) {
	if cfg.NetworkPolicy {
		// Without br_netfilter traffic between pods of the bridge never meets conntrack: replies
		// would be judged as new connections and kube-proxy's Services would not work between
		// them. The guards would hold every pod; refuse instead of cutting pods off silently.
		if err := bridge.CheckBridgeNetfilter(); err != nil {
			return bridge.Seen{}, configError("networkPolicy", true, "NetworkPolicy cannot be enforced on this node: %v", err)
		}
	}
	seen, err := bridge.Preflight(bridgeConfig(cfg, cfg.MTU), full)
	pe, ok := bridge.IsPreflight(err)
	if !ok {
		return seen, err
	}
	if pe.Key == "bridge" {
		return seen, configError("bridge", pe.Value, "%s", pe.Reason)
	}
	gw, _ := netip.ParsePrefix(pe.Value)
	return seen, configError(cfg.rangesKey(), gw.Masked().String(), "%s", pe.Reason)
}
