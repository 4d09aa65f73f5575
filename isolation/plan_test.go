package isolation

import (
	"bytes"
	"net"
	"net/netip"
	"slices"
	"testing"

	"github.com/google/nftables/expr"

	"github.com/kubenet-dev/kubenet/internal/nft"
)

func TestPlan(t *testing.T) {
	for _, tc := range []struct {
		antiSpoofing bool
		chains       []string
	}{
		{false, []string{ChainGuardIPv4, ChainGuardIPv6, ChainGuard}},
		{true, []string{ChainGuardIPv4, ChainGuardIPv6, ChainGuard, ChainAntiSpoofIPv4, ChainAntiSpoofARP,
			ChainAntiSpoofUnspecified, ChainAntiSpoofND, ChainAntiSpoofIPv6, ChainAntiSpoof}},
	} {
		plan := Plan(Config{Network: "n", AntiSpoofing: tc.antiSpoofing})
		var names []string
		for i, c := range plan {
			names = append(names, c.Name)
			if !slices.Contains(chainNames, c.Name) {
				t.Errorf("chain %s is not in chainNames: a plan that drops it would leave it behind", c.Name)
			}
			if c.Base != (c.Name == ChainGuard || c.Name == ChainAntiSpoof) {
				t.Errorf("chain %s: base=%v", c.Name, c.Base)
			}
			// Comments are how ADD tells whether the kernel's rules are current: unique per chain.
			var comments []string
			for _, r := range c.Rules {
				if r.Comment == "" || slices.Contains(comments, r.Comment) {
					t.Errorf("chain %s: empty or repeated comment %q", c.Name, r.Comment)
				}
				comments = append(comments, r.Comment)
				// Every chain a rule goes to must come earlier in the plan (written first).
				for _, e := range r.Exprs {
					if v, ok := e.(*expr.Verdict); ok && v.Kind == expr.VerdictGoto {
						if !slices.ContainsFunc(plan[:i], func(p Chain) bool { return p.Name == v.Chain }) {
							t.Errorf("chain %s goes to %s, which the plan does not write before it", c.Name, v.Chain)
						}
					}
				}
			}
		}
		if !slices.Equal(names, tc.chains) {
			t.Errorf("antiSpoofing=%v: chains %v, want %v", tc.antiSpoofing, names, tc.chains)
		}
		// Each base chain limits itself to the pods' ports; the fast paths before that rule can
		// only let a frame through (return), never drop it or send it elsewhere.
		for _, c := range plan {
			if !c.Base {
				continue
			}
			ports := slices.IndexFunc(c.Rules, func(r nft.Rule) bool {
				return hasLookup(r.Exprs, map[string]string{ChainGuard: SetPodPorts, ChainAntiSpoof: SetAntiSpoofPorts}[c.Name])
			})
			if ports < 0 {
				t.Errorf("base chain %s does not match its ports set", c.Name)
				continue
			}
			for _, r := range c.Rules[:ports] {
				if v, ok := r.Exprs[len(r.Exprs)-1].(*expr.Verdict); !ok || v.Kind != expr.VerdictReturn {
					t.Errorf("base chain %s: rule %q before the ports check does more than let frames through", c.Name, r.Comment)
				}
			}
		}
	}
}

func hasLookup(exprs []expr.Any, set string) bool {
	return slices.ContainsFunc(exprs, func(e expr.Any) bool {
		l, ok := e.(*expr.Lookup)
		return ok && l.SetName == set && l.Invert
	})
}

func TestLinkLocal(t *testing.T) {
	for _, tc := range []struct{ mac, want string }{
		{"52:54:00:12:34:56", "fe80::5054:ff:fe12:3456"},
		{"0a:58:0a:f4:01:01", "fe80::858:aff:fef4:101"},
		{"02:00:00:00:00:01", "fe80::ff:fe00:1"},
	} {
		mac, _ := net.ParseMAC(tc.mac)
		if got := LinkLocal(mac); got != netip.MustParseAddr(tc.want) {
			t.Errorf("LinkLocal(%s) = %s, want %s", tc.mac, got, tc.want)
		}
	}
}

func TestElements(t *testing.T) {
	mac := net.HardwareAddr{0x02, 0xaa, 0xbb, 0xcc, 0xdd, 0xee}
	p := Port{Name: "veth0123456789a", Owner: "c/eth0", MAC: mac,
		Addrs: []netip.Addr{netip.MustParseAddr("10.244.1.5"), netip.MustParseAddr("fd00::5"), netip.MustParseAddr("::ffff:10.244.1.6")}}
	port := append([]byte("veth0123456789a"), 0)
	key := func(v ...byte) []byte { return append(append([]byte{}, port...), v...) }
	want := map[string][][]byte{
		SetPodPorts:       {port},
		SetAntiSpoofPorts: {port},
		SetMAC:            {key(0x02, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0, 0)},
		SetIPv4:           {key(10, 244, 1, 5), key(10, 244, 1, 6)},
		SetIPv6:           {key(LinkLocal(mac).AsSlice()...), key(netip.MustParseAddr("fd00::5").AsSlice()...)},
		// port . MAC (padded to 8) . address: every join of the port's MAC and addresses.
		SetFastIPv4: {key(0x02, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0, 0, 10, 244, 1, 5), key(0x02, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0, 0, 10, 244, 1, 6)},
		SetFastIPv6: {key(append([]byte{0x02, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0, 0}, LinkLocal(mac).AsSlice()...)...),
			key(append([]byte{0x02, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0, 0}, netip.MustParseAddr("fd00::5").AsSlice()...)...)},
	}
	got := p.elements(true)
	for set, keys := range want {
		var have [][]byte
		for _, e := range got[set] {
			have = append(have, e.Key)
			if e.Comment != "c/eth0" {
				t.Errorf("set %s: element comment %q, want the owner", set, e.Comment)
			}
		}
		if !slices.EqualFunc(have, keys, bytes.Equal) {
			t.Errorf("set %s: keys %q, want %q", set, have, keys)
		}
		for _, k := range keys {
			if nameOf(k) != p.Name {
				t.Errorf("set %s: key %q names port %q", set, k, nameOf(k))
			}
		}
	}
	if len(got) != len(want) {
		t.Errorf("elements in %d sets, want %d", len(got), len(want))
	}
	if off := p.elements(false); len(off) != 1 || len(off[SetPodPorts]) != 1 {
		t.Errorf("without anti-spoofing: %v, want only the pod-ports element", off)
	}
}

func TestBatches(t *testing.T) {
	for _, tc := range []struct {
		n, size int
		want    []int // lengths of the batches
	}{
		{0, 64, []int{0}},
		{1, 64, []int{1}},
		{64, 64, []int{64}},
		{65, 64, []int{64, 1}},
		{200, 64, []int{64, 64, 64, 8}},
	} {
		xs := make([]int, tc.n)
		for i := range xs {
			xs[i] = i
		}
		var lens []int
		var all []int
		for _, b := range batches(xs, tc.size) {
			lens = append(lens, len(b))
			all = append(all, b...)
		}
		if !slices.Equal(lens, tc.want) || !slices.Equal(all, xs) {
			t.Errorf("batches of %d by %d: lengths %v (want %v), %d items back", tc.n, tc.size, lens, tc.want, len(all))
		}
	}
}
