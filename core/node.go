package core

import (
	"context"
	"fmt"

	"github.com/kubenet-dev/kubenet/hairpin"
	"github.com/kubenet-dev/kubenet/ipam"
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
	store, err := ipam.Open(cfg.DataDir, cfg.Network)
	if err != nil {
		return fmt.Errorf("address store: %w", err)
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
