package core

import (
	"encoding/json"
	"path/filepath"

	"github.com/kubenet-dev/kubenet/ipam"
)

// ParseCheckConfig decodes and validates stdin for CHECK. CHECK compares the node with what ADD
// recorded, so it checks the network configuration as ADD does but does not look at the
// capability arguments a pod author controls (host ports, bandwidth, annotations): they are
// dropped, whatever they hold. The runtime's ipRanges (the node's pod CIDR) are the network's
// configuration and are checked.
func ParseCheckConfig(stdin []byte) (*Config, error) {
	nc, err := decodeNetConf(stdin, func(raw []byte) (RuntimeConfig, error) {
		var rc struct {
			IPRanges [][]IPRange `json:"ipRanges"`
		}
		err := decodeKey("runtimeConfig", raw, &rc)
		return RuntimeConfig{IPRanges: rc.IPRanges}, err
	})
	if err != nil {
		return nil, err
	}
	return nc.Validate()
}

// ParseTeardownConfig decodes stdin for DEL and GC, which must always be able to finish: DEL
// works from what ADD recorded and from names derived from the attachment's key, GC from the
// records. So only what locates the state must be valid, the network name and the data dir
// (code 7 otherwise). Everything else is at most a hint, taken where valid and ignored where
// not: the runtime's port mappings (more keys to look for), the pod CIDRs (the families of those
// keys). A pod author's bad annotation or hostPort, or a broken prevResult (not read at all),
// cannot make a teardown fail.
func ParseTeardownConfig(stdin []byte) (*Config, error) {
	var conf struct {
		CNIVersion    string          `json:"cniVersion"`
		Name          string          `json:"name"`
		DataDir       json.RawMessage `json:"dataDir"`
		Bridge        json.RawMessage `json:"bridge"`
		PodCIDRs      json.RawMessage `json:"podCIDRs"`
		RuntimeConfig json.RawMessage `json:"runtimeConfig"`
	}
	if err := decode(stdin, &conf); err != nil {
		return nil, err
	}
	c := &Config{Network: conf.Name, CNIVersion: conf.CNIVersion, Bridge: DefaultBridge, DataDir: DefaultDataDir}
	if err := validNetworkName(c.Network); err != nil {
		return nil, err
	}
	if len(conf.DataDir) > 0 && string(conf.DataDir) != "null" {
		if err := decode(conf.DataDir, &c.DataDir); err != nil {
			return nil, configError("dataDir", string(conf.DataDir), "must be a string")
		}
		if c.DataDir == "" {
			c.DataDir = DefaultDataDir
		}
	}
	if !filepath.IsAbs(c.DataDir) {
		return nil, configError("dataDir", c.DataDir, "must be an absolute path")
	}
	var bridgeName string
	if json.Unmarshal(conf.Bridge, &bridgeName) == nil && validBridgeName(bridgeName) == nil {
		c.Bridge = bridgeName
	}
	var rc struct {
		PortMappings []json.RawMessage `json:"portMappings"`
		IPRanges     [][]IPRange       `json:"ipRanges"`
	}
	_ = json.Unmarshal(conf.RuntimeConfig, &rc)
	for _, raw := range rc.PortMappings {
		var pm PortMapping
		if json.Unmarshal(raw, &pm) == nil {
			c.Runtime.PortMappings = append(c.Runtime.PortMappings, pm)
		}
	}
	c.Runtime.PortMappings = validPortMappings(c.Runtime.PortMappings)
	c.Ranges = hintRanges(conf.PodCIDRs, rc.IPRanges)
	return c, nil
}

// hintRanges returns one range set per family from the runtime's ipRanges when they are valid,
// else from the valid entries of podCIDRs, else none.
func hintRanges(podCIDRs json.RawMessage, ipRanges [][]IPRange) []ipam.RangeSet {
	var sets []ipam.RangeSet
	for _, rs := range ipRanges {
		set, err := rangeSetFromIPRanges(rs)
		if err != nil {
			sets = nil
			break
		}
		sets = append(sets, set)
	}
	if len(sets) == 0 {
		var cidrs []json.RawMessage
		_ = json.Unmarshal(podCIDRs, &cidrs)
		for _, raw := range cidrs {
			var s string
			if json.Unmarshal(raw, &s) != nil {
				continue
			}
			if p, err := parsePodCIDR(s); err == nil {
				if r, err := ipam.NewRange(p); err == nil {
					sets = append(sets, ipam.RangeSet{r})
				}
			}
		}
	}
	var out []ipam.RangeSet
	var v4, v6 bool
	for _, set := range sets {
		is6 := set[0].Subnet.Addr().Is6()
		if (is6 && v6) || (!is6 && v4) {
			continue
		}
		v4, v6 = v4 || !is6, v6 || is6
		out = append(out, set)
	}
	return out
}
