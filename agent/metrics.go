package agent

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the agent's Prometheus series. They live on a registry the caller gives, never
// on the global default one, so tests and embedders can run several agents in one process.
type metrics struct {
	routes         prometheus.Gauge
	paths          *prometheus.GaugeVec
	routeFailures  *prometheus.GaugeVec
	syncErrors     prometheus.Counter
	lastSync       prometheus.Gauge
	syncDuration   prometheus.Histogram
	ready          prometheus.Gauge
	confWrites     prometheus.Counter
	stalePasses    *prometheus.CounterVec
	staleCollected *prometheus.CounterVec
	healRepairs    prometheus.Counter
	healRestored   prometheus.Counter
	healErrors     prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		routes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kubenet_agent_routes_programmed",
			Help: "Routes to other nodes' pod CIDRs that are in place after the last sync.",
		}),
		paths: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kubenet_agent_peer_routes",
			Help: "Routes to other nodes' pod CIDRs in place after the last sync, by path: direct (via the node's InternalIP) or vxlan (through the overlay).",
		}, []string{"path"}),
		routeFailures: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kubenet_agent_route_failures",
			Help: "Routes to a node's pod CIDRs that the last sync could not program, by node (not on this node's L2 segment, no InternalIP, conflicting route, ...).",
		}, []string{"node"}),
		syncErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kubenet_agent_sync_errors_total",
			Help: "Syncs that ended with at least one error (a route, the conflist or the node condition).",
		}),
		lastSync: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kubenet_agent_last_sync_timestamp_seconds",
			Help: "Unix time at which the last sync finished, with or without errors.",
		}),
		syncDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kubenet_agent_sync_duration_seconds",
			Help:    "Time one sync took: read the Nodes and the kernel, write the conflist, routes and condition.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14), // 1 ms to 8 s
		}),
		ready: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kubenet_agent_ready",
			Help: "1 when the conflist for the node's pod CIDRs is written, else 0.",
		}),
		confWrites: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kubenet_agent_conflist_writes_total",
			Help: "Times the conflist was (re)written because its content changed.",
		}),
		stalePasses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kubenet_agent_stale_passes_total",
			Help: "Passes of the stale-attachment collection, by result: ok, runtime_unavailable (nothing collected), error (collected in part).",
		}, []string{"result"}),
		staleCollected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kubenet_agent_stale_collected_total",
			Help: "Attachments of sandboxes the runtime no longer lists, and reservations without sandbox or record, that were collected.",
		}, []string{"kind"}),
		healRepairs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kubenet_agent_heal_repairs_total",
			Help: "Times the node-wide rules of the kubenet network were found not as planned (flushed, deleted or changed by another tool) and restored.",
		}),
		healRestored: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kubenet_agent_heal_restored_hostport_elements_total",
			Help: "hostPort map elements of running pods put back from the plugin's ownership index.",
		}),
		healErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kubenet_agent_heal_errors_total",
			Help: "Passes that could not restore the node-wide state of the kubenet network.",
		}),
	}
	for _, c := range []prometheus.Collector{m.routes, m.paths, m.routeFailures, m.syncErrors, m.lastSync, m.syncDuration, m.ready, m.confWrites, m.stalePasses, m.staleCollected, m.healRepairs, m.healRestored, m.healErrors} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
