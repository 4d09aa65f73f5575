package network

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// fakePlugin records Init calls and, in SetUpPod, how many calls run at once per pod and overall.
type fakePlugin struct {
	name    string
	initErr error
	setUp   func(pod string) error

	mu       sync.Mutex
	inits    int
	active   map[string]int
	maxPod   map[string]int
	total    int
	maxTotal int
}

func newFake(name string) *fakePlugin {
	return &fakePlugin{name: name, active: map[string]int{}, maxPod: map[string]int{}}
}

func (f *fakePlugin) Init(Host, HairpinMode, string, int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.inits++
	return f.initErr
}
func (f *fakePlugin) Event(string, map[string]interface{}) {}
func (f *fakePlugin) Name() string                         { return f.name }
func (f *fakePlugin) Capabilities() Capabilities           { return NewCapabilities() }
func (f *fakePlugin) Status() error                        { return nil }
func (f *fakePlugin) TearDownPod(ns, name string, _ ContainerID) error {
	return f.SetUpPod(ns, name, ContainerID{}, nil, nil)
}
func (f *fakePlugin) GetPodNetworkStatus(string, string, ContainerID) (*PodNetworkStatus, error) {
	return nil, nil
}

func (f *fakePlugin) SetUpPod(ns, name string, _ ContainerID, _, _ map[string]string) error {
	pod := ns + "/" + name
	f.mu.Lock()
	f.active[pod]++
	f.total++
	f.maxPod[pod] = max(f.maxPod[pod], f.active[pod])
	f.maxTotal = max(f.maxTotal, f.total)
	f.mu.Unlock()
	var err error
	if f.setUp != nil {
		err = f.setUp(pod)
	}
	f.mu.Lock()
	f.active[pod]--
	f.total--
	f.mu.Unlock()
	return err
}

func TestInitNetworkPlugin(t *testing.T) {
	failing := newFake("failing")
	failing.initErr = errors.New("boom")
	cases := []struct {
		name    string
		plugins []NetworkPlugin
		select_ string
		want    string // plugin name chosen
		wantErr string
		inits   map[*fakePlugin]int
	}{
		{name: "empty name gives no-op", plugins: []NetworkPlugin{newFake("kubenet")}, select_: "", want: DefaultPluginName},
		{name: "no-op by its name", select_: DefaultPluginName, want: DefaultPluginName},
		{name: "by name", plugins: []NetworkPlugin{newFake("kubenet"), newFake("cni")}, select_: "cni", want: "cni"},
		{name: "unknown", plugins: []NetworkPlugin{newFake("kubenet")}, select_: "x", wantErr: `network plugin "x" not found`},
		{name: "duplicate", plugins: []NetworkPlugin{newFake("cni"), newFake("cni")}, select_: "cni", wantErr: `network plugin "cni" was registered more than once`},
		{name: "duplicate of another plugin still fails", plugins: []NetworkPlugin{newFake("kubenet"), newFake("cni"), newFake("cni")}, select_: "kubenet", wantErr: "registered more than once"},
		{name: "invalid name", plugins: []NetworkPlugin{newFake("bad name!")}, select_: "bad name!", wantErr: `invalid name "bad name!"`},
		{name: "qualified name with prefix", plugins: []NetworkPlugin{newFake("example.com/net")}, select_: "example.com/net", want: "example.com/net"},
		{name: "init error", plugins: []NetworkPlugin{failing}, select_: "failing", wantErr: `network plugin "failing" failed init: boom`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := InitNetworkPlugin(c.plugins, c.select_, nil, HairpinVeth, "10.0.0.0/8", UseDefaultMTU)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, c.wantErr)
				}
				if got != nil {
					t.Errorf("got plugin %q together with an error", got.Name())
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.Name() != c.want {
				t.Fatalf("chose %q, want %q", got.Name(), c.want)
			}
			// Only the chosen plugin is initialised, exactly once.
			for _, p := range c.plugins {
				f := p.(*fakePlugin)
				want := 0
				if NetworkPlugin(f) == got {
					want = 1
				}
				if f.inits != want {
					t.Errorf("plugin %q Init called %d times, want %d", f.name, f.inits, want)
				}
			}
		})
	}
}

func TestNoopPlugin(t *testing.T) {
	p, err := InitNetworkPlugin(nil, "", nil, "", "", 0)
	if err != nil {
		t.Fatal(err)
	}
	st, err := p.GetPodNetworkStatus("ns", "pod", ContainerID{})
	if st != nil || err != nil {
		t.Errorf("no-op status = %v, %v; want nil, nil (the shim asks the runtime)", st, err)
	}
	if p.Status() != nil || p.SetUpPod("ns", "pod", ContainerID{}, nil, nil) != nil || p.TearDownPod("ns", "pod", ContainerID{}) != nil {
		t.Error("no-op plugin failed an operation")
	}
}

// TestPluginManagerLocksPerPod runs several calls for each of several pods at once. The fake
// holds each call until calls of every pod are inside at the same time (or a bound passes), so a
// manager that serialized all pods would show overall concurrency 1, and one that did not lock per
// pod would show per-pod concurrency above 1.
func TestPluginManagerLocksPerPod(t *testing.T) {
	const pods, callsPerPod = 4, 5
	f := newFake("fake")
	allIn := make(chan struct{})
	var once sync.Once
	f.setUp = func(string) error {
		f.mu.Lock()
		if f.total == pods {
			once.Do(func() { close(allIn) })
		}
		f.mu.Unlock()
		select {
		case <-allIn:
		case <-time.After(5 * time.Second):
		}
		return nil
	}
	pm, err := NewPluginManager(f, nil)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for p := range pods {
		for c := range callsPerPod {
			wg.Add(1)
			go func() {
				defer wg.Done()
				name := fmt.Sprintf("pod-%d", p)
				var err error
				if c%2 == 0 {
					err = pm.SetUpPod("default", name, ContainerID{ID: name}, nil, nil)
				} else {
					err = pm.TearDownPod("default", name, ContainerID{ID: name})
				}
				if err != nil {
					t.Error(err)
				}
			}()
		}
	}
	wg.Wait()
	for pod, n := range f.maxPod {
		if n != 1 {
			t.Errorf("pod %s had %d calls in the plugin at once, want 1", pod, n)
		}
	}
	if f.maxTotal != pods {
		t.Errorf("at most %d calls ran at once across pods, want %d (one per pod)", f.maxTotal, pods)
	}
	if n := pm.inUse(); n != 0 {
		t.Errorf("%d pod lock entries left after all calls returned, want 0", n)
	}
}

func TestPluginManagerErrorsAndMetrics(t *testing.T) {
	f := newFake("fake")
	f.setUp = func(pod string) error {
		if pod == "default/bad" {
			return errors.New("no addresses left")
		}
		return nil
	}
	reg := prometheus.NewRegistry()
	pm, err := NewPluginManager(f, reg)
	if err != nil {
		t.Fatal(err)
	}
	if err := pm.SetUpPod("default", "good", ContainerID{ID: "1"}, nil, nil); err != nil {
		t.Fatal(err)
	}
	err = pm.SetUpPod("default", "bad", ContainerID{ID: "2"}, nil, nil)
	if want := `networkPlugin fake failed to set up pod "bad_default" network: no addresses left`; err == nil || err.Error() != want {
		t.Errorf("error %v, want %q", err, want)
	}
	err = pm.TearDownPod("default", "bad", ContainerID{ID: "2"})
	if want := `networkPlugin fake failed to teardown pod "bad_default" network: no addresses left`; err == nil || err.Error() != want {
		t.Errorf("error %v, want %q", err, want)
	}
	if _, err := pm.GetPodNetworkStatus("default", "good", ContainerID{ID: "1"}); err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct {
		metric, op string
		want       float64
	}{
		{"kubelet_network_plugin_operations_total", OpSetUpPod, 2},
		{"kubelet_network_plugin_operations_errors_total", OpSetUpPod, 1},
		{"kubelet_network_plugin_operations_total", OpTearDownPod, 1},
		{"kubelet_network_plugin_operations_errors_total", OpTearDownPod, 1},
		{"kubelet_network_plugin_operations_total", OpGetPodNetworkStatus, 1},
	} {
		var got float64
		switch c.metric {
		case "kubelet_network_plugin_operations_total":
			got = testutil.ToFloat64(pm.metrics.operations.WithLabelValues(c.op))
		default:
			got = testutil.ToFloat64(pm.metrics.errors.WithLabelValues(c.op))
		}
		if got != c.want {
			t.Errorf("%s{operation_type=%q} = %v, want %v", c.metric, c.op, got, c.want)
		}
	}
	// The histogram is registered under kubelet's name and observed once per operation.
	if n, err := testutil.GatherAndCount(reg, "kubelet_network_plugin_operations_duration_seconds"); err != nil || n != 3 {
		t.Errorf("duration histogram series: %d, %v; want 3 (one per operation type)", n, err)
	}
	// A second manager on the same registry is refused rather than silently sharing counters.
	if _, err := NewPluginManager(f, reg); err == nil {
		t.Error("second registration on one registry succeeded")
	}
}

func TestEscapePluginName(t *testing.T) {
	for _, c := range []struct{ name, escaped string }{
		{"kubenet", "kubenet"},
		{"kubernetes.io/no-op", "kubernetes.io~no-op"},
		{"vendor.example/a/b", "vendor.example~a~b"},
	} {
		if got := EscapePluginName(c.name); got != c.escaped {
			t.Errorf("EscapePluginName(%q) = %q, want %q", c.name, got, c.escaped)
		}
		if got := UnescapePluginName(c.escaped); got != c.name {
			t.Errorf("UnescapePluginName(%q) = %q, want %q", c.escaped, got, c.name)
		}
	}
}

func TestNoopPortMappingGetter(t *testing.T) {
	var g PortMappingGetter = NoopPortMappingGetter{}
	if pms, err := g.GetPodPortMappings("any"); pms != nil || err != nil {
		t.Errorf("GetPodPortMappings = %v, %v; want nil, nil", pms, err)
	}
}

func TestHostPorts(t *testing.T) {
	got := HostPorts([]*PortMapping{nil, {HostPort: 0, ContainerPort: 80}, {HostPort: 8080, ContainerPort: 80, Protocol: "UDP"}, {HostPort: -1, ContainerPort: 1}})
	if len(got) != 1 || got[0] != (PortMapping{HostPort: 8080, ContainerPort: 80, Protocol: "UDP"}) {
		t.Errorf("HostPorts = %+v, want only the 8080 mapping, untouched", got)
	}
}
