// Package statedir is one network's directory in the data dir, <dataDir>/<network>/, with the
// locks that guard it. They guard more than addresses: the network lock is the flock(2) on
// <dataDir>/<network>/lock (the file the reference host-local IPAM plugin flocks, so the two never
// hand out one address twice), taken around every check-then-write of the network's state on the
// node; the attachment locks, the netfilter lock and the backend lock are fcntl locks on bytes of
// the same file.
// What lives in the directory (reservations: ipam; attachment records and the node's files:
// core) is read and written through Root.
package statedir

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

// lockName is the lock file in the network's directory (host-local's name).
const lockName = "lock"

// Dir is one network's directory, open, with its lock file.
type Dir struct {
	root *safedir.Dir // the network's directory; nothing below it is reached through a symlink
	lock *os.File
	// netfilter serializes LockNetfilter among this Dir's goroutines: the OFD lock belongs to
	// the open file description, so a second goroutine would get it at once, and the first one's
	// release would free it while the second still works under it.
	netfilter sync.Mutex
}

// Open creates the network's directory if needed and opens its lock file. Every Open has its own
// open file description, so two Dirs of one directory exclude each other like two processes do.
// The data dir and the network's directory must not be writable by anyone but their owner (root
// or this user), nor sit below a directory others may write: whoever can write there could plant
// names for kubenet to follow.
func Open(dataDir, network string) (*Dir, error) {
	// The name becomes a path element: refuse anything that would leave dataDir.
	if network == "" || network == "." || network == ".." || strings.ContainsAny(network, "/\x00") {
		return nil, fmt.Errorf("open state dir: invalid network name %q", network)
	}
	data, err := safedir.MkdirAll(dataDir, 0o755)
	if err != nil {
		return nil, fmt.Errorf("open state dir: data dir: %w", err)
	}
	defer data.Close()
	root, err := data.Sub(network, true, 0o755)
	if err != nil {
		return nil, fmt.Errorf("open state dir: %w", err)
	}
	lk, err := openLock(root)
	if err != nil {
		root.Close()
		return nil, fmt.Errorf("open state dir lock in %s: %w", root.Path(), err)
	}
	return &Dir{root: root, lock: lk}, nil
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
	defer flock(root.Fd(), unix.LOCK_UN) //nolint:errcheck // closing the Dir releases it anyway
	if st, err := root.Lstat(lockName); err == nil && st.Mode&unix.S_IFMT != unix.S_IFREG {
		if err := root.RemoveAll(lockName); err != nil {
			return nil, fmt.Errorf("replace the lock, which is not a regular file: %w", err)
		}
	}
	return root.OpenFile(lockName, os.O_RDWR|os.O_CREATE, 0o600)
}

// Path is the network's directory.
func (d *Dir) Path() string { return d.root.Path() }

// Root is the network's directory, open and checked once for the Dir's life: files read and
// written through it need no new walk of its ancestors.
func (d *Dir) Root() *safedir.Dir { return d.root }

// Lock takes the exclusive flock(2) on <dir>/lock, waiting for other holders.
func (d *Dir) Lock() error {
	if err := flock(int(d.lock.Fd()), unix.LOCK_EX); err != nil {
		return fmt.Errorf("lock %s: %w", d.Path(), err)
	}
	return nil
}

// TryLock takes the lock if it is free and reports whether it did, without waiting.
func (d *Dir) TryLock() (bool, error) {
	err := flock(int(d.lock.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	if errors.Is(err, unix.EWOULDBLOCK) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("lock %s: %w", d.Path(), err)
	}
	return true, nil
}

// Unlock releases the lock.
func (d *Dir) Unlock() error {
	if err := flock(int(d.lock.Fd()), unix.LOCK_UN); err != nil {
		return fmt.Errorf("unlock %s: %w", d.Path(), err)
	}
	return nil
}

// LockAttachment takes the attachment lock of (id, ifname), waiting for its holder, and returns
// the function that releases it. It is an open-file-description fcntl lock on one byte of the
// lock file, at an offset derived from the attachment: held by this Dir (not by the process,
// so two Dirs in one process exclude each other too), independent of the flock that Lock takes,
// released by the kernel when the holder dies, and it needs no file per attachment. Two
// attachments share a byte with a chance of 2^-62: they would then only wait for each other.
func (d *Dir) LockAttachment(id, ifname string) (func() error, error) {
	unlock, _, err := d.lockAttachment(id, ifname, unix.F_WRLCK, true)
	return unlock, err
}

// TryLockAttachment takes the attachment lock of (id, ifname) if nobody holds it and reports
// whether it did, without waiting: for a pass over many attachments (the node's healing) that
// must not touch one whose ADD or DEL is in flight, and must not wait behind it. The lock is
// the Dir's own: a Dir that already holds it gets it again, and the release then frees it,
// so a caller skips the attachment it works on itself.
func (d *Dir) TryLockAttachment(id, ifname string) (unlock func() error, ok bool, err error) {
	return d.lockAttachment(id, ifname, unix.F_WRLCK, false)
}

// LockAttachmentShared takes the attachment lock of (id, ifname) shared, waiting for a holder
// of it exclusive (LockAttachment), and returns the function that releases it: for a verb that
// only reads the attachment (CHECK). Shared holders exclude an ADD or DEL of the attachment, not
// one another: a reader does not keep the node's healing, which takes the lock shared too, from
// putting the attachment's rules back.
func (d *Dir) LockAttachmentShared(id, ifname string) (func() error, error) {
	unlock, _, err := d.lockAttachment(id, ifname, unix.F_RDLCK, true)
	return unlock, err
}

// TryLockAttachmentShared is TryLockAttachment, shared: it fails only while an ADD or DEL of the
// attachment holds the lock (exclusively), not while a reader (CHECK, another pass of the node's
// healing) does. A Dir that holds the lock exclusively converts it to shared: a caller skips the
// attachment it works on itself.
func (d *Dir) TryLockAttachmentShared(id, ifname string) (unlock func() error, ok bool, err error) {
	return d.lockAttachment(id, ifname, unix.F_RDLCK, false)
}

// LockNetfilter takes the network's netfilter lock, waiting for its holder, and returns the
// function that releases it: what serializes the writes of node-wide iptables and ebtables rules
// (shared chains and jumps, which concurrent restores would duplicate or empty) among plugin
// processes. It is an OFD lock on byte 2^62 of the lock file, above every attachment's byte,
// independent of Lock and of the attachment locks, so it may be taken while holding either.
func (d *Dir) LockNetfilter() (func() error, error) {
	d.netfilter.Lock()
	unlock, _, err := d.lockByte(netfilterByte, "netfilter", true)
	if err != nil {
		d.netfilter.Unlock()
		return nil, err
	}
	return func() error {
		defer d.netfilter.Unlock()
		return unlock()
	}, nil
}

// The bytes of the lock file above every attachment's: LockNetfilter's, the backend lock's, and
// the turnstile in front of the backend lock.
const (
	netfilterByte = 1 << 62
	backendByte   = netfilterByte + 1
	turnstileByte = netfilterByte + 2
)

// BackendLock is a verb's hold on the network's netfilter backend: shared by every verb that
// writes the node's rules in the backend it chose when it opened (ADD, the node's healing), and
// exclusive while one of them moves the rules to the other backend. A switch therefore waits for
// every such verb in flight to finish, and none starts until the switch is over: no verb writes
// into a backend the node has left.
//
// It is an OFD lock on one byte of the lock file (released by the kernel when the holder dies),
// with a turnstile in front: a verb that asks for it shared first passes the turnstile, which a
// verb asking for it exclusively holds while it waits, so a stream of shared holders cannot keep
// a switch waiting forever.
type BackendLock struct {
	d    *Dir
	held int16 // unix.F_RDLCK, unix.F_WRLCK, or unix.F_UNLCK
}

// ShareBackend takes the backend lock shared, waiting for a switch in progress.
func (d *Dir) ShareBackend() (*BackendLock, error) {
	l := &BackendLock{d: d, held: unix.F_UNLCK}
	return l, l.Share()
}

// Share takes the lock shared: from exclusive it is a downgrade, which never waits.
func (l *BackendLock) Share() error {
	if l.held == unix.F_UNLCK {
		pass, _, err := l.d.lockRange(turnstileByte, unix.F_WRLCK, "backend turnstile", true)
		if err != nil {
			return err
		}
		if err := pass(); err != nil {
			return err
		}
	}
	if _, _, err := l.d.lockRange(backendByte, unix.F_RDLCK, "backend (shared)", true); err != nil {
		return err
	}
	l.held = unix.F_RDLCK
	return nil
}

// Exclusive takes the lock exclusively, waiting for every shared holder to release it. A shared
// hold is released first: two holders each waiting for the other to let go would wait forever
// (the kernel finds no deadlock among OFD locks).
func (l *BackendLock) Exclusive() error {
	if err := l.Release(); err != nil {
		return err
	}
	leave, _, err := l.d.lockRange(turnstileByte, unix.F_WRLCK, "backend turnstile", true)
	if err != nil {
		return err
	}
	_, _, err = l.d.lockRange(backendByte, unix.F_WRLCK, "backend (exclusive)", true)
	if err == nil {
		l.held = unix.F_WRLCK
	}
	return errors.Join(err, leave())
}

// Release lets the lock go, whichever way it is held.
func (l *BackendLock) Release() error {
	if l.held == unix.F_UNLCK {
		return nil
	}
	l.held = unix.F_UNLCK
	un := unix.Flock_t{Type: unix.F_UNLCK, Start: backendByte, Len: 1}
	if err := unix.FcntlFlock(l.d.lock.Fd(), unix.F_OFD_SETLK, &un); err != nil {
		return fmt.Errorf("unlock the backend lock in %s: %w", l.d.Path(), err)
	}
	return nil
}

func (d *Dir) lockAttachment(id, ifname string, kind int16, wait bool) (func() error, bool, error) {
	h := fnv.New64a()
	h.Write([]byte(id))
	h.Write([]byte{0})
	h.Write([]byte(ifname))
	// Attachments take bytes below 2^62: byte 2^62 is the netfilter lock'd.
	return d.lockRange(int64(h.Sum64()>>2), kind, "attachment "+id+" "+ifname, wait)
}

// lockByte takes an OFD write lock on one byte of the lock file.
func (d *Dir) lockByte(offset int64, what string, wait bool) (func() error, bool, error) {
	return d.lockRange(offset, unix.F_WRLCK, what, wait)
}

// lockRange takes an OFD lock of type kind (unix.F_RDLCK or unix.F_WRLCK) on one byte of the lock
// file; a lock this Dir holds on it already is converted to kind.
func (d *Dir) lockRange(offset int64, kind int16, what string, wait bool) (func() error, bool, error) {
	lk := unix.Flock_t{Type: kind, Whence: 0, Start: offset, Len: 1}
	cmd := unix.F_OFD_SETLK
	if wait {
		cmd = unix.F_OFD_SETLKW
	}
	for {
		err := unix.FcntlFlock(d.lock.Fd(), cmd, &lk)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if !wait && (errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EACCES)) {
			return nil, false, nil
		}
		if err != nil {
			return nil, false, fmt.Errorf("lock %s in %s: %w", what, d.Path(), err)
		}
		break
	}
	return func() error {
		un := lk
		un.Type = unix.F_UNLCK
		if err := unix.FcntlFlock(d.lock.Fd(), unix.F_OFD_SETLK, &un); err != nil {
			return fmt.Errorf("unlock %s in %s: %w", what, d.Path(), err)
		}
		return nil
	}, true, nil
}

// Close closes the lock file, which releases the locks if held, and the directory.
func (d *Dir) Close() error {
	err := errors.Join(d.lock.Close(), d.root.Close())
	if err != nil {
		return fmt.Errorf("close state dir %s: %w", d.Path(), err)
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
