package bench

import (
	"net/netip"
	"testing"
	"time"

	"github.com/kubenet-dev/kubenet/agent/policy"
	"github.com/kubenet-dev/kubenet/internal/policyrules"
	"github.com/kubenet-dev/kubenet/netpol"
	"github.com/kubenet-dev/kubenet/test/nettest"
	"github.com/kubenet-dev/kubenet/test/testkit"
)

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
	size := testkit.ScaleLarge
	n := nettest.NewNS(b)
	x := policy.NewIncremental("node-1")
	var local []policy.Local
	cidrs := []netip.Prefix{netip.MustParsePrefix("10.128.0.0/24")}
	for k := range size.Namespaces {
		ns := size.Namespace(k)
		x.SetNamespace(ns.Name, ns)
	}
	for i := range size.Pods {
		p := size.RunningPod(i, "node-2")
		if i < size.Local {
			p = size.Pod(i, "node-1")
			local = append(local, policy.Local{Port: 100 + i, Namespace: p.Namespace, Name: p.Name, IPs: []netip.Addr{size.LocalAddr(i)}})
		}
		x.SetPod(p.Namespace+"/"+p.Name, p)
	}
	for j := range size.Policies {
		np := size.Policy(j, 8000+j)
		x.SetPolicy(np.Namespace+"/"+np.Name, np)
	}
	applier := netpol.NewApplier() // as the agent keeps one
	pass := func() (compile, apply time.Duration, res policyrules.Applied) {
		t0 := time.Now()
		rs := x.Compile(local, cidrs).Ruleset
		rs.PodCIDRs = cidrs
		t1 := time.Now()
		nettest.Do(b, n, func() (err error) { res, err = applier.Apply("scale", rs, netpol.Options{}); return err })
		return t1.Sub(t0), time.Since(t1), res
	}
	compile, apply, res := pass()
	// Reported after the loop: its start (b.Loop's ResetTimer) deletes the metrics reported
	// before it.
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	once := map[string]float64{"first-compile-ms": ms(compile), "first-apply-ms": ms(apply)}
	b.Logf("first pass: %d groups, compile %s, apply %s", res.Groups, compile, apply)

	// A restart finds the tables as the last run left them: the pass that follows compiles
	// everything again and either reads every set back (verify) or trusts the kernel's names.
	rs := x.Compile(local, cidrs).Ruleset
	rs.PodCIDRs = cidrs
	for _, verify := range []bool{true, false} {
		t0 := time.Now()
		nettest.Do(b, n, func() (err error) { res, err = netpol.Apply("scale", rs, netpol.Options{Verify: verify}); return err })
		if res.Changed() {
			b.Fatalf("the pass after the first (verify %v) changed the tables: %+v", verify, res)
		}
		metric := "again-apply-ms"
		if verify {
			metric = "again-verify-apply-ms"
		}
		once[metric] = ms(time.Since(t0))
	}

	// A remote pod of a team=t0 namespace, app=a5, relabelled app=a1 (the ingress peers of local
	// pod 0's policy and of every local pod of a t0 namespace) and back.
	remote := size.RunningPod(size.Namespaces*5, "node-2")
	apps := []string{"a1", remote.Labels["app"]}
	var compiles, applies time.Duration
	var rebuilt, edited int
	flip := 0
	for b.Loop() {
		p := remote.DeepCopy()
		p.Labels = map[string]string{"app": apps[flip%2]}
		flip++
		x.SetPod(p.Namespace+"/"+p.Name, p)
		c, a, r := pass()
		compiles, applies = compiles+c, applies+a
		rebuilt += r.NewGroups
		edited += r.EditedGroups
	}
	b.ReportMetric(float64(compiles.Microseconds())/1000/float64(flip), "compile-ms/op")
	b.ReportMetric(float64(applies.Microseconds())/1000/float64(flip), "apply-ms/op")
	b.ReportMetric(float64(rebuilt)/float64(flip), "new-groups/op")
	b.ReportMetric(float64(edited)/float64(flip), "edited-groups/op")
	for metric, v := range once {
		b.ReportMetric(v, metric)
	}
	if rebuilt+edited == 0 {
		b.Fatalf("no pass built or edited a group: the relabel of %s changed no local pod's list", remote.Name)
	}
}
