package core

import (
	"context"
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"

	"github.com/kubenet-dev/kubenet/bridge"
	"github.com/kubenet-dev/kubenet/hostport"
)

// EnsureNode brings the node-wide state of cfg's network up to date without attaching a pod:
// forwarding and bridge-netfilter sysctls, the bridge with exactly cfg's gateway addresses (a
// gateway of an earlier pod CIDR is removed), MTU, promiscuous mode with its duplicate-frame
// rules, the SNAT chain, and the host-port chains and maps, with the map elements of running
// pods put back from the ownership index when any of that was missing. ADD does the same on
// every call; the in-process
// NetworkPlugin calls this when the node's pod CIDR becomes known or changes, so the node is
// ready (and no stale gateway stays on the bridge) before the first pod arrives. Runs in the
// caller's network namespace.
func EnsureNode(ctx context.Context, cfg *Config) error {
	_, err := HealNode(ctx, cfg, false)
	return err
}

// NodeRepair is what HealNode found and did.
type NodeRepair struct {
	// SetUp says that the network's bridge did not exist: the node was set up for the first time
	// (since boot), not repaired.
	SetUp bool
	// Found is how the node-wide rules differed from the plan before (CheckNode); nil when they
	// were as planned.
	Found error
	// Restored counts the hostPort map elements of running pods put back from the ownership
	// index.
	Restored int
	// IsolatedPorts counts the running pods whose isolation elements were put back from their
	// records because the isolation chains (and with them the sets) had to be created again.
	IsolatedPorts int
	// PolicyGuards counts the bridge's policy guard put back, NetfilterCall says its nf_call
	// options were off and were turned on (NetworkPolicy; the agent counts both with its policy
	// pass's repairs).
	PolicyGuards  int
	NetfilterCall bool
}

// BridgeNetfilterCallOff tells whether the network enforces NetworkPolicy and its bridge exists
// with its nf_call options off: what HealNode turns back on, asked on its own so that a watcher of
// link changes can tell a change that needs a heal from the many a bridge port makes. It only
// reads one link.
func BridgeNetfilterCallOff(cfg *Config) (bool, error) {
	if !cfg.NetworkPolicy {
		return false, nil
	}
	on, err := bridge.NetfilterCallOn(cfg.Bridge)
	if errors.Is(err, bridge.ErrNoBridge) {
		return false, nil // no bridge yet: nothing to keep, the first ADD sets it up
	}
	return !on && err == nil, err
}

// HealNode is EnsureNode for a node agent that re-asserts the node-wide state after somebody
// else changed it (a firewall reload flushes the ruleset): it also says what it found and how
// many hostPort map elements it put back. With allElements every reservation of the hostPort
// index is compared with the kernel's map elements and put back when missing or different,
// which reads everything the node holds (the agent's periodic pass; ADD and EnsureNode only do
// that when some node-wide chain or map was missing).
func HealNode(ctx context.Context, cfg *Config, allElements bool) (rep NodeRepair, err error) {
	h, err := openToApply(cfg, nil)
	if err != nil {
		return rep, err
	}
	defer func() { err = errors.Join(err, h.Close()) }()
	h.settingsChanged = true // the node is being set up: look for what only a change leaves behind
	rep.Found = h.checkNode()
	if rep.Found != nil {
		// The full check found rules that differ (or could not read them): the steps decode
		// and compare every chain, whatever the verified-rules memory says. A memory that
		// vouches for what the check just found wrong (a forged file) would leave it unrepaired,
		// and the heal is the node's safety net.
		h.known = nil
	}
	link, err := netlink.LinkByName(cfg.Bridge)
	if err != nil {
		rep.SetUp = true
	} else if br, ok := link.(*netlink.Bridge); ok && cfg.NetworkPolicy {
		// The bridge step would put them back too, without saying that they were gone.
		if rep.PolicyGuards, rep.NetfilterCall, err = ensureBridgePolicy(br); err != nil {
			return rep, fmt.Errorf("node setup of network %q: %w", cfg.Network, err)
		}
	}
	var hpRepair hostport.Repair
	steps := []struct {
		name string
		run  func() error
	}{
		{"bridge", func() error {
			// Read afresh: the bridge may have changed since preflight, while the settings were
			// claimed and the rules checked.
			_, _, err := h.ensureBridge(bridge.Seen{})
			return err
		}},
		{"duplicate-frame rules", h.ensureDedup},
		{"isolation rules", func() (err error) {
			rep.IsolatedPorts, err = h.ensureIsolation(allElements, nil)
			return err
		}},
		{"masquerade", h.ensureMasquerade},
		{"host-port rules", func() error {
			hpRepair, err = h.ensureHostPortNode(allElements)
			return err
		}},
	}
	for _, s := range steps {
		if err := ctx.Err(); err != nil {
			return rep, fmt.Errorf("node setup interrupted before %s: %w", s.name, err)
		}
		if err := s.run(); err != nil {
			return rep, fmt.Errorf("node setup of network %q: %s: %w", cfg.Network, s.name, err)
		}
	}
	rep.Restored = hpRepair.Elements
	return rep, nil
}

// CheckNode reports how the node-wide rules of cfg's network differ from the plan, in the backend
// that holds them: the SNAT chain, the duplicate-frame rules, the isolation chains and the
// host-port chains and maps, each compared by its rules' expressions and comments. It only reads
// (a dump per chain, or one -save per table), so STATUS and ADD afford it.
func CheckNode(cfg *Config) (err error) {
	h, err := openAsFound(cfg, nil)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, h.Close()) }()
	return h.checkNode()
}
