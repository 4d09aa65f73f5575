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
	for i := range rc.PortMappings {
		pm := &rc.PortMappings[i]
		key := fmt.Sprintf("runtimeConfig.portMappings[%d]", i)
		if pm.HostPort < 1 || pm.HostPort > 65535 {
			return configError(key+".hostPort", pm.HostPort, "must be between 1 and 65535")
		}
		if pm.ContainerPort < 1 || pm.ContainerPort > 65535 {
			return configError(key+".containerPort", pm.ContainerPort, "must be between 1 and 65535")
		}
		pm.Protocol = strings.ToLower(pm.Protocol)
		if pm.Protocol == "" {
			pm.Protocol = "tcp"
		}
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
	}
	return nil
}
