package hostport

import (
	"errors"
	"fmt"
	"slices"
	"syscall"
	"testing"

	"github.com/google/nftables"
)

// faults is a commit for nftablesBackend that loses the kernel's answer (ENOBUFS, as an
// overflowing netlink socket does) according to plan: for the n-th transaction (from 0),
// "committed" sends it and then reports the loss, "lost" reports the loss without sending it,
// "refused" reports another error without sending it, "committed-refused" sends it and then
// reports another error; transactions beyond the plan are sent.
type faults struct {
	plan []string
	n    int
}

func (f *faults) commit(c *nftables.Conn) error {
	what := "ok"
	if f.n < len(f.plan) {
		what = f.plan[f.n]
	}
	f.n++
	switch what {
	case "committed":
		if err := c.Flush(); err != nil {
			return err
		}
		return fmt.Errorf("netlink receive: %w", syscall.ENOBUFS)
	case "lost":
		return fmt.Errorf("netlink receive: %w", syscall.ENOBUFS)
	case "refused":
		return fmt.Errorf("netlink: %w", syscall.EPERM)
	case "committed-refused":
		if err := c.Flush(); err != nil {
			return err
		}
		return fmt.Errorf("netlink: %w", syscall.EPERM)
	}
	return c.Flush()
}

// TestOutcomeUnknown: a transaction whose answer is lost may or may not have been committed.
// Add and Remove read the kernel back instead of trusting either: an Add whose elements are in
// succeeds, one whose elements are not fails and leaves nothing behind; a Remove succeeds once the
// elements are gone, whichever way. When even the undo of a failed Add cannot remove committed
// elements, Add says so (LeftoverError) and keeps their index files, so that DEL or GC finds
// them before anyone else gets their keys or addresses.
func TestOutcomeUnknown(t *testing.T) {
	es := []Entry{entry("tcp", 80, any4, pod4, 8080), entry("udp", 53, ip6, pod6, 53), entry("tcp", 443, any6, pod6, 8443)}
	mine := func() []Reservation { return reservations(ownerA, es) }
	cases := []struct {
		name string
		// add and remove are the fault plans of Add and of the Remove after it (nil: no Remove).
		add, remove []string
		addErr      string // "" success, "error", "leftover"
		inKernel    bool   // after Add
	}{
		{name: "add committed, answer lost", add: []string{"committed"}, remove: []string{}, inKernel: true},
		{name: "add not committed, answer lost", add: []string{"lost"}, addErr: "error"},
		{name: "add committed, answer lost, remove committed, answer lost", add: []string{"committed"}, remove: []string{"committed"}, inKernel: true},
		{name: "remove not committed, answer lost: the read-back deletes", add: []string{}, remove: []string{"lost"}, inKernel: true},
		{name: "add refused after commit, undo refused too: leftover", add: []string{"committed-refused", "refused", "refused"}, addErr: "leftover", inKernel: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t)
			w.do(t, func() error { _, err := EnsureNode(w.cfg, false); return err })
			f := &faults{plan: tc.add}
			faulty := w.cfg
			faulty.Backend = nftablesBackend{commit: f.commit}
			var addErr error
			w.do(t, func() error { addErr = Add(faulty, ownerA, es); return nil })
			var leftover *LeftoverError
			switch {
			case tc.addErr == "" && addErr != nil:
				t.Fatalf("Add = %v, want success", addErr)
			case tc.addErr == "error" && (addErr == nil || errors.As(addErr, &leftover)):
				t.Fatalf("Add = %v, want a plain error", addErr)
			case tc.addErr == "leftover" && !errors.As(addErr, &leftover):
				t.Fatalf("Add = %v, want a LeftoverError", addErr)
			}
			kernel := w.kernelElements(t)
			for _, r := range mine() {
				if got := slices.Contains(kernel, r); got != tc.inKernel {
					t.Errorf("after Add: %s in the kernel = %v, want %v", r.Entry, got, tc.inKernel)
				}
			}
			var index []Reservation
			w.do(t, func() (err error) { index, err = NewIndex(w.cfg.Dir).All(); return err })
			if wantIndex := tc.addErr != "error"; (len(index) == len(es)) != wantIndex || (!wantIndex && len(index) != 0) {
				t.Errorf("after Add: index %v, want the entries reserved = %v", index, wantIndex)
			}
			if tc.remove == nil && tc.addErr != "leftover" {
				return
			}
			// DEL (or GC) removes what is left, through a backend that may lose answers too.
			f.plan, f.n = tc.remove, 0
			w.do(t, func() error { return Remove(faulty, ownerA, KeysOf(es)) })
			if got := w.kernelElements(t); len(got) != 0 {
				t.Errorf("after Remove: kernel holds %v", got)
			}
			w.do(t, func() (err error) { index, err = NewIndex(w.cfg.Dir).All(); return err })
			if len(index) != 0 {
				t.Errorf("after Remove: index holds %v", index)
			}
		})
	}
}
