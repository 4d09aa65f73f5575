package agent

import (
	"context"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/kubenet-dev/kubenet/agent/loop"
	"github.com/kubenet-dev/kubenet/core"
	"github.com/kubenet-dev/kubenet/internal/nft"
)

// DefaultHealPeriod is how often the healer re-asserts the node-wide state and compares every
// hostPort map element with the plugin's ownership index, whether or not an nftables event came.
const DefaultHealPeriod = 30 * time.Second

// The healer keeps the node-wide state of the kubenet network as the plugin set it up: the
// sysctls, the bridge, the SNAT, duplicate-frame and host-port rules (the localnet guard among
// them), and the hostPort map elements of running pods. Another tool that reloads the firewall
// runs `nft flush ruleset`; until something puts kubenet's rules back, pods reach services bound
// to the node's 127.0.0.0/8 (route_localnet stays on) and host ports lead nowhere. The plugin
// restores them at the next ADD, but a node may go long without one, and STATUS reports the node
// not ready meanwhile. The healer reacts to nftables change events (NFNLGRP_NFTABLES) that touch
// the network's tables, and also runs on a timer because events can be lost (the multicast
// socket overflows) and element deletions are not watched (every pod's ADD and DEL makes them).
type healer struct {
	log    *slog.Logger
	period time.Duration
	// config returns the plugin configuration of the network, or nil while there is none (no
	// pod CIDR yet).
	config func() (*core.Config, error)
	// done, when not nil, is told of every pass (tests wait on it).
	done func(healPass)
	// loop runs the passes (newHealer): at start and every period a full one, and one on
	// every trigger below, minGap after the previous pass ended: the healer's own writes are
	// events too, and a rule that kept being changed back (another tool fighting over it) must
	// not make it spin, however long a pass takes.
	loop *loop.Loop
	subs *subscriptions // open while run runs
	// openTables and openLinks subscribe to nftables and link events (watchTables,
	// watchBridges; tests replace them).
	openTables, openLinks opener
	// tablesLost and linksLost: the subscription could not be opened (the loop's goroutine
	// only); each pass tries again, and one is asked for after resubscribeWait.
	tablesLost, linksLost bool
	resubscribeWait       time.Duration
	// ours tells whether an nftables transaction was committed by this process (committedByUs;
	// tests replace it): the agent's own writes, the policy controller's group rebuilds above
	// all, are no change by somebody else and wake nothing.
	ours func(nftBatch) bool
}

// opener subscribes to events on the calling goroutine and returns their forwarder (subscriptions.follow).
type opener func() (forward func(context.Context) bool, closeFn func(), err error)

// resubscribeMin is the first wait before a subscription that could not be opened is tried
// again; it doubles up to the heal period.
const resubscribeMin = time.Second

// healRetryMin is the shortest wait before a failed pass is tried again; it doubles up to the
// heal period.
const healRetryMin = 100 * time.Millisecond

// The healer's triggers.
const (
	healKick          = "kick"           // nftables events, and the agent when the conflist changed
	healTablesEnded   = "tables-ended"   // the nftables subscription ended: events were lost
	healLinksEnded    = "links-ended"    // the link subscription ended
	healBridgeChanged = "bridge-changed" // a bridge changed: a pass only when the network's lost its nf_call options
)

// newHealer returns a healer; run starts it.
func newHealer(log *slog.Logger, period, minGap time.Duration, config func() (*core.Config, error), done func(healPass)) *healer {
	h := &healer{log: log, period: period, config: config, done: done, ours: committedByUs}
	h.openTables, h.openLinks = h.watchTables, h.watchBridges
	h.loop = loop.New(loop.Config{
		AtStart: true, // the first pass compares everything
		Period:  period,
		MinGap:  minGap,
		// A bridge change alone (one of the many a port joining or leaving makes) calls for a
		// pass only when the bridge lost its nf_call options, which no nftables event announces.
		Wanted: func(w loop.Wake) bool { return !w.OnlyFired(healBridgeChanged) || h.bridgeNeedsHeal() },
		// A failed pass (another tool deleting a table between two of the pass's transactions,
		// say) is tried again: no event may follow it, and the node would stay as the other
		// tool left it until the period.
		BackoffMin: max(minGap, healRetryMin),
		BackoffMax: max(period, healRetryMin),
		Pass: func(ctx context.Context, w loop.Wake) loop.Outcome {
			h.resubscribe(w)
			// The periodic pass takes the triggers that came as the period elapsed: an event's
			// or a lost subscription's ask of the policy controller must not be lost in it.
			err := h.pass(ctx, healPass{
				full:       w.Start || w.Periodic,
				announced:  w.Fired(healKick),
				eventsLost: w.Fired(healTablesEnded) && !w.Fired(healKick),
			})
			return loop.Outcome{Err: err, After: h.resubscribeLater()}
		},
	})
	return h
}

// wake asks for a pass without waiting.
func (h *healer) wake() { h.loop.Fire(healKick) }

// healPass is what one pass found and did.
type healPass struct {
	full bool // the periodic pass, which compares every map element
	// announced: an nftables event of another process's change (or the agent) asked for the
	// pass, the periodic one too.
	announced bool
	// eventsLost: the pass ran because the nftables subscription ended (its socket
	// overflowed) and no event asked for it: no event said that anything changed, the lost
	// ones may have.
	eventsLost bool
	err        error
	took       time.Duration
	core.NodeRepair
}

// run heals until ctx ends. All netlink work happens on the calling goroutine, in the caller's
// network namespace (the agent runs in the host's), the event subscriptions included; the
// goroutines that read events only forward signals.
func (h *healer) run(ctx context.Context) {
	h.subs = &subscriptions{ctx: ctx}
	defer h.subs.close()
	h.followTables()
	h.followLinks()
	h.loop.Run(ctx)
}

func (h *healer) followTables() {
	h.tablesLost = h.follow("nftables", h.openTables, healTablesEnded, h.tablesLost,
		"nftables events unavailable; the node-wide state is only checked periodically until they are back")
}

func (h *healer) followLinks() {
	h.linksLost = h.follow("link", h.openLinks, healLinksEnded, h.linksLost,
		"link events unavailable; the bridge's nf_call options are only checked periodically until they are back")
}

// follow subscribes with open; ended is the trigger fired when the subscription ends. It
// returns whether the subscription is lost (could not be opened), which wasLost says it was
// before: the failure is logged once, and the return when it opens again.
func (h *healer) follow(what string, open opener, ended string, wasLost bool, unavailable string) bool {
	if err := h.subs.follow(open, func() { h.loop.Fire(ended) }); err != nil {
		if !wasLost {
			h.log.Warn(unavailable, "err", err, "period", h.period)
		}
		return true
	}
	if wasLost {
		h.log.Info(what + " events available again")
	}
	return false
}

// resubscribe subscribes again to what ended (events were lost: the pass that follows looks at
// what may have changed) or could not be opened before.
func (h *healer) resubscribe(w loop.Wake) {
	if w.Fired(healTablesEnded) || h.tablesLost {
		h.followTables()
	}
	if w.Fired(healLinksEnded) {
		h.log.Warn("link event subscription ended; subscribing again")
	}
	if w.Fired(healLinksEnded) || h.linksLost {
		h.followLinks()
	}
}

// resubscribeLater is how long until the next attempt at a subscription that could not be
// opened (0: none is lost), each attempt waiting twice as long as the one before, up to the period.
func (h *healer) resubscribeLater() time.Duration {
	if !h.tablesLost && !h.linksLost {
		h.resubscribeWait = 0
		return 0
	}
	h.resubscribeWait = min(max(2*h.resubscribeWait, resubscribeMin), max(h.period, resubscribeMin))
	return h.resubscribeWait
}

// subscriptions are the healer's event subscriptions and the goroutines that forward them.
type subscriptions struct {
	ctx        context.Context
	forwarders sync.WaitGroup
	closers    []func()
}

// follow subscribes with open, on the calling goroutine (in its network namespace), and runs the
// forwarder it returns on a goroutine of its own; when the forwarder says the subscription ended
// before ctx (its socket overflowed: events were lost), the subscription is closed at once (the
// healer subscribes again; a socket kept until it stops would pile up with every overflow) and
// ended is called.
func (s *subscriptions) follow(open func() (forward func(context.Context) bool, closeFn func(), err error), ended func()) error {
	forward, closeFn, err := open()
	if err != nil {
		return err
	}
	closeOnce := sync.OnceFunc(closeFn)
	s.closers = append(s.closers, closeOnce)
	s.forwarders.Add(1)
	go func() {
		defer s.forwarders.Done()
		if forward(s.ctx) {
			closeOnce()
			ended()
		}
	}()
	return nil
}

// close ends every subscription and waits for the forwarders.
func (s *subscriptions) close() {
	for _, c := range s.closers {
		c()
	}
	s.forwarders.Wait()
}

// bridgeNeedsHeal tells whether the network's bridge lost its nf_call options (asked on the
// healer's goroutine: in the node's network namespace).
func (h *healer) bridgeNeedsHeal() bool {
	cfg, err := h.config()
	if cfg == nil || err != nil {
		return false
	}
	off, err := core.BridgeNetfilterCallOff(cfg)
	if err != nil {
		h.log.Warn("bridge options unreadable", "err", err)
		return true // a pass reports it properly
	}
	return off
}

// pass runs one HealNode with the current configuration; p says why (healPass) and gets what
// the pass found and did.
func (h *healer) pass(ctx context.Context, p healPass) error {
	cfg, err := h.config()
	if cfg == nil && err == nil {
		return nil // no pod CIDR yet: nothing is set up, nothing to keep
	}
	start := time.Now()
	if err != nil {
		p.err = err
	} else {
		p.NodeRepair, p.err = core.HealNode(ctx, cfg, p.full)
	}
	p.took = time.Since(start)
	switch {
	case p.err != nil:
		h.log.Error("node-wide state of the kubenet network not restored", "err", p.err)
	case p.SetUp:
		h.log.Info("node-wide state of the kubenet network set up", "took", p.took)
	case p.repaired():
		h.log.Warn("node-wide state of the kubenet network restored", "found", p.Found, "restoredHostPortElements", p.Restored, "restoredIsolationPorts", p.IsolatedPorts,
			"policyGuards", p.PolicyGuards, "bridgeNetfilterCallTurnedOn", p.NetfilterCall, "took", p.took)
	}
	if h.done != nil {
		h.done(p)
	}
	return p.err
}

// routine tells whether the pass is a periodic one that nothing else asked for and that found
// nothing to put back: the other controllers have periods of their own.
func (p healPass) routine() bool {
	return p.full && !p.announced && !p.eventsLost && !p.repaired()
}

// repaired tells whether the pass found something changed by somebody else and put it back.
func (p healPass) repaired() bool {
	return p.Found != nil || p.Restored > 0 || p.PolicyGuards > 0 || p.NetfilterCall
}

// watchTables subscribes to nftables change events, forwarded as wake-ups.
func (h *healer) watchTables() (func(context.Context) bool, func(), error) {
	events, closeEvents, err := subscribeTables(tableEventsBuffer)
	if err != nil {
		return nil, nil, err
	}
	return func(ctx context.Context) bool { return h.forward(ctx, events, h.wake) }, closeEvents, nil
}

// watchBridges subscribes to link change events, forwarded as bridge changes.
func (h *healer) watchBridges() (func(context.Context) bool, func(), error) {
	updates, closeLinks, err := watchLinks()
	if err != nil {
		return nil, nil, err
	}
	return func(ctx context.Context) bool {
		return forwardBridges(ctx, updates, func() { h.loop.Fire(healBridgeChanged) })
	}, closeLinks, nil
}

// watchLinks subscribes to link change events (RTNLGRP_LINK) in the caller's network namespace.
// A bridge's nf_call options changed by `ip link set ... type bridge` or through sysfs are
// announced as a change of the bridge.
func watchLinks() (<-chan netlink.LinkUpdate, func(), error) {
	// A generous buffer: the subscription's reader blocks on a full channel, and while it does
	// the socket may overflow and end the subscription.
	updates := make(chan netlink.LinkUpdate, 256)
	done := make(chan struct{})
	if err := netlink.LinkSubscribeWithOptions(updates, done, netlink.LinkSubscribeOptions{}); err != nil {
		return nil, nil, err
	}
	return updates, func() { close(done) }, nil
}

// forwardBridges signals changed for every change of a bridge (the healer then asks whether it
// is the network's, and whether it needs anything). It returns true when the subscription
// ended before ctx. It does no netlink work.
func forwardBridges(ctx context.Context, updates <-chan netlink.LinkUpdate, changed func()) bool {
	for {
		select {
		case <-ctx.Done():
			return false
		case u, ok := <-updates:
			if ctx.Err() != nil {
				return false
			}
			if !ok {
				return true
			}
			if u.Header.Type == unix.RTM_NEWLINK && u.Link != nil && u.Link.Type() == "bridge" {
				changed()
			}
		}
	}
}

// forward signals a pass for every committed transaction of another process that changed a
// table, chain, rule or map of kubenet's (the agent's own transactions are what its loops
// planned: a heal pass, a policy read-back and a node sync for each of them were most of the
// agent's CPU while pods churn). It returns true when the subscription ended before ctx (the socket
// overflowed: events were lost, only a pass can tell what changed). It does no netlink work.
func (h *healer) forward(ctx context.Context, events <-chan nftBatch, wake func()) bool {
	for {
		select {
		case <-ctx.Done():
			return false
		case batch, ok := <-events:
			if ctx.Err() != nil {
				return false
			}
			if !ok {
				h.log.Warn("nftables event subscription ended; subscribing again")
				return true
			}
			if batch.err != nil {
				// The subscription ends after reporting its socket's error; the closed channel follows.
				h.log.Warn("nftables event subscription failed", "err", batch.err)
				continue
			}
			if slices.ContainsFunc(batch.changes, concernsKubenet) && !h.ours(batch) {
				wake()
			}
		}
	}
}

// ownedBy is the healer's test of its own process's transactions: those committedByUs finds, and
// those the policy controller committed (its passes are most of the agent's writes), known by
// the committing socket's netlink port id (policyCommitted) and this process's name (comm): that
// holds in a PID namespace of the agent's own too (a pod without hostPID), where the thread ids
// the kernel reports are not ours to read. Another process is taken for ours only with our name
// and a port id of one of the controller's sockets of the last seconds, which the kernel gives to
// nobody else while the socket is open.
func ownedBy(committedByUs func(nftBatch) bool, policyCommitted func(portid uint32) bool, comm string) func(nftBatch) bool {
	return func(b nftBatch) bool {
		return committedByUs(b) || (comm != "" && b.comm == comm && policyCommitted(b.portid))
	}
}

// selfComm is this process's name as the kernel reports it (comm); "" when unreadable.
func selfComm() string {
	comm, err := os.ReadFile("/proc/self/comm")
	if err != nil {
		return ""
	}
	return strings.TrimSuffix(string(comm), "\n")
}

// committedByUs tells whether the transaction of the batch was committed by a thread of this
// process. The kernel names the committing thread by its id in the initial PID namespace and by
// its name (comm); the thread is ours when /proc/self/task holds that id under the same name. An
// agent in a PID namespace of its own (a pod without hostPID) sees other ids there: its own
// transactions are then taken for somebody else's, which costs what it did before (a heal pass
// and a policy read-back each) and loses no repair. Another process could only be taken for ours
// by having a thread whose id in the initial namespace is the id of one of ours in our
// namespace, under our name.
func committedByUs(b nftBatch) bool {
	if b.pid == 0 {
		return false
	}
	comm, err := os.ReadFile("/proc/self/task/" + strconv.FormatUint(uint64(b.pid), 10) + "/comm")
	return err == nil && strings.TrimSuffix(string(comm), "\n") == b.comm
}

// concernsKubenet tells whether a change is of a table, chain, rule or set of a kubenet network
// (subscribeTables leaves element changes out: every pod's ADD and DEL makes them).
func concernsKubenet(c nftChange) bool {
	return strings.HasPrefix(c.table, nft.TableName("")) || core.IsPolicyTable(c.table)
}

// newHealer returns the agent's healer, which follows the plugin configuration of the conflist
// the agent wrote last.
func (a *Agent) newHealer() *healer {
	config := func() (*core.Config, error) {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.network, nil
	}
	return newHealer(a.log.With("component", "heal"), a.cfg.HealPeriod, 200*time.Millisecond, config, func(p healPass) {
		a.metrics.healed(p)
		// The policy table is node-wide state too, but the policy controller owns it: a
		// change by somebody else (a flushed ruleset) makes it compare and rewrite at once
		// instead of at its next resync, while the flushed node forwards unfiltered.
		if !p.routine() && a.cfg.ManageRoutes {
			// The overlay's firewall is a kubenet table too; the sync compares it (and writes
			// nothing when it is as planned).
			a.loops.sync.Fire(syncHealed)
		}
		if a.policy != nil {
			switch policyAskOf(p) {
			case policyVerify:
				a.policy.Wake()
			case policyCheck:
				a.policy.Check()
			}
			a.policy.Repaired(p.PolicyGuards, p.NetfilterCall)
		}
	})
}

// policyAsk is what a heal pass asks of the policy controller.
type policyAsk int

const (
	policyNothing policyAsk = iota // a routine periodic pass: the controller has its own resync
	// policyCheck: a pass that compares the policy tables' chains, rules and sets (not the
	// group sets' elements) and repairs what differs.
	policyCheck
	policyVerify // a pass that also reads every group set's elements back (Controller.Wake)
)

// policyAskOf: a periodic pass that nothing else asked for and that found the node intact asks
// nothing (the controller has its own resync). A change of a kubenet table announced by an event, or a node that the pass found
// changed (a flushed ruleset), may have touched anything of the policy tables: they are read
// back whole. A pass that ran only because events were lost and found the node intact asks for
// a check: the lost events were mostly the policy controller's own writes (the element events
// of its group rebuilds overflow the socket), elements are never watched anyway, and a check
// still repairs any table, chain, rule or set that another tool removed or changed, escalating
// to a read-back when it finds a group damaged (Controller.Check).
func policyAskOf(p healPass) policyAsk {
	switch {
	case p.routine():
		return policyNothing
	case p.eventsLost && p.err == nil && !p.repaired():
		return policyCheck
	default:
		return policyVerify
	}
}

// healed counts a pass in the metrics.
func (m *metrics) healed(p healPass) {
	switch {
	case p.err != nil:
		m.healErrors.Inc()
	case !p.SetUp && p.repaired():
		m.healRepairs.Inc()
	}
	m.healRestored.Add(float64(p.Restored))
}
