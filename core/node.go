package core

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/kubenet-dev/kubenet/bridge"
	"github.com/kubenet-dev/kubenet/hairpin"
	"github.com/kubenet-dev/kubenet/isolation"
)

// EnsureNode brings the node-wide state of cfg's network up to date without attaching a pod:
// forwarding and bridge-netfilter sysctls, the bridge with exactly cfg's gateway addresses (a
// gateway of an earlier pod CIDR is removed), MTU, promiscuous mode with its duplicate-frame
// rules, and the SNAT chain. ADD does the same on every call; the in-process NetworkPlugin calls
// this when the node's pod CIDR becomes known or changes, so the node is ready (and no stale
// gateway stays on the bridge) before the first pod arrives. Runs in the caller's network
// namespace.
func EnsureNode(ctx context.Context, cfg *Config) error {
	if err := preflight(cfg, false); err != nil {
		return err
	}
	store, err := openStore(cfg)
	if err != nil {
		return err
	}
	defer store.Close()
	a := &addition{cfg: cfg, store: store}
	steps := []struct {
		name string
		run  func() error
	}{
		{"bridge", func() error { return a.ensureBridge(nil) }},
		{"duplicate-frame rules", func() error { return hairpin.EnsureDedup(cfg.Hairpin, dedupFor(cfg)) }},
		{"isolation rules", func() error { return isolation.Ensure(isolationConfig(cfg)) }},
		{"masquerade", func() error { return a.masquerade(nil) }},
	}
	for _, s := range steps {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("node setup interrupted before %s: %w", s.name, err)
		}
		if err := s.run(); err != nil {
			return fmt.Errorf("node setup of network %q: %s: %w", cfg.Network, s.name, err)
		}
	}
	return nil
}

// preflight refuses, before anything changes, a configuration that would break the node (see
// bridge.Preflight): code 7 naming the bridge or the pod CIDR at fault. full also compares the
// pod CIDRs with the node's addresses and routes when the bridge already carries the gateways.
func preflight(cfg *Config, full bool) error {
	err := bridge.Preflight(bridgeConfig(cfg, cfg.MTU), full)
	pe, ok := bridge.IsPreflight(err)
	if !ok {
		return err
	}
	if pe.Key == "bridge" {
		return configError("bridge", pe.Value, "%s", pe.Reason)
	}
	gw, _ := netip.ParsePrefix(pe.Value)
	return configError(cfg.rangesKey(), gw.Masked().String(), "%s", pe.Reason)
}
