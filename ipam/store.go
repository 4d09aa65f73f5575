package ipam

import (
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/kubenet-dev/kubenet/internal/safedir"
)

// Store is the on-disk reservation store of one network: <dataDir>/<network>/.
type Store struct {
	dir  string
	root *safedir.Dir // the network's directory; nothing below it is reached through a symlink
	lock *os.File
	// netfilter serializes LockNetfilter among this Store's goroutines: the OFD lock belongs to
	// the open file description, so a second goroutine would get it at once, and the first one's
	// release would free it while the second still works under it.
	netfilter sync.Mutex
}

// Open creates the network's directory if needed and opens its lock file. Every Open has its own
// open file description, so two Stores of one directory exclude each other like two processes do.
// The data dir and the network's directory must not be writable by anyone but their owner (root
// or this user), nor sit below a directory others may write: whoever can write there could plant
// names for kubenet to follow.
func Open(dataDir, network string) (*Store, error) {
	// The name becomes a path element: refuse anything that would leave dataDir.
	if network == "" || network == "." || network == ".." || strings.ContainsAny(network, "/\x00") {
		return nil, fmt.Errorf("open store: invalid network name %q", network)
	}
	data, err := safedir.MkdirAll(dataDir, 0o755)
	if err != nil {
		return nil, fmt.Errorf("open store: data dir: %w", err)
	}
	defer data.Close()
	root, err := data.Sub(network, true, 0o755)
	if err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	lk, err := openLock(root)
	if err != nil {
		root.Close()
		return nil, fmt.Errorf("open store lock in %s: %w", root.Path(), err)
	}
	return &Store{dir: root.Path(), root: root, lock: lk}, nil
}

// openLock opens (creates) the lock file. host-local flocks this same path (through
// go-filemutex), so both plugins take one lock. We open it ourselves because go-filemutex leaves
// out O_CLOEXEC: a process we exec would inherit the lock and could hold it after we die. It is
// opened for writing because the attachment locks are fcntl write locks on it.
//
// Anything but a regular file under the name (a symlink, a directory, a fifo) is replaced: no
// process can hold a lock on it, since none opens it. The replacement happens under a flock of
// the directory itself, so two processes repairing at once cannot each make a lock file of their
// own.
func openLock(root *safedir.Dir) (*os.File, error) {
	lk, err := root.OpenFile(lockName, os.O_RDWR|os.O_CREATE, 0o600)
	if !errors.Is(err, safedir.ErrNotRegular) {
		return lk, err
	}
	if err := flock(root.Fd(), unix.LOCK_EX); err != nil {
		return nil, err
	}
	defer flock(root.Fd(), unix.LOCK_UN) //nolint:errcheck // closing the store releases it anyway
	if st, err := root.Lstat(lockName); err == nil && st.Mode&unix.S_IFMT != unix.S_IFREG {
		if err := root.RemoveAll(lockName); err != nil {
			return nil, fmt.Errorf("replace the lock, which is not a regular file: %w", err)
		}
	}
	return root.OpenFile(lockName, os.O_RDWR|os.O_CREATE, 0o600)
}

// Dir is the network's directory.
func (s *Store) Dir() string { return s.dir }

// Root is the network's directory, open and checked once for the Store's life: files read and
// written through it need no new walk of its ancestors.
func (s *Store) Root() *safedir.Dir { return s.root }

// Lock takes the exclusive flock(2) on <dir>/lock, waiting for other holders.
func (s *Store) Lock() error {
	if err := flock(int(s.lock.Fd()), unix.LOCK_EX); err != nil {
		return fmt.Errorf("lock %s: %w", s.dir, err)
	}
	return nil
}

// TryLock takes the lock if it is free and reports whether it did, without waiting.
func (s *Store) TryLock() (bool, error) {
	err := flock(int(s.lock.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	if errors.Is(err, unix.EWOULDBLOCK) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("lock %s: %w", s.dir, err)
	}
	return true, nil
}

// Unlock releases the lock.
func (s *Store) Unlock() error {
	if err := flock(int(s.lock.Fd()), unix.LOCK_UN); err != nil {
		return fmt.Errorf("unlock %s: %w", s.dir, err)
	}
	return nil
}

// LockAttachment takes the attachment lock of (id, ifname), waiting for its holder, and returns
// the function that releases it. It is an open-file-description fcntl lock on one byte of the
// lock file, at an offset derived from the attachment: held by this Store (not by the process,
// so two Stores in one process exclude each other too), independent of the flock that Lock takes,
// released by the kernel when the holder dies, and it needs no file per attachment. Two
// attachments share a byte with a chance of 2^-62: they would then only wait for each other.
func (s *Store) LockAttachment(id, ifname string) (func() error, error) {
	unlock, _, err := s.lockAttachment(id, ifname, true)
	return unlock, err
}

// TryLockAttachment takes the attachment lock of (id, ifname) if nobody holds it and reports
// whether it did, without waiting: for a pass over many attachments (the node's healing) that
// must not touch one whose ADD or DEL is in flight, and must not wait behind it. The lock is
// the Store's own: a Store that already holds it gets it again, and the release then frees it,
// so a caller skips the attachment it works on itself.
func (s *Store) TryLockAttachment(id, ifname string) (unlock func() error, ok bool, err error) {
	return s.lockAttachment(id, ifname, false)
}

// LockNetfilter takes the network's netfilter lock, waiting for its holder, and returns the
// function that releases it: what serializes the writes of node-wide iptables and ebtables rules
// (shared chains and jumps, which concurrent restores would duplicate or empty) among plugin
// processes. It is an OFD lock on byte 2^62 of the lock file, above every attachment's byte,
// independent of Lock and of the attachment locks, so it may be taken while holding either.
func (s *Store) LockNetfilter() (func() error, error) {
	s.netfilter.Lock()
	unlock, _, err := s.lockByte(netfilterByte, "netfilter", true)
	if err != nil {
		s.netfilter.Unlock()
		return nil, err
	}
	return func() error {
		defer s.netfilter.Unlock()
		return unlock()
	}, nil
}

// netfilterByte is the byte of the lock file that LockNetfilter locks.
const netfilterByte = 1 << 62

func (s *Store) lockAttachment(id, ifname string, wait bool) (func() error, bool, error) {
	h := fnv.New64a()
	h.Write([]byte(id))
	h.Write([]byte{0})
	h.Write([]byte(ifname))
	// Attachments take bytes below 2^62: byte 2^62 is the netfilter lock's.
	return s.lockByte(int64(h.Sum64()>>2), "attachment "+id+" "+ifname, wait)
}

// lockByte takes an OFD write lock on one byte of the lock file.
func (s *Store) lockByte(offset int64, what string, wait bool) (func() error, bool, error) {
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: offset, Len: 1}
	cmd := unix.F_OFD_SETLK
	if wait {
		cmd = unix.F_OFD_SETLKW
	}
	for {
		err := unix.FcntlFlock(s.lock.Fd(), cmd, &lk)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if !wait && (errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EACCES)) {
			return nil, false, nil
		}
		if err != nil {
			return nil, false, fmt.Errorf("lock %s in %s: %w", what, s.dir, err)
		}
		break
	}
	return func() error {
		un := lk
		un.Type = unix.F_UNLCK
		if err := unix.FcntlFlock(s.lock.Fd(), unix.F_OFD_SETLK, &un); err != nil {
			return fmt.Errorf("unlock %s in %s: %w", what, s.dir, err)
		}
		return nil
	}, true, nil
}

// Close closes the lock file, which releases the locks if held, and the directory.
func (s *Store) Close() error {
	err := errors.Join(s.lock.Close(), s.root.Close())
	if err != nil {
		return fmt.Errorf("close store %s: %w", s.dir, err)
	}
	return nil
}

// flock applies how to fd, retrying when a signal interrupts the wait.
func flock(fd int, how int) error {
	for {
		err := unix.Flock(fd, how)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}
