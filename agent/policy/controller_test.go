package policy

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	fakecorev1 "k8s.io/client-go/kubernetes/typed/core/v1/fake"
	fakenetworkingv1 "k8s.io/client-go/kubernetes/typed/networking/v1/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/kubenet-dev/kubenet/agent/loop"
	"github.com/kubenet-dev/kubenet/internal/policyrules"
)

// TestReportRefused: a refused allow list becomes one Event on each policy that selects its pods
// in its direction (not on the others), recorded once while it stays refused and again when it
// comes back; only the kernel's refusals ask for a retry.
func TestReportRefused(t *testing.T) {
	in := testInput()
	in.Policies = []*networkingv1.NetworkPolicy{
		np("a", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "server")}), // ingress of a/server
		np("a", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "server"), PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}}),
		np("a", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "client")}), // another pod
		np("b", networkingv1.NetworkPolicySpec{}),                                   // another namespace
	}
	for i, p := range in.Policies {
		p.Name = fmt.Sprint("p", i)
	}
	tooBig := policyrules.Refusal{Ingress: true, Pods: []string{"a/server"}, Group: "in-x", Cost: 300000, Err: fmt.Errorf("%w: its sets would cost too much", policyrules.ErrTooBig)}
	byKernel := policyrules.Refusal{Ingress: false, Pods: []string{"a/server"}, Group: "out-y", Err: errors.New("netlink receive: cannot allocate memory")}

	events := record.NewFakeRecorder(10)
	c := &Controller{cfg: Config{NodeName: "n1"}, log: slog.New(slog.DiscardHandler), events: events, reported: map[string]bool{}}
	recorded := func() []string {
		var out []string
		for {
			select {
			case e := <-events.Events:
				out = append(out, e)
			default:
				return out
			}
		}
	}
	c.reportRefused(in, []policyrules.Refusal{tooBig})
	got := recorded()
	if len(got) != 1 || !strings.Contains(got[0], EventPolicyRefused) || !strings.Contains(got[0], "ingress allow list of pod a/server") || !strings.Contains(got[0], "n1") {
		t.Fatalf("events %q, want one on p0 for a/server's ingress", got)
	}
	c.reportRefused(in, []policyrules.Refusal{tooBig})
	if got := recorded(); len(got) != 0 {
		t.Errorf("the same refusal again: events %q, want none", got)
	}
	c.reportRefused(in, []policyrules.Refusal{tooBig, byKernel})
	if got := recorded(); len(got) != 1 || !strings.Contains(got[0], "egress allow list") || !strings.Contains(got[0], "cannot allocate memory") {
		t.Errorf("the kernel's refusal of the egress list: events %q, want one (on p1)", got)
	}
	c.reportRefused(in, nil)
	c.reportRefused(in, []policyrules.Refusal{tooBig})
	if got := recorded(); len(got) != 1 {
		t.Errorf("a refusal that came back: events %q, want one", got)
	}
	if kernelRefused([]policyrules.Refusal{tooBig}) || !kernelRefused([]policyrules.Refusal{tooBig, byKernel}) {
		t.Error("kernelRefused: only the kernel's refusals ask for a retry")
	}
	if got := selecting(in.Policies, map[string]*corev1.Pod{}, []string{"a/server"}, true); len(got) != 0 {
		t.Errorf("policies selecting a pod the API does not have: %v", got)
	}
}

// TestControllerChanges: the informers' events reach the compiler as the objects' keys, read
// back from the stores at the pass (all of them at the first); an update that changes nothing
// the compiler reads is not noted; and the resync's check against a full compile finds a
// compiler that missed a change, counts it, and gives the full compile's result.
func TestControllerChanges(t *testing.T) {
	in := testInput()
	in.Policies = []*networkingv1.NetworkPolicy{np("a", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "server"),
		Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: sel("app", "client")}}}}})}
	m, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	c := &Controller{log: slog.New(slog.DiscardHandler), metrics: m, incr: NewIncremental(""), loop: loop.New(loop.Config{})}
	stores := map[objectKind]cache.Store{kindPod: cache.NewStore(cache.MetaNamespaceKeyFunc), kindNamespace: cache.NewStore(cache.MetaNamespaceKeyFunc), kindPolicy: cache.NewStore(cache.MetaNamespaceKeyFunc)}
	c.stores = stores
	add := func(kind objectKind, obj any) {
		t.Helper()
		if err := stores[kind].Add(obj); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range in.Pods {
		add(kindPod, p)
	}
	for _, ns := range in.Namespaces {
		add(kindNamespace, ns)
	}
	for _, np := range in.Policies {
		add(kindPolicy, np)
	}
	// The first pass reads every object, whatever the events said.
	var p Pass
	check := func(want Result, full bool) {
		t.Helper()
		c.sync()
		if got := c.compile(in.Local, nil, full, &p); !reflect.DeepEqual(got, want) {
			t.Fatalf("compiled\n%+v\nwant\n%+v", got, want)
		}
	}
	check(Compile(in), false)
	if !p.Full || p.Compiled != 2 {
		t.Errorf("first pass: full %v, %d compiled; want a full one of both local pods", p.Full, p.Compiled)
	}

	// a/other becomes a client: the server's ingress gains it.
	other := in.Pods[2].DeepCopy()
	other.Labels = map[string]string{"app": "client"}
	other.ResourceVersion = "2"
	c.changedOn(kindPod, in.Pods[2], other)
	if err := stores[kindPod].Update(other); err != nil {
		t.Fatal(err)
	}
	in.Pods[2] = other
	check(Compile(in), false)
	if p.Full || p.Compiled != 1 {
		t.Errorf("a peer relabelled: full %v, %d compiled; want the server only", p.Full, p.Compiled)
	}

	// A status update of the same slim pod, and the informer's resync, are no change.
	same := other.DeepCopy()
	same.ResourceVersion = "3"
	c.changedOn(kindPod, other, same)
	c.changedOn(kindPod, other, other)
	if keys := c.changes.keys[kindPod]; len(keys) != 0 {
		t.Errorf("no change noted as %v", keys)
	}

	// The policy is deleted, but its event is lost: the incremental result keeps it, the check
	// finds the difference and uses the full compile (of the objects the compiler has), with
	// the policy dropped there too.
	if err := stores[kindPolicy].Delete(in.Policies[0]); err != nil {
		t.Fatal(err)
	}
	c.incr.SetPolicy("a/p", nil)
	c.incr.changedPolicies = map[string]*networkingv1.NetworkPolicy{} // the lost event
	in.Policies = nil
	check(Compile(in), true)
	if got := testutil.ToFloat64(m.divergences); got != 1 {
		t.Errorf("divergences %v, want 1", got)
	}
	check(Compile(in), true)
	if got := testutil.ToFloat64(m.divergences); got != 1 {
		t.Errorf("after the full compile: divergences %v, want still 1", got)
	}
}

// TestMinGap: passes that only changes ask for keep the configured gaps (by default
// DefaultMinGap and DefaultBusyGap; a negative one turns it off), and the resync and the first
// pass stay.
func TestMinGap(t *testing.T) {
	for _, tc := range []struct {
		name     string
		set      time.Duration
		setBusy  float64
		want     time.Duration
		wantBusy float64
	}{
		{"default", 0, 0, DefaultMinGap, DefaultBusyGap},
		{"set", 300 * time.Millisecond, 1, 300 * time.Millisecond, 1},
		{"off", -1, -1, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := New(&fakecorev1.FakeCoreV1{Fake: &k8stesting.Fake{}}, &fakenetworkingv1.FakeNetworkingV1{Fake: &k8stesting.Fake{}},
				Config{Network: "kubenet", MinGap: tc.set, BusyGap: tc.setBusy})
			if err != nil {
				t.Fatal(err)
			}
			if cfg := c.loopConfig(); cfg.MinGap != tc.want || cfg.BusyGap != tc.wantBusy || !cfg.AtStart || cfg.Period != DefaultResync {
				t.Errorf("loop: min gap %v, busy gap %v, at start %v, period %v; want %v, %v, true, %v", cfg.MinGap, cfg.BusyGap, cfg.AtStart, cfg.Period, tc.want, tc.wantBusy, DefaultResync)
			}
		})
	}
}

// TestNeedsReadBack: a pass that did not read the sets back and found a group changed by somebody
// else asks for one that does (Controller.Check escalates); one that read them back, or found
// nothing to repair, does not.
func TestNeedsReadBack(t *testing.T) {
	for _, tc := range []struct {
		name string
		pass Pass
		want bool
	}{
		{"check, nothing repaired", Pass{Applied: policyrules.Applied{NewGroups: 3, RemovedGroups: 2}}, false},
		{"check, a group repaired", Pass{Applied: policyrules.Applied{RepairedGroups: 1}}, true},
		{"read-back, a group repaired", Pass{Verified: true, Applied: policyrules.Applied{RepairedGroups: 1}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := needsReadBack(tc.pass); got != tc.want {
				t.Errorf("needsReadBack(%+v) = %v, want %v", tc.pass, got, tc.want)
			}
		})
	}
}

// TestPodIndexers: the pod informer indexes pods by address only for the drop log, which names
// the other end of a drop by it; without the log it keeps no index (memory at 10 000 pods).
func TestPodIndexers(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "n"},
		Status: corev1.PodStatus{PodIP: "10.0.0.5", PodIPs: []corev1.PodIP{{IP: "10.0.0.5"}, {IP: "fd00::5"}}}}
	for _, tc := range []struct {
		name    string
		dropLog policyrules.DropLog
		want    []string // the index names
	}{
		{"drop log off", policyrules.DropLog{}, nil},
		{"drop log on", policyrules.DropLog{Group: 2700}, []string{podIPIndex}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			idx := podIndexers(tc.dropLog)
			if err := informer(&corev1.Pod{}, nil, nil).AddIndexers(idx); err != nil {
				t.Fatalf("the pod informer takes no indexes %v: %v", idx, err)
			}
			if got := slices.Sorted(maps.Keys(idx)); !slices.Equal(got, tc.want) {
				t.Fatalf("indexes %v, want %v", got, tc.want)
			}
			if f, ok := idx[podIPIndex]; ok {
				if keys, err := f(pod); err != nil || !slices.Equal(keys, []string{"10.0.0.5", "fd00::5"}) {
					t.Errorf("pod indexed by %v (%v), want its two addresses", keys, err)
				}
			}
		})
	}
}
