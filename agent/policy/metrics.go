package policy

import (
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kubenet-dev/kubenet/core"
	"github.com/kubenet-dev/kubenet/internal/policyrules"
)

// metrics are the controller's Prometheus series.
type metrics struct {
	policies prometheus.Gauge
	isolated prometheus.Gauge
	unknown  prometheus.Gauge
	groups   prometheus.Gauge
	refused  prometheus.Gauge
	passes   *prometheus.CounterVec
	passTime prometheus.Histogram
	released prometheus.Counter
	repairs  *prometheus.CounterVec
	cut      prometheus.Counter
	// logLines counts the drop log's lines written.
	logLines prometheus.Counter
	// divergences counts full compiles that found the incremental result different.
	divergences prometheus.Counter
	compiled    prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		policies: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kubenet_agent_network_policies",
			Help: "NetworkPolicies in the cluster at the last pass.",
		}),
		isolated: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kubenet_agent_network_policy_isolated_pods",
			Help: "Pods of this node isolated in at least one direction at the last pass.",
		}),
		unknown: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kubenet_agent_network_policy_unknown_pods",
			Help: "Attachments on this node whose pod the API does not have: their traffic stays denied.",
		}),
		groups: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kubenet_agent_network_policy_groups",
			Help: "Distinct allow lists (a chain and its sets each) in the node's policy table.",
		}),
		refused: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kubenet_agent_network_policy_refused_groups",
			Help: "Allow lists (one direction of one or more pods) the last pass did not install: over a limit, or refused by the kernel. Their pods keep what they had in that direction.",
		}),
		passes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kubenet_agent_network_policy_passes_total",
			Help: "Compile-and-apply passes, by result (ok, error).",
		}, []string{"result"}),
		passTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kubenet_agent_network_policy_pass_seconds",
			Help:    "Time of one compile-and-apply pass.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
		}),
		released: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kubenet_agent_network_policy_released_total",
			Help: "Pods whose policies came into force (released from being held).",
		}),
		repairs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kubenet_agent_network_policy_repairs_total",
			Help: "What passes found removed or changed by somebody else and put back, by what (guard, bridge_netfilter_call, group, fixed).",
		}, []string{"what"}),
		cut: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kubenet_agent_network_policy_cut_connections_total",
			Help: "Conntrack entries of established connections marked cut (their packets dropped) because a policy change denies them (--policy-cut-established).",
		}),
		logLines: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kubenet_networkpolicy_log_lines_total",
			Help: "Lines the drop log (--policy-log) wrote: one per burst of drops of one pod, direction, peer, protocol and port.",
		}),
		divergences: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kubenet_agent_network_policy_incremental_divergences_total",
			Help: "Checks (at the periodic resync) that found the incremental compile's result different from a full compile's; the full one was used. Not 0: a bug, please report.",
		}),
		compiled: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kubenet_agent_network_policy_compiled_pods",
			Help:    "Local pods compiled by one pass (the others kept their rules).",
			Buckets: prometheus.ExponentialBuckets(1, 4, 7),
		}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.policies, m.isolated, m.unknown, m.groups, m.refused, m.passes, m.passTime, m.released, m.repairs, m.cut, m.logLines, m.divergences, m.compiled} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// repaired counts guards put back and the bridge's nf_call options turned on.
func (m *metrics) repaired(guards int, netfilterCall bool) {
	m.repairs.WithLabelValues("guard").Add(float64(guards))
	if netfilterCall {
		m.repairs.WithLabelValues("bridge_netfilter_call").Inc()
	}
}

func (m *metrics) observe(policies int, res Result) {
	m.policies.Set(float64(policies))
	m.isolated.Set(float64(res.Isolated))
	m.unknown.Set(float64(len(res.Unknown)))
}

func (m *metrics) pass(p Pass) {
	m.passTime.Observe(p.Took.Seconds())
	if p.Err != nil {
		m.passes.WithLabelValues("error").Inc()
		return
	}
	m.passes.WithLabelValues("ok").Inc()
	m.compiled.Observe(float64(p.Compiled))
	m.groups.Set(float64(p.Applied.Groups))
	m.refused.Set(float64(len(p.Applied.Refused)))
	m.released.Add(float64(p.Applied.Released))
	m.cut.Add(float64(p.Cut))
	m.repaired(p.Guarded, p.NetfilterCall)
	m.repairs.WithLabelValues("group").Add(float64(p.Applied.RepairedGroups))
	if p.Applied.FixedWritten && p.Applied.Released == 0 && p.Applied.Groups > 0 {
		m.repairs.WithLabelValues("fixed").Inc()
	}
}

// dropsCollector reads the kernel's drop counters at every scrape: one series per isolated
// pod of the node and direction, gone with the pod's counter (cardinality: at most two per
// local pod). It also gives the drop log's losses: the kernel's count of drops over the log's
// rate and the agent's own (socket overruns, the aggregation's bound).
type dropsCollector struct {
	network    string
	names      func() *dropNames
	lost       *dropLost
	read       func() ([]policyrules.PortDrops, uint64, error) // the kernel's counters (core.PolicyDropCounts)
	drops      *prometheus.Desc
	wouldDrops *prometheus.Desc
	logLost    *prometheus.Desc

	mu sync.Mutex
	// rateLimited accumulates the kernel's counter, which starts again when the table is made
	// anew (a flushed ruleset): the metric stays a counter.
	rateLimited, lastKernel uint64
}

func newDropsCollector(network string, names func() *dropNames, lost *dropLost) *dropsCollector {
	return &dropsCollector{network: network, names: names, lost: lost,
		read: func() ([]policyrules.PortDrops, uint64, error) { return core.PolicyDropCounts(network) },
		drops: prometheus.NewDesc("kubenet_networkpolicy_drops_total",
			"Packets the NetworkPolicies dropped, by the node's pod (its namespace and name) and direction (ingress: to the pod, egress: from it), as the kernel counts them.",
			[]string{"namespace", "pod", "direction"}, nil),
		wouldDrops: prometheus.NewDesc("kubenet_networkpolicy_would_drops_total",
			"Packets that staged (audit) NetworkPolicies would have dropped and that passed, by the node's pod and direction: only where no enforced policy isolates the pod in it.",
			[]string{"namespace", "pod", "direction"}, nil),
		logLost: prometheus.NewDesc("kubenet_networkpolicy_log_lost_total",
			"Drops the drop log did not write, by reason: rate_limit (over the log's rate, counted by the kernel), overrun (the agent's socket overflowed), aggregation (too many bursts at once).",
			[]string{"reason"}, nil),
	}
}

func (c *dropsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.drops
	ch <- c.wouldDrops
	ch <- c.logLost
}

func (c *dropsCollector) Collect(ch chan<- prometheus.Metric) {
	counts, limited, err := c.read()
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.drops, err)
		return
	}
	for _, s := range dropSeriesOf(counts, c.names()) {
		desc := c.drops
		if s.audit {
			desc = c.wouldDrops
		}
		ch <- prometheus.MustNewConstMetric(desc, prometheus.CounterValue, float64(s.packets), s.namespace, s.pod, s.direction)
	}
	c.mu.Lock()
	if limited >= c.lastKernel {
		c.rateLimited += limited - c.lastKernel
	} else {
		c.rateLimited += limited
	}
	c.lastKernel = limited
	rateLimited := c.rateLimited
	c.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(c.logLost, prometheus.CounterValue, float64(rateLimited), "rate_limit")
	ch <- prometheus.MustNewConstMetric(c.logLost, prometheus.CounterValue, float64(c.lost.overrun.Load()), "overrun")
	ch <- prometheus.MustNewConstMetric(c.logLost, prometheus.CounterValue, float64(c.lost.aggregation.Load()), "aggregation")
}

// dropSeries is one series of the drop counters.
type dropSeries struct {
	audit                     bool
	namespace, pod, direction string
	packets                   uint64
}

// dropSeriesOf labels the kernel's drop counters with their pods: the last pass's name of the
// port's pod where the counter's comment (cut at 128 bytes) is the start of it, else the
// comment. Counters that end up with the same labels (two pods whose names the cut makes equal,
// on ports the last pass does not know, e.g. before the first pass after a restart; elements
// another tool added) make one series of their sum: a scrape with two equal series fails whole,
// every other metric of the agent with it. A comment is the kernel's bytes, which need not be
// UTF-8 (a cut in a character, or another tool's), and a label that is not makes the metric's
// constructor panic. Pure.
func dropSeriesOf(counts []policyrules.PortDrops, names *dropNames) []dropSeries {
	var out []dropSeries
	at := map[dropSeries]int{} // by labels (packets 0): the index in out
	for _, d := range counts {
		name := d.Pod
		if p, ok := names.ports[d.Port]; ok && strings.HasPrefix(p.name, d.Pod) {
			name = p.name
		}
		ns, pod := splitPod(strings.ToValidUTF8(name, "\uFFFD"))
		s := dropSeries{audit: d.Audit, namespace: ns, pod: pod, direction: "egress"}
		if d.Ingress {
			s.direction = "ingress"
		}
		if i, ok := at[s]; ok {
			out[i].packets += d.Packets
			continue
		}
		at[s] = len(out)
		s.packets = d.Packets
		out = append(out, s)
	}
	return out
}
