package hairpin

import (
	"net"
	"net/netip"
	"testing"

	"github.com/kubenet-dev/kubenet/internal/ipt"
	"github.com/kubenet-dev/kubenet/internal/nft"
	"github.com/kubenet-dev/kubenet/test/golden"
	"github.com/kubenet-dev/kubenet/test/nftrender"
)

// TestGolden renders the promiscuous-bridge dedup plan of each backend (nftables' bridge table,
// ebtables) and compares it with testdata/golden: a rule matching the wrong MAC or address, or
// dropping the gateway's frames, shows in a diff without a kernel. The other modes have no
// rules (EnsureDedup removes them). `go test ./hairpin/ -run TestGolden -update` rewrites the
// files.
func TestGolden(t *testing.T) {
	mac, _ := net.ParseMAC("02:42:0a:f4:01:01")
	p, a := netip.MustParsePrefix, netip.MustParseAddr
	cases := []struct {
		name string
		d    Dedup
	}{
		{"ipv4", Dedup{PodCIDRs: []netip.Prefix{p("10.244.1.0/24")}, Gateways: []netip.Addr{a("10.244.1.1")}}},
		{"ipv6", Dedup{PodCIDRs: []netip.Prefix{p("fd00:10:244:1::/64")}, Gateways: []netip.Addr{a("fd00:10:244:1::1")}}},
		{"dual-stack", Dedup{PodCIDRs: []netip.Prefix{p("10.244.1.0/24"), p("fd00:10:244:1::/64")}, Gateways: []netip.Addr{a("10.244.1.1"), a("fd00:10:244:1::1")}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.d.Network, tc.d.Bridge, tc.d.BridgeMAC = "golden", "cbr0", mac
			table := nft.BridgeTable(tc.d.Network)
			golden.Check(t, tc.name+".nft", nftrender.Table(table, nil, []nftrender.Chain{{Chain: dedupChain(table), Rules: PlanDedup(tc.d)}}))
			golden.Check(t, tc.name+".ebtables", golden.IPTables(ipt.Bridge, "filter", PlanDedupEbtables(tc.d)))
		})
	}
}
