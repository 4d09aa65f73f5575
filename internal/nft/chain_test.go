package nft

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
)

// planned is a small plan in the shape kubenet's chains have: matches, a verdict, comments.
func planned() []Rule {
	p := netip.MustParsePrefix("10.244.1.0/24")
	return []Rule{
		{Comment: "keep", Exprs: append(append(MatchFamily(p.Addr()), MatchPrefix(Source, p, false)...), &expr.Verdict{Kind: expr.VerdictReturn})},
		{Comment: "drop", Exprs: append(MatchLocalDestination(false), &expr.Verdict{Kind: expr.VerdictDrop})},
		{Comment: "snat", Exprs: append(MatchFamily(p.Addr()), &expr.Masq{})},
	}
}

// asRead is what the kernel hands back for rules: its own Rule values with the comment in the
// user data.
func asRead(rules []Rule) []*nftables.Rule {
	out := make([]*nftables.Rule, len(rules))
	for i, r := range rules {
		out[i] = &nftables.Rule{Exprs: r.Exprs, UserData: Comment(r.Comment)}
	}
	return out
}

func TestCompare(t *testing.T) {
	chain := &nftables.Chain{Name: "c", Table: InetTable("n")}
	want := planned()
	changed := func(f func([]*nftables.Rule) []*nftables.Rule) []*nftables.Rule { return f(asRead(planned())) }
	cases := []struct {
		name    string
		have    []*nftables.Rule
		want    []Rule
		diff    string // "" = equal; else a word the difference must name
		missing bool
	}{
		{"equal", asRead(want), want, "", false},
		{"empty plan, empty chain", nil, nil, "", false},
		{"chain missing or empty", nil, want, "missing or empty", true},
		{"a rule removed", asRead(want[:2]), want, "has 2 rules, want 3", false},
		{"a rule added", append(asRead(want), asRead(want[:1])...), want, "has 4 rules, want 3", false},
		{"rules where the plan has none", asRead(want), nil, "has 3 rules, want 0", false},
		{"comment changed", changed(func(rs []*nftables.Rule) []*nftables.Rule {
			rs[1].UserData = Comment("something else")
			return rs
		}), want, `rule 1 is "something else"`, false},
		{"verdict changed in place, comment kept", changed(func(rs []*nftables.Rule) []*nftables.Rule {
			rs[1].Exprs = append(MatchLocalDestination(false), &expr.Verdict{Kind: expr.VerdictAccept})
			return rs
		}), want, `rule 1 ("drop") does not match`, false},
		{"a match changed in place, comment kept", changed(func(rs []*nftables.Rule) []*nftables.Rule {
			rs[0].Exprs = append(append(MatchFamily(netip.MustParseAddr("10.0.0.1")), MatchPrefix(Source, netip.MustParsePrefix("10.244.0.0/16"), false)...), &expr.Verdict{Kind: expr.VerdictReturn})
			return rs
		}), want, `rule 0 ("keep") does not match`, false},
		{"an expression dropped, comment kept", changed(func(rs []*nftables.Rule) []*nftables.Rule {
			rs[2].Exprs = []expr.Any{&expr.Masq{}}
			return rs
		}), want, `rule 2 ("snat") does not match`, false},
		{"same register by another name", changed(func(rs []*nftables.Rule) []*nftables.Rule {
			// NFT_REG32_00 (8) is the first word of NFT_REG_1: the kernel dumps it as 1, so a
			// plan must use Reg32 to compare equal with what it wrote.
			rs[2].Exprs = []expr.Any{&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 8}, rs[2].Exprs[1], rs[2].Exprs[2]}
			return rs
		}), want, "does not match", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := Compare(chain, tc.have, tc.want)
			if tc.diff == "" {
				if d != nil {
					t.Fatalf("Compare = %v, want equal", d)
				}
				return
			}
			if d == nil {
				t.Fatalf("Compare found no difference, want one naming %q", tc.diff)
			}
			if !strings.Contains(d.Error(), tc.diff) || !strings.Contains(d.Error(), "chain c of table inet kubenet-n") {
				t.Errorf("Compare = %q, want it to name the chain and %q", d.Error(), tc.diff)
			}
			if d.Missing != tc.missing {
				t.Errorf("Missing = %v, want %v", d.Missing, tc.missing)
			}
		})
	}
}

func TestMissingWalksWrappedAndJoinedErrors(t *testing.T) {
	table := InetTable("n")
	gone := &Difference{Table: table, Object: "chain a", Missing: true, Detail: "missing"}
	changed := &Difference{Table: table, Object: "chain b", Detail: "changed"}
	mapGone := &Difference{Table: table, Object: "map m", Missing: true, Detail: "missing"}
	err := errors.Join(
		fmt.Errorf("masquerade: %w", gone),
		changed,
		fmt.Errorf("host ports: %w", errors.Join(errors.New("unrelated"), mapGone)),
	)
	got := Missing(err)
	if len(got) != 2 || got[0] != gone || got[1] != mapGone {
		t.Errorf("Missing = %v, want the missing chain and map only", got)
	}
	if Missing(nil) != nil || Missing(changed) != nil {
		t.Error("Missing of nil or of a changed chain should be empty")
	}
}

func TestReg32(t *testing.T) {
	// The kernel's nft_dump_register: a 32-bit register that starts a 128-bit one is dumped as
	// that register (NFT_REG_1..4 = 1..4), the others as NFT_REG32_xx (8 + index).
	want := []uint32{1, 9, 10, 11, 2, 13, 14, 15, 3, 17, 18, 19, 4, 21, 22, 23}
	for i, w := range want {
		if got := Reg32(i); got != w {
			t.Errorf("Reg32(%d) = %d, want %d", i, got, w)
		}
	}
}
