package core

import (
	"fmt"

	"github.com/vishvananda/netlink"

	"github.com/kubenet-dev/kubenet/bridge"
	"github.com/kubenet-dev/kubenet/netpol"
)

// This file holds the NetworkPolicy parts of the verbs: the guards that hold a pod until the
// agent has installed its policies, and what DEL and CHECK do about them. The policy passes
// themselves are in policy.go.

// guardBridge gives the bridge its policy guard when the node enforces NetworkPolicy. The bridge's
// own nf_call options come with bridgeConfig.
func guardBridge(cfg *Config, br *netlink.Bridge) error {
	if !cfg.NetworkPolicy {
		return nil
	}
	return netpol.GuardBridge(br.Index)
}

// checkPolicy is CHECK's part: with NetworkPolicy, br_netfilter, the bridge's nf_call options,
// the bridge's guard and the pod's port guard.
func checkPolicy(cfg *Config, br *netlink.Bridge, host netlink.Link) error {
	if !cfg.NetworkPolicy {
		return nil
	}
	if err := bridge.CheckBridgeNetfilter(); err != nil {
		return fmt.Errorf("networkPolicy: %w", err)
	}
	on, err := bridge.NetfilterCallOn(br.Name)
	if err != nil {
		return err
	}
	if !on {
		return fmt.Errorf("networkPolicy: bridge %q has nf_call_iptables or nf_call_ip6tables off: traffic between its pods bypasses conntrack and kube-proxy", br.Name)
	}
	if err := netpol.CheckBridgeGuard(br.Index); err != nil {
		return err
	}
	return netpol.CheckPortGuard(host.Attrs().Index)
}

// forgetPolicies removes the policy map elements of a deleted pod's port (DEL, and the undo of
// a failed ADD). The agent would on its next pass; doing it here leaves nothing of the
// attachment behind. Policies live in nftables only: on the iptables backend nothing is asked of
// nftables, which such a node may not have at all.
func (h *handle) forgetPolicies(port int) error {
	if port <= 0 || h.nf.backend != NetfilterNFTables {
		return nil
	}
	if err := netpol.Forget(h.cfg.Network, []int{port}); err != nil {
		return fmt.Errorf("network policy: %w", err)
	}
	return nil
}

// ensureGuard puts a missing guard back and says whether it did (1) or not (0).
func ensureGuard(check, guard func(int) error, index int) (int, error) {
	err := check(index)
	if err == nil {
		return 0, nil
	}
	if !netpol.IsGuardMissing(err) {
		return 0, err
	}
	if err := guard(index); err != nil {
		return 0, err
	}
	return 1, nil
}

// ensureBridgePolicy puts the bridge's guard back and turns its nf_call options on, and says how
// many guards it put back and whether the options were off: the policy's node-wide state that
// another tool may remove, which the agent's policy pass and its healer (HealNode) both look at.
func ensureBridgePolicy(br *netlink.Bridge) (guarded int, netfilterCall bool, err error) {
	if netfilterCall, err = ensureNetfilterCall(br.Name); err != nil {
		return 0, false, err
	}
	guarded, err = ensureGuard(netpol.CheckBridgeGuard, netpol.GuardBridge, br.Attrs().Index)
	return guarded, netfilterCall, err
}

// ensureNetfilterCall turns the bridge's nf_call options on when they are off and says whether
// they were.
func ensureNetfilterCall(name string) (bool, error) {
	on, err := bridge.NetfilterCallOn(name)
	if err != nil || on {
		return false, err
	}
	return true, bridge.TurnOnNetfilterCall(name)
}
