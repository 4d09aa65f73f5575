package policy

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// churn is a small random cluster that changes one object at a time, as informers see it: a
// changed object is a new one (the old one stays as it was).
type churn struct {
	rng        *rand.Rand
	pods       map[string]*corev1.Pod
	namespaces map[string]*corev1.Namespace
	policies   map[string]*networkingv1.NetworkPolicy
	local      []Local
	cidrs      []netip.Prefix
	x          *Incremental
}

const churnNode = "node-1"

func (ch *churn) pick(options ...string) string { return options[ch.rng.IntN(len(options))] }

func (ch *churn) labels() map[string]string {
	l := map[string]string{}
	if ch.rng.IntN(5) > 0 {
		l["app"] = ch.pick("a", "b", "c")
	}
	if ch.rng.IntN(2) == 0 {
		l["tier"] = ch.pick("1", "2")
	}
	return l
}

func (ch *churn) selector() *metav1.LabelSelector {
	switch ch.rng.IntN(8) {
	case 0:
		return &metav1.LabelSelector{}
	case 1:
		return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "tier", Operator: metav1.LabelSelectorOpIn, Values: []string{ch.pick("1", "2")}}}}
	case 2:
		return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: metav1.LabelSelectorOpDoesNotExist}}}
	case 3:
		if ch.rng.IntN(4) == 0 { // does not parse
			return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: "Bogus"}}}
		}
	}
	return &metav1.LabelSelector{MatchLabels: map[string]string{"app": ch.pick("a", "b", "c")}}
}

func (ch *churn) nsSelector() *metav1.LabelSelector {
	if ch.rng.IntN(4) == 0 {
		return &metav1.LabelSelector{}
	}
	return &metav1.LabelSelector{MatchLabels: map[string]string{"team": ch.pick("x", "y", "z")}}
}

func (ch *churn) addr(i int, v6 bool) string {
	if v6 {
		return fmt.Sprintf("fd00::%x", i)
	}
	return fmt.Sprintf("10.0.%d.%d", i%3, i)
}

// pod is a new random version of the pod ns/name.
func (ch *churn) pod(ns, name string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: ch.labels(), ResourceVersion: fmt.Sprint(ch.rng.Int())},
		Spec:   corev1.PodSpec{NodeName: ch.pick(churnNode, "node-2", "node-3")},
		Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	switch ch.rng.IntN(12) {
	case 0:
		p.Status.Phase = corev1.PodSucceeded
	case 1:
		p.Status.Phase = corev1.PodFailed
	case 2:
		p.Spec.HostNetwork = true
	}
	for range ch.rng.IntN(3) {
		p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ch.addr(ch.rng.IntN(40), ch.rng.IntN(3) == 0)})
	}
	var ports []corev1.ContainerPort
	for range ch.rng.IntN(3) {
		cp := corev1.ContainerPort{Name: ch.pick("http", "dns", ""), ContainerPort: int32(ch.pick2(80, 8080, 53))}
		if ch.rng.IntN(3) == 0 {
			cp.Protocol = corev1.ProtocolUDP
		}
		ports = append(ports, cp)
	}
	p.Spec.Containers = []corev1.Container{{Name: "c", Ports: ports}}
	return p
}

func (ch *churn) pick2(options ...int) int { return options[ch.rng.IntN(len(options))] }

func (ch *churn) peers() []networkingv1.NetworkPolicyPeer {
	var out []networkingv1.NetworkPolicyPeer
	for range ch.rng.IntN(3) {
		var p networkingv1.NetworkPolicyPeer
		switch ch.rng.IntN(5) {
		case 0:
			p.PodSelector = ch.selector()
		case 1:
			p.NamespaceSelector = ch.nsSelector()
		case 2:
			p.PodSelector, p.NamespaceSelector = ch.selector(), ch.nsSelector()
		case 3:
			p.IPBlock = &networkingv1.IPBlock{CIDR: "10.0.0.0/16", Except: []string{ch.pick("10.0.1.0/24", "10.0.2.0/25")}}
		default:
			p.IPBlock = &networkingv1.IPBlock{CIDR: ch.pick("fd00::/64", "10.0.2.0/24")}
		}
		out = append(out, p)
	}
	return out
}

func (ch *churn) ports() []networkingv1.NetworkPolicyPort {
	var out []networkingv1.NetworkPolicyPort
	for range ch.rng.IntN(3) {
		switch ch.rng.IntN(4) {
		case 0:
			out = append(out, port("", intstr.FromString(ch.pick("http", "dns"))))
		case 1:
			out = append(out, port(corev1.ProtocolUDP, intstr.FromString("dns")))
		case 2:
			out = append(out, port(corev1.ProtocolTCP, intstr.FromInt32(8000), 8100))
		default:
			out = append(out, port(corev1.Protocol(ch.pick("TCP", "UDP", "SCTP")), intstr.FromInt32(int32(ch.pick2(53, 80, 443)))))
		}
	}
	return out
}

func (ch *churn) policy(ns, name string) *networkingv1.NetworkPolicy {
	p := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	if ch.rng.IntN(4) == 0 { // staged: an audit direction where nothing enforced isolates
		p.Annotations = map[string]string{AuditAnnotation: AuditMode}
	}
	p.Spec.PodSelector = *ch.selector()
	for _, t := range []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress, "Sideways"} {
		if ch.rng.IntN(3) == 0 && (t != "Sideways" || ch.rng.IntN(10) == 0) {
			p.Spec.PolicyTypes = append(p.Spec.PolicyTypes, t)
		}
	}
	for range ch.rng.IntN(3) {
		p.Spec.Ingress = append(p.Spec.Ingress, networkingv1.NetworkPolicyIngressRule{From: ch.peers(), Ports: ch.ports()})
	}
	for range ch.rng.IntN(3) {
		p.Spec.Egress = append(p.Spec.Egress, networkingv1.NetworkPolicyEgressRule{To: ch.peers(), Ports: ch.ports()})
	}
	return p
}

// step makes one random change and tells the Incremental.
func (ch *churn) step() {
	ns := fmt.Sprint("ns", ch.rng.IntN(4))
	switch op := ch.rng.IntN(20); {
	case op < 6: // a pod added or changed: labels, addresses, phase, ports, node
		key := fmt.Sprintf("%s/pod%d", ns, ch.rng.IntN(10))
		p := ch.pod(ns, key[len(ns)+1:])
		if old, ok := ch.pods[key]; ok && ch.rng.IntN(2) == 0 {
			p = old.DeepCopy() // only relabelled, or only readdressed
			if ch.rng.IntN(2) == 0 {
				p.Labels = ch.labels()
			} else {
				p.Status.PodIPs = []corev1.PodIP{{IP: ch.addr(ch.rng.IntN(40), false)}}
			}
		}
		ch.pods[key] = p
		ch.x.SetPod(key, p)
	case op < 8:
		for key := range ch.pods {
			delete(ch.pods, key)
			ch.x.SetPod(key, nil)
			break
		}
	case op < 10: // a namespace added or relabelled, or removed
		if ch.rng.IntN(5) == 0 {
			delete(ch.namespaces, ns)
			ch.x.SetNamespace(ns, nil)
			break
		}
		n := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{"team": ch.pick("x", "y", "z")}}}
		ch.namespaces[ns] = n
		ch.x.SetNamespace(ns, n)
	case op < 14: // a policy added, changed or deleted
		key := fmt.Sprintf("%s/p%d", ns, ch.rng.IntN(4))
		if ch.rng.IntN(4) == 0 {
			delete(ch.policies, key)
			ch.x.SetPolicy(key, nil)
			break
		}
		p := ch.policy(ns, key[len(ns)+1:])
		ch.policies[key] = p
		ch.x.SetPolicy(key, p)
	case op < 19: // an attachment appears, goes, is plugged or unplugged, or is readdressed
		i := ch.rng.IntN(len(ch.local) + 1)
		if i == len(ch.local) || ch.rng.IntN(3) == 0 {
			l := Local{Port: ch.rng.IntN(4), Namespace: ns, Name: fmt.Sprint("pod", ch.rng.IntN(10))}
			if ch.rng.IntN(10) == 0 {
				l.Namespace, l.Name = "", "" // a container that is no pod
			}
			for range 1 + ch.rng.IntN(2) {
				l.IPs = append(l.IPs, netip.MustParseAddr(ch.addr(3*ch.rng.IntN(13)+1, ch.rng.IntN(3) == 0)))
			}
			if i < len(ch.local) {
				ch.local[i] = l
			} else {
				ch.local = append(ch.local, l)
			}
			break
		}
		ch.local = append(ch.local[:i], ch.local[i+1:]...)
	default: // the node's pod CIDRs
		ch.cidrs = []netip.Prefix{netip.MustParsePrefix(ch.pick("10.0.1.0/24", "10.0.0.0/16"))}
	}
}

// input is the cluster as Compile takes it, its objects in a random order.
func (ch *churn) input() Input {
	in := Input{NodeName: churnNode, LocalCIDRs: ch.cidrs, Local: ch.local}
	for _, p := range ch.pods {
		in.Pods = append(in.Pods, p)
	}
	for _, n := range ch.namespaces {
		in.Namespaces = append(in.Namespaces, n)
	}
	for _, p := range ch.policies {
		in.Policies = append(in.Policies, p)
	}
	ch.rng.Shuffle(len(in.Pods), func(i, j int) { in.Pods[i], in.Pods[j] = in.Pods[j], in.Pods[i] })
	ch.rng.Shuffle(len(in.Policies), func(i, j int) { in.Policies[i], in.Policies[j] = in.Policies[j], in.Policies[i] })
	return in
}

// TestIncrementalAgainstCompile: on random sequences of changes (pods added, removed, relabelled,
// readdressed, ended, moved; namespaces relabelled and removed; policies added, changed and
// deleted, with named ports, ipBlocks and selectors that do not parse; attachments appearing,
// going, unplugged; the node's pod CIDRs), after every batch of one to three changes the
// Incremental's result is a fresh Compile's on the same objects, and Compile's result does not
// depend on the order of its objects.
func TestIncrementalAgainstCompile(t *testing.T) {
	for _, tc := range []struct {
		seed  uint64
		steps int
	}{{1, 1500}, {2, 1500}, {3, 1500}, {4, 1500}, {5, 1500}, {6, 1500}} {
		t.Run(fmt.Sprint("seed", tc.seed), func(t *testing.T) {
			ch := &churn{rng: rand.New(rand.NewPCG(tc.seed, 27)), pods: map[string]*corev1.Pod{}, namespaces: map[string]*corev1.Namespace{},
				policies: map[string]*networkingv1.NetworkPolicy{}, cidrs: []netip.Prefix{netip.MustParsePrefix("10.0.1.0/24")}, x: NewIncremental(churnNode)}
			isolated, compiled, locals := 0, 0, 0
			for step := 0; step < tc.steps; {
				for range 1 + ch.rng.IntN(3) {
					ch.step()
					step++
				}
				got := ch.x.Compile(ch.local, ch.cidrs)
				want := Compile(ch.input())
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("step %d: incremental\n%+v\nfull compile\n%+v", step, got, want)
				}
				if again := Compile(ch.input()); !reflect.DeepEqual(again, want) {
					t.Fatalf("step %d: Compile on the same objects in another order\n%+v\nfirst\n%+v", step, again, want)
				}
				isolated += want.Isolated
				compiled += ch.x.Compiled()
				locals += len(want.Ruleset.Pods) + len(want.Unknown)
			}
			if isolated == 0 || compiled*4 > locals*3 {
				t.Fatalf("%d local pods isolated, %d compiled again of %d: the sequence tests little", isolated, compiled, locals)
			}
			t.Logf("%d of %d local pods compiled again", compiled, locals)
		})
	}
}
