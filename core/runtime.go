package core

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/kubenet-dev/kubenet/hostport"
)

// validateRuntime checks the capability arguments and normalises them (protocol lower case,
// hostIP canonical), so everything after it can trust them.
func validateRuntime(rc *RuntimeConfig) error {
	pms, err := NormalizePortMappings(rc.PortMappings)
	if err != nil {
		return err
	}
	rc.PortMappings = pms
	return nil
}

// NormalizePortMappings checks port mappings as ADD checks the portMappings capability and
// returns them in normal form: protocol lower case (empty means TCP), hostIP canonical (an
// IPv4-mapped IPv6 address becomes IPv4). Callers that hand mappings to another plugin
// (network/cni) use it so that every face of kubenet accepts and spells mappings alike. Errors
// name the entry and the key (code 7).
func NormalizePortMappings(pms []PortMapping) ([]PortMapping, error) {
	if pms == nil {
		return nil, nil
	}
	out := make([]PortMapping, len(pms))
	for i, pm := range pms {
		if err := validatePortMapping(&pm, fmt.Sprintf("runtimeConfig.portMappings[%d]", i)); err != nil {
			return nil, err
		}
		out[i] = pm
	}
	return out, nil
}

// protocolOf is a mapping's protocol in normal form: lower case, and TCP when none is given
// (Kubernetes' default for a container port). The one place that says so.
func protocolOf(p string) string {
	if p == "" {
		return "tcp"
	}
	return strings.ToLower(p)
}

// validatePortMapping checks and normalises one mapping; key names it in the error.
func validatePortMapping(pm *PortMapping, key string) error {
	if pm.HostPort < 1 || pm.HostPort > 65535 {
		return configError(key+".hostPort", pm.HostPort, "must be between 1 and 65535")
	}
	if pm.ContainerPort < 1 || pm.ContainerPort > 65535 {
		return configError(key+".containerPort", pm.ContainerPort, "must be between 1 and 65535")
	}
	pm.Protocol = protocolOf(pm.Protocol)
	if !slices.Contains(hostport.Protocols(), pm.Protocol) {
		return configError(key+".protocol", pm.Protocol, "must be tcp, udp or sctp")
	}
	if pm.HostIP != "" {
		a, err := netip.ParseAddr(pm.HostIP)
		if err != nil || a.Zone() != "" {
			return configError(key+".hostIP", pm.HostIP, "not an IP address")
		}
		pm.HostIP = a.Unmap().String()
	}
	return nil
}

// validPortMappings returns the mappings of pms that validatePortMapping accepts, normalised:
// on DEL the runtime's mappings are at most hints, and one a pod author got wrong must not stop
// the teardown.
func validPortMappings(pms []PortMapping) []PortMapping {
	var out []PortMapping
	for _, pm := range pms {
		if validatePortMapping(&pm, "") == nil {
			out = append(out, pm)
		}
	}
	return out
}
