package netpoldiff

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"sigs.k8s.io/yaml"
)

// The kinds of disagreement between the kernel and the model.
const (
	KindLeak     = "delivered, the model denies"
	KindBlocked  = "not delivered, the model allows"
	KindNoAnswer = "delivered and allowed, the answer did not come back"
	KindSource   = "delivered from another source address than sent"
	KindSendErr  = "the probe could not be sent (a broken probe, not a verdict)"
)

// Mismatch is an outcome that disagrees with the model.
type Mismatch struct {
	Outcome
	Class   string
	Kind    string
	Verdict Verdict
}

func (m Mismatch) String() string {
	s := fmt.Sprintf("[%s] %s: %s, at %s", m.Class, m.Kind, m.Probe, m.To)
	switch {
	case m.Kind == KindSendErr:
		s += ": " + m.SendErr.Error()
	case m.Kind == KindSource:
		s += fmt.Sprintf(": seen from %s", m.From)
	}
	return s + "\n      model: " + m.Verdict.Why
}

// Compare judges every outcome with the model. It returns the number of pairs per class and
// the mismatches.
func Compare(m *Model, outs []Outcome) (map[string]int, []Mismatch) {
	pairs := map[string]int{}
	var bad []Mismatch
	for _, o := range outs {
		class := PairClass(m, o.Probe, o.To)
		pairs[class]++
		v := m.Judge(o.Probe.Flow(o.To))
		kind := ""
		switch {
		case o.SendErr != nil:
			kind = KindSendErr
		case o.Delivered && !v.Allowed:
			kind = KindLeak
		case !o.Delivered && v.Allowed:
			kind = KindBlocked
		case o.Delivered && needsAnswer(o.Probe) && !o.Answered:
			kind = KindNoAnswer
		case o.Delivered && o.To.Role == RoleLocal && !o.Probe.Group && o.From != o.Probe.Src.WithZone(""):
			// A pod's ingress judges the source it sees: one rewritten before the policy is
			// another peer. Not checked for broadcast and multicast: kubenet's masquerade
			// rewrites a pod's datagram to 255.255.255.255, 224.0.0.0/4 or a non-link-local
			// IPv6 group to the gateway's address in postrouting, after the policy has judged
			// the pod's own address (the bridged copy passes the nat hooks too).
			kind = KindSource
		}
		if kind != "" {
			bad = append(bad, Mismatch{Outcome: o, Class: class, Kind: kind, Verdict: v})
		}
	}
	sort.SliceStable(bad, func(i, j int) bool { return bad[i].Class < bad[j].Class })
	return pairs, bad
}

// ReplayCommand is how to run one seed again.
func ReplayCommand(seed uint64) string {
	return fmt.Sprintf("KUBENET_NETPOL_SEED=%d go test -count=1 -run TestNetpolDifferential -v ./test/netpoldiff/", seed)
}

// Describe prints a case's objects (YAML, as kubectl would take them) and the node's sandboxes.
func Describe(c *Case) string {
	var b strings.Builder
	fmt.Fprintf(&b, "sandboxes on the node (namespace/name: addresses, link-local):\n")
	for _, s := range c.World.Sandboxes {
		fmt.Fprintf(&b, "  %s: %v %s\n", s.Key(), s.Addrs, s.LinkLocal)
	}
	var objs []any
	for _, n := range c.World.Namespaces {
		n.Kind, n.APIVersion = "Namespace", "v1"
		objs = append(objs, n)
	}
	for _, p := range c.World.Pods {
		p.Kind, p.APIVersion = "Pod", "v1"
		objs = append(objs, p)
	}
	for _, np := range c.Installed().Policies {
		np.Kind, np.APIVersion = "NetworkPolicy", "networking.k8s.io/v1"
		objs = append(objs, np)
	}
	for _, o := range objs {
		y, err := yaml.Marshal(o)
		if err != nil {
			fmt.Fprintf(&b, "# %v\n", err)
			continue
		}
		b.WriteString("---\n")
		for _, line := range strings.Split(strings.TrimSpace(string(y)), "\n") {
			// noise of Go's zero values that no manifest carries
			switch strings.TrimSpace(line) {
			case "creationTimestamp: null", "resources: {}", "spec: {}", "status: {}":
				continue
			}
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}

// Stats are the figures of a run.
type Stats struct {
	Cases, Probes, Pairs int
	PairsByClass         map[string]int
	// Mismatches by class and kind, and the seeds that had each class.
	ByClass map[string]map[string]int
	Seeds   map[string][]uint64
	// Smallest is, per class, the failing case with the fewest policy parts (Size): the one to
	// read first.
	Smallest map[string]uint64
	sizes    map[string]int
	Elapsed  time.Duration
}

// Size measures how much there is to read in a case's policies: policies, rules, peers, ports.
func Size(c *Case) int {
	n := 0
	for _, np := range c.World.Policies {
		n++
		for _, r := range np.Spec.Ingress {
			n += 1 + len(r.From) + len(r.Ports)
		}
		for _, r := range np.Spec.Egress {
			n += 1 + len(r.To) + len(r.Ports)
		}
	}
	return n
}

// NewStats is an empty Stats.
func NewStats() *Stats {
	return &Stats{PairsByClass: map[string]int{}, ByClass: map[string]map[string]int{}, Seeds: map[string][]uint64{},
		Smallest: map[string]uint64{}, sizes: map[string]int{}}
}

// Add counts one case.
func (s *Stats) Add(c *Case, probes int, pairs map[string]int, bad []Mismatch) {
	seed, size := c.Seed, Size(c)
	s.Cases++
	s.Probes += probes
	for c, n := range pairs {
		s.Pairs += n
		s.PairsByClass[c] += n
	}
	for _, m := range bad {
		if s.ByClass[m.Class] == nil {
			s.ByClass[m.Class] = map[string]int{}
		}
		s.ByClass[m.Class][m.Kind]++
		if seeds := s.Seeds[m.Class]; len(seeds) == 0 || seeds[len(seeds)-1] != seed {
			s.Seeds[m.Class] = append(seeds, seed)
		}
		if have, ok := s.sizes[m.Class]; !ok || size < have {
			s.sizes[m.Class], s.Smallest[m.Class] = size, seed
		}
	}
}

// String is the run's report: totals, then every class with its pairs and mismatches.
func (s *Stats) String() string {
	var b strings.Builder
	bad := 0
	for _, kinds := range s.ByClass {
		for _, n := range kinds {
			bad += n
		}
	}
	fmt.Fprintf(&b, "differential NetworkPolicy test: %d cases, %d probes, %d probe/receiver pairs, %d mismatches, %s\n",
		s.Cases, s.Probes, s.Pairs, bad, s.Elapsed.Round(100*time.Millisecond))
	classes := make([]string, 0, len(s.PairsByClass))
	for c := range s.PairsByClass {
		classes = append(classes, c)
	}
	sort.Strings(classes)
	fmt.Fprintf(&b, "%-26s %7s %10s  %s\n", "class", "pairs", "mismatches", "kinds (seeds)")
	for _, c := range classes {
		n, kinds := 0, []string{}
		for k, v := range s.ByClass[c] {
			n += v
			kinds = append(kinds, fmt.Sprintf("%d %s", v, k))
		}
		sort.Strings(kinds)
		detail := "ok"
		if n > 0 {
			detail = strings.Join(kinds, "; ") + fmt.Sprintf(" (%d seeds, first %s; smallest %d)", len(s.Seeds[c]), firstSeeds(s.Seeds[c], 5), s.Smallest[c])
		}
		fmt.Fprintf(&b, "%-26s %7d %10d  %s\n", c, s.PairsByClass[c], n, detail)
	}
	return b.String()
}

func firstSeeds(seeds []uint64, n int) string {
	var s []string
	for i, x := range seeds {
		if i == n {
			break
		}
		s = append(s, fmt.Sprint(x))
	}
	return strings.Join(s, " ")
}
