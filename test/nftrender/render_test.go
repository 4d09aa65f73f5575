package nftrender

import (
	"net/netip"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/kubenet-dev/kubenet/internal/nft"
)

// TestRenderRule: each expression the mechanisms use prints as its field and value, and what
// the renderer cannot name prints raw rather than disappearing, so two different rules never
// render alike.
func TestRenderRule(t *testing.T) {
	v4 := netip.MustParsePrefix("10.244.0.0/16")
	mark := func(v uint32) []byte { return binaryutil.NativeEndian.PutUint32(v) }
	cases := []struct {
		name   string
		family nftables.TableFamily
		exprs  []expr.Any
		want   string
	}{
		{"prefix source", nftables.TableFamilyINet, append(nft.MatchFamily(v4.Addr()), append(nft.MatchPrefix(nft.Source, v4, false), &expr.Verdict{Kind: expr.VerdictAccept})...),
			"meta nfproto ipv4 ip saddr 10.244.0.0/16 accept"},
		{"negated destination", nftables.TableFamilyINet, append(nft.MatchFamily(v4.Addr()), nft.MatchPrefix(nft.Destination, v4, true)...),
			"meta nfproto ipv4 ip daddr != 10.244.0.0/16"},
		{"no family match: raw offsets", nftables.TableFamilyINet, nft.MatchPrefix(nft.Source, v4, false),
			"@nh,96,32 & 0xffff0000 == 0x0af40000"},
		{"local destination, masquerade", nftables.TableFamilyINet, append(nft.MatchLocalDestination(true), &expr.Masq{FullyRandom: true}),
			"fib daddr type != local masquerade fully-random"},
		{"transport ports by protocol", nftables.TableFamilyINet, []expr.Any{
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1}, &expr.Cmp{Register: 1, Data: []byte{unix.IPPROTO_SCTP}},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2}, &expr.Cmp{Op: expr.CmpOpGte, Register: 1, Data: []byte{0x1f, 0x90}}},
			"meta l4proto sctp sctp dport >= 8080"},
		{"mark tested and set", nftables.TableFamilyBridge, []expr.Any{
			&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mark(0x10), Xor: mark(0)},
			&expr.Cmp{Register: 1, Data: mark(0)},
			&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mark(^uint32(0x20)), Xor: mark(0x20)},
			&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1},
			&expr.Verdict{Kind: expr.VerdictJump, Chain: "next"}},
			"meta mark & 0x00000010 == 0x00000000 meta mark set meta mark | 0x00000020 jump next"},
		{"concatenated lookup and verdict map", nftables.TableFamilyBridge, []expr.Any{
			&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: unix.NFT_REG_1},
			&expr.Payload{DestRegister: unix.NFT_REG_2, Base: expr.PayloadBaseLLHeader, Offset: 6, Len: 6},
			&expr.Lookup{SourceRegister: unix.NFT_REG_1, SetName: "macs", Invert: true},
			&expr.Meta{Key: expr.MetaKeyOIF, Register: 1},
			&expr.Lookup{SourceRegister: 1, IsDestRegSet: true, SetName: "ports"}},
			"iifname . ether saddr != @macs oif vmap @ports"},
		{"unknown expression", nftables.TableFamilyINet, []expr.Any{&expr.Quota{Bytes: 7}},
			"<*expr.Quota &{Bytes:7 Consumed:0 Over:false}>"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := Rule(tc.family, nft.Rule{Exprs: tc.exprs}); got != tc.want {
				t.Errorf("Rule =\n%s\nwant\n%s", got, tc.want)
			}
		})
	}
}

// TestRenderTableEntryContext: a chain entered only by gotos from rules that matched IPv4 reads
// its payloads as IPv4 fields; one also entered without that match reads them raw.
func TestRenderTableEntryContext(t *testing.T) {
	table := nft.BridgeTable("t")
	loop := netip.MustParsePrefix("127.0.0.0/8")
	ipv4 := []expr.Any{&expr.Meta{Key: expr.MetaKeyPROTOCOL, Register: 1}, &expr.Cmp{Register: 1, Data: []byte{0x08, 0x00}}}
	goTo := func(c string) expr.Any { return &expr.Verdict{Kind: expr.VerdictGoto, Chain: c} }
	base := &nftables.Chain{Name: "base", Table: table, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityFilter}
	got := Table(table, nil, []Chain{
		{Chain: &nftables.Chain{Name: "v4", Table: table}, Rules: []nft.Rule{{Exprs: nft.MatchPrefix(nft.Source, loop, false)}}},
		{Chain: &nftables.Chain{Name: "mixed", Table: table}, Rules: []nft.Rule{{Exprs: nft.MatchPrefix(nft.Source, loop, false)}}},
		{Chain: base, Rules: []nft.Rule{
			{Comment: "to v4", Exprs: append(append([]expr.Any{}, ipv4...), goTo("v4"))},
			{Exprs: append(append([]expr.Any{}, ipv4...), goTo("mixed"))},
			{Exprs: []expr.Any{goTo("mixed")}},
		}},
	})
	want := `table bridge kubenet-t {
	chain v4 {
		ip saddr 127.0.0.0/8
	}

	chain mixed {
		@nh,96,32 & 0xff000000 == 0x7f000000
	}

	chain base {
		type filter hook prerouting priority 0;
		meta protocol ip goto v4 comment "to v4"
		meta protocol ip goto mixed
		goto mixed
	}
}
`
	if got != want {
		t.Errorf("Table =\n%s\nwant\n%s", got, want)
	}
}
