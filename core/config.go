package core

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/kubenet-dev/kubenet/hairpin"
	"github.com/kubenet-dev/kubenet/ipam"
)

// Defaults of the configuration keys (README documents each).
const (
	DefaultBridge  = "cbr0"
	DefaultDataDir = "/var/lib/cni/networks"
)

// NetConf is the plugin's configuration as it arrives on stdin. Key names are fixed: operators'
// conflists and scripts rely on them.
type NetConf struct {
	types.PluginConf
	Bridge             string        `json:"bridge,omitempty"`
	PodCIDRs           []string      `json:"podCIDRs,omitempty"`
	NonMasqueradeCIDRs []string      `json:"nonMasqueradeCIDRs,omitempty"`
	MTU                int           `json:"mtu,omitempty"`
	HairpinMode        string        `json:"hairpinMode,omitempty"`
	DataDir            string        `json:"dataDir,omitempty"`
	LogFile            string        `json:"logFile,omitempty"`
	LogMaxBytes        int64         `json:"logMaxBytes,omitempty"`
	AntiSpoofing       *bool         `json:"antiSpoofing,omitempty"` // nil: on
	RuntimeConfig      RuntimeConfig `json:"runtimeConfig,omitempty"`
}

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

// Config is a validated NetConf.
type Config struct {
	Network    string
	CNIVersion string
	Bridge     string
	// Ranges holds one range set per family; the first range of each set is that family's pod
	// CIDR and carries the gateway.
	Ranges             []ipam.RangeSet
	NonMasqueradeCIDRs []netip.Prefix
	MTU                int // 0: detect at ADD time
	Hairpin            hairpin.Mode
	DataDir            string
	AntiSpoofing       bool // pods may send only from their own MAC and addresses
	Runtime            RuntimeConfig
	PrevResult         *current.Result
	Log                LogSettings
	// Owner names who applies the node-wide settings (OwnerCNI for a CNI configuration; the
	// in-process plugin sets its own). TakeOverNode lets it replace another owner's different
	// settings instead of failing (see claimNode).
	Owner        string
	TakeOverNode bool
}

// PodCIDRs returns the pod CIDR of each family, IPv4 first when both exist.
func (c *Config) PodCIDRs() []netip.Prefix {
	out := make([]netip.Prefix, 0, len(c.Ranges))
	for _, set := range c.Ranges {
		out = append(out, set[0].Subnet)
	}
	return out
}

// Gateways returns each pod CIDR's gateway with the CIDR's prefix length (the bridge addresses).
func (c *Config) Gateways() []netip.Prefix {
	out := make([]netip.Prefix, 0, len(c.Ranges))
	for _, set := range c.Ranges {
		out = append(out, netip.PrefixFrom(set[0].Gateway, set[0].Subnet.Bits()))
	}
	return out
}

// ParseConfig decodes and validates stdin. Malformed JSON gives CNI code 6, a bad value code 7
// naming the key and the value.
func ParseConfig(stdin []byte) (*Config, error) {
	var nc NetConf
	if err := json.Unmarshal(stdin, &nc); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return nil, types.NewError(types.ErrInvalidNetworkConfig,
				fmt.Sprintf("invalid %s: expected %s, got JSON %s", te.Field, te.Type, te.Value), "")
		}
		return nil, types.NewError(types.ErrDecodingFailure, fmt.Sprintf("decode network configuration: %v", err), "")
	}
	return nc.Validate()
}

// Validate checks a NetConf built in code (the in-process NetworkPlugin does) exactly as
// ParseConfig checks stdin, and returns the validated Config.
func (nc *NetConf) Validate() (*Config, error) {
	c := &Config{
		Network:    nc.Name,
		CNIVersion: nc.CNIVersion,
		Bridge:     nc.Bridge,
		MTU:        nc.MTU,
		DataDir:    nc.DataDir,
		Runtime:    nc.RuntimeConfig,
		Owner:      OwnerCNI,
		// On unless turned off: every pod is a possible attacker.
		AntiSpoofing: nc.AntiSpoofing == nil || *nc.AntiSpoofing,
	}
	if c.Network == "" {
		return nil, configError("name", "", "the network needs a name")
	}
	if c.Bridge == "" {
		c.Bridge = DefaultBridge
	}
	if err := validIfName(c.Bridge); err != nil {
		return nil, configError("bridge", c.Bridge, "%v", err)
	}
	if c.DataDir == "" {
		c.DataDir = DefaultDataDir
	}
	if !filepath.IsAbs(c.DataDir) {
		return nil, configError("dataDir", c.DataDir, "must be an absolute path")
	}
	mode, err := hairpin.Parse(nc.HairpinMode)
	if err != nil {
		return nil, configError("hairpinMode", nc.HairpinMode, "valid values are %q, %q and %q", hairpin.HairpinVeth, hairpin.PromiscuousBridge, hairpin.None)
	}
	c.Hairpin = mode
	if c.MTU != 0 && (c.MTU < 576 || c.MTU > 65535) {
		return nil, configError("mtu", c.MTU, "must be 0 (detect) or between 576 and 65535")
	}
	if c.Ranges, err = nc.ranges(); err != nil {
		return nil, err
	}
	if c.MTU != 0 && c.MTU < 1280 && c.hasIPv6() {
		return nil, configError("mtu", c.MTU, "IPv6 needs at least 1280")
	}
	for _, s := range nc.NonMasqueradeCIDRs {
		p, err := parseCIDR(s)
		if err != nil {
			return nil, configError("nonMasqueradeCIDRs", s, "%v", err)
		}
		c.NonMasqueradeCIDRs = append(c.NonMasqueradeCIDRs, p)
	}
	if c.Log, err = nc.logSettings(); err != nil {
		return nil, err
	}
	if err := validateRuntime(&c.Runtime); err != nil {
		return nil, err
	}
	if err := validateBandwidth(&c.Runtime); err != nil {
		return nil, err
	}
	if nc.RawPrevResult != nil {
		if err := version.ParsePrevResult(&nc.PluginConf); err != nil {
			return nil, types.NewError(types.ErrDecodingFailure, fmt.Sprintf("decode prevResult: %v", err), "")
		}
		prev, err := current.NewResultFromResult(nc.PrevResult)
		if err != nil {
			return nil, types.NewError(types.ErrDecodingFailure, fmt.Sprintf("convert prevResult: %v", err), "")
		}
		c.PrevResult = prev
	}
	return c, nil
}

func (c *Config) hasIPv6() bool {
	for _, p := range c.PodCIDRs() {
		if p.Addr().Is6() {
			return true
		}
	}
	return false
}

// ranges builds one range set per family from the ipRanges capability when the runtime sent it
// (the runtime knows the node's CIDR better than a static file), else from podCIDRs.
func (nc *NetConf) ranges() ([]ipam.RangeSet, error) {
	key := "podCIDRs"
	var sets []ipam.RangeSet
	if len(nc.RuntimeConfig.IPRanges) > 0 {
		key = "runtimeConfig.ipRanges"
		for _, rs := range nc.RuntimeConfig.IPRanges {
			set, err := rangeSetFromIPRanges(rs)
			if err != nil {
				return nil, err
			}
			sets = append(sets, set)
		}
	} else {
		for _, s := range nc.PodCIDRs {
			p, err := parseCIDR(s)
			if err != nil {
				return nil, configError("podCIDRs", s, "%v", err)
			}
			r, err := ipam.NewRange(p)
			if err != nil {
				return nil, configError("podCIDRs", s, "%v", err)
			}
			sets = append(sets, ipam.RangeSet{r})
		}
	}
	if len(sets) == 0 {
		return nil, configError("podCIDRs", "[]", "the node has no pod CIDR: set podCIDRs or let the runtime pass ipRanges")
	}
	if len(sets) > 2 || (len(sets) == 2 && sets[0][0].Subnet.Addr().Is4() == sets[1][0].Subnet.Addr().Is4()) {
		return nil, configError(key, cidrList(sets), "give one IPv4 CIDR, one IPv6 CIDR, or one of each")
	}
	if len(sets) == 2 && sets[0][0].Subnet.Addr().Is6() {
		sets[0], sets[1] = sets[1], sets[0] // IPv4 first, as kubelet orders pod IPs
	}
	return sets, nil
}

func rangeSetFromIPRanges(rs []IPRange) (ipam.RangeSet, error) {
	const key = "runtimeConfig.ipRanges"
	var set ipam.RangeSet
	for _, ir := range rs {
		p, err := parseCIDR(ir.Subnet)
		if err != nil {
			return nil, configError(key+" subnet", ir.Subnet, "%v", err)
		}
		r, err := ipam.NewRange(p)
		if err != nil {
			return nil, configError(key+" subnet", ir.Subnet, "%v", err)
		}
		for _, f := range []struct {
			name, value string
			dst         *netip.Addr
		}{{"rangeStart", ir.RangeStart, &r.Start}, {"rangeEnd", ir.RangeEnd, &r.End}, {"gateway", ir.Gateway, &r.Gateway}} {
			if f.value == "" {
				continue
			}
			a, err := netip.ParseAddr(f.value)
			if err != nil || !p.Contains(a) {
				return nil, configError(key+" "+f.name, f.value, "must be an address inside %s", p)
			}
			*f.dst = a
		}
		if r.End.Less(r.Start) {
			return nil, configError(key+" rangeEnd", ir.RangeEnd, "is before rangeStart %s", r.Start)
		}
		if len(set) > 0 && set[0].Subnet.Addr().Is4() != p.Addr().Is4() {
			return nil, configError(key+" subnet", ir.Subnet, "mixes address families in one range set")
		}
		set = append(set, r)
	}
	if len(set) == 0 {
		return nil, configError(key, "[]", "a range set needs at least one range")
	}
	return set, nil
}

func cidrList(sets []ipam.RangeSet) string {
	var s []string
	for _, set := range sets {
		s = append(s, set[0].Subnet.String())
	}
	return "[" + strings.Join(s, " ") + "]"
}

// parseCIDR accepts only a network address: "10.244.1.5/24" is a typo for a node's pod CIDR that
// host-local would turn into "network has host bits set" at the first pod (kubernetes#84541).
func parseCIDR(s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(strings.TrimSpace(s))
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("not a CIDR")
	}
	if p.Masked() != p {
		return netip.Prefix{}, fmt.Errorf("has host bits set (did you mean %s?)", p.Masked())
	}
	return p, nil
}

// validIfName applies the kernel's rules for interface names.
func validIfName(name string) error {
	if len(name) > 15 {
		return fmt.Errorf("longer than 15 bytes")
	}
	if name == "." || name == ".." || strings.ContainsAny(name, "/: \t\n") {
		return fmt.Errorf("not a valid interface name")
	}
	return nil
}
