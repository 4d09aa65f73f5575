package nft

import (
	"testing"

	"github.com/google/nftables"

	"github.com/kubenet-dev/kubenet/test/nettest"
)

// TestGenerations: the generation moves by one with each committed transaction of the network
// namespace that changes something, whoever sends it (here another socket), stays where it is
// between them and for a transaction that changes nothing, and is the namespace's own: one
// namespace's commits do not move another's.
func TestGenerations(t *testing.T) {
	a, b := nettest.NewNS(t), nettest.NewNS(t)
	commit := func(queue func(*nftables.Conn)) error {
		c, err := NewConn()
		if err != nil {
			return err
		}
		queue(c)
		return c.Flush()
	}
	add := func(n string) func(*nftables.Conn) { return func(c *nftables.Conn) { c.AddTable(BridgeTable(n)) } }
	del := func(n string) func(*nftables.Conn) { return func(c *nftables.Conn) { c.DelTable(BridgeTable(n)) } }
	var inB uint32
	nettest.Do(t, b, func() error {
		g, err := OpenGenerations()
		if err != nil {
			return err
		}
		defer g.Close()
		inB, err = g.Read()
		return err
	})
	nettest.Do(t, a, func() error {
		g, err := OpenGenerations()
		if err != nil {
			return err
		}
		defer g.Close()
		start, err := g.Read()
		if err != nil {
			return err
		}
		if again, err := g.Read(); err != nil || again != start {
			t.Fatalf("read again with no commit: %d, %v; want %d", again, err, start)
		}
		for i, step := range []struct {
			queue func(*nftables.Conn)
			moves uint32
		}{{add("one"), 1}, {add("two"), 1}, {add("one"), 0}, {del("one"), 1}} {
			if err := commit(step.queue); err != nil {
				return err
			}
			got, err := g.Read()
			if err != nil {
				return err
			}
			if want := start + step.moves; got != want {
				t.Errorf("after commit %d: generation %d, want %d", i+1, got, want)
			}
			start = got
		}
		return nil
	})
	nettest.Do(t, b, func() error {
		g, err := OpenGenerations()
		if err != nil {
			return err
		}
		defer g.Close()
		if got, err := g.Read(); err != nil || got != inB {
			t.Errorf("the other namespace's generation: %d, %v; want %d (unchanged)", got, err, inB)
		}
		return nil
	})
}
