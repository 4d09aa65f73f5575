package policy

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/kubenet-dev/kubenet/internal/policyrules"
)

// TestDropLogLines: drops become one line per burst (same pod, direction, peer, protocol and
// port within the window), naming both ends' pods where known (the node's from the ruleset,
// others' from the API) and the policies that isolate the pod in the direction; the open bursts
// are bounded, and what is past the bound is counted as lost.
func TestDropLogLines(t *testing.T) {
	a := netip.MustParseAddr
	rs := policyrules.Ruleset{Pods: []policyrules.Pod{
		{Port: 5, Name: "shop/web", IPs: []netip.Addr{a("10.244.1.5"), a("fd00::5")},
			Ingress: policyrules.Direction{Isolated: true, Policies: []string{"shop/deny-all", "shop/web-from-lb"}}},
		{Port: 7, Name: "shop/db", IPs: []netip.Addr{a("10.244.1.7")},
			Egress: policyrules.Direction{Isolated: true, Policies: []string{"shop/db-egress"}}},
	}}
	names := namesOf(rs)
	remote := func(x netip.Addr) string {
		if x == a("10.244.2.9") {
			return "other/client"
		}
		return ""
	}
	t0 := time.Date(2026, 11, 28, 3, 0, 0, 0, time.UTC)
	udp := func(ingress bool, port int, src, dst string, dport uint16, at time.Duration) policyrules.Drop {
		return policyrules.Drop{Time: t0.Add(at), Network: "kubenet", Ingress: ingress, Port: port, Src: a(src), Dst: a(dst), Proto: 17, SrcPort: 40000, DstPort: dport, ICMPType: -1}
	}
	tests := []struct {
		name  string
		drops []policyrules.Drop
		want  []dropLine
	}{
		{
			name:  "one ingress drop from another node's pod",
			drops: []policyrules.Drop{udp(true, 5, "10.244.2.9", "10.244.1.5", 53, 0)},
			want: []dropLine{{Msg: DropLogMsg, Time: t0, Count: 1, Node: "n1", Direction: "ingress", Verdict: "drop", Protocol: "udp", Port: 53,
				Src:      dropEndpoint{IP: "10.244.2.9", Namespace: "other", Pod: "client"},
				Dst:      dropEndpoint{IP: "10.244.1.5", Namespace: "shop", Pod: "web"},
				Policies: []string{"shop/deny-all", "shop/web-from-lb"}}},
		},
		{
			name: "a burst of egress drops to an unknown address, and one to another port",
			drops: []policyrules.Drop{udp(false, 7, "10.244.1.7", "192.0.2.1", 443, 0), udp(false, 7, "10.244.1.7", "192.0.2.1", 443, 10*time.Millisecond),
				udp(false, 7, "10.244.1.7", "192.0.2.1", 443, 20*time.Millisecond), udp(false, 7, "10.244.1.7", "192.0.2.1", 80, 30*time.Millisecond)},
			want: []dropLine{
				{Msg: DropLogMsg, Time: t0, Last: ptr(t0.Add(20 * time.Millisecond)), Count: 3, Node: "n1", Direction: "egress", Verdict: "drop", Protocol: "udp", Port: 443,
					Src: dropEndpoint{IP: "10.244.1.7", Namespace: "shop", Pod: "db"}, Dst: dropEndpoint{IP: "192.0.2.1"}, Policies: []string{"shop/db-egress"}},
				{Msg: DropLogMsg, Time: t0.Add(30 * time.Millisecond), Count: 1, Node: "n1", Direction: "egress", Verdict: "drop", Protocol: "udp", Port: 80,
					Src: dropEndpoint{IP: "10.244.1.7", Namespace: "shop", Pod: "db"}, Dst: dropEndpoint{IP: "192.0.2.1"}, Policies: []string{"shop/db-egress"}},
			},
		},
		{
			name: "between two local pods, ICMP, on a port no pass knows; another network's drop is not this log's",
			drops: []policyrules.Drop{{Time: t0, Network: "kubenet", Ingress: true, Port: 5, Src: a("10.244.1.7"), Dst: a("10.244.1.5"), Proto: 1, ICMPType: 8},
				{Time: t0, Network: "kubenet", Ingress: true, Port: 99, Src: a("10.244.1.7"), Dst: a("10.244.1.99"), Proto: 1, ICMPType: 8},
				{Time: t0, Network: "other", Ingress: true, Port: 5, Src: a("10.244.1.8"), Dst: a("10.244.1.5"), Proto: 1, ICMPType: 8}},
			want: []dropLine{
				{Msg: DropLogMsg, Time: t0, Count: 1, Node: "n1", Direction: "ingress", Verdict: "drop", Protocol: "icmp", ICMPType: ptr(8),
					Src: dropEndpoint{IP: "10.244.1.7", Namespace: "shop", Pod: "db"}, Dst: dropEndpoint{IP: "10.244.1.5", Namespace: "shop", Pod: "web"},
					Policies: []string{"shop/deny-all", "shop/web-from-lb"}},
				{Msg: DropLogMsg, Time: t0, Count: 1, Node: "n1", Direction: "ingress", Verdict: "drop", Protocol: "icmp", ICMPType: ptr(8),
					Src: dropEndpoint{IP: "10.244.1.7", Namespace: "shop", Pod: "db"}, Dst: dropEndpoint{IP: "10.244.1.99"}, Policies: []string{}},
			},
		},
	}
	staged := udp(true, 5, "10.244.2.9", "10.244.1.5", 53, 0)
	staged.Audit = true
	tests = append(tests, struct {
		name  string
		drops []policyrules.Drop
		want  []dropLine
	}{
		name:  "what a staged policy would drop, next to a real drop of the same flow: two lines",
		drops: []policyrules.Drop{staged, udp(true, 5, "10.244.2.9", "10.244.1.5", 53, time.Millisecond)},
		want: []dropLine{
			{Msg: DropLogMsg, Time: t0, Count: 1, Node: "n1", Direction: "ingress", Verdict: "would-drop", Protocol: "udp", Port: 53,
				Src: dropEndpoint{IP: "10.244.2.9", Namespace: "other", Pod: "client"}, Dst: dropEndpoint{IP: "10.244.1.5", Namespace: "shop", Pod: "web"},
				Policies: []string{"shop/deny-all", "shop/web-from-lb"}},
			{Msg: DropLogMsg, Time: t0.Add(time.Millisecond), Count: 1, Node: "n1", Direction: "ingress", Verdict: "drop", Protocol: "udp", Port: 53,
				Src: dropEndpoint{IP: "10.244.2.9", Namespace: "other", Pod: "client"}, Dst: dropEndpoint{IP: "10.244.1.5", Namespace: "shop", Pod: "web"},
				Policies: []string{"shop/deny-all", "shop/web-from-lb"}},
		},
	})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			lines := 0
			now := t0
			l := &dropLog{out: &out, network: "kubenet", node: "n1", log: slog.New(slog.NewTextHandler(io.Discard, nil)), names: func() *dropNames { return names },
				remote: remote, lost: &dropLost{}, lines: func() { lines++ }, now: func() time.Time { return now }, open: map[burstKey]*burst{}}
			l.add(tt.drops)
			l.flush(false)
			if out.Len() != 0 {
				t.Fatalf("a line before the window is over: %s", out.String())
			}
			now = now.Add(dropWindow)
			l.flush(false)
			got := parseLines(t, out.String())
			if len(got) != len(tt.want) || lines != len(tt.want) {
				t.Fatalf("%d lines (counted %d), want %d:\n%s", len(got), lines, len(tt.want), out.String())
			}
			for i := range got {
				g, _ := json.Marshal(got[i])
				w, _ := json.Marshal(tt.want[i])
				if !bytes.Equal(g, w) {
					t.Errorf("line %d:\n got %s\nwant %s", i, g, w)
				}
			}
		})
	}

	t.Run("bounded", func(t *testing.T) {
		lost := &dropLost{}
		var out bytes.Buffer
		l := &dropLog{out: &out, network: "kubenet", log: slog.New(slog.NewTextHandler(io.Discard, nil)), names: func() *dropNames { return names },
			lost: lost, lines: func() {}, now: time.Now, open: map[burstKey]*burst{}}
		var ds []policyrules.Drop
		for i := range maxOpenBursts + 100 {
			ds = append(ds, udp(true, 5, "10.244.2.9", "10.244.1.5", uint16(i), 0))
		}
		l.add(ds)
		if len(l.open) != maxOpenBursts || lost.aggregation.Load() != 100 {
			t.Errorf("%d bursts open, %d lost; want %d and 100", len(l.open), lost.aggregation.Load(), maxOpenBursts)
		}
		l.flush(true)
		if n := strings.Count(out.String(), "\n"); n != maxOpenBursts || len(l.open) != 0 {
			t.Errorf("final flush: %d lines, %d left open", n, len(l.open))
		}
	})

	// The reader names a network's drops in full, a long name too (core.PolicyDropReader reads
	// the kernel's cut and hashed form): those of another network, even one whose name starts
	// the same, are not the log's.
	t.Run("long network name", func(t *testing.T) {
		long := strings.Repeat("n", 128)
		l := &dropLog{out: io.Discard, network: long, log: slog.New(slog.NewTextHandler(io.Discard, nil)), names: func() *dropNames { return names },
			lost: &dropLost{}, lines: func() {}, now: time.Now, open: map[burstKey]*burst{}}
		ours, other := udp(true, 5, "10.244.2.9", "10.244.1.5", 53, 0), udp(true, 5, "10.244.2.9", "10.244.1.5", 54, 0)
		ours.Network, other.Network = long, long[:127]+"m"
		l.add([]policyrules.Drop{ours, other})
		if len(l.open) != 1 {
			t.Errorf("%d bursts open, want 1 (the network's own drop)", len(l.open))
		}
	})
}

func ptr[T any](v T) *T { return &v }

func parseLines(t *testing.T, s string) []dropLine {
	t.Helper()
	var out []dropLine
	for _, line := range strings.Split(strings.TrimSpace(s), "\n") {
		if line == "" {
			continue
		}
		var l dropLine
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		out = append(out, l)
	}
	return out
}
