// Package network is the kubelet-style network plugin layer that a runtime shim (cri-dockerd
// style) embeds: the NetworkPlugin interface that old kubelet's dockershim drove, InitNetworkPlugin
// to select a plugin by name (--network-plugin), the no-op plugin, and the PluginManager that
// serializes calls per pod and records metrics. The plugins live in network/kubenet (kubenet over
// this module's core, in-process) and network/cni (any CNI configuration from a conf dir).
package network

import (
	"net"
	"sort"
	"strings"

	"github.com/kubenet-dev/kubenet/core"
)

// Names and values kubelet used; shims and flags rely on them.
const (
	// DefaultPluginName is the name of the no-op plugin, chosen by an empty --network-plugin.
	DefaultPluginName = "kubernetes.io/no-op"
	// PodCIDRChangeEvent is the Event name a shim sends when the node's pod CIDR is known or
	// changes (CRI UpdateRuntimeConfig).
	PodCIDRChangeEvent = "pod-cidr-change"
	// PodCIDRChangeDetailCIDR is the Event detail that holds the CIDRs, comma-separated, IPv4 and
	// IPv6 in either order ("10.244.1.0/24,fd00:10:244:1::/64").
	PodCIDRChangeDetailCIDR = "pod-cidr"
	// DefaultInterfaceName is the pod's interface name.
	DefaultInterfaceName = "eth0"
	// UseDefaultMTU asks the plugin to choose the MTU itself.
	UseDefaultMTU = 0
	// CNITimeoutSec bounds one plugin operation: just under the 4 minute CRI request timeout, so
	// the runtime sees the plugin's error rather than its own timeout.
	CNITimeoutSec = 220
)

// HairpinMode is kubelet's --hairpin-mode: how a pod reaches itself through a Service.
type HairpinMode string

// The hairpin modes (kubelet's values).
const (
	PromiscuousBridge HairpinMode = "promiscuous-bridge"
	HairpinVeth       HairpinMode = "hairpin-veth"
	HairpinNone       HairpinMode = "none"
)

// Valid reports whether m is one of the three modes.
func (m HairpinMode) Valid() bool {
	return m == PromiscuousBridge || m == HairpinVeth || m == HairpinNone
}

// ContainerID identifies a sandbox: the runtime's type ("docker", "containerd") and its ID.
type ContainerID struct {
	Type string
	ID   string
}

func (c ContainerID) String() string { return c.Type + "://" + c.ID }

// PodNetworkStatus is what a plugin knows about a pod's network: IP is the primary address and
// IPs[0] == IP; IPs holds one address per family on dual-stack nodes.
type PodNetworkStatus struct {
	IP  net.IP   `json:"ip"`
	IPs []net.IP `json:"ips"`
}

// PortMapping is one host port of a pod, as the shim's Host returns it: HostPort,
// ContainerPort, Protocol (TCP, UDP or SCTP in any case, as kubelet's API and checkpoints spell
// them; empty means TCP) and HostIP (empty: every local address). It is the core's type, so the
// shim path and the CNI path accept, normalise and reserve mappings the same way.
type PortMapping = core.PortMapping

// NamespaceGetter is the part of the Host that finds a sandbox's network namespace.
type NamespaceGetter interface {
	// GetNetNS returns the path of the sandbox's network namespace. It never returns "" with a
	// nil error.
	GetNetNS(containerID string) (string, error)
}

// PortMappingGetter is the part of the Host that knows a sandbox's host ports.
type PortMappingGetter interface {
	// GetPodPortMappings returns the sandbox's host ports (nil when it has none).
	GetPodPortMappings(containerID string) ([]*PortMapping, error)
}

// Host is what a plugin needs from the runtime shim, kubelet's composition of the two getters.
type Host interface {
	NamespaceGetter
	PortMappingGetter
}

// NoopPortMappingGetter is a PortMappingGetter for shims without host ports: every sandbox has
// none.
type NoopPortMappingGetter struct{}

// GetPodPortMappings returns no mappings.
func (NoopPortMappingGetter) GetPodPortMappings(string) ([]*PortMapping, error) { return nil, nil }

// HostPorts returns the entries of pms that are host ports, in order: nil entries and those
// without a host port (a container port that is only declared) are dropped, as kubelet did.
// Checking and normalising the rest is the core's (core.NormalizePortMappings).
func HostPorts(pms []*PortMapping) []PortMapping {
	var out []PortMapping
	for _, pm := range pms {
		if pm != nil && pm.HostPort > 0 {
			out = append(out, *pm)
		}
	}
	return out
}

// Capabilities is a set of plugin capability numbers. kubelet once had one (shaping, 1); no
// plugin here declares any, since shaping now comes from pod annotations at SetUpPod.
type Capabilities map[int]struct{}

// NewCapabilities returns the set of the given numbers.
func NewCapabilities(caps ...int) Capabilities {
	s := Capabilities{}
	for _, c := range caps {
		s[c] = struct{}{}
	}
	return s
}

// Has reports whether c is in the set.
func (s Capabilities) Has(c int) bool {
	_, ok := s[c]
	return ok
}

// List returns the numbers in ascending order.
func (s Capabilities) List() []int {
	out := make([]int, 0, len(s))
	for c := range s {
		out = append(out, c)
	}
	sort.Ints(out)
	return out
}

// NetworkPlugin is the interface kubelet's dockershim drove. Init is called once before anything
// else; SetUpPod after the sandbox exists and before its containers start; TearDownPod before the
// sandbox is removed (also when its netns is already gone); Status returns an error while the
// plugin cannot set up pods.
type NetworkPlugin interface {
	Init(host Host, hairpinMode HairpinMode, nonMasqueradeCIDR string, mtu int) error
	Event(name string, details map[string]interface{})
	Name() string
	Capabilities() Capabilities
	SetUpPod(namespace, name string, podSandboxID ContainerID, annotations, options map[string]string) error
	TearDownPod(namespace, name string, podSandboxID ContainerID) error
	GetPodNetworkStatus(namespace, name string, podSandboxID ContainerID) (*PodNetworkStatus, error)
	Status() error
}

// SplitList splits a comma-separated list (kubelet's pod CIDRs, its non-masquerade CIDR),
// trimming the entries and dropping empty ones.
func SplitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// PodCIDRs returns the CIDRs of a pod-cidr-change event's details ("" when there are none or the
// detail is not a string).
func PodCIDRs(details map[string]interface{}) string {
	s, _ := details[PodCIDRChangeDetailCIDR].(string)
	return s
}

// EscapePluginName turns a qualified plugin name (vendor/name) into a name that is safe as one
// directory name on disk (vendor~name), as kubelet did for its plugin directories.
func EscapePluginName(in string) string { return strings.ReplaceAll(in, "/", "~") }

// UnescapePluginName is EscapePluginName's inverse: vendor~name becomes vendor/name.
func UnescapePluginName(in string) string { return strings.ReplaceAll(in, "~", "/") }
