package core

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/nftables"

	"github.com/kubenet-dev/kubenet/internal/nft"
	"github.com/kubenet-dev/kubenet/masq"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

// TestHealRepairsWhatItFoundWhateverTheMemorySays: the verified-rules memory in the data dir
// says which dumps of the node-wide chains were found to hold the plan. One that claims an
// emptied SNAT chain holds it (a forged file: nothing the heal can tell from a true one) must not stop HealNode from repairing the chain that its own
// full check found empty: the agent's heal is the node's safety net.
func TestHealRepairsWhatItFoundWhateverTheMemorySays(t *testing.T) {
	dataDir := t.TempDir()
	node := nettest.NewNS(t)
	cfg, err := ParseConfig(conf(`"dataDir":"` + dataDir + `"`))
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dataDir, "kubenet", VerifiedRulesFile)
	nettest.Do(t, node, func() error {
		// Twice: the first sets the node up, the second learns the healthy chains' dumps.
		for range 2 {
			if _, err := HealNode(context.Background(), cfg, true); err != nil {
				return err
			}
		}
		b, err := os.ReadFile(file)
		if err != nil {
			return err
		}
		var f struct{ Pairs []verifiedPair }
		if err := json.Unmarshal(b, &f); err != nil {
			return err
		}
		if len(f.Pairs) == 0 {
			t.Fatal("the heal learned nothing: the test cannot poison the memory")
		}
		// The SNAT chain emptied, and the memory told that this dump holds every plan it knows.
		chain := &nftables.Chain{Table: nft.InetTable(cfg.Network), Name: masq.ChainName}
		c, err := nftables.New()
		if err != nil {
			return err
		}
		c.FlushChain(chain)
		if err := c.Flush(); err != nil {
			return err
		}
		d, err := nft.DumpChain(chain)
		if err != nil {
			return err
		}
		k, err := d.Digest([]string{masq.ChainName})
		if err != nil {
			return err
		}
		for _, p := range f.Pairs {
			f.Pairs = append(f.Pairs, verifiedPair{Plan: p.Plan, Kernel: k.String()})
		}
		b, _ = json.Marshal(f)
		if err := os.WriteFile(file, b, 0o644); err != nil {
			return err
		}
		rep, err := HealNode(context.Background(), cfg, true)
		if err != nil {
			return err
		}
		if rep.Found == nil {
			t.Error("the heal found nothing missing in an emptied SNAT chain")
		}
		if err := masq.Check(masq.Config{Network: cfg.Network, PodCIDRs: cfg.PodCIDRs(), NonMasqueradeCIDRs: cfg.NonMasqueradeCIDRs}); err != nil {
			t.Errorf("after the heal the SNAT chain is not as planned: %v", err)
		}
		return nil
	})
}
