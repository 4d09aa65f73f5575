package core

import (
	"fmt"
	"os"
	"strings"

	"github.com/kubenet-dev/kubenet/internal/ipt"
	"github.com/kubenet-dev/kubenet/internal/nft"
	"github.com/kubenet-dev/kubenet/internal/safedir"
	"github.com/kubenet-dev/kubenet/masq"
)

// BackendChoice is the backend of a network on a node and the reason for it.
type BackendChoice struct {
	Backend NetfilterBackend `json:"backend"` // nftables or iptables
	Reason  string           `json:"reason"`
	// Configured is the netfilterBackend key it was chosen for; BootID the boot whose kernel
	// auto probed (a kernel can only change with a reboot).
	Configured NetfilterBackend `json:"configured"`
	BootID     string           `json:"bootID,omitempty"`
}

func (c BackendChoice) String() string { return fmt.Sprintf("%s (%s)", c.Backend, c.Reason) }

// readChoice reads the network's backend record; nil when there is none (or it is unreadable as
// such: the next ADD writes it anew).
func readChoice(root *safedir.Dir) (*BackendChoice, error) {
	var c BackendChoice
	found, err := readNodeFile(root, NetfilterFile, &c)
	if err != nil || !found || (c.Backend != NetfilterNFTables && c.Backend != NetfilterIPTables) {
		return nil, err
	}
	return &c, nil
}

func writeChoice(root *safedir.Dir, c BackendChoice) error {
	return writeNodeFile(root, NetfilterFile, c)
}

// bootID identifies the running kernel's boot.
func bootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// iptablesUsable tells whether the tools of the iptables backend can run for cfg's families.
func iptablesUsable(cfg *Config) error {
	fams := []ipt.Family{ipt.Bridge}
	for _, p := range cfg.PodCIDRs() {
		fams = append(fams, ipt.Families(p.Addr().Is6())...)
	}
	for _, f := range fams {
		if err := ipt.Available(f, cfg.ToolRoot); err != nil {
			return err
		}
	}
	return nil
}

// choose decides the backend cfg asks for on this node. rec, the record of an earlier call,
// answers when it was made for the same setting (for auto, in this boot: auto probes the kernel
// once per boot); otherwise the configured backend's tools are checked, or auto probes.
func choose(cfg *Config, rec *BackendChoice) (BackendChoice, error) {
	if recordAnswers(cfg, rec) {
		return *rec, nil
	}
	switch cfg.Netfilter {
	case NetfilterNFTables:
		return BackendChoice{Backend: NetfilterNFTables, Configured: cfg.Netfilter, Reason: "netfilterBackend is nftables"}, nil
	case NetfilterIPTables:
		if err := iptablesUsable(cfg); err != nil {
			return BackendChoice{}, configError("netfilterBackend", cfg.Netfilter, "the iptables tools cannot run: %v", err)
		}
		return BackendChoice{Backend: NetfilterIPTables, Configured: cfg.Netfilter, Reason: "netfilterBackend is iptables"}, nil
	}
	boot := bootID()
	probe := nft.Probe()
	if probe == nil {
		return BackendChoice{Backend: NetfilterNFTables, Configured: NetfilterAuto, BootID: boot,
			Reason: "auto: the kernel holds every nftables object kubenet uses"}, nil
	}
	if err := iptablesUsable(cfg); err != nil {
		return BackendChoice{}, configError("netfilterBackend", cfg.Netfilter, "neither backend can serve: nftables: %v; iptables: %v", probe, err)
	}
	return BackendChoice{Backend: NetfilterIPTables, Configured: NetfilterAuto, BootID: boot,
		Reason: "auto: nftables cannot serve: " + probe.Error()}, nil
}

// recordAnswers tells whether rec was made for cfg's setting and still holds: for auto, in
// this boot (the boot is read only then).
func recordAnswers(cfg *Config, rec *BackendChoice) bool {
	if rec == nil || rec.Configured != cfg.Netfilter {
		return false
	}
	if cfg.Netfilter != NetfilterAuto {
		return true
	}
	boot := bootID()
	return rec.BootID == boot && boot != ""
}

// plannedBackend is the backend the next ADD would choose for cfg (choose), as far as it is
// known without probing the kernel: known is false for auto without a record of this boot.
func plannedBackend(cfg *Config, rec *BackendChoice) (b NetfilterBackend, known bool) {
	switch {
	case recordAnswers(cfg, rec):
		return rec.Backend, true
	case cfg.Netfilter == NetfilterAuto:
		return "", false
	}
	return cfg.Netfilter, true
}

// recordBackend makes the network's record name want, the decision of a verb that applies the
// node's settings (decideBackend's), under the network lock, reading the record afresh there.
// When the node's rules are in the other backend it moves them, but only with exclusive set (the
// caller holds the backend lock exclusively: no other verb is writing rules into the backend the
// node is leaving); without it, it changes nothing and reports that a move is needed. A move
// removes the other backend's rules of the network altogether; the new backend's node-wide
// objects are then missing, so the steps that follow put back every running pod's host ports and
// isolation from the index and the records, as after a flushed ruleset.
func recordBackend(cfg *Config, dir *networkDir, want BackendChoice, exclusive bool) (moveNeeded bool, err error) {
	err = dir.withLock(func() error {
		// Without a record (nothing set up yet, a kubenet from before there were backends,
		// a damaged record) the rules are found where they are.
		rec, err := readChoice(dir.root())
		if err != nil {
			return err
		}
		if rec != nil && *rec == want {
			return nil
		}
		if inUse := backendOf(cfg, rec); inUse != want.Backend {
			if !exclusive {
				moveNeeded = true
				return nil
			}
			crashPoint("switch: exclusive")
			err := backendFor(cfg, inUse, dir).removeAll(cfg.Network)
			if err != nil && rec != nil {
				return fmt.Errorf("switch network %q from %s to %s: %w", cfg.Network, inUse, want.Backend, err)
			}
			crashPoint("switch: old backend removed")
			defer crashPoint("switch: recorded")
		}
		return writeChoice(dir.root(), want)
	})
	return moveNeeded, err
}

// SwitchCrashPoints names the crash points of a backend switch (see CrashPoints), in the order
// an ADD that moves the node's rules passes them: the backend lock held exclusively, the old
// backend's rules removed, the record naming the new one (the lock not yet downgraded, nothing
// put back in the new backend).
func SwitchCrashPoints() []string {
	return []string{"switch: exclusive", "switch: old backend removed", "switch: recorded"}
}

// decideBackend is the backend cfg asks for on this node (choose), rec being the network's
// record, or the refusal of a configuration that backend cannot serve. It changes nothing: a verb
// decides before it claims the node's settings, so that a refused configuration changes nothing
// (handle.prepareBackend then applies the decision).
func decideBackend(cfg *Config, rec *BackendChoice) (BackendChoice, error) {
	want, err := choose(cfg, rec)
	if err != nil {
		return BackendChoice{}, err
	}
	if cfg.NetworkPolicy && want.Backend != NetfilterNFTables {
		return BackendChoice{}, configError("networkPolicy", true, "NetworkPolicy is enforced with nftables only, and this node's backend is %s", want)
	}
	return want, nil
}

// backendOf is the backend that holds the network's rules now, for the verbs that work on what
// is there (DEL, CHECK, GC, STATUS): the recorded one, rec. Without a record (none yet, or a
// damaged one) it is found in the kernel: nftables when the network's nftables table exists,
// iptables when its SNAT chain does; else the configured one (nftables for auto).
func backendOf(cfg *Config, rec *BackendChoice) NetfilterBackend {
	if rec != nil {
		return rec.Backend
	}
	if nft.TableExists(nft.InetTable(cfg.Network)) {
		return NetfilterNFTables
	}
	if masq.HasIPTablesChain(&ipt.State{Root: cfg.ToolRoot}, cfg.Network) {
		return NetfilterIPTables
	}
	if cfg.Netfilter == NetfilterIPTables {
		return NetfilterIPTables
	}
	return NetfilterNFTables
}

// backendFor returns backend b for the network of dir. Each call gets its own: the iptables one
// reads each table once per verb, and writes node-wide rules under the network's netfilter lock.
func backendFor(cfg *Config, b NetfilterBackend, dir *networkDir) netfilter {
	if b == NetfilterIPTables {
		return iptablesRules(cfg.ToolRoot, dir.serializeNetfilter)
	}
	return nftablesRules()
}

// inUse is the backend of the verbs that work on what is there: the one that holds the
// network's rules now (backendOf), rec being the network's record.
func inUse(cfg *Config, rec *BackendChoice, dir *networkDir) netfilter {
	return backendFor(cfg, backendOf(cfg, rec), dir)
}
