package hostport

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/google/nftables"
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
		// 2 maps x (pods, others). The localnet guard: from and to the family's loopback
		// addresses in the NAT chain; with IPv4 the bridge's ingress chain, with the accept of
		// localhost's translated replies. Masquerade: a pod to itself per family, localhost with
		// IPv4, and the rule that keeps other sources.
		{"dual-stack", []netip.Prefix{cidr4, cidr6}, map[string]int{ChainPrerouting: 1, ChainOutput: 1, ChainDNAT: 11, ChainMasquerade: 4, ChainLocalnetNAT: 4, ChainLocalnetInput: 3}},
		{"IPv4", []netip.Prefix{cidr4}, map[string]int{ChainPrerouting: 1, ChainOutput: 1, ChainDNAT: 6, ChainMasquerade: 3, ChainLocalnetNAT: 2, ChainLocalnetInput: 3}},
		{"IPv6", []netip.Prefix{cidr6}, map[string]int{ChainPrerouting: 1, ChainOutput: 1, ChainDNAT: 5, ChainMasquerade: 2, ChainLocalnetNAT: 2}},
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

// TestNoFilterChainOnTheBridgedPath: with bridge netfilter on (kubeadm requires it), every
// frame the bridge forwards from pod to pod runs the base chains of the IP prerouting and
// forward hooks, and each base chain there costs every packet of every pod whatever its rules
// (about 2 µs of kernel CPU per request and response, docs/bench.md). The plan has none there
// but NAT chains, which run only for a connection's first packet; the localnet guard's filter
// hooks input, which sees only what the node delivers to itself.
func TestNoFilterChainOnTheBridgedPath(t *testing.T) {
	for _, ch := range chains(nft.InetTable("x")) {
		if ch.Hooknum == nil {
			continue
		}
		bridged := *ch.Hooknum == *nftables.ChainHookPrerouting || *ch.Hooknum == *nftables.ChainHookForward ||
			*ch.Hooknum == *nftables.ChainHookPostrouting
		if bridged && ch.Type != nftables.ChainTypeNAT {
			t.Errorf("chain %s (type %s, hook %d) runs for every bridged packet", ch.Name, ch.Type, *ch.Hooknum)
		}
	}
}

// TestLocalnetGuardDropsBothDirections: each of the guard's chains drops 127.0.0.0/8 as source
// and as destination (the NAT chain ::1 too); the NAT chain only what did not arrive on lo
// (connections of the node's own), the input chain whatever the node receives on any other
// device, except the replies of masqueraded connections (conntrack's reply direction with the
// source-NAT status bit), which prerouting has already translated back to 127.0.0.1 there.
func TestLocalnetGuardDropsBothDirections(t *testing.T) {
	type shape struct {
		verdict   expr.VerdictKind
		offset    uint32 // of the address matched: 12 source, 16 destination
		notFromLo bool
		reply     bool
	}
	got := map[string][]shape{}
	for _, r := range Rules([]netip.Prefix{cidr4, cidr6}) {
		if r.Chain != ChainLocalnetNAT && r.Chain != ChainLocalnetInput {
			continue
		}
		var s shape
		for i, e := range r.Exprs {
			switch e := e.(type) {
			case *expr.Verdict:
				s.verdict = e.Kind
			case *expr.Payload:
				s.offset = e.Offset
				c, ok := r.Exprs[i+1].(*expr.Cmp) // ::1/128: no mask
				if !ok {
					c, ok = r.Exprs[i+2].(*expr.Cmp)
				}
				if !ok || c.Op != expr.CmpOpEq || !(bytes.Equal(c.Data, []byte{127, 0, 0, 0}) || bytes.Equal(c.Data, netip.IPv6Loopback().AsSlice())) {
					t.Errorf("rule %q: the address is not matched against 127.0.0.0/8 or ::1", r.Comment)
				}
			case *expr.Meta:
				if e.Key == expr.MetaKeyIIFNAME {
					c := r.Exprs[i+1].(*expr.Cmp)
					s.notFromLo = c.Op == expr.CmpOpNeq && bytes.Equal(c.Data, nft.IfName("lo"))
				}
			case *expr.Ct:
				if e.Key == expr.CtKeyDIRECTION {
					s.reply = bytes.Equal(r.Exprs[i+1].(*expr.Cmp).Data, []byte{ctDirectionReply})
				}
			}
		}
		got[r.Chain] = append(got[r.Chain], s)
	}
	want := map[string][]shape{
		ChainLocalnetNAT: {{expr.VerdictDrop, 12, true, false}, {expr.VerdictDrop, 16, true, false},
			{expr.VerdictDrop, 8, true, false}, {expr.VerdictDrop, 24, true, false}},
		ChainLocalnetInput: {{expr.VerdictDrop, 12, true, false}, {expr.VerdictAccept, 16, true, true},
			{expr.VerdictDrop, 16, true, false}},
	}
	for chain, w := range want {
		if len(got[chain]) != len(w) {
			t.Errorf("chain %s: %+v, want %+v", chain, got[chain], w)
			continue
		}
		for i := range w {
			if got[chain][i] != w[i] {
				t.Errorf("chain %s rule %d: %+v, want %+v", chain, i, got[chain][i], w[i])
			}
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
