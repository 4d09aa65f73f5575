// Package cnidir makes the files the agent owns in the node's CNI directories: the kubenet
// conflist, rendered from the Node's pod CIDRs and the agent's settings, in the conf dir, and the
// kubenet binary in the bin dir. Both are replaced atomically and only when their content
// differs, so a runtime watching the directories never reads a partial file and a restart of
// the agent writes nothing.
package cnidir

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/kubenet-dev/kubenet/core"
	"github.com/kubenet-dev/kubenet/internal/atomicfile"
)

// Defaults of Options.
const (
	DefaultName = "kubenet"
	// DefaultCNIVersion is what runtimes without cniVersions support read (containerd 1.6 and
	// podman 4 accept at most 1.0.0); CNIVersions lets newer libcni pick 1.1.0 for GC and STATUS.
	DefaultCNIVersion = "1.0.0"
	DefaultFileName   = "10-kubenet.conflist"
)

// cniVersions is the conflist's cniVersions list: libcni 1.2 and later use the highest version
// it knows, older clients use cniVersion.
var cniVersions = []string{"1.0.0", "1.1.0"}

// Options is what the agent knows about the node's network. Zero values take the plugin's
// defaults (the keys are then left out of the file).
type Options struct {
	Name               string         // network name, default DefaultName
	CNIVersion         string         // default DefaultCNIVersion
	PodCIDRs           []netip.Prefix // the Node's spec.podCIDRs; required
	NonMasqueradeCIDRs []netip.Prefix // the cluster CIDR(s)
	MTU                int            // 0: the plugin detects it
	HairpinMode        string         // kubelet's --hairpin-mode values
	Bridge             string
	DataDir            string
	// NetworkPolicy tells the plugin that the agent enforces NetworkPolicy: ADD holds a new
	// pod's addresses until the agent has installed its policies.
	NetworkPolicy bool
	// NetfilterBackend is the plugin's netfilterBackend key ("": left out, auto).
	NetfilterBackend string
}

// pluginConf is the plugin entry of the conflist: kubenet's keys (README) and the capabilities
// the runtime reads. Render runs the plugin's parser over it, so a misspelt key that loses the
// pod CIDRs fails here and not at the node's first pod.
type pluginConf struct {
	Type               string          `json:"type"`
	Bridge             string          `json:"bridge,omitempty"`
	PodCIDRs           []string        `json:"podCIDRs"`
	NonMasqueradeCIDRs []string        `json:"nonMasqueradeCIDRs,omitempty"`
	MTU                int             `json:"mtu,omitempty"`
	HairpinMode        string          `json:"hairpinMode,omitempty"`
	DataDir            string          `json:"dataDir,omitempty"`
	NetworkPolicy      bool            `json:"networkPolicy,omitempty"`
	NetfilterBackend   string          `json:"netfilterBackend,omitempty"`
	Capabilities       map[string]bool `json:"capabilities"`
}

type confList struct {
	CNIVersion  string       `json:"cniVersion"`
	CNIVersions []string     `json:"cniVersions"`
	Name        string       `json:"name"`
	Plugins     []pluginConf `json:"plugins"`
}

// Render returns the conflist for o, indented for operators who read it on the node. It is
// validated by the plugin's own parser first: a file the plugin would refuse at every ADD is
// never written, the error names the key instead.
func Render(o Options) ([]byte, error) {
	list, _, err := build(o)
	if err != nil {
		return nil, err
	}
	out, err := json.MarshalIndent(list, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("render conflist: %w", err)
	}
	return append(out, '\n'), nil
}

// NetworkConfig returns the plugin's configuration as the runtime passes it with the conflist
// for o: what the plugin itself works with, for the agent's own calls into the core.
func NetworkConfig(o Options) (*core.Config, error) {
	_, cfg, err := build(o)
	return cfg, err
}

// build assembles the conflist for o and runs the plugin's parser over its plugin entry.
func build(o Options) (confList, *core.Config, error) {
	if len(o.PodCIDRs) == 0 {
		return confList{}, nil, fmt.Errorf("render conflist: the node has no pod CIDR")
	}
	if o.Name == "" {
		o.Name = DefaultName
	}
	if o.CNIVersion == "" {
		o.CNIVersion = DefaultCNIVersion
	}
	p := pluginConf{
		Type:               "kubenet",
		Bridge:             o.Bridge,
		PodCIDRs:           cidrStrings(o.PodCIDRs),
		NonMasqueradeCIDRs: cidrStrings(o.NonMasqueradeCIDRs),
		MTU:                o.MTU,
		HairpinMode:        o.HairpinMode,
		DataDir:            o.DataDir,
		NetworkPolicy:      o.NetworkPolicy,
		NetfilterBackend:   o.NetfilterBackend,
		Capabilities: map[string]bool{
			"portMappings": true, "bandwidth": true, "ipRanges": true, "io.kubernetes.cri.pod-annotations": true,
		},
	}
	cfg, err := validate(o, p)
	if err != nil {
		return confList{}, nil, err
	}
	return confList{CNIVersion: o.CNIVersion, CNIVersions: cniVersions, Name: o.Name, Plugins: []pluginConf{p}}, cfg, nil
}

// validate runs the plugin's parser over the plugin entry as a runtime would pass it.
func validate(o Options, p pluginConf) (*core.Config, error) {
	raw, err := json.Marshal(struct {
		pluginConf
		CNIVersion string `json:"cniVersion"`
		Name       string `json:"name"`
	}{p, o.CNIVersion, o.Name})
	if err != nil {
		return nil, fmt.Errorf("render conflist: %w", err)
	}
	cfg, err := core.ParseConfig(raw)
	if err != nil {
		return nil, fmt.Errorf("render conflist: the plugin would refuse it: %w", err)
	}
	return cfg, nil
}

func cidrStrings(ps []netip.Prefix) []string {
	out := make([]string, 0, len(ps))
	for _, p := range ps {
		out = append(out, p.String())
	}
	return out
}

// WriteFile puts data at path unless the file already holds exactly data, and reports whether
// it wrote. atomicfile names its temporary file so that libcni, which only reads *.conf,
// *.conflist and *.json, ignores it: a runtime reading the conf dir sees the old file or the new
// one, never a part.
func WriteFile(path string, data []byte, mode os.FileMode) (bool, error) {
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data) {
		return false, nil
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return false, fmt.Errorf("write %s: %w", path, err)
	}
	if err := atomicfile.Write(path, data, mode); err != nil {
		return false, err
	}
	// The rename is durable only once the directory is synced; a node that loses power right
	// after must not come back without a conflist it had reported as written.
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return true, nil
}
