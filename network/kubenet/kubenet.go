// Package kubenet is the kubenet NetworkPlugin (--network-plugin=kubenet) over this module's
// core, in-process: no CNI binary is executed. Init takes kubelet's hairpin mode,
// non-masquerade CIDR(s) and MTU; the pod-cidr-change event gives the node's pod CIDR(s) and sets
// up the node; SetUpPod/TearDownPod call the core's Add/Del with the pod's host ports (from the
// Host) and bandwidth annotations; GetPodNetworkStatus reads the attachment record.
//
// Differences from old kubelet kubenet, on purpose:
//   - a later, different pod CIDR is applied (old kubenet ignored it until a restart and then left
//     the old gateway on cbr0): the bridge is reconciled to exactly the new gateways at once.
//     Pods attached under the old CIDR keep their addresses but lose their gateway; drain the node
//     first (Kubernetes treats a node's pod CIDR as immutable anyway). Their teardown still works.
//   - TearDownPod works from the attachment record on disk, after a restart and with the netns
//     gone, also before the pod CIDR event arrived (old kubenet needed both an in-memory IP cache
//     and the CIDR, and silently leaked host ports and shaping otherwise).
//   - host-port sockets are re-acquired from the records when a new plugin object is Init'ed.
package kubenet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/kubenet-dev/kubenet/core"
	"github.com/kubenet-dev/kubenet/network"
)

// Defaults of Options (the same as the CNI plugin's).
const (
	PluginName     = "kubenet"
	DefaultNetwork = "kubenet"
	// DefaultNonMasqueradeCIDR is kubelet's --non-masquerade-cidr default, used when Init gets "".
	DefaultNonMasqueradeCIDR = "10.0.0.0/8"
	// DefaultHairpinMode is used when Init gets "", and is kubenetctl's --hairpin-mode default.
	// kubelet's default was promiscuous-bridge; kubenet's is hairpin-veth on purpose: it is the
	// CNI configuration's default too, so the two faces agree on the node-wide bridge without
	// flags; since Linux 6.8 a promiscuous bridge no longer hairpins by itself (kubenet sets the
	// port flag in both modes anyway); and promiscuous mode makes the bridge see every frame and
	// duplicate some, which needs the dedup rules. A shim that passes kubelet's value through
	// still gets promiscuous-bridge.
	DefaultHairpinMode = network.HairpinVeth
)

// Options configure the plugin; zero values take the defaults.
type Options struct {
	// NodeNS is the node's network namespace. nil: the calling process's. A shim runs in the
	// node's namespace; tests and tools that run elsewhere pass the node's.
	NodeNS  ns.NetNS
	DataDir string // default core.DefaultDataDir
	Network string // default DefaultNetwork
	Bridge  string // default core.DefaultBridge
	Logger  *slog.Logger
	// SkipPortReacquire leaves the host ports of pods attached earlier alone at Init. For
	// one-shot tools (kubenetctl): their sockets would close at exit anyway, and a long-lived
	// shim on the node holds them.
	SkipPortReacquire bool
	// Owner names this caller as the owner of the network's node-wide settings (bridge, pod
	// CIDRs, non-masquerade CIDRs, MTU, hairpin mode); default DefaultOwner. When the node's
	// settings belong to another owner (a conflist: core.OwnerCNI) and differ, node set-up and
	// SetUpPod fail naming the differences, unless TakeOverNode makes this caller the owner.
	Owner        string
	TakeOverNode bool
	// NetfilterBackend is the netfilterBackend key: "auto" (default), "nftables" or
	// "iptables". Node-wide, like the settings above.
	NetfilterBackend string
}

// DefaultOwner is the owner of the node-wide settings the in-process plugin applies.
const DefaultOwner = "network/kubenet"

// Plugin is the kubenet NetworkPlugin. Create it with New; Close releases its host-port sockets.
type Plugin struct {
	opts  Options
	log   *slog.Logger
	ports *ports

	eventMu sync.Mutex // serializes Event: one node reconciliation at a time

	mu      sync.Mutex
	host    network.Host
	base    *core.NetConf // Init's settings, without pod CIDRs; nil before Init
	conf    *core.NetConf // base with the node's pod CIDRs; nil until the first valid event
	cfg     *core.Config  // conf validated
	nodeErr error         // last node set-up failure, reported by Status until a retry works
}

// New returns a plugin; it does nothing until Init.
func New(opts Options) *Plugin {
	if opts.DataDir == "" {
		opts.DataDir = core.DefaultDataDir
	}
	if opts.Network == "" {
		opts.Network = DefaultNetwork
	}
	if opts.Bridge == "" {
		opts.Bridge = core.DefaultBridge
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Owner == "" {
		opts.Owner = DefaultOwner
	}
	return &Plugin{opts: opts, log: opts.Logger.With("plugin", PluginName, "network", opts.Network), ports: newPorts()}
}

var _ network.NetworkPlugin = (*Plugin)(nil)

// Name is "kubenet".
func (p *Plugin) Name() string { return PluginName }

// Capabilities is empty: shaping arrives as pod annotations at SetUpPod.
func (p *Plugin) Capabilities() network.Capabilities { return network.Capabilities{} }

// Init checks the settings (so a typo fails at start, not at the first pod) and re-acquires the
// host ports of the pods already attached.
func (p *Plugin) Init(host network.Host, hairpinMode network.HairpinMode, nonMasqueradeCIDR string, mtu int) error {
	if host == nil {
		return errors.New("kubenet needs a Host")
	}
	if hairpinMode == "" {
		hairpinMode = DefaultHairpinMode
	}
	if !hairpinMode.Valid() {
		return fmt.Errorf("invalid hairpin mode %q: valid values are %q, %q and %q", hairpinMode, network.HairpinVeth, network.PromiscuousBridge, network.HairpinNone)
	}
	if strings.TrimSpace(nonMasqueradeCIDR) == "" {
		nonMasqueradeCIDR = DefaultNonMasqueradeCIDR
	}
	base := &core.NetConf{Keys: core.Keys{
		Bridge:             p.opts.Bridge,
		NonMasqueradeCIDRs: network.SplitList(nonMasqueradeCIDR),
		MTU:                mtu,
		HairpinMode:        string(hairpinMode),
		DataDir:            p.opts.DataDir,
		NetfilterBackend:   p.opts.NetfilterBackend,
	}}
	base.Name = p.opts.Network
	versions := core.SupportedVersions()
	base.CNIVersion = versions[len(versions)-1]
	// Validate everything but the pod CIDRs now, with a documentation prefix standing in for
	// them; nothing is applied.
	trial := *base
	trial.PodCIDRs = []string{"192.0.2.0/24"}
	if _, err := trial.Validate(); err != nil {
		return fmt.Errorf("kubenet settings: %w", err)
	}
	p.mu.Lock()
	p.host, p.base = host, base
	p.mu.Unlock()
	if !p.opts.SkipPortReacquire {
		p.reacquirePorts()
	}
	return nil
}

// Event handles pod-cidr-change: {"pod-cidr": "v4cidr[,v6cidr]"}. A new or different CIDR set
// becomes the node's configuration and the node (bridge gateways, SNAT) is reconciled to it at
// once; an invalid one is logged and ignored, the previous configuration stays.
func (p *Plugin) Event(name string, details map[string]interface{}) {
	if name != network.PodCIDRChangeEvent {
		return
	}
	cidrs := network.SplitList(network.PodCIDRs(details))
	if len(cidrs) == 0 {
		p.log.Warn("pod-cidr-change event without a pod CIDR", "details", details)
		return
	}
	p.eventMu.Lock()
	defer p.eventMu.Unlock()
	p.mu.Lock()
	if p.base == nil {
		p.mu.Unlock()
		p.log.Error("pod-cidr-change event before Init; ignored")
		return
	}
	conf := *p.base
	conf.PodCIDRs = cidrs
	cfg, err := p.validate(&conf)
	if err != nil {
		p.mu.Unlock()
		p.log.Error("ignoring invalid pod CIDR", "podCIDR", strings.Join(cidrs, ","), "err", err)
		return
	}
	old := p.cfg
	if old != nil && slices.Equal(old.PodCIDRs(), cfg.PodCIDRs()) && p.nodeErr == nil {
		p.mu.Unlock()
		return
	}
	p.conf, p.cfg = &conf, cfg
	p.mu.Unlock()

	if old != nil && !slices.Equal(old.PodCIDRs(), cfg.PodCIDRs()) {
		p.log.Warn("node pod CIDR changed; pods attached under the old CIDR keep their addresses but lose their gateway until they are recreated",
			"old", old.PodCIDRs(), "new", cfg.PodCIDRs(), "podsOnOldCIDR", p.attachedOutside(cfg.PodCIDRs()))
	}
	p.ensureNode(cfg)
}

// ensureNode reconciles the node to cfg and remembers the outcome for Status.
func (p *Plugin) ensureNode(cfg *core.Config) error {
	ctx, cancel := context.WithTimeout(context.Background(), network.CNITimeoutSec*time.Second)
	defer cancel()
	err := p.inNode(func() error { return core.EnsureNode(ctx, cfg) })
	p.mu.Lock()
	if p.cfg == cfg {
		p.nodeErr = err
	}
	p.mu.Unlock()
	if err != nil {
		p.log.Error("node set-up for the pod CIDR failed; Status reports it until a retry works", "podCIDR", cfg.PodCIDRs(), "err", err)
	} else {
		p.log.Info("node set up", "podCIDR", cfg.PodCIDRs(), "bridge", cfg.Bridge)
	}
	return err
}

// attachedOutside counts attachments whose addresses are in none of cidrs.
func (p *Plugin) attachedOutside(cidrs []netip.Prefix) int {
	recs, err := p.records().List()
	if err != nil {
		return -1
	}
	n := 0
	for _, r := range recs {
		for _, ip := range r.IPs {
			if !slices.ContainsFunc(cidrs, func(c netip.Prefix) bool { return c.Contains(ip.Addr()) }) {
				n++
				break
			}
		}
	}
	return n
}

// Status fails until the node's pod CIDR is known and the node was set up for it, and while
// the core says an ADD cannot succeed (data dir unusable, pod CIDR full, bridge name taken,
// nftables unusable). A failed node set-up is retried here, so a transient failure heals at the
// next poll.
func (p *Plugin) Status() error {
	cfg, err := p.readyConfig()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), network.CNITimeoutSec*time.Second)
	defer cancel()
	if err := p.inNode(func() error { return core.Status(ctx, cfg) }); err != nil {
		return fmt.Errorf("kubenet is not ready: %w", err)
	}
	return nil
}

// readyConfig is the node's configuration once there is one and the node is set up for it
// (retrying a failed set-up). It is the part of Status that SetUpPod needs: ADD itself fails
// clearly on everything else Status probes, without a second pass over the store, the bridge
// and nftables per pod.
func (p *Plugin) readyConfig() (*core.Config, error) {
	p.mu.Lock()
	cfg, nodeErr := p.cfg, p.nodeErr
	p.mu.Unlock()
	if cfg == nil {
		return nil, errors.New("kubenet has no pod CIDR yet: waiting for the pod-cidr-change event (Node.spec.podCIDRs; kubenetctl --pod-cidr)")
	}
	if nodeErr != nil {
		p.eventMu.Lock()
		defer p.eventMu.Unlock()
		if err := p.ensureNode(cfg); err != nil {
			return nil, fmt.Errorf("kubenet could not set up the node for pod CIDR %v: %w", cfg.PodCIDRs(), err)
		}
	}
	return cfg, nil
}

// inNode runs f in the node's network namespace.
func (p *Plugin) inNode(f func() error) error {
	if p.opts.NodeNS == nil {
		return f()
	}
	return p.opts.NodeNS.Do(func(ns.NetNS) error { return f() })
}

func (p *Plugin) records() core.Records {
	return core.NewRecords(filepath.Join(p.opts.DataDir, p.opts.Network))
}

func attachmentOf(id network.ContainerID, netns string) core.Attachment {
	return core.Attachment{ContainerID: id.ID, IfName: network.DefaultInterfaceName, NetNS: netns}
}

func ownerOf(att core.Attachment) string { return att.ContainerID + "/" + att.IfName }

// SetUpPod attaches the sandbox: host ports from the Host, bandwidth from the annotations. Its
// host ports are bound first (so a port a host process holds fails the pod before anything is
// created); on failure the core has rolled back and the new sockets are closed.
func (p *Plugin) SetUpPod(namespace, name string, id network.ContainerID, annotations, options map[string]string) error {
	if _, err := p.readyConfig(); err != nil {
		return fmt.Errorf("kubenet cannot SetUpPod: %w", err)
	}
	p.mu.Lock()
	host, conf := p.host, *p.conf
	p.mu.Unlock()

	netns, err := network.NetNSOf(host, id)
	if err != nil {
		return err
	}
	pms, err := host.GetPodPortMappings(id.ID)
	if err != nil {
		return fmt.Errorf("port mappings of sandbox %s: %w", id.ID, err)
	}
	conf.RuntimeConfig = core.RuntimeConfig{PortMappings: network.HostPorts(pms), PodAnnotations: annotations}
	cfg, err := p.validate(&conf)
	if err != nil {
		return fmt.Errorf("pod %s/%s: %w", namespace, name, err)
	}
	att := attachmentOf(id, netns)
	att.Pod = namespace + "/" + name // in the record, so an operator can tell whose address it is
	var families []bool
	for _, c := range cfg.PodCIDRs() {
		families = append(families, c.Addr().Is6())
	}
	keys, err := portKeys(cfg.Runtime.PortMappings, families)
	if err != nil {
		return fmt.Errorf("pod %s/%s: %w", namespace, name, err)
	}
	var opened []portKey
	if err := p.inNode(func() error {
		var err error
		opened, err = p.ports.open(ownerOf(att), keys)
		return err
	}); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), network.CNITimeoutSec*time.Second)
	defer cancel()
	err = p.inNode(func() error {
		_, err := core.Add(ctx, cfg, att)
		return err
	})
	if err != nil {
		return errors.Join(err, p.ports.close(ownerOf(att), opened))
	}
	return nil
}

// TearDownPod removes everything of the sandbox on the node: veth, addresses, host ports,
// shaping, record; then closes its host-port sockets. It needs neither the netns nor any memory
// of the set-up: the attachment record on disk drives it.
func (p *Plugin) TearDownPod(namespace, name string, id network.ContainerID) error {
	p.mu.Lock()
	host := p.host
	p.mu.Unlock()
	var netns string
	if host != nil {
		var err error
		if netns, err = host.GetNetNS(id.ID); err != nil {
			p.log.Debug("tearing down without the sandbox's netns", "sandbox", id.ID, "err", err)
			netns = ""
		}
	}
	att := attachmentOf(id, netns)
	cfg, err := p.teardownConfig(att)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), network.CNITimeoutSec*time.Second)
	defer cancel()
	if err := p.inNode(func() error { return core.Del(ctx, cfg, att) }); err != nil {
		// The record stays, so the sockets stay too: they mirror what is on disk, and the
		// runtime retries teardown.
		return fmt.Errorf("pod %s/%s: %w", namespace, name, err)
	}
	return p.ports.close(ownerOf(att), nil)
}

// teardownConfig is the current configuration, or, before the pod CIDR event (after a restart),
// one derived from the attachment's record: its addresses carry the pod CIDR's prefix length.
// Without a record either (ADD crashed before writing it, or there is nothing), any CIDR does:
// Del and GC find reservations by container ID and everything else by derived names.
func (p *Plugin) teardownConfig(att core.Attachment) (*core.Config, error) {
	p.mu.Lock()
	cfg, base := p.cfg, p.base
	p.mu.Unlock()
	if cfg != nil {
		return cfg, nil
	}
	if base == nil {
		return nil, errors.New("kubenet cannot tear down pods before Init")
	}
	conf := *base
	if att.ContainerID != "" {
		// An unreadable record gives no CIDR; DEL then finds everything from the attachment's key.
		rec, err := p.records().Load(att)
		if err != nil && !errors.As(err, new(*core.CorruptRecordError)) {
			return nil, err
		}
		if rec != nil {
			for _, ip := range rec.IPs {
				conf.PodCIDRs = append(conf.PodCIDRs, ip.Masked().String())
			}
		}
	}
	if len(conf.PodCIDRs) == 0 {
		conf.PodCIDRs = []string{"192.0.2.0/24"}
	}
	return p.validate(&conf)
}

// validate is conf.Validate with this plugin as the owner of the node-wide settings.
func (p *Plugin) validate(conf *core.NetConf) (*core.Config, error) {
	cfg, err := conf.Validate()
	if err != nil {
		return nil, err
	}
	cfg.Owner, cfg.TakeOverNode = p.opts.Owner, p.opts.TakeOverNode
	return cfg, nil
}

// GC removes every attachment of the network that is not in valid (core.GC: records, host
// ports, shaping, reservations without a record), and closes the host-port sockets of the pods
// it removed. It works before the pod CIDR event too.
func (p *Plugin) GC(valid []core.ValidAttachment) error {
	cfg, err := p.teardownConfig(core.Attachment{})
	if err != nil {
		return err
	}
	before, err := p.records().List()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), network.CNITimeoutSec*time.Second)
	defer cancel()
	gcErr := p.inNode(func() error { return core.GC(ctx, cfg, valid) })
	keep := map[string]bool{}
	for _, v := range valid {
		keep[v.ContainerID+"/"+v.IfName] = true
	}
	var errs []error
	for _, rec := range before {
		owner := ownerOf(core.Attachment{ContainerID: rec.ContainerID, IfName: rec.IfName})
		if !keep[owner] {
			errs = append(errs, p.ports.close(owner, nil))
		}
	}
	return errors.Join(append(errs, gcErr)...)
}

// GetPodNetworkStatus returns the sandbox's addresses from its attachment record, or, when there
// is none (a pod attached by something else) or it is unreadable, from its interface in the netns.
func (p *Plugin) GetPodNetworkStatus(namespace, name string, id network.ContainerID) (*network.PodNetworkStatus, error) {
	rec, err := p.records().Load(attachmentOf(id, ""))
	if err != nil && !errors.As(err, new(*core.CorruptRecordError)) {
		return nil, err
	}
	if rec != nil && len(rec.IPs) > 0 {
		ips := make([]net.IP, len(rec.IPs))
		for i, ip := range rec.IPs {
			ips[i] = ip.Addr().AsSlice()
		}
		return network.StatusOf(ips), nil
	}
	p.mu.Lock()
	host := p.host
	p.mu.Unlock()
	if host == nil {
		return nil, errors.New("kubenet cannot GetPodNetworkStatus before Init")
	}
	return network.StatusFromNetNS(host, id)
}

// reacquirePorts binds the host ports of every attachment on record (a new plugin object after a
// restart). A port that something else took meanwhile is logged: the pod keeps its DNAT rule.
func (p *Plugin) reacquirePorts() {
	recs, err := p.records().List()
	if err != nil {
		p.log.Error("cannot read attachment records to re-acquire host ports", "err", err)
		return
	}
	for _, r := range recs {
		if len(r.PortMappings) == 0 {
			continue
		}
		var families []bool
		for _, ip := range r.IPs {
			families = append(families, ip.Addr().Is6())
		}
		att := core.Attachment{ContainerID: r.ContainerID, IfName: r.IfName}
		keys, err := portKeys(r.PortMappings, families)
		if err == nil {
			err = p.inNode(func() error {
				_, err := p.ports.open(ownerOf(att), keys)
				return err
			})
		}
		if err != nil {
			p.log.Error("host port of an attached pod could not be re-acquired", "sandbox", r.ContainerID, "err", err)
		}
	}
}

// HeldPorts lists the host-port sockets the plugin holds for a sandbox ("tcp/0.0.0.0:8080").
func (p *Plugin) HeldPorts(id network.ContainerID) []string {
	return p.ports.heldBy(ownerOf(attachmentOf(id, "")))
}

// Close releases the host-port sockets (the process is going away); state on disk stays, and
// the next plugin object re-acquires them.
func (p *Plugin) Close() error { return p.ports.closeAll() }
