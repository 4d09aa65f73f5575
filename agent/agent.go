// Package agent is kubenet's node agent (cmd/kubenet-agent): it reads its own Node's pod CIDRs
// and writes the kubenet conflist, installs the kubenet binary, keeps one route per other node's
// pod CIDR via that node's InternalIP, and sets the Node's NetworkUnavailable condition the way a
// cloud route controller would. Its controllers each run in a loop of agent/loop: the node sync
// (Node informer events and kernel events ask for one sync, which reads the informer's cache and
// the kernel and converges both files and routes), the healer, the stale-attachment collection
// and the NetworkPolicy controller.
package agent

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/watch"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	typednetworkingv1 "k8s.io/client-go/kubernetes/typed/networking/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/kubenet-dev/kubenet/agent/cnidir"
	"github.com/kubenet-dev/kubenet/agent/loop"
	"github.com/kubenet-dev/kubenet/agent/policy"
	"github.com/kubenet-dev/kubenet/agent/routes"
	"github.com/kubenet-dev/kubenet/core"
	"github.com/kubenet-dev/kubenet/internal/policyrules"
)

// Defaults of Config.
const (
	DefaultConfDir      = "/etc/cni/net.d"
	DefaultBinDir       = "/opt/cni/bin"
	DefaultResyncPeriod = 5 * time.Minute
	// DefaultStaleGrace is how long an attachment without a sandbox is spared. It must exceed
	// the longest time from CNI ADD to the sandbox appearing in the runtime's list (the rest of
	// RunPodSandbox); kubelet gives RunPodSandbox 2 minutes (--runtime-request-timeout).
	DefaultStaleGrace    = 5 * time.Minute
	DefaultStaleInterval = time.Minute
	// stuckAfter is how long one sync may run before /healthz fails (a hung netlink call or API
	// request); the informer keeps working, but nothing converges any more.
	stuckAfter = 2 * time.Minute
)

// Config is the agent's configuration (cmd/kubenet-agent's flags).
type Config struct {
	NodeName string
	// Conflist holds the settings rendered into the conflist; PodCIDRs come from the Node.
	Conflist cnidir.Options
	ConfDir  string // default DefaultConfDir
	ConfFile string // default cnidir.DefaultFileName
	BinDir   string // default DefaultBinDir
	// BinSource is the kubenet binary to install into BinDir (the image's copy); "" skips it.
	BinSource string
	// ToolRoot is the node's root file system as mounted into the agent: the iptables backend
	// runs the node's iptables, ip6tables and ebtables from it, chrooted (core.Config.ToolRoot).
	// "" uses the tools on the agent's own PATH.
	ToolRoot string
	// ManageRoutes turns the route sync on; off where a cloud route table does the job.
	ManageRoutes  bool
	RouteProtocol int           // default routes.DefaultProtocol
	ResyncPeriod  time.Duration // informer resync: also repairs routes removed behind the agent's back
	// ServiceCIDRs are the cluster's service CIDRs (kube-apiserver's --service-cluster-ip-range),
	// which no pod CIDR may overlap; empty: unknown. The cluster CIDRs are
	// Conflist.NonMasqueradeCIDRs.
	ServiceCIDRs []netip.Prefix
	// RuntimeEndpoint is the container runtime's CRI socket, asked which pod sandboxes exist so
	// that attachments of sandboxes that died without a CNI DEL are collected; "" turns the
	// collection off.
	RuntimeEndpoint string
	StaleGrace      time.Duration // default DefaultStaleGrace
	StaleInterval   time.Duration // default DefaultStaleInterval
	// NetworkPolicy turns NetworkPolicy enforcement on (agent/policy; the conflist's
	// networkPolicy key). Off, the agent removes the policy table once the conflist without the
	// key is written.
	NetworkPolicy bool
	// PolicyDropLog turns the NetworkPolicy drop log on (Group not 0; agent/policy): what the
	// policies drop is sent rate-limited to that NFLOG group and written as JSON lines on
	// stdout. The drop counters (metrics) are there either way.
	PolicyDropLog policyrules.DropLog
	// Networking is the networking/v1 client the NetworkPolicy controller watches policies
	// with; required when NetworkPolicy is on.
	Networking typednetworkingv1.NetworkingV1Interface
	// PolicyCutEstablished removes the conntrack entries of connections a policy change now
	// denies (policy.Config.CutEstablished); off, they flow until they end, as the API allows.
	PolicyCutEstablished bool
	Logger               *slog.Logger
	// Registry receives the agent's metrics and is what /metrics serves; nil: a private one.
	Registry *prometheus.Registry
	// HealPeriod turns the healer on (heal.go): the node-wide state of the network is
	// re-asserted on nftables change events and at least this often. Zero: off (the binary's
	// --heal-period defaults to DefaultHealPeriod); the healer changes the kernel state of the
	// namespace the agent runs in, which an embedder or a test may not want.
	HealPeriod time.Duration
	// Routing is how other nodes' pods are reached (default RoutingAuto); the overlay's device,
	// VNI and UDP port default to overlay.DefaultDevice, DefaultVNI and DefaultPort (8472).
	Routing     Routing
	VXLANDevice string
	VXLANVNI    uint32
	VXLANPort   uint16
}

// Agent is one node's agent. Create it with New and start it with Run.
type Agent struct {
	cfg     Config
	client  typedcorev1.CoreV1Interface
	log     *slog.Logger
	metrics *metrics
	table   routes.Table
	nodes   corelisters.NodeLister
	synced  cache.InformerSynced

	loops  controllers
	policy *policy.Controller // nil when NetworkPolicy is off

	syncState
	reports
	// lastUnderlay is the node's underlay address as its Node said at the last sync that found
	// it (the sync loop's goroutine only).
	lastUnderlay netip.Addr
}

// controllers are the agent's loops (agent/loop), each one controller's passes.
type controllers struct {
	// sync runs the node sync (Agent.sync: conflist, routes, overlay, condition): on Node events,
	// on kernel events that undo its work, after heal passes, and on failure after a backoff.
	sync *loop.Loop
	// heal re-asserts the node-wide state (heal.go); nil when HealPeriod is 0.
	heal *healer
}

// The node sync's triggers.
const (
	syncNodes  = "nodes"  // a Node event (the informer's resyncs too: the periodic repair)
	syncKernel = "kernel" // a route, overlay device or entry of the agent's went, or its events were lost
	syncHealed = "healed" // a heal pass ran on an nftables event: the overlay's firewall, which the healer does not own, is compared again
)

// syncState is what the syncs found and did, for /readyz, /peers and the other loops; mu guards
// it.
type syncState struct {
	mu       sync.Mutex
	ready    bool      // the conflist for the current pod CIDRs is written
	notReady string    // why not, for /readyz
	inSync   time.Time // start of the running sync; zero between syncs
	lastCIDR []netip.Prefix
	// network is the plugin's configuration of the conflist last written (nil before): the
	// network the stale-attachment collection and the healer work on.
	network *core.Config
	// patched is the NetworkUnavailable condition the agent last wrote: its own write, seen
	// again by the informer, needs no sync.
	patched Condition
	// paths is how each peer pod CIDR was reached after the last sync (for /peers); overlayDev
	// the overlay device's index (0: none), which the overlay watcher follows.
	paths      []Path
	overlayDev int
	watching   bool // the kernel event subscriptions are open (watchKernel)
}

// reports are the Events recorded on the agent's Node and what was reported last, so that each
// reason is recorded once.
type reports struct {
	events        record.EventRecorder
	refusedOwn    string
	refusedRoutes map[string]bool
	reportedPaths map[netip.Prefix]string // the path (Via) of each peer CIDR last reported
}

// New checks cfg and builds the agent.
func New(client typedcorev1.CoreV1Interface, cfg Config) (*Agent, error) {
	if cfg.NodeName == "" {
		return nil, errors.New("agent: no node name (set NODE_NAME or --node-name)")
	}
	if cfg.ConfDir == "" {
		cfg.ConfDir = DefaultConfDir
	}
	if cfg.ConfFile == "" {
		cfg.ConfFile = cnidir.DefaultFileName
	}
	if cfg.BinDir == "" {
		cfg.BinDir = DefaultBinDir
	}
	if cfg.RouteProtocol == 0 {
		cfg.RouteProtocol = routes.DefaultProtocol
	}
	if cfg.RouteProtocol < 0 || cfg.RouteProtocol > 255 {
		return nil, fmt.Errorf("agent: route protocol %d: must be between 1 and 255", cfg.RouteProtocol)
	}
	if cfg.ResyncPeriod == 0 {
		cfg.ResyncPeriod = DefaultResyncPeriod
	}
	if cfg.StaleGrace == 0 {
		cfg.StaleGrace = DefaultStaleGrace
	}
	if cfg.StaleInterval == 0 {
		cfg.StaleInterval = DefaultStaleInterval
	}
	if cfg.StaleGrace < 0 || cfg.StaleInterval < 0 {
		return nil, fmt.Errorf("agent: stale-attachment grace %s and interval %s must be positive", cfg.StaleGrace, cfg.StaleInterval)
	}
	if cfg.Routing == "" {
		cfg.Routing = RoutingAuto
	}
	if _, err := ParseRouting(string(cfg.Routing)); err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	if cfg.VXLANDevice == "" {
		cfg.VXLANDevice = core.DefaultOverlayDevice
	}
	if cfg.VXLANVNI == 0 {
		cfg.VXLANVNI = core.DefaultOverlayVNI
	}
	if cfg.VXLANVNI >= 1<<24 {
		return nil, fmt.Errorf("agent: VXLAN VNI %d: must be between 1 and 16777215", cfg.VXLANVNI)
	}
	if cfg.VXLANPort == 0 {
		cfg.VXLANPort = core.DefaultOverlayPort
	}
	if cfg.HealPeriod < 0 {
		return nil, fmt.Errorf("agent: heal period %s: must not be negative", cfg.HealPeriod)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	// Render once with placeholder CIDRs, of the families the cluster CIDRs have, so that a bad
	// MTU or hairpin mode stops the agent at start, not at the moment the node gets its CIDR.
	probe := cfg.Conflist
	probe.PodCIDRs = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24")}
	if slices.ContainsFunc(cfg.Conflist.NonMasqueradeCIDRs, func(p netip.Prefix) bool { return p.Addr().Is6() }) {
		probe.PodCIDRs = append(probe.PodCIDRs, netip.MustParsePrefix("fd00::/64"))
	}
	if _, err := cnidir.Render(probe); err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	m, err := newMetrics(cfg.Registry)
	if err != nil {
		return nil, fmt.Errorf("agent: register metrics: %w", err)
	}
	cfg.Conflist.NetworkPolicy = cfg.NetworkPolicy
	a := &Agent{
		cfg:     cfg,
		client:  client,
		log:     cfg.Logger,
		metrics: m,
		table:   routes.Table{Protocol: cfg.RouteProtocol},
	}
	a.notReady = "starting"
	a.loops.sync = loop.New(loop.Config{
		Pass: a.syncPass,
		// Retries of a failed sync back off from half a second to two minutes: a peer that is
		// not on-link keeps failing, and its re-check must not spin.
		BackoffMin: 500 * time.Millisecond, BackoffMax: 2 * time.Minute,
		OnFailure: func(err error, failures int, _ time.Duration) {
			a.log.Warn("sync incomplete, retrying", "err", err, "retries", failures)
		},
	})
	if cfg.HealPeriod > 0 {
		a.loops.heal = a.newHealer()
	}
	if cfg.NetworkPolicy {
		a.policy, err = policy.New(client, cfg.Networking, policy.Config{DataDir: dataDir(cfg), Network: networkName(cfg),
			Bridge: bridgeName(cfg), NodeName: cfg.NodeName, PodCIDRs: a.podCIDRs, Logger: cfg.Logger, Registry: cfg.Registry,
			CutEstablished: cfg.PolicyCutEstablished, DropLog: cfg.PolicyDropLog})
		if err != nil {
			return nil, fmt.Errorf("agent: %w", err)
		}
		if a.loops.heal != nil {
			a.loops.heal.ours = ownedBy(committedByUs, a.policy.Committed, selfComm())
		}
	}
	return a, nil
}

// bridgeName is the network's bridge.
func bridgeName(cfg Config) string { return cmp.Or(cfg.Conflist.Bridge, core.DefaultBridge) }

// podCIDRs are the pod CIDRs of the conflist last written (nil before).
func (a *Agent) podCIDRs() []netip.Prefix {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.lastCIDR)
}

// Run installs the binary, then runs the controllers until ctx ends: the healer and the
// stale-attachment collection at once, the node sync and the policy controller once the Node
// informer has synced.
func (a *Agent) Run(ctx context.Context) error {
	if a.cfg.BinSource != "" {
		// Before any conflist: a runtime that finds the conflist must find the plugin too.
		changed, err := cnidir.InstallBinary(a.cfg.BinSource, a.cfg.BinDir, "kubenet")
		if err != nil {
			return fmt.Errorf("agent: %w", err)
		}
		a.log.Info("kubenet binary in place", "dir", a.cfg.BinDir, "installed", changed)
	}
	// Every controller stops when Run returns: stop, then wait (defers run last first).
	var running sync.WaitGroup
	defer running.Wait()
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	if a.loops.heal != nil {
		running.Go(func() { a.loops.heal.run(ctx) })
	}
	if a.cfg.RuntimeEndpoint != "" {
		collector, closeRuntime, err := a.newCollector()
		if err != nil {
			return fmt.Errorf("agent: %w", err)
		}
		a.log.Info("collecting attachments of pod sandboxes the runtime no longer lists",
			"endpoint", a.cfg.RuntimeEndpoint, "grace", a.cfg.StaleGrace, "interval", a.cfg.StaleInterval)
		stale := a.staleLoop(collector)
		running.Go(func() { defer closeRuntime(); stale.Run(ctx) })
	}
	if a.events == nil {
		broadcaster := record.NewBroadcaster(record.WithContext(ctx))
		broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: a.client.Events("")})
		defer broadcaster.Shutdown()
		a.events = broadcaster.NewRecorder(eventScheme(), corev1.EventSource{Component: "kubenet-agent", Host: a.cfg.NodeName})
	}
	inf, err := a.nodeInformer()
	if err != nil {
		return err
	}
	running.Go(func() { inf.RunWithContext(ctx) })
	if !cache.WaitForCacheSync(ctx.Done(), a.synced) {
		// Only a stop ends the wait: an agent told to stop while it starts has not failed.
		return nil
	}
	a.log.Info("node informer synced", "node", a.cfg.NodeName)
	// Receiving every Node is the agent's one burst of allocation; the heap it grew for it would
	// otherwise stay resident for minutes.
	debug.FreeOSMemory()
	policyDone := make(chan error, 1)
	if a.policy != nil {
		running.Go(func() { policyDone <- a.policy.Run(ctx) })
	} else {
		policyDone <- nil
	}
	if a.cfg.ManageRoutes {
		a.resubscribeKernel(ctx)
	}
	a.loops.sync.Run(ctx)
	return <-policyDone
}

// nodeInformer builds the informer of Nodes, whose events ask for a sync.
func (a *Agent) nodeInformer() (cache.SharedIndexInformer, error) {
	inf := cache.NewSharedIndexInformerWithOptions(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return a.client.Nodes().List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return a.client.Nodes().Watch(ctx, o)
		},
	}, &corev1.Node{}, cache.SharedIndexInformerOptions{ResyncPeriod: a.cfg.ResyncPeriod})
	// The cache keeps only what the agent reads: a kubelet's Node carries images, capacity and
	// node info (10 KB and more each), which at a thousand Nodes would be most of the agent's
	// memory.
	if err := inf.SetTransform(slimNode); err != nil {
		return nil, fmt.Errorf("agent: node informer: %w", err)
	}
	a.nodes = corelisters.NewNodeLister(inf.GetIndexer())
	a.synced = inf.HasSynced
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { a.loops.sync.Fire(syncNodes) },
		UpdateFunc: func(oldObj, newObj any) {
			// Resyncs deliver old == new: they are the periodic repair, so they sync too.
			o, ok1 := oldObj.(*corev1.Node)
			n, ok2 := newObj.(*corev1.Node)
			if !ok1 || !ok2 || o.ResourceVersion == n.ResourceVersion || a.relevant(o, n) {
				a.loops.sync.Fire(syncNodes)
			}
		},
		DeleteFunc: func(any) { a.loops.sync.Fire(syncNodes) },
	}); err != nil {
		return nil, fmt.Errorf("agent: node informer: %w", err)
	}
	return inf, nil
}

func dataDir(cfg Config) string {
	if cfg.Conflist.DataDir != "" {
		return cfg.Conflist.DataDir
	}
	return core.DefaultDataDir
}

func networkName(cfg Config) string {
	if cfg.Conflist.Name != "" {
		return cfg.Conflist.Name
	}
	return cnidir.DefaultName
}

// relevant reports whether a Node update can change what the agent does: pod CIDRs and
// addresses of any node, and the agent's own node's condition (somebody may overwrite it).
// Other status updates (kubelet heartbeats, images) are frequent and change nothing here.
func (a *Agent) relevant(o, n *corev1.Node) bool {
	if !slices.Equal(o.Spec.PodCIDRs, n.Spec.PodCIDRs) || o.Spec.PodCIDR != n.Spec.PodCIDR ||
		!slices.Equal(o.Status.Addresses, n.Status.Addresses) {
		return true
	}
	if n.Name != a.cfg.NodeName {
		return false
	}
	oc, nc := findCondition(o), findCondition(n)
	if (oc == nil) == (nc == nil) && (oc == nil || conditionOf(oc) == conditionOf(nc)) {
		return false
	}
	// The agent's own patch coming back is no news; anybody else's change is.
	a.mu.Lock()
	patched := a.patched
	a.mu.Unlock()
	return nc == nil || conditionOf(nc) != patched
}

// syncPass is the node sync loop's pass.
func (a *Agent) syncPass(ctx context.Context, _ loop.Wake) loop.Outcome {
	err := a.sync(ctx)
	if err != nil {
		a.metrics.syncErrors.Inc()
	}
	return loop.Outcome{Err: err}
}

// sync converges the conflist, the routes and the node condition with the informer's view.
func (a *Agent) sync(ctx context.Context) error {
	started := time.Now()
	a.mu.Lock()
	a.inSync = started
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		a.inSync = time.Time{}
		a.mu.Unlock()
		a.metrics.lastSync.SetToCurrentTime()
		a.metrics.syncDuration.Observe(time.Since(started).Seconds())
	}()

	self, err := a.nodes.Get(a.cfg.NodeName)
	if apierrors.IsNotFound(err) {
		self = nil
	} else if err != nil {
		return fmt.Errorf("get node %s from the cache: %w", a.cfg.NodeName, err)
	}
	nodes, err := a.nodes.List(labels.Everything())
	if err != nil {
		return fmt.Errorf("list nodes from the cache: %w", err)
	}
	// The node's own networks, which no pod CIDR may overlap. Without them nothing is decided.
	kernel, err := a.table.Read(bridgeName(a.cfg), a.cfg.VXLANDevice)
	if err != nil {
		return err
	}
	cl := newClaims(nodes, CIDRRules{Cluster: a.cfg.Conflist.NonMasqueradeCIDRs, Services: a.cfg.ServiceCIDRs, Networks: kernel.Networks})
	var errs []error
	var want Want
	var ov overlayPlan
	if a.cfg.ManageRoutes {
		// Without its own Node (deleted, not registered again yet) the node keeps the
		// underlay address it had, as it keeps its conflist and direct routes: its pods keep
		// reaching the peers behind the overlay.
		underlay := underlayOf(self)
		if self == nil {
			underlay = a.lastUnderlay
		} else {
			a.lastUnderlay = underlay
		}
		want = cl.routes(a.cfg.NodeName, nodes, pathRules{mode: a.cfg.Routing, underlay: underlay})
		ov = a.planOverlay(&want, underlay)
	}
	cidrsReady, err := a.syncConflist(self, cl, ov.podMTU)
	if err != nil {
		errs = append(errs, err)
	}
	if cidrsReady && !a.cfg.NetworkPolicy {
		// The conflist without networkPolicy is in place, so no ADD guards new pods any more:
		// the guards and policy tables an earlier run left go (reads only when there are none).
		if err := core.RemovePolicies(networkName(a.cfg), bridgeName(a.cfg)); err != nil {
			errs = append(errs, err)
		}
	}
	if !a.cfg.ManageRoutes {
		// No routes, so no overlay: one left from a run that managed them would decapsulate
		// with an allowlist nobody keeps (cheap when there is none).
		if err := core.RemoveOverlay(a.cfg.VXLANDevice); err != nil {
			errs = append(errs, err)
		}
		return errors.Join(errs...)
	}
	a.resubscribeKernel(ctx)
	a.syncOverlay(&want, ov, nodes, cl)
	a.reportRefusedRoutes(self, want.Unusable)
	a.reportPaths(self, programmablePaths(want))
	failures := a.syncRoutes(want, kernel.Routes)
	a.log.Debug("routes synced", "nodes", len(nodes), "peers", len(want.Peers), "wanted", len(want.Routes), "failures", len(failures))
	if len(failures) > 0 {
		errs = append(errs, fmt.Errorf("%d route(s) not programmed", len(failures)))
	}
	// The condition speaks for the node's pod network: before the node has one, it is left to
	// whoever set it (some cloud setups set True at registration and wait for a route owner).
	if self != nil && cidrsReady {
		if err := a.syncCondition(ctx, self, RouteCondition(want.Peers, failures, want.Paths)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// syncConflist writes the conflist for the node's pod CIDRs and reports whether it is in place.
// Refused pod CIDRs write nothing: the conflist already there, if any, stays, so that the pods
// it attached can still be torn down.
// mtu, when not 0, is the largest the pods may have (the overlay's); the configured MTU is kept
// when it is smaller.
func (a *Agent) syncConflist(self *corev1.Node, cl *claims, mtu int) (bool, error) {
	if self == nil {
		a.setReady(false, fmt.Sprintf("node %s not found in the API", a.cfg.NodeName))
		a.log.Warn("own node not found; the conflist and routes stay as they are", "node", a.cfg.NodeName)
		return false, nil
	}
	cidrs, err := cl.own(self.Name)
	a.reportRefusedPodCIDRs(self, err)
	if err != nil {
		// Not retried: only a change of the Node (an event) or of the node's networks (the
		// periodic resync) can make these CIDRs acceptable.
		a.setReady(false, err.Error())
		a.log.Error("pod CIDRs refused: no conflist written", "node", self.Name, "err", err)
		return false, nil
	}
	if len(cidrs) == 0 {
		// Nothing is written: a conflist without a pod CIDR would make every pod fail, while no
		// conflist keeps the node NotReady with "cni config uninitialized", which is the truth.
		a.setReady(false, "waiting for the node's pod CIDR (spec.podCIDRs)")
		return false, nil
	}
	opts := a.cfg.Conflist
	opts.PodCIDRs = cidrs
	if mtu > 0 && (opts.MTU == 0 || mtu < opts.MTU) {
		opts.MTU = mtu
	}
	data, err := cnidir.Render(opts)
	if err != nil {
		a.setReady(false, err.Error())
		return false, err
	}
	network, err := cnidir.NetworkConfig(opts)
	if err != nil {
		a.setReady(false, err.Error())
		return false, err
	}
	network.ToolRoot = a.cfg.ToolRoot
	path := filepath.Join(a.cfg.ConfDir, a.cfg.ConfFile)
	changed, err := cnidir.WriteFile(path, data, 0o644)
	if err != nil {
		a.setReady(false, err.Error())
		return false, err
	}
	a.mu.Lock()
	old := a.lastCIDR
	a.lastCIDR = cidrs
	a.network = network
	a.mu.Unlock()
	if old == nil || changed {
		// The healer sets the node up for the new configuration at once (bridge, rules).
		if a.loops.heal != nil {
			a.loops.heal.wake()
		}
	}
	if changed {
		a.metrics.confWrites.Inc()
		a.log.Info("conflist written", "path", path, "podCIDRs", cidrs)
	}
	if old != nil && !slices.Equal(old, cidrs) {
		// The plugin moves the bridge to the new gateways at the next ADD; pods still on the
		// old CIDR lose their gateway (README "Pod CIDR change").
		a.log.Warn("pod CIDR changed; pods attached under the old CIDR must be recreated", "old", old, "new", cidrs)
	}
	a.setReady(true, "")
	return true, nil
}

// syncRoutes converges the main table, read as current, and returns the wanted routes that are
// not in place.
func (a *Agent) syncRoutes(want Want, current []routes.Existing) []routes.Failure {
	plan := routes.Diff(current, want.Routes, a.cfg.RouteProtocol)
	for _, e := range plan.Delete {
		a.log.Info("deleting route", "dst", e.Dst, "gw", e.Gw)
	}
	for _, r := range plan.Replace {
		a.log.Info("replacing route", "dst", r.Dst, "gw", r.Gw, "node", r.Node)
	}
	for _, r := range plan.Add {
		a.log.Info("adding route", "dst", r.Dst, "gw", r.Gw, "node", r.Node)
	}
	failures := slices.Concat(want.Unusable, plan.Conflicts, a.table.Apply(plan))
	a.metrics.routeFailures.Reset()
	for _, f := range failures {
		a.log.Error("route not programmed", "node", f.Route.Node, "dst", f.Route.Dst, "gw", f.Route.Gw, "err", f.Err)
		a.metrics.routeFailures.WithLabelValues(f.Route.Node).Inc()
	}
	programmed := 0
	byPath := map[string]int{ViaDirect: 0, ViaVXLAN: 0}
	for _, r := range slices.Concat(plan.InPlace, plan.Replace, plan.Add) {
		if !slices.ContainsFunc(failures, func(f routes.Failure) bool { return f.Route.Dst == r.Dst }) {
			programmed++
			byPath[want.Paths[r.Dst].Via]++
		}
	}
	a.metrics.routes.Set(float64(programmed))
	for via, n := range byPath {
		a.metrics.paths.WithLabelValues(via).Set(float64(n))
	}
	a.recordPaths(want, failures)
	return failures
}

// syncCondition patches the node's NetworkUnavailable condition when it differs from c.
func (a *Agent) syncCondition(ctx context.Context, self *corev1.Node, c Condition) error {
	now := metav1.Now()
	transition := now
	if old := findCondition(self); old != nil {
		if old.Status == c.Status && old.Reason == c.Reason && old.Message == c.Message {
			return nil
		}
		if old.Status == c.Status {
			transition = old.LastTransitionTime
		}
	}
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.NodeCondition{{
		Type:               corev1.NodeNetworkUnavailable,
		Status:             c.Status,
		Reason:             c.Reason,
		Message:            c.Message,
		LastTransitionTime: transition,
		LastHeartbeatTime:  now,
	}}}})
	if err != nil {
		return fmt.Errorf("node condition: %w", err)
	}
	// A strategic merge patch merges conditions by type: other conditions (kubelet's) stay.
	if _, err := a.client.Nodes().PatchStatus(ctx, self.Name, patch); err != nil {
		return fmt.Errorf("set node %s condition NetworkUnavailable=%s: %w", self.Name, c.Status, err)
	}
	a.mu.Lock()
	a.patched = c
	a.mu.Unlock()
	a.log.Info("node condition set", "type", corev1.NodeNetworkUnavailable, "status", c.Status, "reason", c.Reason, "message", c.Message)
	return nil
}

// slimNode is the informer's transform: a Node with only the fields the agent reads (name,
// version, pod CIDRs, addresses, the NetworkUnavailable condition). Other objects (a deletion's
// tombstone) pass unchanged.
func slimNode(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	slim := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.Name, UID: n.UID, ResourceVersion: n.ResourceVersion},
		Spec:       corev1.NodeSpec{PodCIDR: n.Spec.PodCIDR, PodCIDRs: n.Spec.PodCIDRs},
		Status:     corev1.NodeStatus{Addresses: n.Status.Addresses},
	}
	if c := findCondition(n); c != nil {
		slim.Status.Conditions = []corev1.NodeCondition{*c}
	}
	return slim, nil
}

// eventScheme knows the one kind the agent records Events about. client-go's scheme would know
// every API group, and with it bring all of their code into the binary.
func eventScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(corev1.AddToScheme(s))
	return s
}

func conditionOf(c *corev1.NodeCondition) Condition {
	return Condition{Status: c.Status, Reason: c.Reason, Message: c.Message}
}

func findCondition(n *corev1.Node) *corev1.NodeCondition {
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == corev1.NodeNetworkUnavailable {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}

func (a *Agent) setReady(ready bool, why string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.ready, a.notReady = ready, why
	if ready {
		a.metrics.ready.Set(1)
	} else {
		a.metrics.ready.Set(0)
	}
}
