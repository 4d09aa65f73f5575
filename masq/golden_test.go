package masq

import (
	"net/netip"
	"testing"

	"github.com/kubenet-dev/kubenet/internal/ipt"
	"github.com/kubenet-dev/kubenet/internal/nft"
	"github.com/kubenet-dev/kubenet/test/golden"
	"github.com/kubenet-dev/kubenet/test/nftrender"
)

// TestGolden renders the SNAT plan of each backend and compares it with testdata/golden: a rule
// whose source and destination are swapped, a wrong verdict or a missing exemption shows in a
// diff, without a kernel. `go test ./masq/ -run TestGolden -update` rewrites the files.
func TestGolden(t *testing.T) {
	p := netip.MustParsePrefix
	pod4, pod6 := p("10.244.1.0/24"), p("fd00:10:244:1::/64")
	cases := []struct {
		name string
		cfg  Config
	}{
		{"ipv4", Config{PodCIDRs: []netip.Prefix{pod4}}},
		{"ipv4-non-masquerade", Config{PodCIDRs: []netip.Prefix{pod4}, NonMasqueradeCIDRs: []netip.Prefix{p("10.0.0.0/8"), p("192.168.0.0/16")}}},
		// The other family's CIDRs are left out; host bits of a CIDR are masked off.
		{"ipv4-other-family-ignored", Config{PodCIDRs: []netip.Prefix{pod4}, NonMasqueradeCIDRs: []netip.Prefix{p("fd00::/8"), p("172.16.5.9/12")}}},
		{"ipv6", Config{PodCIDRs: []netip.Prefix{pod6}, NonMasqueradeCIDRs: []netip.Prefix{p("fd00::/8")}}},
		{"dual-stack", Config{PodCIDRs: []netip.Prefix{pod4, pod6}, NonMasqueradeCIDRs: []netip.Prefix{p("10.0.0.0/8"), p("fd00::/8")}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Network = "golden"
			table := nft.InetTable(tc.cfg.Network)
			golden.Check(t, tc.name+".nft", nftrender.Table(table, nil, []nftrender.Chain{{Chain: chain(table), Rules: Plan(tc.cfg)}}))
			plans := PlanIPTables(tc.cfg)
			var text string
			for _, f := range []ipt.Family{ipt.IPv4, ipt.IPv6} {
				if plan, ok := plans[f]; ok {
					text += golden.IPTables(f, "nat", plan)
				}
			}
			golden.Check(t, tc.name+".iptables", text)
		})
	}
}
