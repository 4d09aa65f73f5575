package netpoldiff

import (
	"fmt"
	"math/rand/v2"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// fixedSeeds is the seed set `make test` runs.
const fixedSeeds = 48

// config is a run's settings, from the environment:
//
//	KUBENET_NETPOL_SEED     one seed (replay a failure)
//	KUBENET_NETPOL_CASES    a long run of this many cases (make netpol-diff), from
//	KUBENET_NETPOL_FIRST_SEED (default: chosen from the clock and printed)
//	KUBENET_NETPOL_PROBES   probes per case (default 192)
//	KUBENET_NETPOL_CLASSES  a regexp: only pairs of the classes it matches are probed and judged,
//	                        e.g. '^pod-pod/' or 'll/' or '^(broadcast|multicast)/'
//	KUBENET_NETPOL_DETAILS  how many failing cases print their objects (default all; 10 in a
//	                        long run, where each failing case prints 10 of its mismatches)
type config struct {
	seeds   []uint64
	probes  int
	classes *regexp.Regexp
	details int // failing cases that print their objects (-1: all)
	lines   int // mismatches a failing case prints (-1: all)
}

func envInt(t *testing.T, key string, def uint64) uint64 {
	v := os.Getenv(key)
	if v == "" {
		return def
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		t.Fatalf("%s=%q: not a number: %v", key, v, err)
	}
	return n
}

func configFromEnv(t *testing.T) config {
	c := config{probes: int(envInt(t, "KUBENET_NETPOL_PROBES", 192)), details: -1, lines: -1}
	re := os.Getenv("KUBENET_NETPOL_CLASSES")
	if re == "" {
		re = "."
	}
	var err error
	if c.classes, err = regexp.Compile(re); err != nil {
		t.Fatalf("KUBENET_NETPOL_CLASSES=%q: %v", re, err)
	}
	switch {
	case os.Getenv("KUBENET_NETPOL_SEED") != "":
		c.seeds = []uint64{envInt(t, "KUBENET_NETPOL_SEED", 0)}
	case os.Getenv("KUBENET_NETPOL_CASES") != "":
		n := envInt(t, "KUBENET_NETPOL_CASES", 0)
		first := envInt(t, "KUBENET_NETPOL_FIRST_SEED", uint64(time.Now().Unix()%1_000_000)*1000)
		t.Logf("long run: %d cases from seed %d (KUBENET_NETPOL_FIRST_SEED=%d repeats it)", n, first, first)
		for i := range n {
			c.seeds = append(c.seeds, first+i)
		}
		c.details, c.lines = 10, 10
	default:
		for i := range uint64(fixedSeeds) {
			c.seeds = append(c.seeds, i+1)
		}
	}
	if d := os.Getenv("KUBENET_NETPOL_DETAILS"); d != "" {
		c.details = int(envInt(t, "KUBENET_NETPOL_DETAILS", 0))
	}
	return c
}

// TestNetpolDifferential generates random clusters, installs their policies on a real node
// through kubenet's compiler and kernel side, sends real packets of every kind and compares
// what arrives with the model. Every mismatch fails the case's subtest with its seed.
func TestNetpolDifferential(t *testing.T) {
	start := time.Now()
	cfg := configFromEnv(t)
	lab := NewLab(t, binDir)
	if err := sctpSockets(lab.node.NS); err != nil {
		if lab.NoSCTP != nil {
			t.Logf("SCTP not probed: the kernel has no SCTP sockets (%v) and raw SCTP packets cannot be sent: %v", err, lab.NoSCTP)
		} else {
			t.Logf("the kernel has no SCTP sockets (%v): SCTP is probed with raw INIT chunks, which the kernel's SCTP conntrack and nftables see as any SCTP association's first packet; no SCTP answer is checked", err)
		}
	}
	cands := Candidates(lab.Topo, lab.NoSCTP == nil)
	t.Logf("lab ready in %s: %d sandboxes, %d kinds of probe", time.Since(start).Round(time.Millisecond), len(lab.Topo.Sandboxes), len(Classes(cands)))

	// The control: no policies, every sandbox's pod known; one probe of every class from every
	// sender must arrive and be answered, or the probes themselves are broken and no "denied"
	// below would mean anything.
	t.Run("control", func(t *testing.T) {
		w := World{Sandboxes: lab.Topo.Sandboxes}
		for _, name := range namespaceNames {
			w.Namespaces = append(w.Namespaces, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})
		}
		for _, s := range lab.Topo.Sandboxes {
			w.Pods = append(w.Pods, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: s.Namespace, Name: s.Name},
				Status: corev1.PodStatus{Phase: corev1.PodRunning}})
		}
		if err := lab.Install(w); err != nil {
			t.Fatal(err)
		}
		m := NewModel(w)
		probes := OnePerKind(rand.New(rand.NewPCG(0, 0)), cands)
		var bad []Mismatch
		for i := 0; i < len(probes); i += 100 {
			outs := lab.Run(probes[i:min(i+100, len(probes))], func(p *Probe, to Endpoint) bool { return m.Judge(p.Flow(to)).Allowed })
			_, b := Compare(m, outs)
			bad = append(bad, b...)
		}
		if len(bad) > 0 {
			var s []string
			for _, b := range bad {
				s = append(s, b.String())
			}
			t.Fatalf("%d of %d control probes (no policy) failed; the prober is broken:\n  %s", len(bad), len(probes), strings.Join(s, "\n  "))
		}
		t.Logf("%d control probes, every kind from every sender, all delivered and answered", len(probes))
	})
	if t.Failed() {
		return
	}

	stats := NewStats()
	detailed := 0
	for _, seed := range cfg.seeds {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			c := Generate(seed, lab.Topo)
			m := NewModel(c.World)
			probes := Sample(rand.New(rand.NewPCG(seed, 2)), m, cands, cfg.probes, cfg.classes)
			if err := lab.Install(c.Installed()); err != nil {
				t.Fatalf("seed %d: install: %v\n%s", seed, err, Describe(c))
			}
			outs := lab.Run(append(probes, Controls(lab.Topo, m)...), func(p *Probe, to Endpoint) bool { return m.Judge(p.Flow(to)).Allowed })
			var judged []Outcome
			for _, o := range outs {
				switch {
				case o.Probe.Class == ControlClass:
					if !o.Delivered || !o.Answered || o.SendErr != nil {
						t.Errorf("seed %d: the control probe %s failed (delivered %v, answered %v, error %v): this case's \"not delivered\" outcomes mean nothing",
							seed, o.Probe, o.Delivered, o.Answered, o.SendErr)
					}
				case cfg.classes.MatchString(PairClass(m, o.Probe, o.To)):
					judged = append(judged, o)
				}
			}
			pairs, bad := Compare(m, judged)
			stats.Add(c, len(probes), pairs, bad)
			if len(bad) == 0 {
				return
			}
			var b strings.Builder
			fmt.Fprintf(&b, "seed %d: %d of %d probe/receiver pairs disagree with the model\n  replay: %s\n", seed, len(bad), len(judged), ReplayCommand(seed))
			for i, m := range bad {
				if cfg.lines >= 0 && i == cfg.lines {
					fmt.Fprintf(&b, "  … and %d more (replay the seed for all)\n", len(bad)-i)
					break
				}
				fmt.Fprintf(&b, "  %s\n", m)
			}
			if cfg.details < 0 || detailed < cfg.details {
				detailed++
				b.WriteString(Describe(c))
			}
			t.Error(b.String())
		})
	}
	stats.Elapsed = time.Since(start)
	t.Log("\n" + stats.String())
}
