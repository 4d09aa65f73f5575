package nft

import (
	"errors"
	"testing"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"

	"github.com/kubenet-dev/kubenet/test/nettest"
)

// TestNewConn: google/nftables over Exchange commits a transaction, reads it back through a dump
// (GetSets, GetSetElements: mdlayher/netlink checks the replies' port id and sequence), and
// reports an error of any message of a batch, not only of the last one, committing nothing of it.
func TestNewConn(t *testing.T) {
	n := nettest.NewNS(t)
	nettest.Do(t, n, func() error {
		c, err := NewConn()
		if err != nil {
			return err
		}
		table := c.AddTable(BridgeTable("x"))
		set := &nftables.Set{Table: table, Name: "s", KeyType: nftables.TypeInteger}
		if err := c.AddSet(set, []nftables.SetElement{{Key: []byte{1, 2, 3, 4}}}); err != nil {
			return err
		}
		if err := c.Flush(); err != nil {
			t.Fatalf("a valid transaction: %v", err)
		}
		sets, err := c.GetSets(table)
		if err != nil || len(sets) != 1 || sets[0].Name != "s" {
			t.Errorf("GetSets = %v, %v; want set s", sets, err)
		}
		els, err := c.GetSetElements(set)
		if err != nil || len(els) != 1 {
			t.Errorf("GetSetElements = %v, %v; want one element", els, err)
		}

		// The failing message first, valid ones after it: the last acknowledgement is a success.
		missing := &nftables.Set{Table: table, Name: "missing", KeyType: nftables.TypeInteger}
		if err := c.SetAddElements(missing, []nftables.SetElement{{Key: []byte{9, 9, 9, 9}}}); err != nil {
			return err
		}
		if err := c.SetAddElements(set, []nftables.SetElement{{Key: []byte{5, 6, 7, 8}}}); err != nil {
			return err
		}
		c.AddChain(&nftables.Chain{Name: "later", Table: table})
		if err := c.Flush(); !errors.Is(err, unix.ENOENT) {
			t.Errorf("a batch whose first message fails: %v, want ENOENT", err)
		}
		if els, err := c.GetSetElements(set); err != nil || len(els) != 1 {
			t.Errorf("after the failed batch the set holds %v (%v), want its one element: the batch is all or nothing", els, err)
		}
		return nil
	})
}
