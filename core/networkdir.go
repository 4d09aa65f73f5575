package core

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"

	"github.com/kubenet-dev/kubenet/internal/safedir"
	"github.com/kubenet-dev/kubenet/internal/statedir"
	"github.com/kubenet-dev/kubenet/ipam"
)

// NodeSettingsFile, in the network's directory of the data dir, records the node-wide settings
// that the network's node state (bridge addresses, MTU and promiscuous mode, dedup, isolation and
// SNAT rules) was last made from, and who made it. host-local ignores it (its content is no container ID).
const NodeSettingsFile = "kubenet-node.json"

// NetfilterFile, in the network's directory of the data dir, records which backend holds the
// network's rules on this node, and why. host-local ignores it (no container ID in it).
const NetfilterFile = "kubenet-netfilter.json"

// VerifiedRulesFile, in the network's directory of the data dir, remembers which dumps of the
// node-wide chains were found to hold which plan (nft.Verified), so that ADD recognises a healthy
// node's rules from a digest of one raw dump instead of decoding them. host-local ignores it (no
// container ID in it).
const VerifiedRulesFile = "kubenet-verified-rules.json"

// networkDir is one network's directory in the data dir, <dataDir>/<network>/, as the verbs use
// it: the network lock and the attachment locks on its lock file, the address reservations, the
// attachment records, and the node's own files (NodeSettingsFile, NetfilterFile,
// VerifiedRulesFile).
type networkDir struct {
	state   *statedir.Dir
	store   *ipam.Store
	records Records
}

// openNetworkDir opens cfg's network directory. A data dir that others may write (or that sits
// below such a directory) is a configuration error naming dataDir: kubenet refuses to keep state
// where someone else could plant names for it to follow.
func openNetworkDir(cfg *Config) (*networkDir, error) {
	d, err := openDir(cfg.DataDir, cfg.Network)
	if errors.Is(err, safedir.ErrUntrusted) {
		return nil, configError("dataDir", cfg.DataDir, "%v", err)
	}
	if err != nil {
		return nil, fmt.Errorf("address store: %w", err)
	}
	return d, nil
}

// openDir opens the network's directory in dataDir, creating it when needed; its errors are
// statedir's own (operators' reads and STATUS word them themselves).
func openDir(dataDir, network string) (*networkDir, error) {
	state, err := statedir.Open(dataDir, network)
	if err != nil {
		return nil, err
	}
	return &networkDir{state: state, store: ipam.New(state.Root()), records: Records{networkDir: state.Path(), root: state.Root()}}, nil
}

func (d *networkDir) Close() error { return d.state.Close() }

// path is the directory's path.
func (d *networkDir) path() string { return d.state.Path() }

// root is the directory, open and checked once: the node's files are read and written through it.
func (d *networkDir) root() *safedir.Dir { return d.state.Root() }

// withLock runs f holding the network lock and returns f's error (or the unlock's).
//
// The network lock is the flock on the lock file of the network's directory in the data dir
// (<dataDir>/<network>/lock, the same file host-local locks, so the two never hand out one
// address twice). It guards everything on the node that belongs to one network and is read
// before it is written: the address reservations, the attachment records, the node's files and
// the hostPort ownership index with its nftables map elements. Every check-then-write on any of
// them runs inside one call of this function. Kernel work that does not decide ownership (links,
// qdiscs, the conntrack walk) stays outside, so the lock is held only briefly.
func (d *networkDir) withLock(f func() error) error {
	if err := d.state.Lock(); err != nil {
		return fmt.Errorf("take the network lock: %w", err)
	}
	err := f()
	return errors.Join(err, d.state.Unlock())
}

// lockAttachment takes the attachment lock of k, waiting for its holder, and returns its release.
func (d *networkDir) lockAttachment(k attachmentKey) (func() error, error) {
	return d.state.LockAttachment(k.ContainerID, k.IfName)
}

// lockAttachmentShared takes the attachment lock of k shared (a verb that only reads the
// attachment), waiting for an ADD or DEL of it, and returns its release.
func (d *networkDir) lockAttachmentShared(k attachmentKey) (func() error, error) {
	return d.state.LockAttachmentShared(k.ContainerID, k.IfName)
}

// tryLockAttachmentShared takes the attachment lock of k shared if no ADD or DEL of it holds it,
// without waiting. Readers (CHECK, another healing pass) do not keep it from the caller.
func (d *networkDir) tryLockAttachmentShared(k attachmentKey) (unlock func() error, ok bool, err error) {
	return d.state.TryLockAttachmentShared(k.ContainerID, k.IfName)
}

// serializeNetfilter runs f under the network's netfilter lock: what keeps plugin processes
// from writing node-wide iptables and ebtables rules at once.
func (d *networkDir) serializeNetfilter(f func() error) error {
	unlock, err := d.state.LockNetfilter()
	if err != nil {
		return err
	}
	return errors.Join(f(), unlock())
}

// IsNodeFile tells whether name, in a network's directory of the data dir, is one of the files
// that belong to the node rather than to an attachment: the node-wide settings, the backend
// record, the verified rules and the last policy pass. Audits of what a pod left behind skip
// them.
func IsNodeFile(name string) bool {
	return name == NodeSettingsFile || name == NetfilterFile || name == VerifiedRulesFile || name == PolicyStateFile
}

// readNodeFile reads the JSON file name (one of the node's files of a network: NodeSettingsFile,
// NetfilterFile, VerifiedRulesFile) from the network's directory root into v. It never follows a
// symlink, and anything but a small regular file that decodes is not found (safedir.MaxFileSize
// bounds what is read): the next writer replaces it.
func readNodeFile(root *safedir.Dir, name string, v any) (bool, error) {
	data, err := root.ReadFile(name)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, safedir.ErrNotRegular) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("%s: %w", name, err)
	}
	return json.Unmarshal(data, v) == nil, nil
}

// writeNodeFile writes v as the JSON file name in the network's directory root, whole or not at
// all.
func writeNodeFile(root *safedir.Dir, name string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return root.WriteFile(name, data, 0o644, false)
}
