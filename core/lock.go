package core

import (
	"errors"
	"fmt"

	"github.com/kubenet-dev/kubenet/internal/safedir"
	"github.com/kubenet-dev/kubenet/ipam"
)

// openStore opens the network's address store. A data dir that others may write (or that sits
// below such a directory) is a configuration error naming dataDir: kubenet refuses to keep state
// where someone else could plant names for it to follow.
func openStore(cfg *Config) (*ipam.Store, error) {
	store, err := ipam.Open(cfg.DataDir, cfg.Network)
	if errors.Is(err, safedir.ErrUntrusted) {
		return nil, configError("dataDir", cfg.DataDir, "%v", err)
	}
	if err != nil {
		return nil, fmt.Errorf("address store: %w", err)
	}
	return store, nil
}

// withNetworkLock runs f holding the network lock and returns f's error (or the unlock's).
//
// The network lock is the flock on the lock file of the network's directory in the data dir
// (<dataDir>/<network>/lock, the same file host-local locks, so the two never hand out one
// address twice). It guards everything on the node that belongs to one network and is read
// before it is written: the address reservations, the attachment records and the hostPort
// ownership index with its nftables map elements. Every check-then-write on any of them runs
// inside one call of this function. Kernel work that does not decide ownership (links, qdiscs,
// the conntrack walk) stays outside, so the lock is held only briefly.
func withNetworkLock(store *ipam.Store, f func() error) error {
	if err := store.Lock(); err != nil {
		return fmt.Errorf("take the network lock: %w", err)
	}
	err := f()
	return errors.Join(err, store.Unlock())
}
