package policy

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kubenet-dev/kubenet/internal/policyrules"
)

// TestDropsCollectorHostileCounters: the drop counters are the kernel's elements, whose comments
// (the pods' names, cut at 128 bytes) another tool may have written and the cut may make equal.
// Every scrape still succeeds, with valid labels and one series per labels holding the sum:
// a failed scrape takes every metric of the agent with it, a panic the agent.
func TestDropsCollectorHostileCounters(t *testing.T) {
	long := strings.Repeat("a", 200)
	cut := func(s string) string { return s[:128] }
	rs := policyrules.Ruleset{Pods: []policyrules.Pod{
		{Port: 3, Name: "shop/" + long + "-1", Ingress: policyrules.Direction{Isolated: true}},
		{Port: 4, Name: "shop/" + long + "-2", Ingress: policyrules.Direction{Isolated: true}},
	}}
	type want struct {
		metric, namespace, pod, direction string
		value                             float64
	}
	tests := []struct {
		name   string
		names  *dropNames
		counts []policyrules.PortDrops
		want   []want
	}{
		{"names known: the full names", namesOf(rs), []policyrules.PortDrops{
			{Ingress: true, Port: 3, Pod: cut("shop/" + long + "-1"), Packets: 2},
			{Ingress: true, Port: 4, Pod: cut("shop/" + long + "-2"), Packets: 5},
		}, []want{
			{"kubenet_networkpolicy_drops_total", "shop", long + "-1", "ingress", 2},
			{"kubenet_networkpolicy_drops_total", "shop", long + "-2", "ingress", 5},
		}},
		{"before the first pass: the cut makes two pods one series", namesOf(policyrules.Ruleset{}), []policyrules.PortDrops{
			{Ingress: true, Port: 3, Pod: cut("shop/" + long + "-1"), Packets: 2},
			{Ingress: true, Port: 4, Pod: cut("shop/" + long + "-2"), Packets: 5},
			{Ingress: true, Port: 4, Pod: cut("shop/" + long + "-2"), Audit: true, Packets: 1},
		}, []want{
			{"kubenet_networkpolicy_drops_total", "shop", cut("shop/" + long + "-1")[5:], "ingress", 7},
			{"kubenet_networkpolicy_would_drops_total", "shop", cut("shop/" + long + "-1")[5:], "ingress", 1},
		}},
		{"a comment that is not UTF-8", namesOf(policyrules.Ruleset{}), []policyrules.PortDrops{
			{Port: 9, Pod: "shop/caf\xc3", Packets: 1},
			{Port: 10, Pod: "\xff\xfe", Packets: 1},
		}, []want{
			{"kubenet_networkpolicy_drops_total", "shop", "caf\uFFFD", "egress", 1},
			{"kubenet_networkpolicy_drops_total", "", "\uFFFD", "egress", 1},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newDropsCollector("kubenet", func() *dropNames { return tt.names }, &dropLost{})
			c.read = func() ([]policyrules.PortDrops, uint64, error) { return tt.counts, 0, nil }
			reg := prometheus.NewPedanticRegistry()
			reg.MustRegister(c)
			defer func() {
				if r := recover(); r != nil {
					t.Fatalf("scrape panicked: %v", r)
				}
			}()
			families, err := reg.Gather()
			if err != nil {
				t.Fatalf("scrape failed: %v", err)
			}
			var got []want
			for _, f := range families {
				if !strings.HasSuffix(f.GetName(), "drops_total") {
					continue
				}
				for _, m := range f.GetMetric() {
					w := want{metric: f.GetName(), value: m.GetCounter().GetValue()}
					for _, l := range m.GetLabel() {
						if !utf8.ValidString(l.GetValue()) {
							t.Errorf("label %s=%q is not UTF-8", l.GetName(), l.GetValue())
						}
						switch l.GetName() {
						case "namespace":
							w.namespace = l.GetValue()
						case "pod":
							w.pod = l.GetValue()
						case "direction":
							w.direction = l.GetValue()
						}
					}
					got = append(got, w)
				}
			}
			if len(got) != len(tt.want) {
				t.Fatalf("series %+v, want %+v", got, tt.want)
			}
			for _, w := range tt.want {
				found := false
				for _, g := range got {
					found = found || g == w
				}
				if !found {
					t.Errorf("no series %+v in %+v", w, got)
				}
			}
		})
	}
}
