package policy

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/kubenet-dev/kubenet/test/testkit"
)

// scaleInput is the control-plane workload of test/agent's BenchmarkNetworkPolicyScale
// (testkit.ScaleCluster) as Compile's input: size.Local of its pods on this node, attached.
func scaleInput(size testkit.ScaleSize) Input {
	in := Input{NodeName: "node-1", LocalCIDRs: []netip.Prefix{netip.MustParsePrefix("10.128.0.0/24")}}
	for k := range size.Namespaces {
		in.Namespaces = append(in.Namespaces, size.Namespace(k))
	}
	for i := range size.Pods {
		p := size.RunningPod(i, "node-2")
		if i < size.Local {
			p = size.Pod(i, "node-1")
			in.Local = append(in.Local, Local{Port: 100 + i, Namespace: p.Namespace, Name: p.Name, IPs: []netip.Addr{size.LocalAddr(i)}})
		}
		in.Pods = append(in.Pods, p)
	}
	for j := range size.Policies {
		in.Policies = append(in.Policies, size.Policy(j, 8000+j))
	}
	return in
}

var scaleSizes = []testkit.ScaleSize{testkit.ScaleSmall, testkit.ScaleLarge}

// BenchmarkCompileScale: a full Compile of the control-plane workload.
//
//	go test -run '^$' -bench CompileScale ./agent/policy/
func BenchmarkCompileScale(b *testing.B) {
	for _, size := range scaleSizes {
		in := scaleInput(size)
		b.Run(size.String(), func(b *testing.B) {
			for b.Loop() {
				if res := Compile(in); res.Isolated != size.Local {
					b.Fatalf("%d local pods isolated, want %d", res.Isolated, size.Local)
				}
			}
		})
	}
}

// BenchmarkIncrementalScale: one remote pod relabelled in and out of the peers of the local pods'
// policies, compiled incrementally, in the control-plane workload.
func BenchmarkIncrementalScale(b *testing.B) {
	for _, size := range scaleSizes {
		in := scaleInput(size)
		b.Run(size.String(), func(b *testing.B) {
			x := NewIncremental(in.NodeName)
			for _, p := range in.Pods {
				x.SetPod(p.Namespace+"/"+p.Name, p)
			}
			for _, ns := range in.Namespaces {
				x.SetNamespace(ns.Name, ns)
			}
			for _, np := range in.Policies {
				x.SetPolicy(np.Namespace+"/"+np.Name, np)
			}
			start := time.Now()
			x.Compile(in.Local, in.LocalCIDRs)
			b.ReportMetric(float64(time.Since(start).Microseconds())/1000, "first-ms")
			remote := in.Pods[len(in.Pods)-1]
			flip := 0
			for b.Loop() {
				p := remote.DeepCopy()
				p.Labels = map[string]string{"app": fmt.Sprintf("a%d", 1+flip%2)} // the local pods' ingress and egress peers
				flip++
				x.SetPod(p.Namespace+"/"+p.Name, p)
				x.Compile(in.Local, in.LocalCIDRs)
			}
			b.ReportMetric(float64(x.Compiled()), "compiled/op")
		})
	}
}

// TestScaleInput: the workload is what the benchmarks say it is: every local pod isolated both
// ways, with ingress and egress peers.
func TestScaleInput(t *testing.T) {
	res := Compile(scaleInput(testkit.ScaleSmall))
	if res.Isolated != testkit.ScaleSmall.Local || len(res.Unknown) > 0 {
		t.Fatalf("%d isolated, %d unknown of %d local pods", res.Isolated, len(res.Unknown), testkit.ScaleSmall.Local)
	}
	for _, p := range res.Ruleset.Pods {
		if len(p.Ingress.Allow) == 0 || len(p.Egress.Allow) == 0 {
			t.Errorf("%s: %d ingress and %d egress entries, want some of each", p.Name, len(p.Ingress.Allow), len(p.Egress.Allow))
		}
	}
}
