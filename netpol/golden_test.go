package netpol

import (
	"maps"
	"net/netip"
	"slices"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/kubenet-dev/kubenet/internal/policyrules"
	"github.com/kubenet-dev/kubenet/test/golden"
	"github.com/kubenet-dev/kubenet/test/nftrender"
)

// TestGolden renders the policy tables Apply writes for a ruleset (the bridge table's fixed
// chains, maps, sets and group chains with their elements; the inet table's mark chains) and
// compares them with testdata/golden, so that a peer matched as the wrong address, a mark bit
// set or tested the wrong way, or a wrong verdict shows in a diff without a kernel. nftables is
// the only backend of network policy. `go test ./netpol/ -run TestGolden -update` rewrites the
// files.
func TestGolden(t *testing.T) {
	p, a := netip.MustParsePrefix, netip.MustParseAddr
	rng := func(first, last string) policyrules.Range { return policyrules.Range{First: a(first), Last: a(last)} }
	cases := []struct {
		name string
		rs   policyrules.Ruleset
		log  policyrules.DropLog
	}{
		{"no-pods-ipv4", policyrules.Ruleset{PodCIDRs: []netip.Prefix{p("10.244.1.0/24")}, NodeAddrs: []netip.Addr{a("10.244.1.1")}}, policyrules.DropLog{}},
		{"pods-dual-stack", policyrules.Ruleset{
			PodCIDRs:  []netip.Prefix{p("10.244.1.0/24"), p("fd00:10:244:1::/64")},
			NodeAddrs: []netip.Addr{a("10.244.1.1"), a("fd00:10:244:1::1")},
			Pods: []policyrules.Pod{
				{Port: 5, Name: "ns/web", IPs: []netip.Addr{a("10.244.1.5"), a("fd00:10:244:1::5")},
					Ingress: policyrules.Direction{Isolated: true, Allow: []policyrules.Entry{
						{Peer: policyrules.PrefixRange(p("10.244.2.0/24"))},
						{Peer: rng("10.0.0.10", "10.0.0.20"), Ports: &policyrules.Ports{Protocol: policyrules.TCP, First: 80, Last: 80}},
						{Peer: policyrules.PrefixRange(p("fd00:10:244:2::/64")), Ports: &policyrules.Ports{Protocol: policyrules.UDP, First: 53, Last: 54}},
					}}},
				{Port: 7, Name: "ns/db", IPs: []netip.Addr{a("10.244.1.7")},
					Ingress: policyrules.Direction{Isolated: true}, // denies every peer
					Egress: policyrules.Direction{Isolated: true, Allow: []policyrules.Entry{
						{Peer: policyrules.PrefixRange(p("0.0.0.0/0")), Ports: &policyrules.Ports{Protocol: policyrules.SCTP, First: 3868, Last: 3868}},
					}}},
				{Port: 9, Name: "ns/open", IPs: []netip.Addr{a("fd00:10:244:1::9")}},
			},
		}, policyrules.DropLog{}},
		// Pods as peers: single addresses on every port (hosts) and one address on one port
		// (points) go into hash sets; a point a range of the same list covers is left out; a
		// single address on a port range stays an interval element.
		{"pod-peers", policyrules.Ruleset{
			PodCIDRs:  []netip.Prefix{p("10.244.1.0/24"), p("fd00:10:244:1::/64")},
			NodeAddrs: []netip.Addr{a("10.244.1.1"), a("fd00:10:244:1::1")},
			Pods: []policyrules.Pod{
				{Port: 5, Name: "ns/web", IPs: []netip.Addr{a("10.244.1.5"), a("fd00:10:244:1::5")},
					Ingress: policyrules.Direction{Isolated: true, Allow: []policyrules.Entry{
						{Peer: policyrules.Single(a("10.244.2.7"))},
						{Peer: policyrules.Single(a("fd00:10:244:2::7"))},
						{Peer: policyrules.Single(a("10.244.2.8")), Ports: &policyrules.Ports{Protocol: policyrules.TCP, First: 8080, Last: 8080}},
						{Peer: policyrules.Single(a("10.244.2.9")), Ports: &policyrules.Ports{Protocol: policyrules.TCP, First: 8080, Last: 8080}},
						{Peer: policyrules.Single(a("fd00:10:244:2::8")), Ports: &policyrules.Ports{Protocol: policyrules.UDP, First: 53, Last: 53}},
						{Peer: policyrules.Single(a("10.0.0.15")), Ports: &policyrules.Ports{Protocol: policyrules.TCP, First: 80, Last: 80}}, // in the range below
						{Peer: rng("10.0.0.10", "10.0.0.20"), Ports: &policyrules.Ports{Protocol: policyrules.TCP, First: 80, Last: 80}},
						{Peer: policyrules.Single(a("10.244.2.10")), Ports: &policyrules.Ports{Protocol: policyrules.TCP, First: 9000, Last: 9010}},
					}}},
			},
		}, policyrules.DropLog{}},
		// The same allow list enforced (ns/web) and staged (ns/staged): two groups, the audit
		// one passing what it does not allow; a staged deny-all egress (ns/staged).
		{"audit", policyrules.Ruleset{
			PodCIDRs:  []netip.Prefix{p("10.244.1.0/24")},
			NodeAddrs: []netip.Addr{a("10.244.1.1")},
			Pods: []policyrules.Pod{
				{Port: 5, Name: "ns/web", IPs: []netip.Addr{a("10.244.1.5")},
					Ingress: policyrules.Direction{Isolated: true, Allow: []policyrules.Entry{
						{Peer: rng("10.0.0.10", "10.0.0.20"), Ports: &policyrules.Ports{Protocol: policyrules.TCP, First: 80, Last: 80}}}}},
				{Port: 6, Name: "ns/staged", IPs: []netip.Addr{a("10.244.1.6")},
					Ingress: policyrules.Direction{Isolated: true, Audit: true, Allow: []policyrules.Entry{
						{Peer: rng("10.0.0.10", "10.0.0.20"), Ports: &policyrules.Ports{Protocol: policyrules.TCP, First: 80, Last: 80}}}},
					Egress: policyrules.Direction{Isolated: true, Audit: true}},
			},
		}, policyrules.DropLog{Group: policyrules.DefaultLogGroup, Rate: policyrules.DefaultLogRate, Burst: policyrules.DefaultLogBurst}},
		{"drop-log", policyrules.Ruleset{
			PodCIDRs:  []netip.Prefix{p("10.244.1.0/24")},
			NodeAddrs: []netip.Addr{a("10.244.1.1")},
			Pods: []policyrules.Pod{
				{Port: 5, Name: "ns/web", IPs: []netip.Addr{a("10.244.1.5")},
					Ingress: policyrules.Direction{Isolated: true, Allow: []policyrules.Entry{
						{Peer: policyrules.PrefixRange(p("10.244.2.0/24")), Ports: &policyrules.Ports{Protocol: policyrules.TCP, First: 80, Last: 80}},
					}}},
			},
		}, policyrules.DropLog{Group: policyrules.DefaultLogGroup, Rate: policyrules.DefaultLogRate, Burst: policyrules.DefaultLogBurst}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			const network = "golden"
			d := plan(tc.rs, newGroupMemo())
			assignStems(d, state{}, nil, newSlots(nil))
			if len(d.refused) > 0 {
				t.Fatalf("refused: %v", d.refused)
			}
			bt, it := BridgeTable(network), InetTable(network)
			var sets []nftrender.Set
			for _, s := range fixedSets(bt) {
				var els []nftables.SetElement
				switch s.Name {
				case MapEgress, MapIngress:
					for _, port := range slices.Sorted(maps.Keys(d.maps[s.Name])) {
						els = append(els, nftables.SetElement{Key: portKey(port), VerdictData: &expr.Verdict{Kind: expr.VerdictGoto, Chain: d.maps[s.Name][port]}})
					}
				case SetOnLink:
					els = onLinkElements(tc.rs.PodCIDRs)
				case SetLocalPodsIPv4, SetLocalPodsIPv6:
					els = localPodsElements(tc.rs.PodCIDRs, tc.rs.NodeAddrs, s.Name == SetLocalPodsIPv6)
				case SetSourcesIPv4, SetSourcesIPv6:
					els = d.sources[s.Name]
				case SetDropsEgress, SetDropsIngress:
					names := map[int]string{}
					for _, p := range tc.rs.Pods {
						names[p.Port] = p.Name
					}
					dir := egressDir
					if s.Name == SetDropsIngress {
						dir = ingressDir
					}
					els = dropsElements(d.maps[mapOf(dir)], names)
				}
				sets = append(sets, nftrender.Set{Set: s, Elements: els})
			}
			rules := BridgeRules(network, tc.log)
			var chains []nftrender.Chain
			for _, ch := range bridgeChains(bt) {
				chains = append(chains, nftrender.Chain{Chain: ch, Rules: rules[ch.Name]})
			}
			for _, name := range slices.Sorted(maps.Keys(d.groups)) {
				g := d.groups[name]
				for _, s := range groupSets(bt, g.stem, g.group, true) {
					sets = append(sets, nftrender.Set{Set: s.set, Elements: s.elements})
				}
				chains = append(chains, nftrender.Chain{Chain: &nftables.Chain{Table: bt, Name: name}, Rules: groupRules(name, g.stem, g.dir, g.group, g.audit)})
			}
			var inet []nftrender.Chain
			inetRules := InetRules()
			for _, ch := range inetChains(it) {
				inet = append(inet, nftrender.Chain{Chain: ch, Rules: inetRules[ch.Name]})
			}
			golden.Check(t, tc.name+".nft", nftrender.Table(bt, sets, chains)+"\n"+nftrender.Table(it, nil, inet))
		})
	}
}
