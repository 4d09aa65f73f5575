package policy

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kubenet-dev/kubenet/internal/policyrules"
	"github.com/kubenet-dev/kubenet/test/testkit"
)

// subtractOneByOne removes the cuts from r one after the other, splitting every piece each cut
// touches: the obvious construction, in the number of cuts squared, which subtract must agree
// with piece for piece.
func subtractOneByOne(r policyrules.Range, cuts []policyrules.Range) []policyrules.Range {
	out := []policyrules.Range{r}
	for _, cut := range cuts {
		var next []policyrules.Range
		for _, r := range out {
			if cut.Last.Compare(r.First) < 0 || cut.First.Compare(r.Last) > 0 {
				next = append(next, r)
				continue
			}
			if cut.First.Compare(r.First) > 0 {
				next = append(next, policyrules.Range{First: r.First, Last: cut.First.Prev()})
			}
			if cut.Last.Compare(r.Last) < 0 {
				next = append(next, policyrules.Range{First: cut.Last.Next(), Last: r.Last})
			}
		}
		out = next
	}
	return out
}

// TestSubtractAgainstOneByOne: on random blocks and exceptions (overlapping, touching, outside
// the block, covering it, at the ends of the address space) subtract gives the pieces of the
// one-by-one construction, in the same order.
func TestSubtractAgainstOneByOne(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	prefix := func(is6 bool, minBits int) netip.Prefix {
		if is6 {
			a := [16]byte{0xff, 0xff, 15: byte(rng.IntN(256))}
			if rng.IntN(2) == 0 {
				a[0], a[1] = 0, 0
			}
			return netip.PrefixFrom(netip.AddrFrom16(a), 120+rng.IntN(9)).Masked()
		}
		a := [4]byte{byte(rng.IntN(2) * 255), 255, 255, byte(rng.IntN(256))}
		return netip.PrefixFrom(netip.AddrFrom4(a), max(minBits, 24+rng.IntN(9))).Masked()
	}
	for i := range 3000 {
		is6 := i%2 == 1
		block := policyrules.PrefixRange(prefix(is6, 0))
		if i%7 == 0 {
			block = allIPv4
			if is6 {
				block = allIPv6
			}
		}
		var cuts []policyrules.Range
		for range rng.IntN(12) {
			cuts = append(cuts, policyrules.PrefixRange(prefix(is6, 0)))
		}
		want := subtractOneByOne(block, cuts)
		if got := subtract([]policyrules.Range{block}, cuts); !slices.Equal(got, want) {
			t.Fatalf("%s minus %v:\nsubtract    %v\none by one  %v", block, cuts, got, want)
		}
	}
}

// TestBlockWithManyExceptions: a /8 with 100 000 exceptions is cut into the right pieces (one
// exception after the other, that took minutes; BenchmarkCompile shows the cost per entry).
func TestBlockWithManyExceptions(t *testing.T) {
	block := &networkingv1.IPBlock{CIDR: "20.0.0.0/8"}
	for i := range 100000 { // the first and third /26 of 50 000 /24s
		j := i / 2
		block.Except = append(block.Except, fmt.Sprintf("20.%d.%d.%d/26", j/256, j%256, 128*(i%2)))
	}
	got := blockRanges(block)
	if len(got) != 100000 || got[0] != policyrules.PrefixRange(netip.MustParsePrefix("20.0.0.64/26")) ||
		got[len(got)-1] != (policyrules.Range{First: netip.MustParseAddr("20.195.79.192"), Last: netip.MustParseAddr("20.255.255.255")}) {
		t.Errorf("%d pieces, from %s to %s; want the second and fourth /26 of each /24 cut, then the rest of the /8", len(got), got[0], got[len(got)-1])
	}
}

// bigPolicyInput is the test cluster with one more policy: ingress to a/server from n ipBlock
// peers on TCP 8080 and 443 (and from a/client).
func bigPolicyInput(n int) Input {
	in := testInput()
	peers := append(testkit.IPBlockPeers(n, 1), networkingv1.NetworkPolicyPeer{PodSelector: sel("app", "client")})
	in.Policies = append(in.Policies, np("a", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "server"),
		Ingress: []networkingv1.NetworkPolicyIngressRule{{From: peers, Ports: []networkingv1.NetworkPolicyPort{
			port(corev1.ProtocolTCP, intstr.FromInt32(8080)), port(corev1.ProtocolTCP, intstr.FromInt32(443))}}}}))
	return in
}

// TestCompileStopsPastTheLimit: a rule whose peers times ports are far more entries than
// policyrules.MaxAllowEntries yields exactly one more than it (so that the kernel side refuses
// the direction whole) and stops there, instead of expanding them all.
func TestCompileStopsPastTheLimit(t *testing.T) {
	in := bigPolicyInput(4000)
	var ports []networkingv1.NetworkPolicyPort
	for p := range 1000 { // 4001 peers × 1000 ports: 4 million entries
		ports = append(ports, port(corev1.ProtocolTCP, intstr.FromInt32(int32(1000+p))))
	}
	in.Policies[0].Spec.Ingress[0].Ports = ports
	in.Policies[0].Spec.Egress = []networkingv1.NetworkPolicyEgressRule{{To: in.Policies[0].Spec.Ingress[0].From[:10]}}
	in.Policies[0].Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}
	res := Compile(in)
	server := res.Ruleset.Pods[0]
	if n := len(server.Ingress.Allow); n != policyrules.MaxAllowEntries+1 {
		t.Errorf("ingress of a/server: %d entries, want %d", n, policyrules.MaxAllowEntries+1)
	}
	if n := len(server.Egress.Allow); n == 0 || n > 20 {
		t.Errorf("egress of a/server: %d entries, want its ten blocks' pieces", n)
	}
}

// BenchmarkCompile: the compiler with one policy of n ipBlock peers (testkit.IPBlockPeers:
// mixed sizes, some with exceptions) on two ports, selecting the local server.
//
//	go test -run '^$' -bench Compile ./agent/policy/
func BenchmarkCompile(b *testing.B) {
	for _, n := range []int{100, 1000, 10000, 50000} {
		in := bigPolicyInput(n)
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			for b.Loop() {
				if res := Compile(in); len(res.Ruleset.Pods[0].Ingress.Allow) < n {
					b.Fatal("the server's ingress is missing entries")
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/entry")
		})
	}
}

// TestCompileSharesRules: a rule that is the same for every pod a policy selects is expanded once
// and every selected pod gets all of it; an ingress rule with a named port stays each pod's own
// (a/server has the port "http", a/client none).
func TestCompileSharesRules(t *testing.T) {
	in := testInput()
	blocks := testkit.IPBlockPeers(300, 2)
	in.Policies = []*networkingv1.NetworkPolicy{np("a", networkingv1.NetworkPolicySpec{
		PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
		Ingress: []networkingv1.NetworkPolicyIngressRule{
			{From: blocks, Ports: []networkingv1.NetworkPolicyPort{port(corev1.ProtocolTCP, intstr.FromInt32(443))}},
			{From: blocks[:1], Ports: []networkingv1.NetworkPolicyPort{port("", intstr.FromString("http"))}},
		},
		Egress: []networkingv1.NetworkPolicyEgressRule{{To: blocks}},
	})}
	pods := Compile(in).Ruleset.Pods
	if len(pods) != 2 {
		t.Fatalf("%d local pods, want 2", len(pods))
	}
	server, client := pods[0], pods[1]
	named := func(allow []policyrules.Entry) int {
		return len(slices.DeleteFunc(slices.Clone(allow), func(e policyrules.Entry) bool { return e.Ports == nil || e.Ports.First != 8080 }))
	}
	if n := named(server.Ingress.Allow); n == 0 {
		t.Error("a/server's ingress lacks its named port http (8080)")
	}
	if n := named(client.Ingress.Allow); n != 0 {
		t.Errorf("a/client's ingress has %d entries on a/server's named port", n)
	}
	if len(client.Ingress.Allow) < 300 || !slices.Equal(server.Egress.Allow, client.Egress.Allow) || len(server.Egress.Allow) < 300 {
		t.Errorf("shared rules: client ingress %d entries, egress %d and %d; want the 300 blocks each", len(client.Ingress.Allow), len(server.Egress.Allow), len(client.Egress.Allow))
	}
}
