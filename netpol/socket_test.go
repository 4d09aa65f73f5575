package netpol

import (
	"sync/atomic"
	"testing"

	"github.com/google/nftables"
)

// TestCommittedWhileClosing: an agent's healer asks Committed about the notification of the
// Applier's last transaction while the Applier closes its socket (Close, or the reopen after a
// refused transaction). The port id must be known throughout: as the open socket's, then as a
// closed one's. Were it known as neither for a moment, the healer would take the Applier's own
// write for another tool's.
func TestCommittedWhileClosing(t *testing.T) {
	a := NewApplier()
	for id := uint32(1); id <= 2000; id++ {
		a.mu.Lock()
		a.conn = &nftables.Conn{} // a socket (never dialled): closeSocket only closes it
		a.opening = true
		a.opened(id)
		a.opening = false
		a.mu.Unlock()
		var asked, missed atomic.Bool
		done := make(chan struct{})
		finished := make(chan struct{})
		go func() {
			defer close(finished)
			for {
				select {
				case <-done:
					return
				default:
				}
				if !a.Committed(id) {
					missed.Store(true)
				}
				asked.Store(true)
			}
		}()
		for !asked.Load() {
		}
		a.Close()
		close(done)
		<-finished
		if missed.Load() {
			t.Fatalf("port %d: Committed said no while the socket was being closed", id)
		}
		if !a.Committed(id) {
			t.Fatalf("port %d: not known after Close", id)
		}
	}
}

// TestPerRequestSocketsAreNotTheCurrentOne: a socket google/nftables opens for one request (the
// lasting one closed, a reopen failed) is closed right after it, and the kernel gives its port
// id to the next socket that asks: it is the Applier's for ownWindow, never its current one,
// which stays the lasting socket's.
func TestPerRequestSocketsAreNotTheCurrentOne(t *testing.T) {
	a := NewApplier()
	a.mu.Lock()
	a.opening = true
	a.opened(7) // the lasting socket
	a.opening = false
	a.opened(8) // a request's own
	a.opened(9)
	a.mu.Unlock()
	if got := a.current.Load(); got != 7 {
		t.Errorf("current port id %d after two requests' sockets, want the lasting socket's 7", got)
	}
	for _, id := range []uint32{7, 8, 9} {
		if !a.Committed(id) {
			t.Errorf("port %d not known as the Applier's", id)
		}
	}
}
