package network

import (
	"errors"
	"fmt"
	"regexp"
)

// qualifiedName is Kubernetes' qualified name: an optional DNS subdomain prefix and "/", then
// up to 63 alphanumerics, '-', '_' or '.', starting and ending alphanumeric.
var qualifiedName = regexp.MustCompile(`^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$`)

// InitNetworkPlugin selects the plugin called name among plugins, Inits it with the other
// arguments and returns it. An empty name selects the no-op plugin. Every plugin's name must be a
// qualified name and unique, also the ones not selected: a broken registration fails startup
// rather than surprising later. Unknown name: `network plugin "x" not found`.
func InitNetworkPlugin(plugins []NetworkPlugin, name string, host Host, hairpinMode HairpinMode, nonMasqueradeCIDR string, mtu int) (NetworkPlugin, error) {
	if name == "" || name == DefaultPluginName {
		p := &NoopNetworkPlugin{}
		if err := p.Init(host, hairpinMode, nonMasqueradeCIDR, mtu); err != nil {
			return nil, err
		}
		return p, nil
	}
	var errs []error
	byName := map[string]NetworkPlugin{}
	for _, p := range plugins {
		n := p.Name()
		if !qualifiedName.MatchString(n) || len(n) > 253+1+63 {
			errs = append(errs, fmt.Errorf("network plugin has an invalid name %q", n))
			continue
		}
		if _, dup := byName[n]; dup {
			errs = append(errs, fmt.Errorf("network plugin %q was registered more than once", n))
			continue
		}
		byName[n] = p
	}
	chosen, ok := byName[name]
	if !ok {
		errs = append(errs, fmt.Errorf("network plugin %q not found", name))
	} else if err := chosen.Init(host, hairpinMode, nonMasqueradeCIDR, mtu); err != nil {
		errs = append(errs, fmt.Errorf("network plugin %q failed init: %w", name, err))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return chosen, nil
}

// NoopNetworkPlugin sets up nothing: pods keep whatever network the runtime gave them.
// GetPodNetworkStatus returns (nil, nil), which tells the shim to ask the runtime for the IP.
// Unlike kubelet's, Init does not touch bridge-netfilter sysctls: they belong to whoever owns a
// bridge (kubenet's core sets them for its own, per node namespace).
type NoopNetworkPlugin struct{}

// Init does nothing.
func (*NoopNetworkPlugin) Init(Host, HairpinMode, string, int) error { return nil }

// Event ignores every event.
func (*NoopNetworkPlugin) Event(string, map[string]interface{}) {}

// Name is DefaultPluginName.
func (*NoopNetworkPlugin) Name() string { return DefaultPluginName }

// Capabilities is empty.
func (*NoopNetworkPlugin) Capabilities() Capabilities { return Capabilities{} }

// SetUpPod does nothing.
func (*NoopNetworkPlugin) SetUpPod(string, string, ContainerID, map[string]string, map[string]string) error {
	return nil
}

// TearDownPod does nothing.
func (*NoopNetworkPlugin) TearDownPod(string, string, ContainerID) error { return nil }

// GetPodNetworkStatus knows nothing.
func (*NoopNetworkPlugin) GetPodNetworkStatus(string, string, ContainerID) (*PodNetworkStatus, error) {
	return nil, nil
}

// Status is always ready.
func (*NoopNetworkPlugin) Status() error { return nil }
