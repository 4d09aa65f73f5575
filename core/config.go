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
	"github.com/containernetworking/cni/pkg/utils"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/kubenet-dev/kubenet/hairpin"
	"github.com/kubenet-dev/kubenet/internal/ipnet"
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
	Keys
	RuntimeConfig RuntimeConfig `json:"runtimeConfig,omitempty"`
}

// Keys are kubenet's own keys of the configuration.
type Keys struct {
	Bridge             string   `json:"bridge,omitempty"`
	PodCIDRs           []string `json:"podCIDRs,omitempty"`
	NonMasqueradeCIDRs []string `json:"nonMasqueradeCIDRs,omitempty"`
	MTU                int      `json:"mtu,omitempty"`
	HairpinMode        string   `json:"hairpinMode,omitempty"`
	DataDir            string   `json:"dataDir,omitempty"`
	LogFile            string   `json:"logFile,omitempty"`
	LogMaxBytes        int64    `json:"logMaxBytes,omitempty"`
	NetworkPolicy      bool     `json:"networkPolicy,omitempty"` // kubenet-agent enforces policies: ADD holds new pods (docs/networkpolicy.md)
	AntiSpoofing       *bool    `json:"antiSpoofing,omitempty"`  // nil: on
	NetfilterBackend   string   `json:"netfilterBackend,omitempty"`
}

// OwnerCNI is the owner of node-wide settings that come from a CNI configuration (the CNI
// binary, run by a runtime with a conflist). ParseConfig sets it.
const OwnerCNI = "cni"

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
	NetworkPolicy      bool
	AntiSpoofing       bool // pods may send only from their own MAC and addresses
	// Netfilter is the netfilterBackend key: where the rules go (backend.go resolves auto).
	Netfilter  NetfilterBackend
	Runtime    RuntimeConfig
	PrevResult *current.Result
	Log        LogSettings
	// Owner names who applies the node-wide settings (OwnerCNI for a CNI configuration; the
	// in-process plugin sets its own). TakeOverNode lets it replace another owner's different
	// settings instead of failing (see claimNodeSettings).
	Owner        string
	TakeOverNode bool
	// fromIPRanges: the ranges came from the runtime's ipRanges, not from podCIDRs.
	fromIPRanges bool
	// ToolRoot is where the iptables backend finds iptables, ip6tables and ebtables: "" is the
	// process's own PATH (the CNI binary runs on the node); kubenet-agent, in its container,
	// sets the node's root file system, mounted into it, and runs the node's tools chrooted.
	// Not a configuration key: it says where the caller runs.
	ToolRoot string
}

// rangesKey is the configuration key the pod CIDRs came from, for messages.
func (c *Config) rangesKey() string {
	if c.fromIPRanges {
		return "runtimeConfig.ipRanges"
	}
	return "podCIDRs"
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
	nc, err := decodeNetConf(stdin, decodeRuntimeConfig)
	if err != nil {
		return nil, err
	}
	return nc.Validate()
}

// wireConf is NetConf as it is read from stdin, with the parts that only some calls carry (the
// capability arguments, a prevResult) kept raw. encoding/json builds its tables for a type's
// whole tree the first time it meets the type, and for NetConf's (with types.PluginConf's ipam,
// dns, prevResult and GC list) that cost a fresh process 0.15 ms, a sixth of what a STATUS does
// of its own. The raw parts are decoded only when present; ipam, dns, args and capabilities,
// which kubenet does not read, are not decoded at all.
type wireConf struct {
	CNIVersion string `json:"cniVersion"`
	Name       string `json:"name"`
	Type       string `json:"type"`
	Keys
	PrevResult    json.RawMessage `json:"prevResult"`
	RuntimeConfig json.RawMessage `json:"runtimeConfig"`
}

// decodeNetConf decodes stdin as NetConf, the runtimeConfig key (when present) with runtime.
func decodeNetConf(stdin []byte, runtime func(raw []byte) (RuntimeConfig, error)) (*NetConf, error) {
	var w wireConf
	if err := decode(stdin, &w); err != nil {
		return nil, err
	}
	nc := &NetConf{PluginConf: types.PluginConf{CNIVersion: w.CNIVersion, Name: w.Name, Type: w.Type}, Keys: w.Keys}
	if present(w.PrevResult) {
		if err := decodeKey("prevResult", w.PrevResult, &nc.RawPrevResult); err != nil {
			return nil, err
		}
	}
	if present(w.RuntimeConfig) {
		rc, err := runtime(w.RuntimeConfig)
		if err != nil {
			return nil, err
		}
		nc.RuntimeConfig = rc
	}
	return nc, nil
}

// decodeRuntimeConfig decodes every capability argument kubenet takes.
func decodeRuntimeConfig(raw []byte) (RuntimeConfig, error) {
	var rc RuntimeConfig
	err := decodeKey("runtimeConfig", raw, &rc)
	return rc, err
}

// present tells whether a raw key was given a value other than null.
func present(raw json.RawMessage) bool {
	return len(raw) > 0 && string(raw) != "null"
}

// decodeKey is decode for the value of one key of stdin: a value of the wrong type is named by
// its path from the top (key.field), as when the whole configuration is decoded at once.
func decodeKey(key string, raw []byte, v any) error {
	err := json.Unmarshal(raw, v)
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		if te.Field == "" {
			te.Field = key
		} else {
			te.Field = key + "." + te.Field
		}
	}
	return decodeError(err)
}

// decode unmarshals stdin into v: malformed JSON gives code 6, a value of the wrong type code 7
// naming the key.
func decode(stdin []byte, v any) error {
	return decodeError(json.Unmarshal(stdin, v))
}

// decodeError turns an error of encoding/json into decode's CNI error.
func decodeError(err error) error {
	if err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return types.NewError(types.ErrInvalidNetworkConfig,
				fmt.Sprintf("invalid %s: expected %s, got JSON %s", te.Field, te.Type, te.Value), "")
		}
		return types.NewError(types.ErrDecodingFailure, fmt.Sprintf("decode network configuration: %v", err), "")
	}
	return nil
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
	c.NetworkPolicy = nc.NetworkPolicy
	if err := validNetworkName(c.Network); err != nil {
		return nil, err
	}
	if c.Bridge == "" {
		c.Bridge = DefaultBridge
	}
	if err := validBridgeName(c.Bridge); err != nil {
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
	if c.Netfilter, err = parseNetfilterBackend(nc.NetfilterBackend); err != nil {
		return nil, err
	}
	if c.MTU != 0 && (c.MTU < 576 || c.MTU > 65535) {
		return nil, configError("mtu", c.MTU, "must be 0 (detect) or between 576 and 65535")
	}
	if c.Ranges, err = nc.ranges(); err != nil {
		return nil, err
	}
	c.fromIPRanges = len(nc.RuntimeConfig.IPRanges) > 0
	if c.MTU != 0 && c.MTU < 1280 && c.hasIPv6() {
		return nil, configError("mtu", c.MTU, "IPv6 needs at least 1280")
	}
	for _, s := range nc.NonMasqueradeCIDRs {
		p, err := parseCIDR(s)
		if err == nil {
			err = sensibleNonMasquerade(p)
		}
		if err != nil {
			return nil, configError("nonMasqueradeCIDRs", s, "%v", err)
		}
		c.NonMasqueradeCIDRs = append(c.NonMasqueradeCIDRs, p)
	}
	if c.Log, err = newLogSettings(nc.LogFile, nc.LogMaxBytes); err != nil {
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
			p, err := parsePodCIDR(s)
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
		p, err := parsePodCIDR(ir.Subnet)
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

// MaxNetworkNameLen bounds the network name: it becomes a directory name and, prefixed, the
// name of nftables tables and part of the bridge's alias.
const MaxNetworkNameLen = 128

// validNetworkName applies CNI's rule for network names (letters, digits and "_.-", not starting
// with a symbol) that skel applies to the binary's input, for the in-process NetworkPlugin too.
func validNetworkName(name string) error {
	if name == "" {
		return configError("name", "", "the network needs a name")
	}
	if err := utils.ValidateNetworkName(name); err != nil {
		return configError("name", name, "%s", strings.TrimSuffix(err.Msg, ":"))
	}
	if len(name) > MaxNetworkNameLen {
		return configError("name", name, "longer than %d bytes", MaxNetworkNameLen)
	}
	return nil
}

// validBridgeName applies the kernel's rules for interface names and refuses the names the
// kernel treats specially: "lo"; "all" and "default", which are the sysctl directories for every
// interface (kubenet writes sysctls under the bridge's name: route_localnet on "all" would open
// the node's 127.0.0.0/8 on every link); "bonding_masters" (a file in /sys/class/net); names
// with "%" (the kernel numbers them, e.g. "br%d" becomes "br0"); and names of kubenet's own host
// veths and ifbs, which a DEL would delete.
func validBridgeName(name string) error {
	if err := utils.ValidateInterfaceName(name); err != nil {
		return errors.New(err.Msg)
	}
	for _, b := range []byte(name) {
		if b <= ' ' || b > '~' {
			return fmt.Errorf("contains the byte %#x: use printable ASCII", b)
		}
	}
	switch {
	case name == "lo":
		return errors.New("is the loopback interface")
	case name == "all" || name == "default":
		return errors.New("names the sysctl settings of every interface")
	case name == "bonding_masters":
		return errors.New("is a reserved name in /sys/class/net")
	case strings.Contains(name, "%"):
		return errors.New("is a name template the kernel would number")
	case isAttachmentLinkName(name):
		return errors.New("has the form of kubenet's own host veth and ifb names")
	}
	return nil
}

// parsePodCIDR is parseCIDR for a pod network: it must not overlap a special range.
func parsePodCIDR(s string) (netip.Prefix, error) {
	p, err := parseCIDR(s)
	if err != nil {
		return p, err
	}
	if r, ok := ipnet.OverlappingSpecial(p); ok {
		return netip.Prefix{}, fmt.Errorf("overlaps %s, which is %s", r.Prefix, r.What)
	}
	return p, nil
}

// sensibleNonMasquerade refuses a non-masquerade CIDR that can never match a pod's destination:
// one inside the loopback, multicast, unspecified or IPv4-embedding ranges. Wider ones (0.0.0.0/0
// turns masquerading off) and link-local ones (a cloud's metadata service) are fine.
func sensibleNonMasquerade(p netip.Prefix) error {
	for _, r := range ipnet.SpecialRanges() {
		if r.PodDestination || r.Prefix.Bits() > p.Bits() || !r.Prefix.Contains(p.Addr()) {
			continue
		}
		return fmt.Errorf("lies in %s, which is %s: no pod traffic goes there", r.Prefix, r.What)
	}
	return nil
}
