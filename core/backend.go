package core

import (
	"fmt"
	"os"
	"strings"

	"github.com/kubenet-dev/kubenet/internal/ipt"
	"github.com/kubenet-dev/kubenet/internal/nft"
	"github.com/kubenet-dev/kubenet/internal/safedir"
	"github.com/kubenet-dev/kubenet/ipam"
	"github.com/kubenet-dev/kubenet/masq"
)

// NetfilterBackend is a value of the netfilterBackend key, and (nftables, iptables) the backend
// that holds a network's rules on a node.
type NetfilterBackend string

const (
	// NetfilterAuto, the default, is nftables where the kernel holds everything kubenet uses
	// in nftables (nft.Probe), else iptables.
	NetfilterAuto     NetfilterBackend = "auto"
	NetfilterNFTables NetfilterBackend = "nftables"
	NetfilterIPTables NetfilterBackend = "iptables"
)

// NetfilterBackends lists the values of the netfilterBackend key.
func NetfilterBackends() []NetfilterBackend {
	return []NetfilterBackend{NetfilterAuto, NetfilterNFTables, NetfilterIPTables}
}

func parseNetfilterBackend(s string) (NetfilterBackend, error) {
	if s == "" {
		return NetfilterAuto, nil
	}
	for _, b := range NetfilterBackends() {
		if NetfilterBackend(s) == b {
			return b, nil
		}
	}
	return "", configError("netfilterBackend", s, "valid values are %q, %q and %q", NetfilterAuto, NetfilterNFTables, NetfilterIPTables)
}

// NetfilterFile, in the network's directory of the data dir, records which backend holds the
// network's rules on this node, and why. host-local ignores it (no container ID in it).
const NetfilterFile = "kubenet-netfilter.json"

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

// prepareBackend is what ADD and the node's setup (EnsureNode, HealNode) do first: choose cfg's
// backend and, when the node's rules are in the other one, switch under the network lock: the
// other backend's rules of the network are removed altogether, and the record names the new one.
// The new backend's node-wide objects are then missing, so the steps that follow put back every
// running pod's host ports and isolation from the index and the records, as after a flushed
// ruleset. It returns cfg with the chosen backend.
func prepareBackend(cfg *Config, store *ipam.Store) (*Config, error) {
	rec, err := readChoice(store.Root())
	if err != nil {
		return nil, err
	}
	want, err := choose(cfg, rec)
	if err != nil {
		return nil, err
	}
	if cfg.NetworkPolicy && want.Backend != NetfilterNFTables {
		return nil, configError("networkPolicy", true, "NetworkPolicy is enforced with nftables only, and this node's backend is %s", want)
	}
	if rec == nil || *rec != want {
		err := withNetworkLock(store, func() error {
			// Without a record (nothing set up yet, a kubenet from before there were backends,
			// a damaged record) the rules are found where they are.
			rec, inUse, err := inUseBackend(cfg, store)
			if err != nil {
				return err
			}
			if inUse != want.Backend {
				err := filterFor(cfg, inUse, store).removeAll(cfg.Network)
				if err != nil && rec != nil {
					return fmt.Errorf("switch network %q from %s to %s: %w", cfg.Network, inUse, want.Backend, err)
				}
			}
			return writeChoice(store.Root(), want)
		})
		if err != nil {
			return nil, err
		}
	}
	return cfg.withFilter(filterFor(cfg, want.Backend, store)), nil
}

// inUseBackend is the backend that holds the network's rules now, for the verbs that work on
// what is there (DEL, CHECK, GC, STATUS): the recorded one. Without a record (none yet, or a
// damaged one) it is found in the kernel: nftables when the network's nftables table exists,
// iptables when its SNAT chain does; else the configured one (nftables for auto).
func inUseBackend(cfg *Config, store *ipam.Store) (*BackendChoice, NetfilterBackend, error) {
	rec, err := readChoice(store.Root())
	if err != nil {
		return nil, "", err
	}
	return rec, backendOf(cfg, rec), nil
}

// backendOf is inUseBackend for the record rec, read already.
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

// inUse returns cfg with the backend that holds the network's rules now.
func inUse(cfg *Config, store *ipam.Store) (*Config, error) {
	_, b, err := inUseBackend(cfg, store)
	if err != nil {
		return nil, err
	}
	return cfg.withFilter(filterFor(cfg, b, store)), nil
}

// withFilter returns a copy of cfg whose verbs use nf. A copy, because the in-process plugin
// shares one Config among concurrent verbs.
func (c *Config) withFilter(nf packetFilter) *Config {
	out := *c
	out.nf = nf
	return &out
}

// withKnown returns a copy of c whose nftables checks recognise the node-wide chains from the
// pairs remembered in the network's directory (VerifiedRulesFile).
func (c *Config) withKnown(store *ipam.Store) *Config {
	out := *c
	out.known = newVerifiedRules(store.Root())
	return &out
}

// filter is the backend the verb resolved; a Config no verb resolved (built by hand) uses
// nftables, the only backend of kubenets before the key existed.
func (c *Config) filter() packetFilter {
	if c.nf == nil {
		return nftablesFilter{}
	}
	return c.nf
}

// NetfilterStatus says which backend holds the network's rules on this node and why, for STATUS
// and operators. Before the first ADD with auto nothing is decided yet: the first ADD probes the
// kernel (STATUS never does: it is polled, and a probe costs a transaction).
func NetfilterStatus(cfg *Config) (BackendChoice, error) {
	store, err := ipam.Open(cfg.DataDir, cfg.Network)
	if err != nil {
		return BackendChoice{}, err
	}
	defer store.Close()
	rec, b, err := inUseBackend(cfg, store)
	if err != nil || rec != nil {
		if rec == nil {
			return BackendChoice{}, err
		}
		return *rec, err
	}
	reason := "netfilterBackend is " + string(cfg.Netfilter) + "; no pod yet"
	if cfg.Netfilter == NetfilterAuto {
		reason = "auto: not decided yet; the first ADD probes the kernel"
	}
	return BackendChoice{Backend: b, Configured: cfg.Netfilter, Reason: reason}, nil
}

// IsNodeFile tells whether name, in a network's directory of the data dir, is one of the files
// that belong to the node rather than to an attachment: the node-wide settings, the backend
// record and the verified rules. Audits of what a pod left behind skip them.
func IsNodeFile(name string) bool {
	return name == NodeSettingsFile || name == NetfilterFile || name == VerifiedRulesFile
}

// ReadNetfilterRecord returns the backend record of the network in dataDir: which backend holds
// its rules on this node and why; nil before any ADD recorded one.
func ReadNetfilterRecord(dataDir, network string) (*BackendChoice, error) {
	store, err := ipam.Open(dataDir, network)
	if err != nil {
		return nil, err
	}
	defer store.Close()
	return readChoice(store.Root())
}
