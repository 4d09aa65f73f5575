package policy

import (
	"github.com/prometheus/client_golang/prometheus"
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
	for _, c := range []prometheus.Collector{m.policies, m.isolated, m.unknown, m.groups, m.refused, m.passes, m.passTime, m.released, m.repairs, m.divergences, m.compiled} {
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
	m.repaired(p.Guarded, p.NetfilterCall)
	m.repairs.WithLabelValues("group").Add(float64(p.Applied.RepairedGroups))
	if p.Applied.FixedWritten && p.Applied.Released == 0 && p.Applied.Groups > 0 {
		m.repairs.WithLabelValues("fixed").Inc()
	}
}
