package nft

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
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

// ProbeSet is the set ProbeElementExpiry leaves in the table it probed in: one element per probe
// on a kernel that keeps element timeouts, none on one that ends them.
const ProbeSet = "expiry-probe"

// ProbeElementExpiry tells whether the kernel applies a new timeout to an existing element (nil)
// or keeps the old one (older kernels take the add of an existing element as a no-op), which
// decides whether kubenet's sets are made with the timeout flag and their elements ended by
// expiry. In table (made when missing), it adds an element with timeout Forever to ProbeSet,
// gives it EndTimeout, and reads the expiry back. Nothing is deleted: on a kernel that applies
// the update the element ends by expiry, on one that does not it stays, under a key of its own
// (random: concurrent probes do not read each other's), in a set nothing refers to. A few
// netlink round trips in the caller's namespace; callers run it only when they create sets.
func ProbeElementExpiry(table *nftables.Table) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("element expiry probe: netlink: %w", err)
	}
	c.AddTable(table)
	set := &nftables.Set{Table: table, Name: ProbeSet, HasTimeout: true, KeyType: nftables.TypeInteger}
	key := make([]byte, 4)
	if _, err := rand.Read(key); err != nil {
		return fmt.Errorf("element expiry probe: %w", err)
	}
	el := nftables.SetElement{Key: key, Timeout: Forever}
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
	for _, got := range els {
		if bytes.Equal(got.Key, key) && got.Expires > time.Second {
			return fmt.Errorf("the kernel keeps an element's timeout when the element is added again (expires in %v after a timeout of %v)", got.Expires, EndTimeout)
		}
	}
	return nil
}
