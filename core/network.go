package core

import (
	"errors"
	"net/netip"

	"github.com/kubenet-dev/kubenet/bridge"

	"github.com/kubenet-dev/kubenet/internal/nft"
	"github.com/kubenet-dev/kubenet/internal/statedir"
)

// handle is one verb's handle on one network of the node. A verb opens it once, first thing,
// and everything after works through it:
//
//   - cfg, the validated configuration (configuration only: nothing a verb learns goes into it,
//     so the in-process plugin shares one Config among concurrent verbs);
//   - dir, the network's directory in the data dir with its locks, reservations and records;
//   - the attachment lock of the verb's attachment, when it has one, held until Close;
//   - seen, what preflight read of the bridge before anything changed (applying verbs);
//   - settingsChanged, what the claim of the node-wide settings found;
//   - known, the verified-rules memory of the verbs that apply the node's settings;
//   - nf, the netfilter backend, chosen once when the handle opens, and backend, the verb's
//     shared hold on it (the verbs that apply the node's settings), so that no other verb
//     switches the node to the other backend until this one is done.
//
// There are two ways to open it. openToApply is for the verbs that apply the node's settings
// (ADD, EnsureNode and HealNode): it claims the node-wide settings and chooses the backend,
// switching the node's rules over when they are in the other one. openAsFound is for the verbs
// that work on what is there (DEL, CHECK, GC, STATUS, CheckNode): the backend that holds the
// rules now, and the node's settings left as they are.
type handle struct {
	cfg    *Config
	dir    *networkDir
	unlock func() error // releases the attachment lock; nil when the verb took none
	seen   bridge.Seen  // what preflight read of the bridge (the verbs that apply the settings)
	// settingsChanged: the node-wide settings were written by this call (first pod, a new
	// configuration), or the caller sets the node up (EnsureNode, HealNode): what only a change
	// can leave behind is looked for too.
	settingsChanged bool
	// known remembers the node-wide chains' dumps found as planned (nil: every check decodes
	// and compares in full, as CHECK and STATUS do).
	known   nft.Verified
	nf      netfilter
	backend *statedir.BackendLock // nil for the verbs that work on what is there
}

// openToApply opens cfg's network for a verb that applies the node's settings. Before anything
// changes, a configuration that would break the node is refused (preflight). With att it then
// takes that attachment's lock, so that a DEL of the same attachment runs wholly before or wholly
// after the verb; the backend is decided next (a configuration it cannot serve is refused), then
// the node-wide settings are claimed, so that a caller they do not belong to is refused before
// anything node-wide changes, a switch of backend included.
func openToApply(cfg *Config, att *Attachment) (*handle, error) {
	seen, err := preflight(cfg, false)
	if err != nil {
		return nil, err
	}
	h := &handle{cfg: cfg, seen: seen}
	if err := h.open(att, lockExclusive, h.applySettings); err != nil {
		return nil, err
	}
	return h, nil
}

// openAsFound opens cfg's network for a verb that works on what is there, with the backend that
// holds the network's rules now. With att it first takes that attachment's lock, so that an ADD
// or DEL of the same attachment in flight finishes first (and the backend read is the one it
// left).
func openAsFound(cfg *Config, att *Attachment) (*handle, error) {
	h := &handle{cfg: cfg}
	if err := h.open(att, lockExclusive, h.findBackend); err != nil {
		return nil, err
	}
	return h, nil
}

// openToRead is openAsFound for a verb that only reads att (CHECK): its attachment lock is taken
// shared. It still waits for an ADD or DEL of att in flight, but not for another reader, and the
// node's healing (a backend switch's rebuild among it) does not pass over the attachment because
// it is being read.
func openToRead(cfg *Config, att Attachment) (*handle, error) {
	h := &handle{cfg: cfg}
	if err := h.open(&att, lockShared, h.findBackend); err != nil {
		return nil, err
	}
	return h, nil
}

// lockMode is how a verb holds its attachment's lock: exclusive when it may change the
// attachment, shared when it only reads it (CHECK).
type lockMode bool

const (
	lockExclusive lockMode = false
	lockShared    lockMode = true
)

// open opens the directory, takes att's lock (in mode) when att is set and lets choose find the
// rest; what it opened is closed again when something fails.
func (h *handle) open(att *Attachment, mode lockMode, choose func() error) (err error) {
	if h.dir, err = openNetworkDir(h.cfg); err != nil {
		return err
	}
	if att != nil {
		lock := h.dir.lockAttachment
		if mode == lockShared {
			lock = h.dir.lockAttachmentShared
		}
		if h.unlock, err = lock(att.key()); err != nil {
			return errors.Join(err, h.dir.Close())
		}
	}
	if err := choose(); err != nil {
		return errors.Join(err, h.Close())
	}
	return nil
}

// applySettings claims the node-wide settings and chooses the backend (switching the node's
// rules over to it when they are in the other one).
func (h *handle) applySettings() (err error) {
	// Held until Close: the rules this verb writes go into the backend it chooses here, and no
	// other verb moves the node's rules out of it meanwhile.
	if h.backend, err = h.dir.state.ShareBackend(); err != nil {
		return err
	}
	// The backend record is read once, without the network lock: the claim below does not write
	// it, and prepareBackend reads it again under the lock when it has to change it.
	rec, err := readChoice(h.dir.root())
	if err != nil {
		return err
	}
	// Decided first: a configuration its backend cannot serve is refused before the claim
	// writes its settings.
	want, err := decideBackend(h.cfg, rec)
	if err != nil {
		return err
	}
	if h.settingsChanged, err = claimNodeSettings(h.cfg, h.dir); err != nil {
		return err
	}
	if err := h.prepareBackend(rec, want); err != nil {
		return err
	}
	h.known = newVerifiedRules(h.dir.root())
	return nil
}

// prepareBackend makes want the handle's backend (decideBackend's decision; rec is the record it
// decided from, read without the lock). When rec names want nothing is read again. Otherwise the
// record is made to name it; when the node's rules are in the other backend they are moved, with
// the backend lock held exclusively: the move waits for every other verb that writes rules (into
// the backend the node is leaving) to finish, and none starts until it is over.
func (h *handle) prepareBackend(rec *BackendChoice, want BackendChoice) error {
	if rec == nil || *rec != want {
		moveNeeded, err := recordBackend(h.cfg, h.dir, want, false)
		if err == nil && moveNeeded {
			if err = h.backend.Exclusive(); err == nil {
				_, err = recordBackend(h.cfg, h.dir, want, true)
				err = errors.Join(err, h.backend.Share())
			}
		}
		if err != nil {
			return err
		}
	}
	h.nf = backendFor(h.cfg, want.Backend, h.dir)
	return nil
}

// findBackend finds the backend that holds the network's rules now.
func (h *handle) findBackend() error {
	rec, err := readChoice(h.dir.root())
	if err != nil {
		return err
	}
	h.nf = inUse(h.cfg, rec, h.dir)
	return nil
}

// Close releases the attachment lock and closes the directory (which releases every lock the
// verb may still hold).
func (h *handle) Close() error {
	var err error
	if h.unlock != nil {
		err = h.unlock()
	}
	if h.backend != nil {
		err = errors.Join(err, h.backend.Release())
	}
	return errors.Join(err, h.dir.Close())
}

// bridgeConfig is the bridge cfg asks for with MTU mtu (CHECK passes cfg.MTU: 0 accepts any).
func bridgeConfig(cfg *Config, mtu int) bridge.Config {
	return bridge.Config{Name: cfg.Bridge, MTU: mtu, Gateways: cfg.Gateways(), Promisc: cfg.Hairpin.PromiscuousBridge(), Owner: cfg.Network, NetfilterCall: cfg.NetworkPolicy}
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
