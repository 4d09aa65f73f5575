package hostport

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/google/nftables"

	"github.com/kubenet-dev/kubenet/internal/ipt"
	"github.com/kubenet-dev/kubenet/internal/nft"
	"github.com/kubenet-dev/kubenet/test/golden"
	"github.com/kubenet-dev/kubenet/test/nftrender"
)

// TestGolden renders what each backend programs for a node and its pods' host ports (nftables:
// the fixed chains, the maps' and hairpin sets' elements; iptables: the fixed chains and jumps,
// one DNAT and one hairpin rule per entry) and compares it with testdata/golden, so that a wrong
// port, address, protocol, direction or verdict shows in a diff without a kernel.
// `go test ./hostport/ -run TestGolden -update` rewrites the files.
func TestGolden(t *testing.T) {
	p, a := netip.MustParsePrefix, netip.MustParseAddr
	pod4, pod6 := p("10.244.1.0/24"), p("fd00:10:244:1::/64")
	type pod struct {
		owner    Owner
		ips      []netip.Addr
		mappings []Mapping
	}
	web := pod{Owner{"c0ffee", "eth0"}, []netip.Addr{a("10.244.1.5"), a("fd00:10:244:1::5")}, []Mapping{
		{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"},                             // every family of the pod
		{HostPort: 5353, ContainerPort: 53, Protocol: "udp", HostIP: a("192.168.1.10")},  // one IPv4 address
		{HostPort: 8443, ContainerPort: 443, Protocol: "tcp", HostIP: a("2001:db8::10")}, // one IPv6 address
		{HostPort: 9000, ContainerPort: 9001, Protocol: "sctp", HostIP: a("0.0.0.0")},    // any IPv4 address only
	}}
	dns := pod{Owner{"beef", "net1"}, []netip.Addr{a("10.244.1.6")}, []Mapping{
		{HostPort: 53, ContainerPort: 53, Protocol: "udp"},
		{HostPort: 53, ContainerPort: 53, Protocol: "tcp", HostIP: a("192.168.1.10")},
	}}
	v6 := pod{Owner{"f00d", "eth0"}, []netip.Addr{a("fd00:10:244:1::7")}, []Mapping{
		{HostPort: 80, ContainerPort: 8080, Protocol: "tcp", HostIP: a("::")},
		{HostPort: 3868, ContainerPort: 3868, Protocol: "sctp"},
	}}
	cases := []struct {
		name     string
		podCIDRs []netip.Prefix
		pods     []pod
	}{
		{"ipv4", []netip.Prefix{pod4}, []pod{{web.owner, web.ips[:1], web.mappings}, dns}},
		{"ipv6", []netip.Prefix{pod6}, []pod{v6}},
		{"dual-stack", []netip.Prefix{pod4, pod6}, []pod{web, dns, v6}},
		{"no-host-ports", []netip.Prefix{pod4, pod6}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{Network: "golden", Bridge: "cbr0", PodCIDRs: tc.podCIDRs}
			var rs []Reservation
			for _, pd := range tc.pods {
				entries, err := Plan(pd.mappings, pd.ips)
				if err != nil {
					t.Fatal(err)
				}
				for _, e := range entries {
					rs = append(rs, Reservation{Entry: e, Owner: pd.owner})
				}
			}
			golden.Check(t, tc.name+".nft", renderNFTables(cfg, rs))
			golden.Check(t, tc.name+".iptables", renderIPTables(cfg, rs))
		})
	}
}

// renderNFTables is the network's inet table as the nftables backend makes it: the maps and
// hairpin sets of the node's families with rs's elements, and the fixed chains.
func renderNFTables(cfg Config, rs []Reservation) string {
	table := nft.InetTable(cfg.Network)
	elements := byMap(rs)
	var sets []nftrender.Set
	for _, name := range plannedMaps(cfg) {
		sets = append(sets, nftrender.Set{Set: mapSet(table, name), Elements: elements[name]})
	}
	for _, is6 := range cfg.families() {
		var els []nftables.SetElement
		var seen []netip.Addr
		for _, r := range rs {
			if r.PodIP.Is6() == is6 && !slices.Contains(seen, r.PodIP) {
				seen = append(seen, r.PodIP)
				els = append(els, hairpinElement(r))
			}
		}
		sets = append(sets, nftrender.Set{Set: hairpinSetDef(table, is6), Elements: els})
	}
	var chainList []nftrender.Chain
	for _, ch := range chains(table) {
		var rules []nft.Rule
		for _, r := range Rules(cfg.PodCIDRs) {
			if r.Chain == ch.Name {
				rules = append(rules, nft.Rule{Comment: r.Comment, Exprs: r.Exprs})
			}
		}
		chainList = append(chainList, nftrender.Chain{Chain: ch, Rules: rules})
	}
	return nftrender.Table(table, sets, chainList)
}

// renderIPTables is every table the iptables backend writes: the fixed chains and jumps, and in
// the entry chains one DNAT rule per reservation and one hairpin rule per pod address.
func renderIPTables(cfg Config, rs []Reservation) string {
	var out string
	for _, p := range iptablesPlan(cfg) {
		plan := p.plan
		for _, name := range p.entries {
			c := ipt.Chain{Name: name}
			for _, r := range rs {
				if r.Is6() != (p.f == ipt.IPv6) {
					continue
				}
				if name == chainHPDNAT(cfg.Network) {
					c.Rules = append(c.Rules, dnatRule(r))
				}
			}
			if name == chainHPHAIR(cfg.Network) {
				c.Rules = hairpins(slices.DeleteFunc(slices.Clone(rs), func(r Reservation) bool { return r.Is6() != (p.f == ipt.IPv6) }))
			}
			plan.Chains = append(plan.Chains, c)
		}
		out += golden.IPTables(p.f, p.table, plan)
	}
	return out
}
