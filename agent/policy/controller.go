package policy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	typednetworkingv1 "k8s.io/client-go/kubernetes/typed/networking/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/kubenet-dev/kubenet/agent/loop"
	"github.com/kubenet-dev/kubenet/core"
	"github.com/kubenet-dev/kubenet/internal/policyrules"
)

// Defaults of Config.
const (
	// DefaultResync is how often the controller applies the ruleset with no event at all: it
	// repairs a table someone flushed and catches a missed file event. A pass that finds the
	// kernel as wanted only reads.
	DefaultResync = 30 * time.Second
	// retryMin and retryMax bound the backoff after a failed pass.
	retryMin = 200 * time.Millisecond
	retryMax = 30 * time.Second
	// DefaultMinGap is the shortest time between two passes that only changes ask for: a
	// tenant churning labels gets the node's rules updated this often, not once per change.
	DefaultMinGap = 20 * time.Millisecond
	// DefaultBusyGap is how many times its duration a pass leaves idle after it when changes
	// kept coming while it ran (loop.Config.BusyGap): under sustained churn the passes take at
	// most a twelfth of the time (a pass at issue 27's size takes the same 0.2 – 0.4 s of CPU
	// whether a gap gathered 10 changes or 100, so a shorter gap only burns more of the node's
	// CPU), and each batches the changes of the gap; a change that comes alone waits only
	// MinGap, and a new pod's record or a repair never waits for it (loop.Config.Urgent).
	DefaultBusyGap = 11
	// DefaultBusyFloor is the shortest wait after a busy pass (loop.Config.BusyFloor): under
	// sustained churn a remote change reaches the node's rules within about this plus a pass,
	// and passes that got cheap (a pod change's pass at issue 27's size is some 50 ms) run at
	// most once in it instead of twelve times their duration apart, so the agent's CPU falls
	// with their cost. Twice kube-proxy's default --min-sync-period (1 s).
	DefaultBusyFloor = 2 * time.Second
	// unpluggedMin is the first wait before a pass looks again for the bridge port of an
	// attachment whose record is there but whose veth is not a port yet (doubling up to retryMax).
	unpluggedMin = 50 * time.Millisecond
)

// Config is the controller's configuration.
type Config struct {
	DataDir string // the plugin's dataDir
	Network string // the CNI network name
	Bridge  string // the network's bridge (default core.DefaultBridge)
	// NodeName is this node: its pods are known by their attachment records only.
	NodeName string
	// PodCIDRs are this node's pod CIDRs (a function: the agent learns them after it starts).
	PodCIDRs func() []netip.Prefix
	Resync   time.Duration
	// CutEstablished marks cut, after every pass that changed the rules, conntrack's entries of
	// the connections they now deny (core.PolicyNetwork.CutEstablished).
	CutEstablished bool
	// MinGap is the shortest time between passes that only changes ask for (default
	// DefaultMinGap; negative: none).
	MinGap time.Duration
	// BusyGap is how many times its duration a pass during which changes kept coming leaves
	// idle after it (default DefaultBusyGap; negative: none).
	BusyGap float64
	// BusyFloor is the shortest wait after a busy pass (default DefaultBusyFloor; negative:
	// none).
	BusyFloor time.Duration
	Logger    *slog.Logger
	// Registry receives the controller's metrics; nil: none.
	Registry prometheus.Registerer
	// Events records the Events on policies whose allow lists were refused; nil: Run records
	// them through the core/v1 client.
	Events record.EventRecorder
	// DropLog turns the drop log on (Group not 0): the rules send what the policies drop to
	// that NFLOG group, rate-limited, and Run writes it to DropLogOut as JSON lines. Off, the
	// rules have no log action. The drop counters are there either way.
	DropLog policyrules.DropLog
	// DropLogOut receives the drop log's lines (default os.Stdout).
	DropLogOut io.Writer
}

// EventPolicyRefused is the reason of the Event on a NetworkPolicy when the allow list of a pod
// it selects was not installed on the node (over a limit, or refused by the kernel).
const EventPolicyRefused = "KubenetPolicyRefused"

// Controller keeps the node's policy table equal to what the cluster's NetworkPolicies say about
// the node's pods. Every event (a policy, pod or namespace changed in the API; an attachment
// record written or removed on the node) asks for one pass; a pass compiles what the changes since
// the last one can affect (Incremental) and applies the difference. Passes never overlap and a
// burst of events collapses into one.
type Controller struct {
	cfg        Config
	core       typedcorev1.CoreV1Interface
	networking typednetworkingv1.NetworkingV1Interface
	log        *slog.Logger
	loop       *loop.Loop // the passes: on every trigger, every Resync, after failures, for unplugged ports
	metrics    *metrics

	// The informers' stores; the changes noted since the last pass, by kind and key; the
	// compiler, which has the objects as of the last pass.
	stores  map[objectKind]cache.Store
	changes changes
	incr    *Incremental
	// passed, when set, is told of every pass (tests).
	passed func(Pass)
	// events records Events on policies; reported are the refusals recorded at the last pass
	// (each is recorded once, when it appears).
	events   record.EventRecorder
	reported map[string]bool
	// cutPending says the rules in force may deny connections no pass has cut yet: the next
	// pass cuts even if it changes nothing. True at start (an agent stopped between an apply and
	// its cut, or started with CutEstablished newly on, finds rules in force that its first pass
	// does not change) and after a pass that failed (its apply may have changed rules, its cut
	// may not have run or not to the end).
	cutPending bool
	// names is who is on each port of the node at the last pass, for the drop log and metrics.
	names atomic.Pointer[dropNames]
	// logLost counts what the drop log lost in the agent.
	logLost dropLost
	// applier keeps the allow lists' groups from one pass to the next.
	applier *core.PolicyApplier
}

// Pass is what one pass did.
type Pass struct {
	Applied policyrules.Applied
	// Guarded counts guards put back; NetfilterCall says the bridge's nf_call options were off
	// and were turned on (somebody else changed the node).
	Guarded       int
	NetfilterCall bool
	Verified      bool
	Unknown       int // local attachments whose pod the API does not have: still denied
	// Unplugged counts local attachments whose veth is not a port of the bridge (yet): held.
	Unplugged int
	// Cut counts conntrack entries of connections the new rules deny that were marked cut
	// (Config.CutEstablished).
	Cut uint
	// Compiled counts the local pods compiled (the others kept their rules); Full says the pass
	// compiled everything (the first) or checked the incremental result against a full compile
	// (the periodic resync).
	Compiled int
	Full     bool
	Took     time.Duration
	Err      error
}

// New builds the controller over the core/v1 (pods, namespaces) and networking/v1 clients.
func New(coreClient typedcorev1.CoreV1Interface, networking typednetworkingv1.NetworkingV1Interface, cfg Config) (*Controller, error) {
	if coreClient == nil || networking == nil {
		return nil, errors.New("network policy: no API client")
	}
	if cfg.DataDir == "" {
		cfg.DataDir = core.DefaultDataDir
	}
	if cfg.Network == "" {
		return nil, errors.New("network policy: no network name")
	}
	if cfg.Resync == 0 {
		cfg.Resync = DefaultResync
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Bridge == "" {
		cfg.Bridge = core.DefaultBridge
	}
	if cfg.MinGap == 0 {
		cfg.MinGap = DefaultMinGap
	}
	if cfg.BusyGap == 0 {
		cfg.BusyGap = DefaultBusyGap
	}
	if cfg.BusyFloor == 0 {
		cfg.BusyFloor = DefaultBusyFloor
	}
	if cfg.PodCIDRs == nil {
		cfg.PodCIDRs = func() []netip.Prefix { return nil }
	}
	m, err := newMetrics(cfg.Registry)
	if err != nil {
		return nil, fmt.Errorf("network policy metrics: %w", err)
	}
	if cfg.DropLogOut == nil {
		cfg.DropLogOut = os.Stdout
	}
	c := &Controller{cfg: cfg, core: coreClient, networking: networking, log: cfg.Logger, metrics: m,
		events: cfg.Events, reported: map[string]bool{}, cutPending: true, incr: NewIncremental(cfg.NodeName), applier: core.NewPolicyApplier()}
	c.names.Store(namesOf(policyrules.Ruleset{}))
	if cfg.Registry != nil {
		if err := cfg.Registry.Register(newDropsCollector(cfg.Network, c.names.Load, &c.logLost)); err != nil {
			return nil, fmt.Errorf("network policy metrics: %w", err)
		}
	}
	c.loop = loop.New(c.loopConfig())
	return c, nil
}

// The controller's triggers.
const (
	triggerChange = "change" // a policy, pod or namespace changed
	triggerRecord = "record" // an attachment record was written or removed: a pod may be held
	triggerVerify = "verify" // somebody else changed the ruleset: read every set back (Wake)
	triggerCheck  = "check"  // events were lost: compare the tables without their group elements (Check)
)

// OnPass registers f to be told of every pass (for tests). Call before Run.
func (c *Controller) OnPass(f func(Pass)) { c.passed = f }

// Wake asks for a pass that reads everything back and repairs it, without waiting (the agent's
// healer, after somebody else changed the ruleset).
func (c *Controller) Wake() { c.loop.Fire(triggerVerify) }

// Check asks for a pass that compares the tables, chains, rules and sets without reading the
// group sets' elements back, and repairs what differs, without waiting (the agent's healer, after
// nftables events were lost and the node was found intact). A check that finds a group damaged
// asks for a pass that reads every set back: whoever damaged it may have changed elements too.
func (c *Controller) Check() { c.loop.Fire(triggerCheck) }

func (c *Controller) wake() { c.loop.Fire(triggerChange) }

// Repaired counts what the agent's healer put back of the policy's node-wide state (the bridge's
// guard and nf_call options, which the healer's node setup and the passes both look at) with the
// passes' repairs: whoever gets there first, the repair is counted once.
func (c *Controller) Repaired(guards int, netfilterCall bool) {
	c.metrics.repaired(guards, netfilterCall)
}

// Run watches the API and the node's attachment records and applies until ctx ends. Nothing is
// applied before the informers have synced: a half-filled cache would look like fewer policies
// and release pods too early. The table stays when Run returns (a restart keeps the node's rules).
func (c *Controller) Run(ctx context.Context) error {
	podInf := informer(&corev1.Pod{},
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return c.core.Pods("").List(ctx, o)
		},
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return c.core.Pods("").Watch(ctx, o)
		})
	nsInf := informer(&corev1.Namespace{},
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return c.core.Namespaces().List(ctx, o)
		},
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return c.core.Namespaces().Watch(ctx, o)
		})
	npInf := informer(&networkingv1.NetworkPolicy{},
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return c.networking.NetworkPolicies("").List(ctx, o)
		},
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return c.networking.NetworkPolicies("").Watch(ctx, o)
		})
	for inf, transform := range map[cache.SharedIndexInformer]cache.TransformFunc{podInf: slimPod, nsInf: slimMeta, npInf: slimMeta} {
		if err := inf.SetTransform(transform); err != nil {
			return fmt.Errorf("network policy: %w", err)
		}
	}
	if err := podInf.AddIndexers(podIndexers(c.cfg.DropLog)); err != nil {
		return fmt.Errorf("network policy: %w", err)
	}
	c.stores = map[objectKind]cache.Store{kindPod: podInf.GetStore(), kindNamespace: nsInf.GetStore(), kindPolicy: npInf.GetStore()}
	for kind, inf := range map[objectKind]cache.SharedIndexInformer{kindPod: podInf, kindNamespace: nsInf, kindPolicy: npInf} {
		if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(o any) { c.changed(kind, o) },
			UpdateFunc: func(o, n any) { c.changedOn(kind, o, n) },
			DeleteFunc: func(o any) { c.changed(kind, o) },
		}); err != nil {
			return fmt.Errorf("network policy: %w", err)
		}
	}

	informerCtx, stopInformers := context.WithCancel(ctx)
	var running sync.WaitGroup
	for _, inf := range []cache.SharedIndexInformer{podInf, nsInf, npInf} {
		running.Go(func() { inf.RunWithContext(informerCtx) })
	}
	defer func() { stopInformers(); running.Wait() }()
	if !cache.WaitForCacheSync(ctx.Done(), podInf.HasSynced, nsInf.HasSynced, npInf.HasSynced) {
		// Only a stop ends the wait: an agent told to stop while it starts has not failed.
		return nil
	}
	c.log.Info("network policy informers synced")

	watcher, err := watchRecords(filepath.Join(c.cfg.DataDir, c.cfg.Network), func() { c.loop.Fire(triggerRecord) })
	if err != nil {
		// Without file events new pods still get their rules at the next API event or resync;
		// slower, not wrong (they stay pending until then).
		c.log.Warn("network policy: no file events for attachment records; relying on API events and the resync", "err", err)
	} else {
		defer watcher.close()
	}

	if c.events == nil {
		broadcaster := record.NewBroadcaster(record.WithContext(ctx))
		broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: c.core.Events("")})
		defer broadcaster.Shutdown()
		c.events = broadcaster.NewRecorder(runtime.NewScheme(), corev1.EventSource{Component: "kubenet-agent", Host: c.cfg.NodeName})
	}

	if c.cfg.DropLog.Group != 0 {
		r, err := core.OpenPolicyDropLog(c.cfg.Network, c.cfg.DropLog.Group, 0)
		if err != nil {
			// The rules log all the same (to nobody): drops stay counted, enforcement is whole.
			c.log.Error("network policy: no drop log", "err", err)
		} else {
			l := &dropLog{out: c.cfg.DropLogOut, network: c.cfg.Network, node: c.cfg.NodeName, log: c.log, names: c.names.Load,
				remote: remotePod(podInf.GetIndexer()), lost: &c.logLost, lines: c.metrics.logLines.Inc, now: time.Now}
			running.Go(func() { l.run(informerCtx, r) })
		}
	}

	c.loop.Run(ctx)
	c.applier.Close()
	return nil
}

// podIPIndex indexes the pods by their addresses (the drop log names the other end's pod).
const podIPIndex = "podIP"

// podIndexers are the pod informer's indexes: by address when the drop log is on (it names the
// other end's pod), none otherwise (10 000 pods' index is a few MiB nothing reads).
func podIndexers(dropLog policyrules.DropLog) cache.Indexers {
	if dropLog.Group == 0 {
		return cache.Indexers{}
	}
	return cache.Indexers{podIPIndex: indexPodIPs}
}

func indexPodIPs(obj any) ([]string, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok || p.Spec.HostNetwork {
		return nil, nil
	}
	var out []string
	for _, a := range podIPs(p) {
		out = append(out, a.String())
	}
	return out, nil
}

// remotePod names the pod that has an address in the API ("" when none or several running
// ones do): the other end of a drop, when it is not one of the node's pods.
func remotePod(pods cache.Indexer) func(netip.Addr) string {
	return func(a netip.Addr) string {
		objs, err := pods.ByIndex(podIPIndex, a.String())
		if err != nil {
			return ""
		}
		name := ""
		for _, o := range objs {
			p, ok := o.(*corev1.Pod)
			if !ok || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
				continue
			}
			if name != "" {
				return "" // two pods claim it: say neither
			}
			name = p.Namespace + "/" + p.Name
		}
		return name
	}
}

// loopConfig is the controller's loop. Passes that read every set back (verify): the first
// after a start, the periodic resync, retries and Wake; a change alone only compiles and applies.
// A pass that failed, or whose group the kernel refused (it may fit later: memory), is retried
// with a backoff. ADD writes the record (which wakes the controller) before it plugs the pod's
// veth into the bridge, and nothing announces the port: a pass that found unplugged attachments
// asks for another soon, and later the longer it takes (a crashed ADD's record stays until DEL
// or GC).
func (c *Controller) loopConfig() loop.Config {
	unplugged := time.Duration(0)
	return loop.Config{
		AtStart:   true,
		Period:    c.cfg.Resync,
		MinGap:    max(c.cfg.MinGap, 0),
		BusyGap:   max(c.cfg.BusyGap, 0),
		BusyFloor: max(c.cfg.BusyFloor, 0),
		// A repair the healer asks for (another tool flushed or changed the tables: the node
		// may forward unfiltered until the pass) does not wait for a tenant's churn.
		Prompt: []string{triggerVerify, triggerCheck},
		// A new pod is held until its pass: its record never waits for the churn.
		Urgent:     []string{triggerRecord},
		BackoffMin: retryMin, BackoffMax: retryMax,
		OnFailure: func(err error, _ int, retryIn time.Duration) {
			c.log.Warn("network policy pass failed, retrying", "err", err, "in", retryIn)
		},
		Pass: func(_ context.Context, w loop.Wake) loop.Outcome {
			p := c.pass(w.Start || w.Periodic || w.Retry || w.Fired(triggerVerify), w.Periodic)
			if p.Err != nil || kernelRefused(p.Applied.Refused) {
				return loop.Outcome{Err: p.Err, Retry: true}
			}
			if needsReadBack(p) {
				c.loop.Fire(triggerVerify)
			}
			if p.Unplugged == 0 {
				unplugged = 0
			} else {
				unplugged = min(max(2*unplugged, unpluggedMin), retryMax)
			}
			return loop.Outcome{After: unplugged}
		},
	}
}

// needsReadBack tells whether a pass that did not read the group sets back (a change or a
// check) found a group whose chain or sets somebody else changed: whoever did may have changed
// set elements too, which only a read-back of every set sees.
func needsReadBack(p Pass) bool { return !p.Verified && p.Applied.RepairedGroups > 0 }

// informer is a shared informer over one list and watch (the agent links only the typed
// clients it needs, not a clientset of every API group), without the namespace index: the
// controller lists nothing by namespace from the stores.
func informer(obj runtime.Object, list func(context.Context, metav1.ListOptions) (runtime.Object, error), watchFn func(context.Context, metav1.ListOptions) (watch.Interface, error)) cache.SharedIndexInformer {
	return cache.NewSharedIndexInformerWithOptions(&cache.ListWatch{ListWithContextFunc: list, WatchFuncWithContext: watchFn}, obj,
		cache.SharedIndexInformerOptions{Indexers: cache.Indexers{}}) // not nil: AddIndexers adds to it
}

// The kinds of objects the controller watches.
type objectKind int

const (
	kindPod objectKind = iota
	kindNamespace
	kindPolicy
)

// changes are the keys of the objects that changed since the last pass, by kind; primed: the
// compiler has had every object once (the first pass reads them all).
type changes struct {
	mu     sync.Mutex
	keys   [3]map[string]bool
	primed bool
}

// changed notes that an object was added, changed or deleted, and wakes the loop.
func (c *Controller) changed(kind objectKind, obj any) {
	key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	if err != nil {
		c.log.Warn("network policy: an object without a key", "err", err)
		return
	}
	c.changes.mu.Lock()
	if c.changes.keys[kind] == nil {
		c.changes.keys[kind] = map[string]bool{}
	}
	c.changes.keys[kind][key] = true
	c.changes.mu.Unlock()
	c.wake()
}

// changedOn notes an update unless it changed nothing the compiler reads (the slim objects are
// equal): pods' status updates are frequent and mostly about conditions.
func (c *Controller) changedOn(kind objectKind, o, n any) {
	if om, ok := o.(metav1.Object); ok {
		if nm, ok := n.(metav1.Object); ok && om.GetResourceVersion() == nm.GetResourceVersion() {
			return // a resync of the informer, with no change
		}
	}
	op, ok1 := o.(*corev1.Pod)
	np, ok2 := n.(*corev1.Pod)
	if ok1 && ok2 && samePod(op, np) {
		return
	}
	c.changed(kind, n)
}

// sync tells the compiler of the objects that changed since the last pass, as the informers'
// stores have them now (every object at the first pass).
func (c *Controller) sync() {
	c.changes.mu.Lock()
	keys, all := c.changes.keys, !c.changes.primed
	c.changes.keys, c.changes.primed = [3]map[string]bool{}, true
	c.changes.mu.Unlock()
	set := [3]func(key string, obj any){
		kindPod:       func(key string, obj any) { p, _ := obj.(*corev1.Pod); c.incr.SetPod(key, p) },
		kindNamespace: func(key string, obj any) { ns, _ := obj.(*corev1.Namespace); c.incr.SetNamespace(key, ns) },
		kindPolicy:    func(key string, obj any) { np, _ := obj.(*networkingv1.NetworkPolicy); c.incr.SetPolicy(key, np) },
	}
	for kind, store := range c.stores {
		if all {
			keys[kind] = map[string]bool{}
			for _, key := range store.ListKeys() {
				keys[kind][key] = true
			}
		}
		for key := range keys[kind] {
			obj, ok, err := store.GetByKey(key)
			if err != nil || !ok {
				obj = nil // deleted (a store in memory does not fail)
			}
			set[kind](key, obj)
		}
	}
}

// compile compiles the local pods incrementally; full compares the result with a full compile,
// and a difference (a bug) is logged, counted, and the full result used.
func (c *Controller) compile(local []Local, cidrs []netip.Prefix, full bool, p *Pass) Result {
	res := c.incr.Compile(local, cidrs)
	p.Compiled = c.incr.Compiled()
	p.Full = full || c.incr.Full()
	if !full {
		return res
	}
	want := Compile(c.incr.Input(local, cidrs))
	if !reflect.DeepEqual(res, want) {
		c.metrics.divergences.Inc()
		c.log.Error("network policy: the incremental compile differs from the full one; using the full one", "localPods", len(local))
		c.incr.Reset()
		return want
	}
	return res
}

// Committed tells whether a transaction the kernel announces as committed through netlink port
// portid was one of the controller's passes (core.PolicyApplier.Committed).
func (c *Controller) Committed(portid uint32) bool { return c.applier.Committed(portid) }

// pass compiles and applies once; verify reads every set back, check compares the incremental
// compile with a full one.
func (c *Controller) pass(verify, check bool) Pass {
	start := time.Now()
	p := Pass{Verified: verify}
	c.sync()
	cidrs := c.cfg.PodCIDRs()
	pass, err := core.ApplyPolicies(core.PolicyNetwork{DataDir: c.cfg.DataDir, Network: c.cfg.Network, Bridge: c.cfg.Bridge, PodCIDRs: cidrs, Verify: verify,
		Log: c.cfg.DropLog, CutEstablished: c.cfg.CutEstablished, CutAgain: c.cutPending, Applier: c.applier},
		func(locals []core.PolicyLocal) policyrules.Ruleset {
			local := LocalsOf(locals)
			for _, l := range locals {
				if l.Port == 0 {
					p.Unplugged++
				}
			}
			res := c.compile(local, cidrs, check && c.incr.Built(), &p)
			c.names.Store(namesOf(res.Ruleset))
			p.Unknown = len(res.Unknown)
			c.metrics.observe(c.incr.Policies(), res)
			return res.Ruleset
		})
	p.Applied, p.Guarded, p.NetfilterCall, p.Cut = pass.Applied, pass.Guarded, pass.NetfilterCall, pass.Cut
	if err == nil {
		// The rules are in force; a failed cut fails the pass, so that it is tried again.
		err = pass.CutErr
	}
	c.cutPending = err != nil
	if pass.Unguarded != nil {
		c.log.Error("network policy: ports without their guard (their pods are judged by the rules, without the backstop; recreate them)", "err", pass.Unguarded)
	}
	if pass.Unrecorded != nil {
		c.log.Warn("network policy: applied, but not recorded for kubenetctl policy explain", "err", pass.Unrecorded)
	}
	p.Took, p.Err = time.Since(start), err
	c.metrics.pass(p)
	if err == nil {
		var in Input
		if len(p.Applied.Refused) > 0 {
			in = c.incr.Input(nil, nil)
		}
		c.reportRefused(in, p.Applied.Refused)
	}
	if p.Guarded > 0 || p.NetfilterCall {
		c.log.Warn("network policy: put back what somebody removed", "guards", p.Guarded, "bridgeNetfilterCallTurnedOn", p.NetfilterCall)
	}
	if err == nil && p.Applied.Changed() {
		a := p.Applied
		c.log.Info("network policy applied", "groups", a.Groups, "newGroups", a.NewGroups, "editedGroups", a.EditedGroups, "repairedGroups", a.RepairedGroups,
			"removedGroups", a.RemovedGroups, "mapChanges", a.MapChanges, "released", a.Released, "conntrackRemoved", a.Conntrack,
			"fixedWritten", a.FixedWritten, "transactions", a.Transactions, "unknownPods", p.Unknown, "cutConnections", p.Cut, "verified", verify,
			"compiledPods", p.Compiled, "full", p.Full, "took", p.Took)
	}
	if err == nil && c.incr.Full() { // the first pass, or one after the compiler started over
		c.log.Info("network policy: compiled everything", "localPods", p.Compiled, "policies", c.incr.Policies(), "took", p.Took)
	}
	if c.passed != nil {
		c.passed(p)
	}
	return p
}

// kernelRefused tells whether the kernel refused an allow list (a limit's refusal stays until
// the list changes).
func kernelRefused(refused []policyrules.Refusal) bool {
	return slices.ContainsFunc(refused, func(r policyrules.Refusal) bool { return !errors.Is(r.Err, policyrules.ErrTooBig) })
}

// reportRefused logs every refusal that is new since the last pass and records it as an Event
// on each policy that selects its pods in its direction: the policies' authors see why their
// pods do not get what they ask for.
func (c *Controller) reportRefused(in Input, refused []policyrules.Refusal) {
	pods := make(map[string]*corev1.Pod, len(in.Pods))
	for _, p := range in.Pods {
		pods[p.Namespace+"/"+p.Name] = p
	}
	now := map[string]bool{}
	for _, r := range refused {
		dir := "egress"
		if r.Ingress {
			dir = "ingress"
		}
		msg := fmt.Sprintf("the %s allow list of pod %s", dir, r.Pods[0])
		if len(r.Pods) > 1 {
			msg += fmt.Sprintf(" and %d more pods", len(r.Pods)-1)
		}
		msg += fmt.Sprintf(" is not installed on node %s: %v; they keep what they had in that direction, or are denied", c.cfg.NodeName, r.Err)
		for _, np := range selecting(in.Policies, pods, r.Pods, r.Ingress) {
			key := np.Namespace + "/" + np.Name + "\x00" + msg
			now[key] = true
			if c.reported[key] {
				continue
			}
			c.log.Warn("network policy: allow list not installed", "policy", np.Namespace+"/"+np.Name, "direction", dir, "pods", r.Pods, "group", r.Group, "cost", r.Cost, "err", r.Err)
			c.events.Event(&corev1.ObjectReference{Kind: "NetworkPolicy", APIVersion: "networking.k8s.io/v1", Namespace: np.Namespace, Name: np.Name, UID: np.UID},
				corev1.EventTypeWarning, EventPolicyRefused, msg)
		}
	}
	c.reported = now
}

// selecting lists the policies that select one of the pods (by "namespace/name") and isolate it
// in the direction.
func selecting(policies []*networkingv1.NetworkPolicy, pods map[string]*corev1.Pod, names []string, ingress bool) []*networkingv1.NetworkPolicy {
	var out []*networkingv1.NetworkPolicy
	for _, np := range policies {
		in, eg, known := policyTypes(np)
		if !known {
			in, eg = true, true // Compile isolates both directions then
		}
		if (ingress && !in) || (!ingress && !eg) {
			continue
		}
		if slices.ContainsFunc(names, func(name string) bool {
			pod, ok := pods[name]
			if !ok || pod.Namespace != np.Namespace {
				return false
			}
			selected, _ := policySelects(&np.Spec.PodSelector, pod.Labels)
			return selected
		}) {
			out = append(out, np)
		}
	}
	return out
}

// LocalsOf turns the node's attachments into Locals. The pod's name comes from CNI_ARGS
// ("namespace/name"); a record without one is a container that is no Kubernetes pod. The pod's
// addresses are its record's and its link-local one.
func LocalsOf(locals []core.PolicyLocal) []Local {
	out := make([]Local, 0, len(locals))
	for _, r := range locals {
		l := Local{Port: r.Port}
		if ns, name, ok := strings.Cut(r.Pod, "/"); ok && ns != "" && name != "" {
			l.Namespace, l.Name = ns, name
		}
		for _, p := range r.IPs {
			l.IPs = append(l.IPs, p.Addr().Unmap())
		}
		if r.LinkLocal.IsValid() {
			l.IPs = append(l.IPs, r.LinkLocal)
		}
		out = append(out, l)
	}
	return out
}

// slimPod keeps of a pod what the compiler reads (name, labels, node, host network, container
// ports, phase, addresses): a thousand pods then cost a few MiB, not tens.
func slimPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil // a tombstone: deletions only need the key
	}
	slim := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID, Labels: p.Labels, ResourceVersion: p.ResourceVersion},
		Spec:       corev1.PodSpec{NodeName: p.Spec.NodeName, HostNetwork: p.Spec.HostNetwork},
		Status:     corev1.PodStatus{Phase: p.Status.Phase, PodIP: p.Status.PodIP, PodIPs: p.Status.PodIPs},
	}
	slim.Spec.Containers = portsOnly(p.Spec.Containers)
	slim.Spec.InitContainers = portsOnly(p.Spec.InitContainers)
	return slim, nil
}

func portsOnly(cs []corev1.Container) []corev1.Container {
	var out []corev1.Container
	for _, c := range cs {
		if len(c.Ports) > 0 {
			out = append(out, corev1.Container{Name: c.Name, Ports: c.Ports})
		}
	}
	return out
}

// slimMeta drops what no controller reads of namespaces and policies (managed fields and
// annotations, which hold a copy of the whole object after kubectl apply), but a policy's
// AuditAnnotation.
func slimMeta(obj any) (any, error) {
	if m, ok := obj.(metav1.Object); ok {
		m.SetManagedFields(nil)
		var keep map[string]string
		if mode, ok := m.GetAnnotations()[AuditAnnotation]; ok {
			keep = map[string]string{AuditAnnotation: mode}
		}
		m.SetAnnotations(keep)
	}
	return obj, nil
}

// samePod compares what the compiler reads of two slim pods.
func samePod(a, b *corev1.Pod) bool {
	a2, b2 := *a, *b
	a2.ResourceVersion, b2.ResourceVersion = "", ""
	return reflect.DeepEqual(a2.ObjectMeta, b2.ObjectMeta) && reflect.DeepEqual(a2.Spec, b2.Spec) && reflect.DeepEqual(a2.Status, b2.Status)
}
