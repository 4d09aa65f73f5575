package overlay

import (
	"net/netip"
	"testing"

	"github.com/kubenet-dev/kubenet/test/golden"
	"github.com/kubenet-dev/kubenet/test/nftrender"
)

// TestFirewallGolden renders the firewall's plan (its sets with their elements, its chains) and
// compares it with testdata/golden without a kernel, for each option: with and without the
// node's underlay address, of either family, nodes listed twice or IPv4-mapped, pod networks
// that merge. TestFirewall checks the kernel's own listing of one of them (firewall.list).
// `go test ./overlay/ -run TestFirewallGolden -update` rewrites the files.
func TestFirewallGolden(t *testing.T) {
	a, p := netip.MustParseAddr, netip.MustParsePrefix
	cases := []struct {
		name string
		fw   Firewall
	}{
		{"dual-stack", Firewall{Port: 8472, Device: "kubenet-vxlan", Bridge: "cbr0",
			Nodes:       []netip.Addr{a("192.0.2.1"), a("192.0.2.2"), a("2001:db8::1"), a("192.0.2.1")},
			PodNetworks: []netip.Prefix{p("10.244.0.0/16"), p("fd00:10:244::/48")}}},
		{"local-ipv4", Firewall{Port: DefaultPort, Device: DefaultDevice, Bridge: "kbr0", Local: a("192.0.2.1"),
			Nodes:       []netip.Addr{a("192.0.2.1"), a("::ffff:192.0.2.3")},
			PodNetworks: []netip.Prefix{p("10.244.1.0/24"), p("10.244.0.0/24"), p("10.244.3.0/24")}}},
		{"local-ipv6", Firewall{Port: DefaultPort, Device: DefaultDevice, Bridge: "kbr0", Local: a("2001:db8::1"),
			Nodes:       []netip.Addr{a("2001:db8::1"), a("2001:db8::2")},
			PodNetworks: []netip.Prefix{p("fd00:10:244:1::/64"), p("fd00:10:244:2::/64")}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			golden.Check(t, tc.name+".nft", renderFirewall(tc.fw))
		})
	}
}

// renderFirewall is the table Sync writes for f.
func renderFirewall(f Firewall) string {
	var sets []nftrender.Set
	for _, s := range f.sets() {
		sets = append(sets, nftrender.Set{Set: s.set, Elements: s.els})
	}
	input, forward := f.chains()
	inRules, fwdRules := f.rules()
	raw, rawRules := f.rawChain()
	return nftrender.Table(FirewallTable, sets, []nftrender.Chain{{Chain: input, Rules: inRules}, {Chain: forward, Rules: fwdRules}, {Chain: raw, Rules: rawRules}})
}
