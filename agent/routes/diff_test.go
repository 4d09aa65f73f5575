package routes

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
)

func TestDiff(t *testing.T) {
	const proto = DefaultProtocol
	p := netip.MustParsePrefix
	a := netip.MustParseAddr
	r := func(dst, gw, node string) Route { return Route{Dst: p(dst), Gw: a(gw), Node: node} }
	ours := func(dst, gw string) Existing { return Existing{Dst: p(dst), Gw: a(gw), Protocol: proto} }
	theirs := func(dst, gw string, protocol int) Existing {
		e := Existing{Dst: p(dst), Protocol: protocol}
		if gw != "" {
			e.Gw = a(gw)
		}
		return e
	}
	tests := []struct {
		name      string
		current   []Existing
		want      []Route
		add       []Route
		replace   []Route
		del       []Existing
		inPlace   []Route
		conflicts []string // destinations
	}{
		{
			name: "empty table: everything is added",
			want: []Route{r("10.244.2.0/24", "192.168.1.2", "n2"), r("fd00:10:244:2::/64", "fd00:1::2", "n2")},
			add:  []Route{r("10.244.2.0/24", "192.168.1.2", "n2"), r("fd00:10:244:2::/64", "fd00:1::2", "n2")},
		},
		{
			name:    "restart with everything right: nothing changes",
			current: []Existing{ours("10.244.2.0/24", "192.168.1.2"), ours("fd00:10:244:2::/64", "fd00:1::2"), theirs("0.0.0.0/0", "192.168.1.254", 3)},
			want:    []Route{r("10.244.2.0/24", "192.168.1.2", "n2"), r("fd00:10:244:2::/64", "fd00:1::2", "n2")},
			inPlace: []Route{r("10.244.2.0/24", "192.168.1.2", "n2"), r("fd00:10:244:2::/64", "fd00:1::2", "n2")},
		},
		{
			name:    "node address changed: replaced in place, not deleted",
			current: []Existing{ours("10.244.2.0/24", "192.168.1.9")},
			want:    []Route{r("10.244.2.0/24", "192.168.1.2", "n2")},
			replace: []Route{r("10.244.2.0/24", "192.168.1.2", "n2")},
		},
		{
			name: "the overlay's device was re-created: a route on the old device index is replaced",
			current: []Existing{
				{Dst: p("10.244.3.0/24"), Gw: a("10.244.3.0"), Dev: 7, Protocol: proto},
				{Dst: p("10.244.4.0/24"), Gw: a("10.244.4.0"), Dev: 9, Protocol: proto},
			},
			want:    []Route{{Dst: p("10.244.3.0/24"), Gw: a("10.244.3.0"), Dev: 9, Node: "n3"}, {Dst: p("10.244.4.0/24"), Gw: a("10.244.4.0"), Dev: 9, Node: "n4"}},
			replace: []Route{{Dst: p("10.244.3.0/24"), Gw: a("10.244.3.0"), Dev: 9, Node: "n3"}},
			inPlace: []Route{{Dst: p("10.244.4.0/24"), Gw: a("10.244.4.0"), Dev: 9, Node: "n4"}},
		},
		{
			name:    "direct to overlay: the gateway changes, the route is replaced",
			current: []Existing{{Dst: p("10.244.3.0/24"), Gw: a("192.168.1.3"), Dev: 2, Protocol: proto}},
			want:    []Route{{Dst: p("10.244.3.0/24"), Gw: a("10.244.3.0"), Dev: 9, Node: "n3"}},
			replace: []Route{{Dst: p("10.244.3.0/24"), Gw: a("10.244.3.0"), Dev: 9, Node: "n3"}},
		},
		{
			name:    "a direct route names no device: whichever link the kernel chose is right",
			current: []Existing{{Dst: p("10.244.3.0/24"), Gw: a("192.168.1.3"), Dev: 2, Protocol: proto}},
			want:    []Route{r("10.244.3.0/24", "192.168.1.3", "n3")},
			inPlace: []Route{r("10.244.3.0/24", "192.168.1.3", "n3")},
		},
		{
			name:    "node gone: its routes are deleted, others stay",
			current: []Existing{ours("10.244.2.0/24", "192.168.1.2"), ours("10.244.3.0/24", "192.168.1.3"), ours("fd00:10:244:3::/64", "fd00:1::3")},
			want:    []Route{r("10.244.2.0/24", "192.168.1.2", "n2")},
			inPlace: []Route{r("10.244.2.0/24", "192.168.1.2", "n2")},
			del:     []Existing{ours("10.244.3.0/24", "192.168.1.3"), ours("fd00:10:244:3::/64", "fd00:1::3")},
		},
		{
			name:    "pod CIDR changed: old destination deleted, new one added",
			current: []Existing{ours("10.244.3.0/24", "192.168.1.3")},
			want:    []Route{r("10.244.33.0/24", "192.168.1.3", "n3")},
			add:     []Route{r("10.244.33.0/24", "192.168.1.3", "n3")},
			del:     []Existing{ours("10.244.3.0/24", "192.168.1.3")},
		},
		{
			name:    "routes of other owners are never deleted",
			current: []Existing{theirs("10.99.0.0/24", "192.168.1.250", 4), theirs("10.244.7.0/24", "192.168.1.7", 3), theirs("10.98.0.0/24", "", 2)},
			want:    nil,
		},
		{
			name:      "somebody else's route to another gateway holds the destination: conflict, untouched",
			current:   []Existing{theirs("10.244.2.0/24", "192.168.1.99", 4)},
			want:      []Route{r("10.244.2.0/24", "192.168.1.2", "n2")},
			conflicts: []string{"10.244.2.0/24"},
		},
		{
			name:    "somebody else's route to the same gateway does the job: left alone, in place",
			current: []Existing{theirs("10.244.2.0/24", "192.168.1.2", 4)},
			want:    []Route{r("10.244.2.0/24", "192.168.1.2", "n2")},
			inPlace: []Route{r("10.244.2.0/24", "192.168.1.2", "n2")},
		},
		{
			name:      "a device route of another owner is a conflict",
			current:   []Existing{theirs("10.244.2.0/24", "", 2)},
			want:      []Route{r("10.244.2.0/24", "192.168.1.2", "n2")},
			conflicts: []string{"10.244.2.0/24"},
		},
		{
			name: "duplicates of ours (another metric): the right one is kept, the rest deleted",
			current: []Existing{
				{Dst: p("10.244.2.0/24"), Gw: a("192.168.1.9"), Protocol: proto, Priority: 10},
				{Dst: p("10.244.2.0/24"), Gw: a("192.168.1.2"), Protocol: proto, Priority: 0},
			},
			want:    []Route{r("10.244.2.0/24", "192.168.1.2", "n2")},
			inPlace: []Route{r("10.244.2.0/24", "192.168.1.2", "n2")},
			del:     []Existing{{Dst: p("10.244.2.0/24"), Gw: a("192.168.1.9"), Protocol: proto, Priority: 10}},
		},
		{
			name:    "a route with our destination but another protocol number is not ours",
			current: []Existing{theirs("10.244.2.0/24", "192.168.1.2", proto+1)},
			want:    nil,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Diff(tt.current, tt.want, proto)
			check := func(what string, got, want []Route) {
				t.Helper()
				if !slices.Equal(got, want) {
					t.Errorf("%s = %v, want %v", what, got, want)
				}
			}
			check("Add", got.Add, tt.add)
			check("Replace", got.Replace, tt.replace)
			check("InPlace", got.InPlace, tt.inPlace)
			if !slices.Equal(got.Delete, tt.del) {
				t.Errorf("Delete = %v, want %v", got.Delete, tt.del)
			}
			var conflicts []string
			for _, c := range got.Conflicts {
				conflicts = append(conflicts, c.Route.Dst.String())
				if !strings.Contains(c.Error(), "leaves routes it did not make alone") {
					t.Errorf("conflict message %q does not say the route is left alone", c.Error())
				}
			}
			if !slices.Equal(conflicts, tt.conflicts) {
				t.Errorf("Conflicts = %v, want %v", conflicts, tt.conflicts)
			}
			if got.Empty() != (len(tt.add)+len(tt.replace)+len(tt.del) == 0) {
				t.Errorf("Empty() = %v", got.Empty())
			}
		})
	}
}
