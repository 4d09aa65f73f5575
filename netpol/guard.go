package netpol

import (
	"errors"
	"fmt"

	"github.com/kubenet-dev/kubenet/internal/tcguard"
)

// GuardPort puts the port guard on a pod's bridge port (its host veth, by interface index):
// from then on the pod receives nothing that the policy rules did not mark (MarkIngress), ARP
// excepted. ADD does this before the pod's interface comes up, so the pod is denied until the
// agent has installed its policies. The guard goes with the veth.
func GuardPort(port int) error {
	if err := tcguard.Ensure(port, tcguard.Egress, MarkIngress); err != nil {
		return fmt.Errorf("network policy: port guard: %w", err)
	}
	return nil
}

// GuardBridge puts the bridge guard on the network's bridge (by interface index): what the
// bridge's ports hand up to the node — to the node itself or to be routed — passes only with
// MarkEgress (ARP excepted). Bridged frames between ports never cross it; the forward chain and
// the receiving port's guard hold those.
func GuardBridge(bridge int) error {
	if err := tcguard.Ensure(bridge, tcguard.Ingress, MarkEgress); err != nil {
		return fmt.Errorf("network policy: bridge guard: %w", err)
	}
	return nil
}

// CheckPortGuard and CheckBridgeGuard report a missing or replaced guard (CHECK, STATUS, the
// agent's repair).
func CheckPortGuard(port int) error {
	if err := tcguard.Check(port, tcguard.Egress, MarkIngress); err != nil {
		return fmt.Errorf("network policy: port guard: %w", err)
	}
	return nil
}

func CheckBridgeGuard(bridge int) error {
	if err := tcguard.Check(bridge, tcguard.Ingress, MarkEgress); err != nil {
		return fmt.Errorf("network policy: bridge guard: %w", err)
	}
	return nil
}

// IsGuardMissing tells whether err says a guard is not there (rather than that it could not be
// read).
func IsGuardMissing(err error) bool { return errors.Is(err, tcguard.ErrMissing) }

// Unguard removes the guards from the bridge and the given ports (NetworkPolicy turned off on
// the node: nothing marks packets any more). Missing guards are fine.
func Unguard(bridge int, ports []int) error {
	var errs []error
	for _, p := range ports {
		errs = append(errs, tcguard.Remove(p, tcguard.Egress))
	}
	if bridge > 0 {
		errs = append(errs, tcguard.Remove(bridge, tcguard.Ingress))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("network policy: remove guards: %w", err)
	}
	return nil
}
