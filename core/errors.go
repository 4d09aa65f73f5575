package core

import (
	"fmt"

	"github.com/containernetworking/cni/pkg/types"
)

// STATUS codes of CNI 1.1 that the types package does not name.
const (
	// ErrPluginNotAvailable: STATUS says an ADD cannot succeed now.
	ErrPluginNotAvailable uint = 50
	// ErrLimitedConnectivity: not available, and existing pods may have limited connectivity.
	ErrLimitedConnectivity uint = 51
)

// kubenet's own CNI error codes (the spec reserves 100 and up for plugins).
const (
	// ErrAttachmentExists: ADD for a (container ID, interface) that kubenet already attached.
	ErrAttachmentExists uint = 101
	// ErrNoAddresses: the pod CIDR has no free address left.
	ErrNoAddresses uint = 102
	// ErrPortConflict: a hostPort is already held by another attachment.
	ErrPortConflict uint = 103
	// ErrNodeOwned: the network's node-wide settings belong to another caller and differ.
	ErrNodeOwned uint = 104
)

// configError is a CNI "invalid network configuration" (7) error naming the key and value.
func configError(key string, value any, format string, args ...any) *types.Error {
	return types.NewError(types.ErrInvalidNetworkConfig,
		fmt.Sprintf("invalid %s %v: %s", key, quote(value), fmt.Sprintf(format, args...)), "")
}

func quote(v any) string {
	if s, ok := v.(string); ok {
		return fmt.Sprintf("%q", s)
	}
	return fmt.Sprint(v)
}

// envError is a CNI "invalid environment variables" (4) error.
func envError(format string, args ...any) *types.Error {
	return types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf(format, args...), "")
}
