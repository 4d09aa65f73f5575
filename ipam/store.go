package ipam

import (
	"github.com/kubenet-dev/kubenet/internal/safedir"
)

// Store is the on-disk reservation store of one network: the reservation files and cursors in
// <dataDir>/<network>/. It holds no lock: the network lock (statedir.Dir.Lock, the flock
// host-local takes too) is the caller's to hold around every change.
type Store struct {
	root *safedir.Dir // the network's directory; nothing below it is reached through a symlink
}

// New returns the store in the network's directory root, opened and checked by its owner
// (statedir.Dir.Root), who closes it.
func New(root *safedir.Dir) *Store { return &Store{root: root} }
