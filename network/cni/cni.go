// Package cni is the generic CNI NetworkPlugin (--network-plugin=cni), like kubelet's
// cniNetworkPlugin: it runs the first valid network configuration of a conf dir through libcni,
// for any CNI plugin (this module's cmd/kubenet or the reference bridge, host-local, portmap...).
//
// Behaviour, with the differences from kubelet on purpose:
//   - the conf dir is re-read whenever its listing (names, sizes, modification times) changed,
//     checked at every call, so a new or edited conflist is picked up without a restart and
//     without a background goroutine; while no valid network was found it is re-read at every
//     call, so plugins installed later are found too. When no file is valid any more, Status fails
//     and SetUpPod refuses, but TearDownPod still works: it deletes with the configuration each
//     attachment was added with, from libcni's cache.
//   - loopback: the `loopback` plugin as its own network (cni-loopback, ifname lo) when it is in a
//     bin dir, which also gives it a libcni cache entry that TearDownPod removes (kubernetes#81828);
//     without it, lo is set up over netlink inside the pod's netns, and teardown has nothing to do.
//   - ipRanges: one range set per pod CIDR of the pod-cidr-change event (kubelet sent the
//     comma-joined dual-stack string as a single subnet). A later, different CIDR replaces it for
//     new pods.
//   - the pod's addresses are read over netlink in its netns (kubelet exec'ed nsenter and ip).
package cni

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/kubenet-dev/kubenet/core"
	"github.com/kubenet-dev/kubenet/internal/links"
	"github.com/kubenet-dev/kubenet/network"
)

// Defaults (kubelet's).
const (
	PluginName      = "cni"
	DefaultConfDir  = "/etc/cni/net.d"
	DefaultBinDir   = "/opt/cni/bin"
	DefaultCacheDir = "/var/lib/cni/cache"
	// LoopbackNetwork is the name of the loopback network in libcni's cache.
	LoopbackNetwork = "cni-loopback"
	loopbackIfName  = "lo"
)

// Capability names passed as runtimeConfig (libcni hands each plugin those it declares).
const (
	capPortMappings   = "portMappings"
	capBandwidth      = "bandwidth"
	capIPRanges       = "ipRanges"
	capPodAnnotations = "io.kubernetes.cri.pod-annotations"
	capDNS            = "dns"
)

// VendorCNIDirTemplate is where kubelet looked for a vendor's plugin binaries: prefix, then the
// plugin type.
const VendorCNIDirTemplate = "%s/opt/%s/bin"

// Options configure the plugin; zero values take the defaults.
type Options struct {
	ConfDir  string
	BinDirs  []string // searched in order; empty entries dropped
	CacheDir string
	// VendorCNIDirPrefix is kubelet's vendor directory prefix: a plugin of type T is also
	// looked for in <prefix>/opt/T/bin, after BinDirs. "" (kubelet's production value) searches
	// /opt/T/bin.
	VendorCNIDirPrefix string
	// NodeNS is the node's network namespace, where plugins are executed (a child process
	// inherits the namespace of the thread that starts it). nil: the calling process's.
	NodeNS ns.NetNS
	Logger *slog.Logger
	// Timeout bounds each ADD, CHECK or DEL (and the loading of the conf dir); 0 means
	// network.CNITimeoutSec. A plugin still running then is killed and the call fails.
	Timeout time.Duration
}

// Plugin is the CNI NetworkPlugin. Create it with New.
type Plugin struct {
	opts     Options
	log      *slog.Logger
	cni      *libcni.CNIConfig
	loopback *libcni.NetworkConfigList // nil: no loopback plugin, lo is set up over netlink

	mu          sync.Mutex
	host        network.Host
	fingerprint string                    // of the conf dir at the last load
	net         *libcni.NetworkConfigList // the default network; nil until one is valid
	netFile     string
	loadErr     error
	podCIDRs    []netip.Prefix // from the pod-cidr-change event, IPv4 first
}

var _ network.NetworkPlugin = (*Plugin)(nil)

// New returns the plugin. It reads nothing yet: Init and every later call load the conf dir (or
// re-check it).
func New(opts Options) *Plugin {
	if opts.ConfDir == "" {
		opts.ConfDir = DefaultConfDir
	}
	var bins []string
	for _, d := range opts.BinDirs {
		if d = strings.TrimSpace(d); d != "" && !slices.Contains(bins, d) {
			bins = append(bins, d)
		}
	}
	if len(bins) == 0 {
		bins = []string{DefaultBinDir}
	}
	opts.BinDirs = bins
	if opts.CacheDir == "" {
		opts.CacheDir = DefaultCacheDir
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Timeout <= 0 {
		opts.Timeout = network.CNITimeoutSec * time.Second
	}
	return &Plugin{opts: opts, log: opts.Logger.With("plugin", PluginName), cni: libcni.NewCNIConfigWithCacheDir(bins, opts.CacheDir, nil)}
}

// cniFor is the libcni client that runs list: the bin dirs, then each of its plugin types'
// vendor dir. A type that is not a plain file name gets no vendor dir (it could not name a binary
// in one anyway, and must not steer the search elsewhere).
func (p *Plugin) cniFor(list *libcni.NetworkConfigList) *libcni.CNIConfig {
	path := slices.Clone(p.opts.BinDirs)
	for _, pl := range list.Plugins {
		t := pl.Network.Type
		if t == "" || t == "." || t == ".." || strings.ContainsAny(t, "/\\\x00") {
			continue
		}
		if dir := fmt.Sprintf(VendorCNIDirTemplate, p.opts.VendorCNIDirPrefix, t); !slices.Contains(path, dir) {
			path = append(path, dir)
		}
	}
	return libcni.NewCNIConfigWithCacheDir(path, p.opts.CacheDir, nil)
}

// callContext bounds one operation by the configured timeout.
func (p *Plugin) callContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), p.opts.Timeout)
}

// callError wraps a failed libcni call, saying so when the timeout killed it.
func callError(ctx context.Context, timeout time.Duration, err error, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("%s: timed out after %s: %w", msg, timeout, errors.Join(err, ctx.Err()))
	}
	return fmt.Errorf("%s: %w", msg, err)
}

// Name is "cni".
func (p *Plugin) Name() string { return PluginName }

// Capabilities is empty.
func (p *Plugin) Capabilities() network.Capabilities { return network.Capabilities{} }

// Init stores the host. Hairpin mode, non-masquerade CIDR and MTU belong to the CNI
// configuration here, as with kubelet.
func (p *Plugin) Init(host network.Host, _ network.HairpinMode, _ string, _ int) error {
	if host == nil {
		return errors.New("cni plugin needs a Host")
	}
	p.mu.Lock()
	p.host = host
	p.mu.Unlock()
	p.sync()
	return nil
}

// Event takes the node's pod CIDRs (pod-cidr-change) for the ipRanges capability.
func (p *Plugin) Event(name string, details map[string]interface{}) {
	if name != network.PodCIDRChangeEvent {
		return
	}
	raw := network.PodCIDRs(details)
	var cidrs []netip.Prefix
	for _, s := range network.SplitList(raw) {
		c, err := netip.ParsePrefix(s)
		if err != nil || c.Masked() != c {
			p.log.Error("ignoring invalid pod CIDR event", "podCIDR", raw, "entry", s)
			return
		}
		cidrs = append(cidrs, c)
	}
	if len(cidrs) == 0 || len(cidrs) > 2 || (len(cidrs) == 2 && cidrs[0].Addr().Is4() == cidrs[1].Addr().Is4()) {
		p.log.Error("ignoring pod CIDR event: want one IPv4 CIDR, one IPv6 CIDR, or one of each", "podCIDR", raw)
		return
	}
	sort.SliceStable(cidrs, func(i, j int) bool { return cidrs[i].Addr().Is4() && !cidrs[j].Addr().Is4() })
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.podCIDRs != nil && !slices.Equal(p.podCIDRs, cidrs) {
		p.log.Warn("node pod CIDR changed; new pods get addresses from the new one", "old", p.podCIDRs, "new", cidrs)
	}
	p.podCIDRs = cidrs
}

// Status fails while no valid network is loaded, or while the network wants ipRanges and no pod
// CIDR arrived yet.
func (p *Plugin) Status() error {
	p.sync()
	_, _, err := p.ready()
	return err
}

// ready returns the default network and the pod CIDRs, or why pods cannot be set up.
func (p *Plugin) ready() (*libcni.NetworkConfigList, []netip.Prefix, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.net == nil {
		if p.loadErr != nil {
			return nil, nil, fmt.Errorf("cni config uninitialized: %w", p.loadErr)
		}
		return nil, nil, errors.New("cni config uninitialized")
	}
	if wantsCapability(p.net, capIPRanges) && len(p.podCIDRs) == 0 {
		return nil, nil, fmt.Errorf("cni config %s needs ipRanges but no PodCIDR set", p.netFile)
	}
	return p.net, p.podCIDRs, nil
}

func wantsCapability(list *libcni.NetworkConfigList, name string) bool {
	for _, pl := range list.Plugins {
		if pl.Network.Capabilities[name] {
			return true
		}
	}
	return false
}

// sync reloads the conf dir if its listing changed since the last load, or if the last load found
// nothing valid. A network that was loaded stays loaded only while its file is still the first
// valid one.
func (p *Plugin) sync() {
	fp, err := fingerprint(p.opts.ConfDir)
	p.mu.Lock()
	unchanged := err == nil && fp == p.fingerprint && p.net != nil
	p.mu.Unlock()
	if unchanged {
		return
	}
	list, file, loadErr := p.load()
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		loadErr = errors.Join(err, loadErr)
	}
	if list != nil && (p.net == nil || file != p.netFile || string(list.Bytes) != string(p.net.Bytes)) {
		p.log.Info("using CNI configuration file", "file", file, "network", list.Name)
	}
	p.fingerprint, p.net, p.netFile, p.loadErr = fp, list, file, loadErr
}

// fingerprint summarises the conf dir's listing: a change of any candidate file's name, size or
// modification time changes it.
func fingerprint(dir string) (string, error) {
	files, err := libcni.ConfFiles(dir, []string{".conf", ".conflist", ".json"})
	if err != nil {
		return "", err
	}
	sort.Strings(files)
	h := sha256.New()
	for _, f := range files {
		st, err := os.Stat(f)
		if err != nil {
			continue
		}
		fmt.Fprintf(h, "%s\x00%d\x00%d\n", f, st.Size(), st.ModTime().UnixNano())
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// load returns the first valid network of the conf dir in lexical order of file names. Invalid
// files are logged with the reason and skipped.
func (p *Plugin) load() (*libcni.NetworkConfigList, string, error) {
	files, err := libcni.ConfFiles(p.opts.ConfDir, []string{".conf", ".conflist", ".json"})
	if err != nil {
		return nil, "", fmt.Errorf("read CNI conf dir %s: %w", p.opts.ConfDir, err)
	}
	if len(files) == 0 {
		return nil, "", fmt.Errorf("no networks found in %s", p.opts.ConfDir)
	}
	sort.Strings(files)
	ctx, cancel := p.callContext()
	defer cancel()
	var reasons []string
	for _, f := range files {
		list, err := p.validList(ctx, f)
		if err != nil {
			p.log.Warn("skipping CNI configuration file", "file", f, "reason", err)
			reasons = append(reasons, fmt.Sprintf("%s: %v", filepath.Base(f), err))
			continue
		}
		p.ensureLoopback(ctx)
		return list, f, nil
	}
	return nil, "", fmt.Errorf("no valid networks found in %s (%s)", p.opts.ConfDir, strings.Join(reasons, "; "))
}

func (p *Plugin) validList(ctx context.Context, file string) (*libcni.NetworkConfigList, error) {
	var list *libcni.NetworkConfigList
	if strings.HasSuffix(file, ".conflist") {
		l, err := libcni.NetworkConfFromFile(file)
		if err != nil {
			return nil, err
		}
		list = l
	} else {
		l, err := singlePluginList(file)
		if err != nil {
			return nil, err
		}
		list = l
	}
	if len(list.Plugins) == 0 {
		return nil, errors.New("the network has no plugins")
	}
	// Runs VERSION on every plugin: a list whose binaries are missing or do not speak its
	// cniVersion is not usable.
	if err := p.inNode(func() error {
		_, err := p.cniFor(list).ValidateNetworkList(ctx, list)
		return err
	}); err != nil {
		return nil, err
	}
	return list, nil
}

// singlePluginList reads a .conf/.json file, one plugin's configuration, as a list of that plugin
// (what libcni's deprecated ConfListFromConf did).
func singlePluginList(file string) (*libcni.NetworkConfigList, error) {
	raw, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	conf, err := libcni.NetworkPluginConfFromBytes(raw)
	if err != nil {
		return nil, err
	}
	if conf.Network.Type == "" {
		return nil, errors.New("no plugin type (perhaps this is a .conflist?)")
	}
	list, err := json.Marshal(map[string]any{
		"cniVersion": conf.Network.CNIVersion,
		"name":       conf.Network.Name,
		"plugins":    []json.RawMessage{raw},
	})
	if err != nil {
		return nil, err
	}
	return libcni.NetworkConfFromBytes(list)
}

// ensureLoopback builds the loopback network once the loopback plugin is found in a bin dir.
func (p *Plugin) ensureLoopback(ctx context.Context) {
	p.mu.Lock()
	have := p.loopback != nil
	p.mu.Unlock()
	if have {
		return
	}
	lo := loopbackConf()
	if _, err := p.cniFor(lo).ValidateNetworkList(ctx, lo); err != nil {
		p.log.Debug("no usable loopback plugin; lo is set up over netlink", "binDirs", p.opts.BinDirs, "err", err)
		return
	}
	p.mu.Lock()
	p.loopback = lo
	p.mu.Unlock()
}

func loopbackConf() *libcni.NetworkConfigList {
	list, err := libcni.NetworkConfFromBytes([]byte(`{"cniVersion":"0.3.1","name":"` + LoopbackNetwork + `","plugins":[{"type":"loopback"}]}`))
	if err != nil {
		panic(err) // a constant
	}
	return list
}

// inNode runs f in the node's network namespace.
func (p *Plugin) inNode(f func() error) error {
	if p.opts.NodeNS == nil {
		return f()
	}
	return p.opts.NodeNS.Do(func(ns.NetNS) error { return f() })
}

func (p *Plugin) getHost() (network.Host, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.host == nil {
		return nil, errors.New("cni plugin used before Init")
	}
	return p.host, nil
}

// sandboxCall is what an ADD or CHECK for a sandbox needs.
type sandboxCall struct {
	list  *libcni.NetworkConfigList
	cidrs []netip.Prefix
	host  network.Host
	netns string
}

// sandbox re-checks the conf dir and gathers the network, pod CIDRs, host and the sandbox's netns.
func (p *Plugin) sandbox(id network.ContainerID) (sandboxCall, error) {
	p.sync()
	var s sandboxCall
	var err error
	if s.list, s.cidrs, err = p.ready(); err != nil {
		return s, err
	}
	if s.host, err = p.getHost(); err != nil {
		return s, err
	}
	s.netns, err = network.NetNSOf(s.host, id)
	return s, err
}

// SetUpPod adds the sandbox to the loopback network and to the default network. options["dns"]
// (the shim's JSON of the pod's CRI DNSConfig) becomes the dns capability when the network
// declares it, as kubelet did.
func (p *Plugin) SetUpPod(namespace, name string, id network.ContainerID, annotations, options map[string]string) error {
	s, err := p.sandbox(id)
	if err != nil {
		return err
	}
	list, cidrs, host, netns := s.list, s.cidrs, s.host, s.netns
	pms, err := host.GetPodPortMappings(id.ID)
	if err != nil {
		return fmt.Errorf("port mappings of sandbox %s: %w", id.ID, err)
	}
	caps, err := capabilityArgs(pms, annotations, cidrs)
	if err == nil && wantsCapability(list, capDNS) {
		err = addDNS(caps, options)
	}
	if err != nil {
		return fmt.Errorf("pod %s/%s: %w", namespace, name, err)
	}
	ctx, cancel := p.callContext()
	defer cancel()
	if err := p.addLoopback(ctx, id, netns); err != nil {
		return err
	}
	rt := runtimeConf(namespace, name, id, netns, network.DefaultInterfaceName)
	rt.CapabilityArgs = caps
	return p.inNode(func() error {
		if _, err := p.cniFor(list).AddNetworkList(ctx, list, rt); err != nil {
			return callError(ctx, p.opts.Timeout, err, "error adding pod %s/%s to CNI network %q", namespace, name, list.Name)
		}
		return nil
	})
}

func (p *Plugin) addLoopback(ctx context.Context, id network.ContainerID, netns string) error {
	p.mu.Lock()
	lo := p.loopback
	p.mu.Unlock()
	if lo == nil {
		if err := loopbackUp(netns); err != nil {
			return fmt.Errorf("set up lo of sandbox %s: %w", id.ID, err)
		}
		return nil
	}
	rt := &libcni.RuntimeConf{ContainerID: id.ID, NetNS: netns, IfName: loopbackIfName}
	return p.inNode(func() error {
		if _, err := p.cniFor(lo).AddNetworkList(ctx, lo, rt); err != nil {
			return callError(ctx, p.opts.Timeout, err, "error adding sandbox %s to the loopback network", id.ID)
		}
		return nil
	})
}

// loopbackUp sets lo up inside the netns (what the loopback plugin does).
func loopbackUp(netns string) error {
	podNS, err := ns.GetNS(netns)
	if err != nil {
		return err
	}
	defer podNS.Close()
	return podNS.Do(func(ns.NetNS) error { return links.SetLoopbackUp() })
}

// runtimeConf is kubelet's: the sandbox ID, netns and interface, and the Kubernetes CNI_ARGS
// (IgnoreUnknown so plugins that know none of them accept them).
func runtimeConf(namespace, name string, id network.ContainerID, netns, ifName string) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{
		ContainerID: id.ID,
		NetNS:       netns,
		IfName:      ifName,
		Args: [][2]string{
			{"IgnoreUnknown", "1"},
			{"K8S_POD_NAMESPACE", namespace},
			{"K8S_POD_NAME", name},
			{"K8S_POD_INFRA_CONTAINER_ID", id.ID},
		},
	}
}

// capabilityArgs builds runtimeConfig: portMappings always (kubelet sent an empty list too),
// bandwidth when an annotation asks for it, ipRanges when the node's pod CIDR is known, and the
// pod annotations.
func capabilityArgs(pms []*network.PortMapping, annotations map[string]string, cidrs []netip.Prefix) (map[string]interface{}, error) {
	caps := map[string]interface{}{}
	mappings, err := core.NormalizePortMappings(network.HostPorts(pms))
	if err != nil {
		return nil, err
	}
	if mappings == nil {
		mappings = []core.PortMapping{} // kubelet sent an empty list too
	}
	caps[capPortMappings] = mappings

	bw, err := core.BandwidthFromAnnotations(annotations)
	if err != nil {
		return nil, fmt.Errorf("error reading pod bandwidth annotations: %w", err)
	}
	if bw != nil {
		caps[capBandwidth] = bw
	}
	if len(cidrs) > 0 {
		sets := make([][]core.IPRange, len(cidrs))
		for i, c := range cidrs {
			sets[i] = []core.IPRange{{Subnet: c.String()}}
		}
		caps[capIPRanges] = sets
	}
	if len(annotations) > 0 {
		caps[capPodAnnotations] = annotations
	}
	return caps, nil
}

// dnsConfig is the dns capability (CNI conventions), and the JSON of the CRI DNSConfig that a
// shim passes in SetUpPod's options["dns"]: the same three keys.
type dnsConfig struct {
	Servers  []string `json:"servers,omitempty"`
	Searches []string `json:"searches,omitempty"`
	Options  []string `json:"options,omitempty"`
}

// addDNS adds options["dns"] as the dns capability. Servers must be IP addresses; an option
// that is not JSON of that shape fails the set-up, naming it. Without the option nothing is
// added.
func addDNS(caps map[string]interface{}, options map[string]string) error {
	raw, ok := options["dns"]
	if !ok {
		return nil
	}
	var dns dnsConfig
	if err := json.Unmarshal([]byte(raw), &dns); err != nil {
		return fmt.Errorf("SetUpPod option dns %q: %w", raw, err)
	}
	for _, s := range dns.Servers {
		if _, err := netip.ParseAddr(s); err != nil {
			return fmt.Errorf("SetUpPod option dns: server %q is not an IP address", s)
		}
	}
	if len(dns.Servers)+len(dns.Searches)+len(dns.Options) > 0 {
		caps[capDNS] = dns
	}
	return nil
}

// CheckPod runs CHECK for the sandbox on the default network (CNI ≥ 0.4.0 configurations).
func (p *Plugin) CheckPod(namespace, name string, id network.ContainerID) error {
	s, err := p.sandbox(id)
	if err != nil {
		return err
	}
	list, netns := s.list, s.netns
	ctx, cancel := p.callContext()
	defer cancel()
	rt := runtimeConf(namespace, name, id, netns, network.DefaultInterfaceName)
	c := p.cniFor(list)
	// CHECK must see the runtimeConfig of ADD: take it from libcni's cache.
	if _, cached, err := c.GetNetworkListCachedConfig(list, rt); err == nil && cached != nil {
		rt.CapabilityArgs = cached.CapabilityArgs
	}
	return p.inNode(func() error {
		if err := c.CheckNetworkList(ctx, list, rt); err != nil {
			return callError(ctx, p.opts.Timeout, err, "CHECK of pod %s/%s on CNI network %q", namespace, name, list.Name)
		}
		return nil
	})
}

// TearDownPod deletes the sandbox from the loopback network and from every network libcni's cache
// says it was added to on the pod interface (with the configuration of that ADD), or, without a
// cache entry, from the current default network. A missing netns is not an error: plugins clean
// up host-side state without it.
func (p *Plugin) TearDownPod(namespace, name string, id network.ContainerID) error {
	p.sync()
	var netns string
	if host, err := p.getHost(); err == nil {
		if netns, err = host.GetNetNS(id.ID); err != nil {
			p.log.Debug("tearing down without the sandbox's netns", "sandbox", id.ID, "err", err)
			netns = ""
		}
	}
	ctx, cancel := p.callContext()
	defer cancel()

	p.mu.Lock()
	lo, current := p.loopback, p.net
	p.mu.Unlock()
	if lo != nil {
		rt := &libcni.RuntimeConf{ContainerID: id.ID, NetNS: netns, IfName: loopbackIfName}
		if err := p.inNode(func() error { return p.cniFor(lo).DelNetworkList(ctx, lo, rt) }); err != nil {
			p.log.Warn("loopback teardown failed", "sandbox", id.ID, "err", err)
		}
	}

	dels, err := p.deletions(namespace, name, id, netns, current)
	if err != nil {
		return err
	}
	var errs []error
	for _, d := range dels {
		err := p.inNode(func() error { return p.cniFor(d.list).DelNetworkList(ctx, d.list, d.rt) })
		if err != nil && ctx.Err() == nil && strings.Contains(err.Error(), "no such file or directory") {
			// Old plugins fail DEL when the netns is gone although there is nothing left to do.
			p.log.Info("ignoring DEL error for a vanished netns", "sandbox", id.ID, "network", d.list.Name, "err", err)
			err = nil
		}
		if err != nil {
			errs = append(errs, callError(ctx, p.opts.Timeout, err, "error removing pod %s/%s from CNI network %q", namespace, name, d.list.Name))
		}
	}
	return errors.Join(errs...)
}

type deletion struct {
	list *libcni.NetworkConfigList
	rt   *libcni.RuntimeConf
}

func (p *Plugin) deletions(namespace, name string, id network.ContainerID, netns string, current *libcni.NetworkConfigList) ([]deletion, error) {
	cached, err := p.cni.GetCachedAttachments(id.ID)
	if err != nil {
		p.log.Warn("cannot read the libcni cache", "sandbox", id.ID, "err", err)
	}
	var out []deletion
	for _, a := range cached {
		if a.IfName != network.DefaultInterfaceName || a.Network == LoopbackNetwork {
			continue
		}
		list, err := libcni.NetworkConfFromBytes(a.Config)
		if err != nil {
			p.log.Warn("unusable libcni cache entry", "sandbox", id.ID, "network", a.Network, "err", err)
			continue
		}
		rt := runtimeConf(namespace, name, id, netns, a.IfName)
		if a.CniArgs != nil {
			rt.Args = a.CniArgs
		}
		rt.CapabilityArgs = a.CapabilityArgs
		out = append(out, deletion{list: list, rt: rt})
	}
	if len(out) > 0 {
		return out, nil
	}
	if current == nil {
		return nil, errors.New("cni config uninitialized and no cached attachment of the sandbox")
	}
	// No cache entry (a repeated teardown, or one by another runtime): DEL with the current
	// network and what an ADD would have passed, so plugins that need their runtimeConfig on
	// DEL too (ipRanges for host-local, portMappings for portmap) get it.
	rt := runtimeConf(namespace, name, id, netns, network.DefaultInterfaceName)
	var pms []*network.PortMapping
	if host, err := p.getHost(); err == nil {
		pms, _ = host.GetPodPortMappings(id.ID)
	}
	p.mu.Lock()
	cidrs := p.podCIDRs
	p.mu.Unlock()
	if caps, err := capabilityArgs(pms, nil, cidrs); err == nil {
		rt.CapabilityArgs = caps
	}
	return []deletion{{list: current, rt: rt}}, nil
}

// GetPodNetworkStatus reads the pod interface's addresses in the sandbox's netns.
func (p *Plugin) GetPodNetworkStatus(namespace, name string, id network.ContainerID) (*network.PodNetworkStatus, error) {
	host, err := p.getHost()
	if err != nil {
		return nil, err
	}
	return network.StatusFromNetNS(host, id)
}

// NetworkName is the name of the loaded default network ("" when none).
func (p *Plugin) NetworkName() string {
	p.sync()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.net == nil {
		return ""
	}
	return p.net.Name
}
