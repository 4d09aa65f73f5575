package bench

import (
	"net/netip"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/kubenet-dev/kubenet/agent/policy"
	"github.com/kubenet-dev/kubenet/internal/policyrules"
	"github.com/kubenet-dev/kubenet/netpol"
	"github.com/kubenet-dev/kubenet/test/nettest"
	"github.com/kubenet-dev/kubenet/test/testkit"
)

// scaleRig is the control-plane workload (testkit.ScaleLarge) in the incremental compiler, and
// a network namespace whose policy tables its passes write, as the agent's do (one Applier kept
// from pass to pass).
type scaleRig struct {
	size    testkit.ScaleSize
	x       *policy.Incremental
	local   []policy.Local
	cidrs   []netip.Prefix
	node    ns.NetNS
	applier *netpol.Applier
}

func newScaleRig(b *testing.B) *scaleRig {
	r := &scaleRig{size: testkit.ScaleLarge, node: nettest.NewNS(b), x: policy.NewIncremental("node-1"),
		cidrs: []netip.Prefix{netip.MustParsePrefix("10.128.0.0/24")}, applier: netpol.NewApplier()}
	for k := range r.size.Namespaces {
		ns := r.size.Namespace(k)
		r.x.SetNamespace(ns.Name, ns)
	}
	for i := range r.size.Pods {
		p := r.size.RunningPod(i, "node-2")
		if i < r.size.Local {
			p = r.size.Pod(i, "node-1")
			r.local = append(r.local, policy.Local{Port: 100 + i, Namespace: p.Namespace, Name: p.Name, IPs: []netip.Addr{r.size.LocalAddr(i)}})
		}
		r.x.SetPod(p.Namespace+"/"+p.Name, p)
	}
	for j := range r.size.Policies {
		np := r.size.Policy(j, 8000+j)
		r.x.SetPolicy(np.Namespace+"/"+np.Name, np)
	}
	return r
}

// pass compiles what changed and applies it, and times both.
func (r *scaleRig) pass(b *testing.B) (compile, apply time.Duration, res policyrules.Applied) {
	t0 := time.Now()
	rs := r.x.Compile(r.local, r.cidrs).Ruleset
	rs.PodCIDRs = r.cidrs
	t1 := time.Now()
	nettest.Do(b, r.node, func() (err error) { res, err = r.applier.Apply("scale", rs, netpol.Options{}); return err })
	return t1.Sub(t0), time.Since(t1), res
}

// relabel gives remote pod i (not a local one) the label app.
func (r *scaleRig) relabel(i int, app string) {
	p := r.size.RunningPod(i, "node-2")
	p.Labels = map[string]string{"app": app}
	r.x.SetPod(p.Namespace+"/"+p.Name, p)
}

// millis is d in milliseconds.
func millis(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// passTotals sums what the timed passes did, for the per-op metrics.
type passTotals struct {
	ops             int
	compile, apply  time.Duration
	rebuilt, edited int
}

func (t *passTotals) add(compile, apply time.Duration, res policyrules.Applied) {
	t.ops++
	t.compile, t.apply = t.compile+compile, t.apply+apply
	t.rebuilt, t.edited = t.rebuilt+res.NewGroups, t.edited+res.EditedGroups
}

func (t passTotals) report(b *testing.B) {
	n := float64(t.ops)
	b.ReportMetric(millis(t.compile)/n, "compile-ms/op")
	b.ReportMetric(millis(t.apply)/n, "apply-ms/op")
	b.ReportMetric(float64(t.rebuilt)/n, "new-groups/op")
	b.ReportMetric(float64(t.edited)/n, "edited-groups/op")
	if t.rebuilt+t.edited == 0 {
		b.Fatal("no pass built or edited a group: the relabels changed no local pod's list")
	}
}

// BenchmarkPolicyPassScale is the agent's policy pass in process, at issue 27's size
// (testkit.ScaleLarge: 10 000 pods, 2 000 policies, 500 namespaces, 100 of the pods local),
// without the API server: the incremental compile and netpol.Apply into a network namespace of
// its own. Each op relabels one remote pod in or out of the ingress peers of a third of the
// local pods (what BenchmarkNetworkPolicyScale's pod changes do) and runs one pass. It tells the
// compile's share of a pass from the kernel's, and takes a CPU profile where the end-to-end
// benchmark cannot:
//
//	go test -run '^$' -bench PolicyPassScale -benchtime 20x -cpuprofile /tmp/pass.prof ./bench/
func BenchmarkPolicyPassScale(b *testing.B) {
	r := newScaleRig(b)
	compile, apply, res := r.pass(b)
	// Reported after the loop: its start (b.Loop's ResetTimer) deletes the metrics reported
	// before it.
	once := map[string]float64{"first-compile-ms": millis(compile), "first-apply-ms": millis(apply)}
	b.Logf("first pass: %d groups, compile %s, apply %s", res.Groups, compile, apply)

	// A restart finds the tables as the last run left them: the pass that follows compiles
	// everything again and either reads every set back (verify) or trusts the kernel's names.
	rs := r.x.Compile(r.local, r.cidrs).Ruleset
	rs.PodCIDRs = r.cidrs
	for _, verify := range []bool{true, false} {
		t0 := time.Now()
		nettest.Do(b, r.node, func() (err error) { res, err = netpol.Apply("scale", rs, netpol.Options{Verify: verify}); return err })
		if res.Changed() {
			b.Fatalf("the pass after the first (verify %v) changed the tables: %+v", verify, res)
		}
		metric := "again-apply-ms"
		if verify {
			metric = "again-verify-apply-ms"
		}
		once[metric] = millis(time.Since(t0))
	}

	// A remote pod of a team=t0 namespace, app=a5, relabelled app=a1 (the ingress peers of local
	// pod 0's policy and of every local pod of a t0 namespace) and back.
	remote := r.size.Namespaces * 5
	apps := []string{"a1", r.size.Pod(remote, "").Labels["app"]}
	var t passTotals
	for b.Loop() {
		r.relabel(remote, apps[t.ops%2])
		t.add(r.pass(b))
	}
	t.report(b)
	for metric, v := range once {
		b.ReportMetric(v, metric)
	}
}

// BenchmarkPolicyPassScaleChurn: each op is one pass after churnPerPass remote pods moved
// between the local pods' ingress peers, their egress peers and no peers (what
// BenchmarkNetworkPolicyScale's churn of 50 changes a second gathers into a pass of about 1.3 s):
// every local pod's lists change.
//
//	go test -run '^$' -bench PolicyPassScaleChurn -benchtime 10x -cpuprofile /tmp/churn.prof ./bench/
func BenchmarkPolicyPassScaleChurn(b *testing.B) {
	const churnPerPass = 65
	r := newScaleRig(b)
	r.pass(b)
	var t passTotals
	c := 0
	for b.Loop() {
		for range churnPerPass {
			r.relabel(r.size.Local+c*7919%(r.size.Pods-r.size.Local), []string{"a1", "a2", "a7"}[c%3])
			c++
		}
		t.add(r.pass(b))
	}
	t.report(b)
}
