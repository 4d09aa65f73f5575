package core

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/kubenet-dev/kubenet/hostport"
	"github.com/kubenet-dev/kubenet/shaping"
)

// RuntimeConfig carries the capability arguments a runtime passes. encoding/json matches keys
// case-insensitively, which is what lets containerd's capitalised keys (HostPort, IngressRate)
// and CRI-O's and podman's lower-case ones (hostPort, ingressRate) both arrive.
type RuntimeConfig struct {
	PortMappings   []PortMapping     `json:"portMappings,omitempty"`
	Bandwidth      *Bandwidth        `json:"bandwidth,omitempty"`
	IPRanges       [][]IPRange       `json:"ipRanges,omitempty"`
	PodAnnotations map[string]string `json:"io.kubernetes.cri.pod-annotations,omitempty"`
}

// PortMapping is one host port of a pod: an entry of the portMappings capability, and (as
// network.PortMapping) what a runtime shim's Host returns. The field widths are kubelet's and
// CRI's. Protocol is tcp, udp or sctp in any case, empty meaning TCP; HostIP empty means every
// local address of each family the pod has. NormalizePortMappings checks and normalises them.
type PortMapping struct {
	HostPort      int32  `json:"hostPort"`
	ContainerPort int32  `json:"containerPort"`
	Protocol      string `json:"protocol,omitempty"`
	HostIP        string `json:"hostIP,omitempty"`
}

// Bandwidth is the bandwidth capability: rates in bit/s, bursts in bits.
type Bandwidth struct {
	IngressRate  uint64 `json:"ingressRate,omitempty"`
	IngressBurst uint64 `json:"ingressBurst,omitempty"`
	EgressRate   uint64 `json:"egressRate,omitempty"`
	EgressBurst  uint64 `json:"egressBurst,omitempty"`
}

// IPRange is one range of the ipRanges capability (host-local's range shape).
type IPRange struct {
	Subnet     string `json:"subnet"`
	RangeStart string `json:"rangeStart,omitempty"`
	RangeEnd   string `json:"rangeEnd,omitempty"`
	Gateway    string `json:"gateway,omitempty"`
}

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

// validateBandwidth checks the bandwidth capability and the bandwidth pod annotations in rc and
// replaces rc.Bandwidth with the limits that ADD will apply (capability first, annotations where
// it is silent; see shaping.Resolve), bursts normalised so that 0 means "default". nil means no
// shaping. The attachment record then holds what was applied, whichever way it arrived.
func validateBandwidth(rc *RuntimeConfig) error {
	var capability *shaping.Limits
	if rc.Bandwidth != nil {
		c := rc.Bandwidth.limits()
		capability = &c
	}
	l, err := shaping.Resolve(capability, rc.PodAnnotations)
	var ve *shaping.ValueError
	if errors.As(err, &ve) {
		return configError(ve.Key, ve.Value, "%s", ve.Reason)
	}
	if err != nil {
		return err
	}
	rc.Bandwidth = nil
	if !l.IsZero() {
		rc.Bandwidth = &Bandwidth{
			IngressRate: l.Ingress.Rate, IngressBurst: l.Ingress.Burst,
			EgressRate: l.Egress.Rate, EgressBurst: l.Egress.Burst,
		}
	}
	return nil
}

// BandwidthFromAnnotations resolves a pod's bandwidth annotations the way ADD does and returns
// them as the bandwidth capability a runtime sends (nil: no limit). Bursts are what containerd
// sends when a pod asks for none: plugins that know the convention (kubenet) choose their own,
// the reference bandwidth plugin needs a value.
func BandwidthFromAnnotations(annotations map[string]string) (*Bandwidth, error) {
	l, err := shaping.Resolve(nil, annotations)
	if err != nil || l.IsZero() {
		return nil, err
	}
	bw := &Bandwidth{}
	if l.Ingress.Rate > 0 {
		bw.IngressRate, bw.IngressBurst = l.Ingress.Rate, shaping.RuntimeDefaultBurst
	}
	if l.Egress.Rate > 0 {
		bw.EgressRate, bw.EgressBurst = l.Egress.Rate, shaping.RuntimeDefaultBurst
	}
	return bw, nil
}

// toMappings converts validated mappings (validateRuntime checked ranges, protocol and hostIP).
func toMappings(pms []PortMapping) []hostport.Mapping {
	out := make([]hostport.Mapping, 0, len(pms))
	for _, pm := range pms {
		m := hostport.Mapping{HostPort: uint16(pm.HostPort), ContainerPort: uint16(pm.ContainerPort), Protocol: protocolOf(pm.Protocol)}
		if pm.HostIP != "" {
			m.HostIP, _ = netip.ParseAddr(pm.HostIP)
		}
		out = append(out, m)
	}
	return out
}

// limits converts a validated Bandwidth (nil: none) to the shaper's terms.
func (b *Bandwidth) limits() shaping.Limits {
	if b == nil {
		return shaping.Limits{}
	}
	return shaping.Limits{
		Ingress: shaping.Limit{Rate: b.IngressRate, Burst: b.IngressBurst},
		Egress:  shaping.Limit{Rate: b.EgressRate, Burst: b.EgressBurst},
	}
}
