package isolation

import (
	"net"
	"net/netip"
	"testing"

	"github.com/kubenet-dev/kubenet/internal/ipt"
	"github.com/kubenet-dev/kubenet/internal/nft"
	"github.com/kubenet-dev/kubenet/test/golden"
	"github.com/kubenet-dev/kubenet/test/nftrender"
)

// TestGolden renders what each backend programs for a configuration and its pods (nftables: the
// bridge table's chains and the ports' set elements; ebtables: the guard, the dispatch rules and
// the pods' chains) and compares it with testdata/golden, so that a wrong offset, direction or
// verdict of the router guard or of anti-spoofing shows in a diff without a kernel.
// `go test ./isolation/ -run TestGolden -update` rewrites the files.
func TestGolden(t *testing.T) {
	mac := func(s string) net.HardwareAddr {
		m, err := net.ParseMAC(s)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	a := netip.MustParseAddr
	dual := Port{Name: "veth1a2b3c4d", Owner: "c0ffee/eth0", MAC: mac("0a:58:0a:f4:01:05"), Addrs: []netip.Addr{a("10.244.1.5"), a("fd00:10:244:1::5")}}
	ipv4 := Port{Name: "veth5e6f7a8b", Owner: "beef/eth0", MAC: mac("0a:58:0a:f4:01:06"), Addrs: []netip.Addr{a("10.244.1.6")}}
	cases := []struct {
		name  string
		cfg   Config
		ports []Port
	}{
		{"guard-only", Config{}, []Port{dual}},
		{"anti-spoofing", Config{AntiSpoofing: true}, []Port{dual, ipv4}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Network = "golden"
			table := nft.BridgeTable(tc.cfg.Network)
			els := elementsOf(tc.ports, tc.cfg.AntiSpoofing)
			var listed []nftrender.Set
			for _, s := range sets(table, true) {
				listed = append(listed, nftrender.Set{Set: s, Elements: els[s.Name]})
			}
			var chains []nftrender.Chain
			for _, c := range Plan(tc.cfg) {
				chains = append(chains, nftrender.Chain{Chain: chainDef(table, c), Rules: c.Rules})
			}
			golden.Check(t, tc.name+".nft", nftrender.Table(table, listed, chains))

			plan := EbtablesNodePlan(tc.cfg)
			pods := ipt.Chain{Name: ebtablesPods(tc.cfg.Network), Policy: "RETURN"}
			var podChains []ipt.Chain
			for _, p := range tc.ports {
				pods.Rules = append(pods.Rules, dispatch(tc.cfg.Network, p.Name))
				podChains = append(podChains, ebtablesPodChain(tc.cfg, p))
			}
			plan.Chains = append(append(plan.Chains, pods), podChains...)
			golden.Check(t, tc.name+".ebtables", golden.IPTables(ipt.Bridge, ebtablesTable, plan))
		})
	}
}
