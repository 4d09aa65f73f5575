package netpol

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/nftables"

	"github.com/kubenet-dev/kubenet/internal/policyrules"
)

// The pure steps of Apply, each on its own: what every port gets, which pods are released, what
// a dispatch map's switch deletes and adds, and which groups go afterwards.

// ports builds a dispatch map (port → chain) from port, chain pairs.
func ports(pairs ...any) map[int]string {
	m := map[int]string{}
	for i := 0; i < len(pairs); i += 2 {
		m[pairs[i].(int)] = pairs[i+1].(string)
	}
	return m
}

func TestPortChains(t *testing.T) {
	tests := []struct {
		name       string
		want, keep map[int]string // planned ingress map; keep: ports refused (chain ignored)
		have       map[int]string
		final      map[int]string
	}{
		{name: "planned chains as planned", want: ports(3, "in-a", 4, ChainAllowIngress), have: ports(3, "in-old"), final: ports(3, "in-a", 4, ChainAllowIngress)},
		{name: "a refused port keeps its group", want: ports(4, "in-a"), keep: ports(3, ""), have: ports(3, "in-old"), final: ports(3, "in-old", 4, "in-a")},
		{name: "a refused port that was open is denied, not left open", keep: ports(3, ""), have: ports(3, ChainAllowIngress), final: ports()},
		{name: "a refused new port gets nothing", keep: ports(3, ""), final: ports()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := desired{maps: map[string]map[int]string{MapIngress: tt.want, MapEgress: {}}, keep: map[string]map[int]bool{MapIngress: {}, MapEgress: {}}}
			for port := range tt.keep {
				want.keep[MapIngress][port] = true
			}
			have := map[string]map[int]string{MapIngress: tt.have, MapEgress: {}}
			got := portChains(want, have)
			if fmt.Sprint(got[MapIngress]) != fmt.Sprint(tt.final) || len(got[MapEgress]) != 0 {
				t.Fatalf("portChains = %v, want ingress %v", got, tt.final)
			}
			if len(tt.want) > 0 {
				got[MapIngress][-1] = "x"
				if _, leaked := tt.want[-1]; leaked {
					t.Fatal("portChains returned the plan's own map")
				}
			}
		})
	}
}

func TestReleasedPods(t *testing.T) {
	pod := func(port int) policyrules.Pod {
		return policyrules.Pod{Port: port, Name: fmt.Sprint("p", port), IPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 0, 0, byte(port)})}}
	}
	have := map[string]map[int]string{MapEgress: ports(1, "out-a"), MapIngress: ports(2, "in-a")}
	final := map[string]map[int]string{MapEgress: ports(1, "out-a", 3, "out-b"), MapIngress: ports(2, "in-a", 4, "in-b")}
	got := releasedPods([]policyrules.Pod{pod(1), pod(2), pod(3), pod(4), pod(5)}, have, final)
	var names []string
	for _, p := range got {
		names = append(names, p.Name)
	}
	// 1 and 2 had elements already; 5 gets none (refused in both directions): still held.
	if !slices.Equal(names, []string{"p3", "p4"}) {
		t.Fatalf("releasedPods = %v, want [p3 p4]", names)
	}
	if addrs := fmt.Sprint(podAddrs(got)); addrs != "[10.0.0.3 10.0.0.4]" {
		t.Fatalf("podAddrs = %s", addrs)
	}
}

func TestMapDiff(t *testing.T) {
	key := func(e nftables.SetElement) string {
		s := fmt.Sprint(binary.NativeEndian.Uint32(e.Key))
		if e.VerdictData != nil {
			s += ":" + e.VerdictData.Chain
		}
		return s
	}
	keys := func(els []nftables.SetElement) []string {
		out := []string{}
		for _, e := range els {
			out = append(out, key(e))
		}
		return out
	}
	tests := []struct {
		name     string
		have     map[int]string
		want     map[int]string
		del, add []string
	}{
		{name: "nothing to do", have: ports(1, "in-a"), want: ports(1, "in-a"), del: []string{}, add: []string{}},
		{name: "a port comes", have: ports(1, "in-a"), want: ports(1, "in-a", 2, "in-b"), del: []string{}, add: []string{"2:in-b"}},
		{name: "a port goes", have: ports(1, "in-a", 2, "in-b"), want: ports(1, "in-a"), del: []string{"2"}, add: []string{}},
		{name: "a port changes chain: deleted and added", have: ports(1, "in-a"), want: ports(1, "in-b"), del: []string{"1"}, add: []string{"1:in-b"}},
		{name: "sorted by port", have: ports(9, "a", 3, "a"), want: ports(8, "b", 2, "b"), del: []string{"3", "9"}, add: []string{"2:b", "8:b"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			del, add := mapDiff(tt.have, tt.want)
			if !slices.Equal(keys(del), tt.del) || !slices.Equal(keys(add), tt.add) {
				t.Fatalf("mapDiff = del %v add %v, want del %v add %v", keys(del), keys(add), tt.del, tt.add)
			}
		})
	}
}

func TestUnusedGroups(t *testing.T) {
	one := group{any4: []policyrules.Range{policyrules.Single(netip.MustParseAddr("10.0.0.1"))}}
	// in-a is planned with slot 0 (any-ipv4 only); out-a is a refused list's chain, kept, that
	// looks up slot 5 (and, rewritten by another tool, g4-ports-ipv4); in-b and out-c go; in-e
	// came from out-x's slot 7 by an edit that deleted g7-ports-ipv6.
	final := map[string]map[int]string{MapIngress: ports(1, "in-a", 2, ChainAllowIngress, 3, "in-e"), MapEgress: ports(1, "out-a")}
	cur := state{
		groupChains:  map[string]bool{"in-a": true, "in-b": true, "out-a": true, "out-c": true, "out-x": true},
		groupStems:   map[string]string{"in-a": "g0", "in-b": "in-b", "out-a": "g5", "out-c": "g2", "out-x": "g7"},
		groupLookups: map[string][]string{"out-a": {"g5-any-ipv4", "g4-ports-ipv4"}},
	}
	want := desired{groups: map[string]plannedGroup{"in-a": {stem: "g0", group: one}, "in-e": {stem: "g7", group: one}}}
	edits := map[string]*inPlaceEdit{"in-e": {donor: "out-x", stem: "g7", sets: []setEdit{
		{set: &nftables.Set{Name: "g7-any-ipv4"}}, {set: &nftables.Set{Name: "g7-ports-ipv6"}, remove: true}}}}
	sets := []string{"g0-any-ipv4", "g0-ports-ipv4", "in-b-any-ipv4", "in-b-ports-ipv6", "g2-any-ipv6", "g5-any-ipv4", "g5-ports-ipv6",
		"g9-ports-ipv4", "g7-any-ipv4", "g7-ports-ipv6", "g4-ports-ipv4", SetOnLink, SetSourcesIPv4}
	gotChains, gotSets := unusedGroups(final, cur, want, edits, sets)
	if !slices.Equal(gotChains, []string{"in-b", "out-c"}) {
		t.Errorf("unused chains = %v, want [in-b out-c] (out-x went with its edit)", gotChains)
	}
	// g0-ports-ipv4 is a kind in-a does not need; g9 has sets left by a refused build and no
	// chain: they go too; the kept chain's sets, the edited ones and the fixed sets never do.
	if want := []string{"g0-ports-ipv4", "in-b-any-ipv4", "in-b-ports-ipv6", "g2-any-ipv6", "g9-ports-ipv4"}; !slices.Equal(gotSets, want) {
		t.Errorf("unused sets = %v, want %v", gotSets, want)
	}
}

// TestIntervalDiff: elements by both bounds (a range that keeps its start and moves its end is
// deleted and added), whatever their length (bounds longer than a group set's too).
func TestIntervalDiff(t *testing.T) {
	el := func(key, end string) nftables.SetElement {
		return nftables.SetElement{Key: []byte(key), KeyEnd: []byte(end)}
	}
	long := strings.Repeat("x", 40)
	for _, tc := range []struct {
		name             string
		have, want       []nftables.SetElement
		wantDel, wantAdd []string
	}{
		{"same", []nftables.SetElement{el("a", "b")}, []nftables.SetElement{el("a", "b")}, nil, nil},
		{"end moves", []nftables.SetElement{el("a", "b"), el("c", "d")}, []nftables.SetElement{el("a", "c"), el("c", "d")}, []string{"a-b"}, []string{"a-c"}},
		{"one goes, one comes", []nftables.SetElement{el("a", "b")}, []nftables.SetElement{el("e", "f")}, []string{"a-b"}, []string{"e-f"}},
		{"long bounds differ after 24 bytes", []nftables.SetElement{el(long+"1", "z")}, []nftables.SetElement{el(long+"2", "z")}, []string{long + "1-z"}, []string{long + "2-z"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			del, add := intervalDiff(tc.have, tc.want)
			str := func(els []nftables.SetElement) []string {
				var out []string
				for _, e := range els {
					out = append(out, string(e.Key)+"-"+string(e.KeyEnd))
				}
				return out
			}
			if !slices.Equal(str(del), tc.wantDel) || !slices.Equal(str(add), tc.wantAdd) {
				t.Errorf("del %v add %v, want %v %v", str(del), str(add), tc.wantDel, tc.wantAdd)
			}
		})
	}
}

// TestPackedDiffIsIntervalDiff: between two random groups' sets of one stem, the packed diff
// deletes and adds exactly the elements intervalDiff does (by both bounds), and every element it
// makes encodes what groupSets encodes.
func TestPackedDiffIsIntervalDiff(t *testing.T) {
	rng := rand.New(rand.NewPCG(34, 1))
	bounds := func(els []nftables.SetElement) []string {
		out := make([]string, len(els))
		for i, e := range els {
			out[i] = fmt.Sprintf("%x-%x", e.Key, e.KeyEnd)
		}
		slices.Sort(out)
		return out
	}
	randomGroup := func() group {
		allow := randomAllow(rng, rng.IntN(12))
		for range rng.IntN(6) { // single addresses, some on one port: hosts and points
			a := netip.AddrFrom4([4]byte{10, 0, 0, byte(rng.IntN(16))})
			e := policyrules.Entry{Peer: policyrules.Single(a)}
			if rng.IntN(2) == 0 {
				e.Ports = &policyrules.Ports{Protocol: policyrules.TCP, First: 80, Last: 80}
			}
			allow = append(allow, e)
		}
		g, _ := canonical(allow, maxGroupCost)
		return g
	}
	compared := 0
	for range 300 {
		a, b := randomGroup(), randomGroup()
		have := map[string]packedSet{}
		for _, p := range packGroupSets(nil, "g1", a, true) {
			have[p.set.Name] = p
		}
		plain := map[string][]nftables.SetElement{}
		for _, s := range groupSets(nil, "g1", b, true) {
			plain[s.set.Name] = s.elements
		}
		for _, want := range packGroupSets(nil, "g1", b, true) {
			if got := bounds(want.elements()); !slices.Equal(got, bounds(plain[want.set.Name])) {
				t.Fatalf("set %s packs %v, groupSets gives %v", want.set.Name, got, bounds(plain[want.set.Name]))
			}
			h, ok := have[want.set.Name]
			if !ok {
				continue
			}
			del, add := packedDiff(h, want)
			wantDel, wantAdd := intervalDiff(h.elements(), want.elements())
			if !slices.Equal(bounds(del), bounds(wantDel)) || !slices.Equal(bounds(add), bounds(wantAdd)) {
				t.Fatalf("set %s: packed diff deletes %v adds %v; intervalDiff deletes %v adds %v", want.set.Name, bounds(del), bounds(add), bounds(wantDel), bounds(wantAdd))
			}
			compared++
		}
	}
	if compared < 100 {
		t.Errorf("only %d sets held by both groups compared", compared)
	}
}
