package nft

import (
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"
)

// Ending a set element by expiry instead of deletion.
//
// A transaction that deletes anything (an element included) leaves the old objects to a kernel
// worker that frees them after an RCU grace period, and every nfnetlink socket of the namespace
// that closes while that worker is pending waits for it with the namespace's commit lock held
// (nf_tables' NETLINK_URELEASE handler flushes the worker). So one DEL's deletion costs its own
// process a grace period (~12–15 ms) and stalls every other kubenet process that closes a socket
// meanwhile: 100 parallel DELs queue 100 grace periods. Giving an existing element a timeout that
// has already run out ends it without a deletion: lookups and listings skip it at the next tick
// and the set's own garbage collector frees it later, off everyone's path.
const (
	// Forever is the timeout of an element that lives until it is ended: a century, so that
	// adding the element again (an ADD right after the DEL of the same attachment, a heal) also
	// resets an expiry that is still running out; an element without a timeout would keep it.
	Forever = 100 * 365 * 24 * time.Hour
	// EndTimeout is the timeout that ends an element: the kernel rounds it up to one tick.
	EndTimeout = time.Millisecond
)

// IsEnded tells whether el (as read from the kernel) was ended and only waits for the next tick
// to leave the listings: no element kubenet keeps has a timeout under a second.
func IsEnded(el nftables.SetElement) bool { return el.Timeout > 0 && el.Timeout < time.Second }

// IsInvalid tells whether err is the kernel's EINVAL: among others, its answer to an element
// timeout for a set without the timeout flag (made by a kubenet that did not end elements by
// expiry, or on a kernel that cannot).
func IsInvalid(err error) bool { return errors.Is(err, unix.EINVAL) }

// ProbeElementExpiry tells whether the kernel applies a new timeout to an existing element (nil)
// or keeps the old one (older kernels take the add of an existing element as a no-op), which
// decides whether kubenet's sets are made with the timeout flag and their elements ended by
// expiry. It adds an element with timeout Forever, gives it EndTimeout, and reads the expiry back, in
// a network namespace of its own on a thread that dies with it: nothing can be left behind in
// the caller's namespace, not even when the process is killed, and no deletion happens there.
// About 1 ms; callers run it only when they create sets.
func ProbeElementExpiry() error {
	done := make(chan error, 1)
	go func() {
		// Never unlocked: the runtime ends the thread with the goroutine, and with it the
		// thread's scratch namespace.
		runtime.LockOSThread()
		done <- probeExpiryHere()
	}()
	return <-done
}

func probeExpiryHere() error {
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("element expiry probe: a scratch network namespace: %w", err)
	}
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("element expiry probe: netlink: %w", err)
	}
	table := c.AddTable(&nftables.Table{Family: nftables.TableFamilyBridge, Name: "kubenet-probe"})
	set := &nftables.Set{Table: table, Name: "expiry", HasTimeout: true, KeyType: nftables.TypeInteger}
	el := nftables.SetElement{Key: []byte{1, 2, 3, 4}, Timeout: Forever}
	if err := c.AddSet(set, []nftables.SetElement{el}); err != nil {
		return fmt.Errorf("element expiry probe: %w", err)
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("element expiry probe: a set with timeouts: %w", err)
	}
	el.Timeout = EndTimeout
	if err := c.SetAddElements(set, []nftables.SetElement{el}); err != nil {
		return fmt.Errorf("element expiry probe: %w", err)
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("element expiry probe: a new timeout for an element: %w", err)
	}
	els, err := c.GetSetElements(set)
	if err != nil {
		return fmt.Errorf("element expiry probe: read back: %w", err)
	}
	// Gone already, or running out: applied. Still expiring in a century: ignored.
	if len(els) > 0 && els[0].Expires > time.Second {
		return fmt.Errorf("the kernel keeps an element's timeout when the element is added again (expires in %v after a timeout of %v)", els[0].Expires, EndTimeout)
	}
	return nil
}
