package core

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"

	"github.com/kubenet-dev/kubenet/bridge"
	"github.com/kubenet-dev/kubenet/hostport"
	"github.com/kubenet-dev/kubenet/ipam"
	"github.com/kubenet-dev/kubenet/isolation"
)

// EnsureNode brings the node-wide state of cfg's network up to date without attaching a pod:
// forwarding and bridge-netfilter sysctls, the bridge with exactly cfg's gateway addresses (a
// gateway of an earlier pod CIDR is removed), MTU, promiscuous mode with its duplicate-frame
// rules, the SNAT chain, and the host-port chains and maps, with the map elements of running
// pods put back from the ownership index when any of that was missing. ADD does the same on
// every call; the in-process
// NetworkPlugin calls this when the node's pod CIDR becomes known or changes, so the node is
// ready (and no stale gateway stays on the bridge) before the first pod arrives. Runs in the
// caller's network namespace.
func EnsureNode(ctx context.Context, cfg *Config) error {
	_, err := HealNode(ctx, cfg, false)
	return err
}

// NodeRepair is what HealNode found and did.
type NodeRepair struct {
	// SetUp says that the network's bridge did not exist: the node was set up for the first time
	// (since boot), not repaired.
	SetUp bool
	// Found is how the node-wide rules differed from the plan before (CheckNode); nil when they
	// were as planned.
	Found error
	// Restored counts the hostPort map elements of running pods put back from the ownership
	// index.
	Restored int
	// IsolatedPorts counts the running pods whose isolation elements were put back from their
	// records because the isolation chains (and with them the sets) had to be created again.
	IsolatedPorts int
	// PolicyGuards counts the bridge's policy guard put back, NetfilterCall says its nf_call
	// options were off and were turned on (NetworkPolicy; the agent counts both with its policy
	// pass's repairs).
	PolicyGuards  int
	NetfilterCall bool
}

// BridgeNetfilterCallOff tells whether the network enforces NetworkPolicy and its bridge exists
// with its nf_call options off: what HealNode turns back on, asked on its own so that a watcher of
// link changes can tell a change that needs a heal from the many a bridge port makes. It only
// reads one link.
func BridgeNetfilterCallOff(cfg *Config) (bool, error) {
	if !cfg.NetworkPolicy {
		return false, nil
	}
	on, err := bridge.NetfilterCallOn(cfg.Bridge)
	if errors.Is(err, bridge.ErrNoBridge) {
		return false, nil // no bridge yet: nothing to keep, the first ADD sets it up
	}
	return !on && err == nil, err
}

// HealNode is EnsureNode for a node agent that re-asserts the node-wide state after somebody
// else changed it (a firewall reload flushes the ruleset): it also says what it found and how
// many hostPort map elements it put back. With allElements every reservation of the hostPort
// index is compared with the kernel's map elements and put back when missing or different,
// which reads everything the node holds (the agent's periodic pass; ADD and EnsureNode only do
// that when some node-wide chain or map was missing).
func HealNode(ctx context.Context, cfg *Config, allElements bool) (NodeRepair, error) {
	var rep NodeRepair
	if _, err := preflight(cfg, false); err != nil {
		return rep, err
	}
	store, err := openStore(cfg)
	if err != nil {
		return rep, err
	}
	defer store.Close()
	// Claimed first, so that a caller the node's settings do not belong to changes nothing
	// (a switch of netfilter backend included).
	if _, err := claimNodeSettings(cfg, store); err != nil {
		return rep, err
	}
	if cfg, err = prepareBackend(cfg, store); err != nil {
		return rep, err
	}
	rep.Found = cfg.filter().checkNode(cfg)
	link, err := netlink.LinkByName(cfg.Bridge)
	if err != nil {
		rep.SetUp = true
	} else if br, ok := link.(*netlink.Bridge); ok && cfg.NetworkPolicy {
		// The bridge step would put them back too, without saying that they were gone.
		if rep.PolicyGuards, rep.NetfilterCall, err = ensureBridgePolicy(br); err != nil {
			return rep, fmt.Errorf("node setup of network %q: %w", cfg.Network, err)
		}
	}
	a := &addition{cfg: cfg, store: store, settingsChanged: true}
	var hpRepair hostport.Repair
	steps := []struct {
		name string
		run  func() error
	}{
		{"bridge", func() error { return a.ensureBridge(nil) }},
		{"duplicate-frame rules", func() error { return a.hairpinDedup() }},
		{"isolation rules", func() (err error) {
			rep.IsolatedPorts, err = ensureIsolation(cfg, store, allElements, nil)
			return err
		}},
		{"masquerade", func() error { return a.masquerade(nil) }},
		{"host-port rules", func() error {
			hp := hostportConfig(cfg, store.Dir())
			if !allElements {
				return ensureHostPortNode(store, hp, &hpRepair)
			}
			return withNetworkLock(store, func() (err error) {
				hpRepair, err = hostport.EnsureNode(hp, true)
				return err
			})
		}},
	}
	for _, s := range steps {
		if err := ctx.Err(); err != nil {
			return rep, fmt.Errorf("node setup interrupted before %s: %w", s.name, err)
		}
		if err := s.run(); err != nil {
			return rep, fmt.Errorf("node setup of network %q: %s: %w", cfg.Network, s.name, err)
		}
	}
	rep.Restored = hpRepair.Elements
	return rep, nil
}

// ensureIsolation brings the bridge's isolation chains up to date and adds the elements of ports.
// When the chains had to be created again (a flushed ruleset took the sets, and every running
// pod's elements with them: those pods were no longer guarded) or when all is set (the agent's
// periodic pass, which also puts back single elements someone deleted), the elements of every
// recorded attachment are added too; it returns how many after a rebuild. A pod whose record is
// unreadable cannot be put back: its addresses are unknown. self is the attachment an ADD works
// on (nil for the node's healing): its port is among ports already.
//
// An attachment is put back only under its attachment lock, taken without waiting, and only
// if its record is still there once the lock is held: a DEL removes the elements first and the
// record last, so putting back from a record read while that DEL runs would leave elements of a
// deleted pod behind. An attachment whose ADD or DEL is in flight is skipped: the ADD adds its
// own elements, the DEL removes them, and the next pass puts back what is still missing.
func ensureIsolation(cfg *Config, store *ipam.Store, all bool, self *Attachment, ports ...isolation.Port) (int, error) {
	icfg := isolationConfig(cfg)
	rebuilt, err := cfg.filter().ensureIsolation(icfg, ports...)
	if err != nil || !(rebuilt || all) {
		return 0, err
	}
	records := NewRecords(store.Dir())
	scan, scanErr := records.Scan()
	var recorded []isolation.Port
	var unlocks []func() error
	defer func() {
		for _, unlock := range unlocks {
			_ = unlock()
		}
	}()
	for _, rec := range scan.Records {
		att := rec.attachment()
		if self != nil && att == *self {
			continue
		}
		unlock, ok, err := store.TryLockAttachment(att.ContainerID, att.IfName)
		if err != nil || !ok {
			scanErr = errors.Join(scanErr, err)
			continue
		}
		unlocks = append(unlocks, unlock)
		if now, err := records.Load(att); err != nil || now == nil {
			continue // deleted (or damaged) since the scan
		}
		recorded = append(recorded, portOf(cfg, att, rec.IPs))
	}
	if _, err := cfg.filter().ensureIsolation(icfg, recorded...); err != nil {
		return 0, errors.Join(scanErr, fmt.Errorf("put back the isolation elements of %d pods: %w", len(recorded), err))
	}
	if !rebuilt {
		return 0, scanErr
	}
	return len(recorded), scanErr
}

// CheckNode reports how the node-wide rules of cfg's network differ from the plan, in the backend
// that holds them: the SNAT chain, the duplicate-frame rules, the isolation chains and the
// host-port chains and maps, each compared by its rules' expressions and comments. It only reads
// (a dump per chain, or one -save per table), so STATUS and ADD afford it.
func CheckNode(cfg *Config) error {
	store, err := openStore(cfg)
	if err != nil {
		return err
	}
	defer store.Close()
	if cfg, err = inUse(cfg, store); err != nil {
		return err
	}
	return cfg.filter().checkNode(cfg)
}

// missingNodeRules returns what the node-wide rules are missing altogether (a flushed ruleset, a
// deleted table or chain), or nil. Rules that merely differ (a configuration edited since the
// last ADD) are not STATUS's business: the next ADD rewrites them, CHECK reports them. The
// host-port chains count only once host ports were used on the node (hostport.InUse): a node set
// up by an older kubenet that never had a hostPort pod does not have them, and has nothing for
// them to guard.
func missingNodeRules(cfg *Config, networkDir string) error {
	return cfg.filter().missingNode(cfg, func() (bool, error) { return hostport.InUse(hostportConfig(cfg, networkDir)) })
}

// preflight refuses, before anything changes, a configuration that would break the node (see
// bridge.Preflight): code 7 naming the bridge or the pod CIDR at fault. full also compares the
// pod CIDRs with the node's addresses and routes when the bridge already carries the gateways.
// What it read of the bridge comes back (bridge.Seen), for bridge.Ensure and STATUS.
func preflight(cfg *Config, full bool) (bridge.Seen, error) {
	if cfg.NetworkPolicy {
		// Without br_netfilter traffic between pods of the bridge never meets conntrack: replies
		// would be judged as new connections and kube-proxy's Services would not work between
		// them. The guards would hold every pod; refuse instead of cutting pods off silently.
		if err := bridge.CheckBridgeNetfilter(); err != nil {
			return bridge.Seen{}, configError("networkPolicy", true, "NetworkPolicy cannot be enforced on this node: %v", err)
		}
	}
	seen, err := bridge.Preflight(bridgeConfig(cfg, cfg.MTU), full)
	pe, ok := bridge.IsPreflight(err)
	if !ok {
		return seen, err
	}
	if pe.Key == "bridge" {
		return seen, configError("bridge", pe.Value, "%s", pe.Reason)
	}
	gw, _ := netip.ParsePrefix(pe.Value)
	return seen, configError(cfg.rangesKey(), gw.Masked().String(), "%s", pe.Reason)
}
