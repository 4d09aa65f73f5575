package overlay

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/google/nftables"

	"github.com/kubenet-dev/kubenet/test/nettest"
)

// TestFirewallManyPodNetworks writes the firewall of a node with 1000 dual-stack peers whose pod
// CIDRs no cluster CIDR covers (the agent without --cluster-cidr): the pod networks once were a
// rule's conditions, which the kernel refuses past about 30 networks of a family (a rule holds
// 4 KiB of expressions), so that any bigger cluster's overlay had no firewall and no routes
// (BenchmarkAgentScaleOverlay found it). As interval sets, consecutive CIDRs merge.
func TestFirewallManyPodNetworks(t *testing.T) {
	nettest.RequireRoot(t)
	const peers = 1000
	f := Firewall{Port: DefaultPort, Device: DefaultDevice, Bridge: "kbr0"}
	for i := range peers {
		f.Nodes = append(f.Nodes, netip.AddrFrom4([4]byte{172, 16, byte(i / 256), byte(i)}))
		f.PodNetworks = append(f.PodNetworks, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i / 256), byte(i), 0}), 24),
			netip.MustParsePrefix(fmt.Sprintf("fd00:10:0:%x::/64", 2*i))) // every other /64: no two merge
	}
	n := nettest.NewNS(t)
	nettest.Do(t, n, func() error {
		if changed, err := f.Sync(); err != nil || !changed {
			return fmt.Errorf("first write: changed %v, %v", changed, err)
		}
		if changed, err := f.Sync(); err != nil || changed {
			return fmt.Errorf("second sync: changed %v (want nothing to write), %v", changed, err)
		}
		return nil
	})
	_ = n.Do(func(ns.NetNS) error {
		c, err := nftables.New()
		if err != nil {
			t.Fatal(err)
		}
		for name, want := range map[string]int{setPods4: 2, setPods6: 2 * peers} {
			els, err := c.GetSetElements(&nftables.Set{Table: FirewallTable, Name: name})
			if err != nil || len(els) != want {
				t.Errorf("set %s: %d elements (%v), want %d", name, len(els), err, want)
			}
		}
		return nil
	})
}
