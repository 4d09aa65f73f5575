package core

import (
	"context"
	"errors"
	"fmt"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/google/nftables"
	"golang.org/x/sys/unix"
)

// notAvailable is STATUS's "plugin not available" (50) error.
func notAvailable(format string, args ...any) *types.Error {
	return types.NewError(ErrPluginNotAvailable, fmt.Sprintf(format, args...), "")
}

// StatusConfigError turns a configuration that cannot be used into STATUS's answer: the node
// is not ready (50) and the message says why (most often: no pod CIDR yet).
func StatusConfigError(err error) error {
	var e *types.Error
	if errors.As(err, &e) {
		return notAvailable("configuration: %s", e.Msg)
	}
	return notAvailable("configuration: %v", err)
}

// Status answers whether an ADD can succeed now: the data dir is usable, the netfilter backend
// answers, the configuration cannot break the node (the bridge name is free or a bridge no other
// network uses, no pod CIDR overlaps the node's addresses or connected routes), every pod CIDR has
// a free address, and, once the bridge exists, none of the network's node-wide rules is missing
// in the backend that holds them (NetfilterStatus names it, and every answer of 50 does too).
// containerd and CRI-O poll it every few seconds, so it only reads: one small file per network,
// each pod CIDR's allocation cursor and the reservation after it (the directory is listed only
// when the pod CIDR is nearly full), one sysctl, the bridge, one address and one route dump (of
// the pod CIDRs' families), one dump of each of the network's nftables tables (their rules
// counted, not decoded) or, on iptables, the rules of kubenet's fixed chains counted (over
// netlink where only iptables-nft can hold them, else listed by the tools); no other file
// contents, and never a probe of the kernel.
func Status(ctx context.Context, cfg *Config) error {
	dir, err := openDir(cfg.DataDir, cfg.Network)
	if err != nil {
		return notAvailable("data dir %s unusable: %v", cfg.DataDir, err)
	}
	defer dir.Close()
	if err := unix.Access(dir.path(), unix.W_OK); err != nil {
		return notAvailable("data dir %s not writable: %v", dir.path(), err)
	}
	free, err := dir.store.HasFree(cfg.Ranges...)
	if err != nil {
		return notAvailable("address store %s: %v", dir.path(), err)
	}
	for i, set := range cfg.Ranges {
		if !free[i] {
			return notAvailable("no free address in pod CIDR %s: every address is reserved (run GC if pods leaked)", set)
		}
	}
	seen, err := preflight(cfg, true)
	if err != nil {
		return notAvailable("configuration: %s", errMsg(err))
	}
	rec, err := readChoice(dir.root())
	if err != nil {
		return notAvailable("netfilter backend: %v", err)
	}
	// As ADD refuses it (decideBackend): by the backend the next ADD chooses, not the one
	// recorded, which that ADD may switch away from.
	if planned, known := plannedBackend(cfg, rec); cfg.NetworkPolicy && known && planned != NetfilterNFTables {
		return notAvailable("configuration: networkPolicy: NetworkPolicy is enforced with nftables only, and this node's backend is %s", planned)
	}
	if seen.Exists() {
		// The bridge exists, so the network's node-wide rules were set up, and losing them
		// (another tool ran `nft flush ruleset`) leaves the node open: without the localnet guard
		// route_localnet lets pods reach services bound to 127.0.0.1. Differences that are not
		// missing objects (an edited configuration) are left to the next ADD. Only here is the
		// backend that holds the rules needed (without a record, found in the kernel).
		// The handle on the directory opened above (it holds no lock of its own: the deferred
		// Close of dir is its end).
		h := &handle{cfg: cfg, dir: dir, nf: inUse(cfg, rec, dir)}
		if err := h.missingNodeRules(); err != nil {
			return notAvailable("node-wide rules of network %q in %s are missing (the next ADD or kubenet-agent restores them): %v", cfg.Network, describeChoice(rec, h.nf.backend), err)
		}
		return ctx.Err()
	}
	// Nothing set up yet: the backend the first ADD would use must answer (with auto, either).
	nftErr := nftablesUsable()
	switch {
	case cfg.Netfilter == NetfilterNFTables && nftErr != nil:
		return notAvailable("netfilterBackend nftables: nftables unusable: %v", nftErr)
	case cfg.NetworkPolicy && nftErr != nil:
		return notAvailable("configuration: networkPolicy: NetworkPolicy is enforced with nftables only, and nftables is unusable: %v", nftErr)
	case cfg.Netfilter == NetfilterIPTables:
		if err := iptablesUsable(cfg); err != nil {
			return notAvailable("netfilterBackend iptables: %v", err)
		}
	case nftErr != nil:
		if err := iptablesUsable(cfg); err != nil {
			return notAvailable("netfilterBackend auto: neither backend answers: nftables: %v; iptables: %v", nftErr, err)
		}
	}
	return ctx.Err()
}

// nftablesUsable tells whether nftables answers at all (one list of tables).
func nftablesUsable() error {
	c, err := nftables.New()
	if err == nil {
		_, err = c.ListTablesOfFamily(nftables.TableFamilyINet)
	}
	return err
}

func describeChoice(rec *BackendChoice, b NetfilterBackend) string {
	if rec != nil {
		return rec.String()
	}
	return string(b)
}
