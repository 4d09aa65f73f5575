package hostport

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/google/nftables/expr"

	"github.com/kubenet-dev/kubenet/internal/nft"
)

var (
	cidr4 = netip.MustParsePrefix("10.244.1.0/24")
	cidr6 = netip.MustParsePrefix("fd00:10:244:1::/64")
)

// rulesByChain counts the planned rules per chain.
func rulesByChain(rules []Rule) map[string]int {
	out := map[string]int{}
	for _, r := range rules {
		out[r.Chain]++
	}
	return out
}

func TestRulesPerConfiguration(t *testing.T) {
	cases := []struct {
		name string
		pods []netip.Prefix
		want map[string]int
	}{
		// Per IPv4 CIDR: 2 maps x (pods, localhost, others); per IPv6 CIDR: the ::1 return, then
		// 2 maps x (pods, others). The localnet guard exists only with IPv4. Masquerade: a pod
		// to itself per family, localhost with IPv4, and the rule that keeps other sources.
		{"dual-stack", []netip.Prefix{cidr4, cidr6}, map[string]int{ChainPrerouting: 1, ChainOutput: 1, ChainDNAT: 11, ChainMasquerade: 4, ChainLocalnet: 2}},
		{"IPv4", []netip.Prefix{cidr4}, map[string]int{ChainPrerouting: 1, ChainOutput: 1, ChainDNAT: 6, ChainMasquerade: 3, ChainLocalnet: 2}},
		{"IPv6", []netip.Prefix{cidr6}, map[string]int{ChainPrerouting: 1, ChainOutput: 1, ChainDNAT: 5, ChainMasquerade: 2}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := rulesByChain(Rules(tc.pods))
			if len(got) != len(tc.want) {
				t.Errorf("chains %v, want %v", got, tc.want)
			}
			for ch, n := range tc.want {
				if got[ch] != n {
					t.Errorf("chain %s has %d rules, want %d", ch, got[ch], n)
				}
			}
		})
	}
}

// TestRulesEnterOnlyForLocalDestinations: the base chains are the only way into the DNAT chain,
// and both require a local destination (the GHSA-jv3w-x3r3-g6rm fix).
func TestRulesEnterOnlyForLocalDestinations(t *testing.T) {
	for _, r := range Rules([]netip.Prefix{cidr4, cidr6}) {
		var jumps, fibLocal bool
		for _, e := range r.Exprs {
			switch e := e.(type) {
			case *expr.Verdict:
				jumps = jumps || e.Chain == ChainDNAT
			case *expr.Fib:
				fibLocal = e.FlagDADDR && e.ResultADDRTYPE
			}
		}
		if jumps != (r.Chain == ChainPrerouting || r.Chain == ChainOutput) {
			t.Errorf("rule %q in %s: jumps to %s = %v", r.Comment, r.Chain, ChainDNAT, jumps)
		}
		if jumps && !fibLocal {
			t.Errorf("rule %q enters %s without `fib daddr type local`", r.Comment, ChainDNAT)
		}
	}
}

// TestRulesTouchOnlyTheirMarkBit: every write of the packet mark keeps all bits but Mark.
func TestRulesTouchOnlyTheirMarkBit(t *testing.T) {
	marks := 0
	for _, r := range Rules([]netip.Prefix{cidr4, cidr6}) {
		for i, e := range r.Exprs {
			m, ok := e.(*expr.Meta)
			if !ok || m.Key != expr.MetaKeyMARK || !m.SourceRegister {
				continue
			}
			marks++
			// The value written is "mark & mask ^ xor" computed right before it.
			bw, ok := r.Exprs[i-1].(*expr.Bitwise)
			load, okLoad := r.Exprs[i-2].(*expr.Meta)
			if !ok || !okLoad || load.Key != expr.MetaKeyMARK || bw.SourceRegister != load.Register || bw.DestRegister != m.Register {
				t.Errorf("rule %q writes the mark without reading it first", r.Comment)
				continue
			}
			if !bytes.Equal(bw.Mask, native(^Mark)) || !(bytes.Equal(bw.Xor, native(Mark)) || bytes.Equal(bw.Xor, native(0))) {
				t.Errorf("rule %q changes mark bits other than 0x%x: mask %x xor %x", r.Comment, Mark, bw.Mask, bw.Xor)
			}
		}
	}
	// Set in the 4 rules for pods and the 2 for localhost, cleared in the 4 masquerade rules.
	if marks != 10 {
		t.Errorf("%d mark writes, want 10", marks)
	}
}

// TestRulesMarkAfterLookup: in each DNAT rule the mark is set after the map lookup, so a
// connection that no mapping translates keeps its mark.
func TestRulesMarkAfterLookup(t *testing.T) {
	for _, r := range Rules([]netip.Prefix{cidr4, cidr6}) {
		lookup := -1
		for i, e := range r.Exprs {
			switch e := e.(type) {
			case *expr.Lookup:
				lookup = i
			case *expr.Meta:
				if e.Key == expr.MetaKeyMARK && e.SourceRegister && r.Chain == ChainDNAT && (lookup < 0 || lookup > i) {
					t.Errorf("rule %q sets the mark before its lookup", r.Comment)
				}
			}
		}
	}
}

func TestElementRoundTrip(t *testing.T) {
	owner := Owner{ContainerID: "abc", IfName: "eth0"}
	for _, e := range []Entry{
		entry("tcp", 80, any4, pod4, 8080),
		entry("udp", 65535, ip4, pod4, 1),
		entry("sctp", 9000, any6, pod6, 9001),
		entry("tcp", 443, ip6, pod6, 8443),
	} {
		el := element(Reservation{Entry: e, Owner: owner})
		name := mapName(e.Key)
		s := mapSet(nft.InetTable("x"), name)
		if uint32(len(el.Key)) != s.KeyType.Bytes || uint32(len(el.Val)) != s.DataType.Bytes {
			t.Errorf("%v: key %d bytes, value %d bytes; map %s wants %d and %d", e, len(el.Key), len(el.Val), name, s.KeyType.Bytes, s.DataType.Bytes)
		}
		got, ok := decodeElement(name, el)
		if !ok || got != e {
			t.Errorf("decode(encode(%v)) = %v, %v", e, got, ok)
		}
		if el.Comment != "abc/eth0" {
			t.Errorf("element comment %q, want the owner", el.Comment)
		}
	}
	// The map of each key: by family, and by whether it names an address.
	for k, want := range map[Key]string{
		{"tcp", 1, any4}: MapIPv4, {"tcp", 1, ip4}: MapIPv4Addr, {"tcp", 1, any6}: MapIPv6, {"tcp", 1, ip6}: MapIPv6Addr,
	} {
		if got := mapName(k); got != want {
			t.Errorf("mapName(%v) = %s, want %s", k, got, want)
		}
	}
}

func TestMapTypes(t *testing.T) {
	table := nft.InetTable("x")
	for name, want := range map[string]struct{ key, data string }{
		MapIPv4:     {"inet_proto . inet_service", "ipv4_addr . inet_service"},
		MapIPv4Addr: {"ipv4_addr . inet_proto . inet_service", "ipv4_addr . inet_service"},
		MapIPv6:     {"inet_proto . inet_service", "ipv6_addr . inet_service"},
		MapIPv6Addr: {"ipv6_addr . inet_proto . inet_service", "ipv6_addr . inet_service"},
	} {
		s := mapSet(table, name)
		if s.KeyType.Name != want.key || s.DataType.Name != want.data || !s.IsMap {
			t.Errorf("map %s: %s : %s, want %s : %s", name, s.KeyType.Name, s.DataType.Name, want.key, want.data)
		}
	}
}
