package core

import (
	"fmt"
	"slices"
	"strings"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/kubenet-dev/kubenet/internal/safedir"
)

// NodeSettings are the settings of a network that every pod of the node shares: applying other
// values rewrites the node for all of them.
type NodeSettings struct {
	Owner              string   `json:"owner"`
	Bridge             string   `json:"bridge"`
	PodCIDRs           []string `json:"podCIDRs"`
	NonMasqueradeCIDRs []string `json:"nonMasqueradeCIDRs"`
	MTU                int      `json:"mtu"` // as configured: 0 detects
	HairpinMode        string   `json:"hairpinMode"`
	// AntiSpoofing is "on" or "off"; "" (a file written before kubenet had the key) reads as
	// the default, "on".
	AntiSpoofing string `json:"antiSpoofing,omitempty"`
	// NetfilterBackend is the netfilterBackend key; "" (a file written before kubenet had the
	// key) reads as the default, auto.
	NetfilterBackend string `json:"netfilterBackend,omitempty"`
}

// nodeSettings are cfg's node-wide settings in canonical form.
func (c *Config) nodeSettings() NodeSettings {
	s := NodeSettings{Owner: c.Owner, Bridge: c.Bridge, MTU: c.MTU, HairpinMode: string(c.Hairpin), AntiSpoofing: "off", NetfilterBackend: string(c.Netfilter)}
	if c.AntiSpoofing {
		s.AntiSpoofing = "on"
	}
	for _, p := range c.PodCIDRs() {
		s.PodCIDRs = append(s.PodCIDRs, p.String())
	}
	for _, p := range c.NonMasqueradeCIDRs {
		s.NonMasqueradeCIDRs = append(s.NonMasqueradeCIDRs, p.Masked().String())
	}
	slices.Sort(s.NonMasqueradeCIDRs)
	s.NonMasqueradeCIDRs = slices.Compact(s.NonMasqueradeCIDRs)
	return s
}

// differences lists the settings in which s and o differ, "key: s's value (where), o's (here)".
func (s NodeSettings) differences(o NodeSettings) []string {
	var out []string
	diff := func(key string, a, b any) {
		if fmt.Sprint(a) != fmt.Sprint(b) {
			out = append(out, fmt.Sprintf("%s %v on the node, %v here", key, a, b))
		}
	}
	diff("bridge", s.Bridge, o.Bridge)
	diff("podCIDRs", s.PodCIDRs, o.PodCIDRs)
	diff("nonMasqueradeCIDRs", s.NonMasqueradeCIDRs, o.NonMasqueradeCIDRs)
	diff("mtu", s.MTU, o.MTU)
	diff("hairpinMode", s.HairpinMode, o.HairpinMode)
	orOn := func(v string) string {
		if v == "" {
			return "on"
		}
		return v
	}
	diff("antiSpoofing", orOn(s.AntiSpoofing), orOn(o.AntiSpoofing))
	orAuto := func(v string) string {
		if v == "" {
			return string(NetfilterAuto)
		}
		return v
	}
	diff("netfilterBackend", orAuto(s.NetfilterBackend), orAuto(o.NetfilterBackend))
	return out
}

func readNodeSettings(root *safedir.Dir) (*NodeSettings, error) {
	var s NodeSettings
	found, err := readNodeFile(root, NodeSettingsFile, &s)
	if err != nil || !found || s.Owner == "" {
		return nil, err
	}
	return &s, nil
}

// claimNodeSettings makes sure that cfg may apply its node-wide settings, before ADD or EnsureNode
// touches node-wide state. Node-wide settings have one owner: the first caller records its
// settings; a caller with the same settings proceeds, whoever owns them; the owner may change
// its own settings (a new pod CIDR); a different caller with different settings gets
// ErrNodeOwned naming every difference, unless it takes the node over (cfg.TakeOverNode), which
// makes it the owner. Without this, two faces with different defaults (a conflist with both
// families, kubenetctl with one) would rewrite each other's bridge and SNAT rules pod by pod.
//
// It tells whether it wrote the settings: they changed (or the node had none), so node-wide
// state that only a change of them can leave behind (the dedup rules of a hairpin mode left) is
// worth looking for.
func claimNodeSettings(cfg *Config, dir *networkDir) (changed bool, err error) {
	want := cfg.nodeSettings()
	have, err := readNodeSettings(dir.root())
	if err != nil {
		return false, err
	}
	if have != nil && len(have.differences(want)) == 0 {
		return false, nil
	}
	var refusal *types.Error // returned as it is, so that the binary reports its code
	err = dir.withLock(func() error {
		have, err := readNodeSettings(dir.root())
		if err != nil {
			return err
		}
		if have != nil {
			diffs := have.differences(want)
			if len(diffs) == 0 {
				return nil
			}
			if have.Owner != want.Owner && !cfg.TakeOverNode {
				refusal = types.NewError(ErrNodeOwned, fmt.Sprintf(
					"network %q: the node-wide settings belong to %s and differ: %s; use the node's settings, or take the node over explicitly (kubenetctl --take-over-node)",
					cfg.Network, describeOwner(have.Owner), strings.Join(diffs, "; ")), "")
				return nil
			}
		}
		changed = true
		return writeNodeFile(dir.root(), NodeSettingsFile, want)
	})
	if err != nil {
		return false, fmt.Errorf("node settings: %w", err)
	}
	if refusal != nil {
		return false, refusal
	}
	return changed, nil
}

func describeOwner(owner string) string {
	if owner == OwnerCNI {
		return "the CNI configuration (cni)"
	}
	return fmt.Sprintf("%q", owner)
}
