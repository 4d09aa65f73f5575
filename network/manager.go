package network

import (
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Operation types of the metrics (kubelet's label values).
const (
	OpSetUpPod            = "set_up_pod"
	OpTearDownPod         = "tear_down_pod"
	OpGetPodNetworkStatus = "get_pod_network_status"
)

// metrics are kubelet's network plugin metrics (subsystem kubelet, label operation_type).
type metrics struct {
	operations *prometheus.CounterVec
	duration   *prometheus.HistogramVec
	errors     *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		operations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Subsystem: "kubelet", Name: "network_plugin_operations_total",
			Help: "Cumulative number of network plugin operations by operation type.",
		}, []string{"operation_type"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Subsystem: "kubelet", Name: "network_plugin_operations_duration_seconds",
			Help:    "Latency in seconds of network plugin operations. Broken down by operation type.",
			Buckets: prometheus.DefBuckets,
		}, []string{"operation_type"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Subsystem: "kubelet", Name: "network_plugin_operations_errors_total",
			Help: "Cumulative number of network plugin operation errors by operation type.",
		}, []string{"operation_type"}),
	}
	for _, c := range []prometheus.Collector{m.operations, m.duration, m.errors} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register network plugin metrics: %w", err)
		}
	}
	return m, nil
}

func (m *metrics) record(op string, start time.Time, err error) {
	m.operations.WithLabelValues(op).Inc()
	m.duration.WithLabelValues(op).Observe(time.Since(start).Seconds())
	if err != nil {
		m.errors.WithLabelValues(op).Inc()
	}
}

// PluginManager wraps a NetworkPlugin the way kubelet's did: SetUpPod, TearDownPod and
// GetPodNetworkStatus of one pod (namespace/name) run one at a time, different pods in parallel;
// errors name the plugin and the pod; every pod operation is counted and timed.
type PluginManager struct {
	plugin  NetworkPlugin
	metrics *metrics

	mu   sync.Mutex
	pods map[string]*podLock // pod full name -> lock; entries exist only while in use
}

// podLock is a pod's lock with the number of callers holding or waiting for it, so the map entry
// can be dropped when the last one leaves: a node sees an unbounded stream of pod names.
type podLock struct {
	refs int
	mu   sync.Mutex
}

// NewPluginManager wraps plugin. The metrics are registered on reg; nil registers them on a
// private registry (the caller then has no way to read them, which suits tests and tools).
func NewPluginManager(plugin NetworkPlugin, reg prometheus.Registerer) (*PluginManager, error) {
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	return &PluginManager{plugin: plugin, metrics: m, pods: map[string]*podLock{}}, nil
}

// PluginName is the wrapped plugin's name.
func (pm *PluginManager) PluginName() string { return pm.plugin.Name() }

// Event passes through without a pod lock.
func (pm *PluginManager) Event(name string, details map[string]interface{}) {
	pm.plugin.Event(name, details)
}

// Status passes through without a pod lock.
func (pm *PluginManager) Status() error { return pm.plugin.Status() }

// podFullName is kubelet's BuildPodFullName.
func podFullName(namespace, name string) string { return name + "_" + namespace }

func (pm *PluginManager) lock(fullName string) *podLock {
	pm.mu.Lock()
	l, ok := pm.pods[fullName]
	if !ok {
		l = &podLock{}
		pm.pods[fullName] = l
	}
	l.refs++
	pm.mu.Unlock()
	l.mu.Lock()
	return l
}

func (pm *PluginManager) unlock(fullName string, l *podLock) {
	l.mu.Unlock()
	pm.mu.Lock()
	l.refs--
	if l.refs == 0 {
		delete(pm.pods, fullName)
	}
	pm.mu.Unlock()
}

// inUse returns the number of pod lock entries (for tests: it must drop back to zero).
func (pm *PluginManager) inUse() int {
	pm.mu.Lock()
	defer pm.mu.Unlock()
	return len(pm.pods)
}

// SetUpPod sets up the pod's network under the pod's lock.
func (pm *PluginManager) SetUpPod(namespace, name string, id ContainerID, annotations, options map[string]string) (err error) {
	fullName := podFullName(namespace, name)
	l := pm.lock(fullName)
	defer pm.unlock(fullName, l)
	start := time.Now()
	defer func() { pm.metrics.record(OpSetUpPod, start, err) }()
	if err := pm.plugin.SetUpPod(namespace, name, id, annotations, options); err != nil {
		return fmt.Errorf("networkPlugin %s failed to set up pod %q network: %w", pm.plugin.Name(), fullName, err)
	}
	return nil
}

// TearDownPod tears down the pod's network under the pod's lock.
func (pm *PluginManager) TearDownPod(namespace, name string, id ContainerID) (err error) {
	fullName := podFullName(namespace, name)
	l := pm.lock(fullName)
	defer pm.unlock(fullName, l)
	start := time.Now()
	defer func() { pm.metrics.record(OpTearDownPod, start, err) }()
	if err := pm.plugin.TearDownPod(namespace, name, id); err != nil {
		return fmt.Errorf("networkPlugin %s failed to teardown pod %q network: %w", pm.plugin.Name(), fullName, err)
	}
	return nil
}

// GetPodNetworkStatus asks the plugin for the pod's addresses under the pod's lock.
func (pm *PluginManager) GetPodNetworkStatus(namespace, name string, id ContainerID) (status *PodNetworkStatus, err error) {
	fullName := podFullName(namespace, name)
	l := pm.lock(fullName)
	defer pm.unlock(fullName, l)
	start := time.Now()
	defer func() { pm.metrics.record(OpGetPodNetworkStatus, start, err) }()
	status, err = pm.plugin.GetPodNetworkStatus(namespace, name, id)
	if err != nil {
		return nil, fmt.Errorf("networkPlugin %s failed on the status hook for pod %q: %w", pm.plugin.Name(), fullName, err)
	}
	return status, nil
}
