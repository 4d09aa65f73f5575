package core

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"

	"github.com/kubenet-dev/kubenet/bridge"
	"github.com/kubenet-dev/kubenet/hostport"
	"github.com/kubenet-dev/kubenet/isolation"
)

// This file holds the node-wide steps: what every pod of the network shares on the node (the
// forwarding sysctls and the bridge, the dedup rules, the isolation chains, the SNAT chain, the
// host-port chains and maps). ADD's step list and the node's healing (HealNode) are both made
// of them, on a handle opened to apply the node's settings; CHECK and STATUS read them back.

// ensureBridge brings the forwarding sysctls and the bridge up to date (seen: what preflight read
// of it) and returns the bridge with the MTU it has (cfg's, or detected when that is 0). The
// node-wide settings were claimed when the handle opened, so they are the caller's to apply.
func (h *handle) ensureBridge(seen bridge.Seen) (*netlink.Bridge, int, error) {
	mtu := h.cfg.MTU
	if mtu == 0 {
		mtu = bridge.DetectMTU(h.cfg.Bridge)
	}
	var v4, v6 bool
	for _, p := range h.cfg.PodCIDRs() {
		v4, v6 = v4 || p.Addr().Is4(), v6 || p.Addr().Is6()
	}
	if err := bridge.EnsureNodeSysctls(v4, v6); err != nil {
		return nil, 0, err
	}
	br, err := bridge.Ensure(bridgeConfig(h.cfg, mtu), seen)
	if err != nil {
		return nil, 0, err
	}
	return br, mtu, guardBridge(h.cfg, br)
}

// ensureDedup installs the promiscuous bridge's duplicate-frame rules, or removes them in the
// other hairpin modes.
func (h *handle) ensureDedup() error {
	return h.nf.ensureDedup(h.cfg.Hairpin, h.dedup(), h.settingsChanged)
}

// ensureMasquerade brings the SNAT chain up to date.
func (h *handle) ensureMasquerade() error {
	return h.nf.ensureMasquerade(h.masqConfig())
}

// ensureIsolation brings the bridge's isolation chains up to date and adds the elements of ports.
// When the chains had to be created again (a flushed ruleset took the sets, and every running
// pod's elements with them: those pods were no longer guarded) or when all is set (the agent's
// periodic pass, which also puts back single elements someone deleted), the elements of every
// recorded attachment are added too; it returns how many after a rebuild. A pod whose record is
// unreadable cannot be put back: its addresses are unknown. self is the attachment an ADD works
// on (nil for the node's healing): its port is among ports already.
//
// An attachment is put back only under its attachment lock, taken shared without waiting, and
// only if its record is still there once the lock is held: a DEL removes the elements first and
// the record last, so putting back from a record read while that DEL runs would leave elements of
// a deleted pod behind. An attachment whose ADD or DEL is in flight is skipped: the ADD adds its
// own elements, the DEL removes them, and the next pass puts back what is still missing. The
// lock is taken shared because a CHECK of the attachment holds it so too: a CHECK writes nothing,
// and skipping the pods it held would leave them out of a new backend's sets after a switch, no
// longer guarded (TestCheckRacesBackendSwitch).
func (h *handle) ensureIsolation(all bool, self *attachmentKey, ports ...isolation.Port) (int, error) {
	icfg := h.isolationConfig()
	rebuilt, err := h.nf.ensureIsolation(icfg, ports...)
	if err != nil || !(rebuilt || all) {
		return 0, err
	}
	records := h.dir.records
	scan, scanErr := records.Scan()
	var recorded []isolation.Port
	var unlocks []func() error
	defer func() {
		for _, unlock := range unlocks {
			_ = unlock()
		}
	}()
	for _, rec := range scan.Records {
		k := rec.key()
		if self != nil && k == *self {
			continue
		}
		unlock, ok, err := h.dir.tryLockAttachmentShared(k)
		if err != nil || !ok {
			scanErr = errors.Join(scanErr, err)
			continue
		}
		unlocks = append(unlocks, unlock)
		if now, err := records.Load(k.attachment()); err != nil || now == nil {
			continue // deleted (or damaged) since the scan
		}
		recorded = append(recorded, h.portOf(k, rec.IPs))
	}
	if _, err := h.nf.ensureIsolation(icfg, recorded...); err != nil {
		return 0, errors.Join(scanErr, fmt.Errorf("put back the isolation elements of %d pods: %w", len(recorded), err))
	}
	if !rebuilt {
		return 0, scanErr
	}
	return len(recorded), scanErr
}

// ensureHostPortNode brings the node-wide host-port chains and maps up to date. Unless all is
// set it checks them without the lock first (one dump of the network's table: what a healthy
// node pays) and repairs them under the lock only when they are not as planned; with all (the
// agent's periodic pass) every reservation of the index is compared with the kernel's map
// elements under the lock, and put back when missing or different. It returns what was changed.
func (h *handle) ensureHostPortNode(all bool) (hostport.Repair, error) {
	hp := h.hostportConfig()
	var rep hostport.Repair
	if !all && hostport.CheckNode(hp) == nil {
		return rep, nil
	}
	// The verbs that apply the node's settings hold the backend lock: hp's backend is the one in
	// use for as long as they run.
	err := h.dir.withLock(func() (err error) {
		rep, err = hostport.EnsureNode(hp, all)
		return err
	})
	if err != nil && !all {
		return rep, fmt.Errorf("host-port rules: %w", err)
	}
	return rep, err
}

// checkNode reports how every node-wide rule differs from the plan, in the handle's backend.
func (h *handle) checkNode() error { return h.nf.checkNode(h.nodeRules()) }

// missingNodeRules returns what the node-wide rules are missing altogether (a flushed ruleset, a
// deleted table or chain), or nil. Rules that merely differ (a configuration edited since the
// last ADD) are not STATUS's business: the next ADD rewrites them, CHECK reports them. The
// host-port chains count only once host ports were used on the node (hostport.InUse): a node set
// up by an older kubenet that never had a hostPort pod does not have them, and has nothing for
// them to guard.
func (h *handle) missingNodeRules() error {
	return h.nf.missingNode(h.nodeRules(), func() (bool, error) { return hostport.InUse(h.hostportConfig()) })
}
