//go:build kubenet_e2e_agent

package agent

import (
	"context"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kubenet-dev/kubenet/agent/policy"
	"github.com/kubenet-dev/kubenet/internal/policyrules"
	"github.com/kubenet-dev/kubenet/test/controlplane"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

// ipBlockProbes are addresses of both families checked for every accepted form: each is denied
// unless the form's row allows it. ::ffff:10.1.2.3 is the IPv6 (mapped) spelling of an address
// many rows allow as IPv4: no IPv6 block covers it.
var ipBlockProbes = []string{
	"0.0.0.0", "9.255.255.255", "10.0.0.0", "10.1.2.3", "10.255.255.255", "11.0.0.0", "255.255.255.255",
	"::", "::ffff:10.1.2.3", "fd00::1", "fd00:0:0:1::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
}

// cidrWarnings collects the API server's warnings about non-standard CIDR values, which name
// the value's standard form: what the API server itself takes the value to mean.
type cidrWarnings struct {
	mu        sync.Mutex
	canonical map[string]string // value → its standard form
	other     []string          // warnings of another shape
}

// The shapes of k8s.io/apimachinery's GetWarningsForCIDR; the first form an ambiguous value
// "should be" is its network, the meaning the API server checks excepts against.
var cidrWarningShapes = []*regexp.Regexp{
	regexp.MustCompile(`ipBlock\.(?:cidr|except\[\d+\]): non-standard CIDR value ("[^"]*") will be considered invalid in a future Kubernetes release: use ("[^"]*")$`),
	regexp.MustCompile(`ipBlock\.(?:cidr|except\[\d+\]): CIDR value ("[^"]*") is ambiguous in this context \(should be ("[^"]*") or "[^"]*"\?\)$`),
	regexp.MustCompile(`ipBlock\.(?:cidr|except\[\d+\]): IPv6 CIDR value ("[^"]*") should be in RFC 5952 canonical format \(("[^"]*")\)$`),
}

func (w *cidrWarnings) HandleWarningHeader(_ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, re := range cidrWarningShapes {
		if m := re.FindStringSubmatch(text); m != nil {
			value, err1 := strconv.Unquote(m[1])
			std, err2 := strconv.Unquote(m[2])
			if err1 == nil && err2 == nil {
				if prev, ok := w.canonical[value]; ok && prev != std {
					w.other = append(w.other, fmt.Sprintf("%s (and before: use %q)", text, prev))
				}
				w.canonical[value] = std
				return
			}
		}
	}
	w.other = append(w.other, text)
}

// take returns the warnings since the last call and forgets them.
func (w *cidrWarnings) take() (map[string]string, []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	c, o := w.canonical, w.other
	w.canonical, w.other = map[string]string{}, nil
	return c, o
}

// TestIPBlockForms asks the real API server which forms of ipBlock.cidr and except it takes,
// and checks that kubenet's compiler gives every form it takes the meaning docs/networkpolicy.md
// documents (agent/policy's TestBlockRanges has the exact ranges), which is the meaning the API
// server's own warnings give it: the policy with every value replaced by the standard form the
// warning names compiles to the same ranges. A form the table calls refused that a future API
// server takes fails here, until its meaning is decided.
func TestIPBlockForms(t *testing.T) {
	cp := startControlPlane(t, nettest.NewUnderlay(t, 0), controlPlaneAddr)
	warnings := &cidrWarnings{canonical: map[string]string{}}
	cfg := cp.RESTConfig(t, controlplane.AdminUser)
	cfg.WarningHandler = warnings
	api, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ipblock", Labels: map[string]string{"kubernetes.io/metadata.name": "ipblock"}}}
	if _, err := api.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	all4 := []string{"0.0.0.0", "9.255.255.255", "10.0.0.0", "10.1.2.3", "10.255.255.255", "11.0.0.0", "255.255.255.255"}
	net10 := []string{"10.0.0.0", "10.1.2.3", "10.255.255.255"}
	cut := []string{"10.0.0.0", "10.0.255.255", "10.2.0.0", "10.255.255.255"} // 10.0.0.0/8 minus 10.1.0.0/16
	cases := []struct {
		name     string
		cidr     string
		except   []string
		accepted bool     // by the API server
		allow    []string // allowed addresses; every other probe is denied
		deny     []string // more addresses that must be denied
	}{
		{"IPv4", "10.0.0.0/8", nil, true, net10, nil},
		{"leading zeros in octets are decimal", "010.000.000.000/8", nil, true, net10, []string{"8.0.0.0"}},
		{"leading zeros in the prefix length", "10.0.0.0/008", nil, true, net10, nil},
		{"host bits set: the network", "10.1.2.3/8", nil, true, net10, nil},
		{"all of IPv4", "0.0.0.0/0", nil, true, all4, nil},
		{"all of IPv4 with host bits", "10.0.0.0/0", nil, true, all4, nil},
		{"IPv4-mapped is IPv4", "::ffff:10.0.0.0/104", nil, true, net10, nil},
		{"IPv4-mapped in hex, upper case", "::FFFF:A00:0/104", nil, true, net10, nil},
		{"IPv4-mapped address", "::ffff:10.1.2.3/128", nil, true, []string{"10.1.2.3"}, []string{"10.1.2.4"}},
		{"IPv4-mapped with leading zeros", "::ffff:010.001.002.003/128", nil, true, []string{"10.1.2.3"}, []string{"8.1.2.3"}},
		{"IPv4-mapped /96 is all of IPv4", "::ffff:10.1.2.3/96", nil, true, all4, nil},
		{"shorter than /96 is IPv6", "::ffff:10.0.0.0/95", nil, true, []string{"::fffe:0:0", "::fffe:ffff:ffff"}, []string{"::ffff:0:0", "::ffff:ffff:ffff"}},
		{"all of IPv6, the mapped addresses excepted", "::/0", nil, true,
			[]string{"::", "fd00::1", "fd00:0:0:1::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "::fffe:ffff:ffff", "::1:0:0:0"}, []string{"::ffff:0:0", "::ffff:ffff:ffff"}},
		{"IPv6", "fd00::/64", nil, true, []string{"fd00::1"}, []string{"fd00:0:0:1::"}},
		{"IPv6 upper case, not compressed", "FD00:0:0:0:0:0:0:0/64", nil, true, []string{"fd00::1"}, nil},
		{"IPv6 group of five hex digits", "0fd00::/16", nil, true, []string{"fd00::1", "fd00:0:0:1::"}, []string{"fd01::"}},
		{"IPv6 host bits set", "fd00::1/64", nil, true, []string{"fd00::1"}, nil},
		{"IPv4-compatible is IPv6", "::1.2.3.4/128", nil, true, []string{"::102:304"}, []string{"1.2.3.4"}},

		{"except", "10.0.0.0/8", []string{"10.1.0.0/16"}, true, cut, []string{"10.1.0.0", "10.1.255.255"}},
		{"except with leading zeros", "10.0.0.0/8", []string{"010.001.000.000/16"}, true, cut, []string{"10.1.0.0", "8.1.0.0"}},
		{"except with host bits", "10.0.0.0/8", []string{"10.1.2.3/16"}, true, cut, []string{"10.1.0.0", "10.1.255.255"}},
		{"IPv4-mapped except of an IPv4 cidr", "10.0.0.0/8", []string{"::ffff:10.1.0.0/112"}, true, cut, []string{"10.1.0.0", "10.1.255.255"}},
		{"IPv4-mapped except the whole cidr", "10.0.0.0/8", []string{"::ffff:10.0.0.0/104"}, true, nil, nil},
		{"IPv4-mapped except wider than the cidr", "10.0.0.0/8", []string{"::ffff:10.0.0.0/103"}, true, nil, []string{"11.255.255.255"}},
		{"IPv4-mapped cidr and except", "::ffff:10.0.0.0/104", []string{"::ffff:10.1.0.0/112"}, true, cut, []string{"10.1.0.0"}},
		{"IPv6 except", "fd00::/16", []string{"fd00::/64"}, true, []string{"fd00:0:0:1::"}, []string{"fd00::1"}},

		{"IPv4 except of an IPv4-mapped cidr", "::ffff:10.0.0.0/104", []string{"10.1.0.0/16"}, false, nil, nil},
		{"IPv6 except of an IPv4 cidr", "10.0.0.0/8", []string{"fd00::/64"}, false, nil, nil},
		{"IPv4 except of an IPv6 cidr", "::/0", []string{"10.0.0.0/8"}, false, nil, nil},
		{"IPv4-mapped except of an IPv6 cidr", "::/0", []string{"::ffff:10.0.0.0/104"}, false, nil, nil},
		{"except equal to the cidr", "10.0.0.0/8", []string{"10.0.0.0/8"}, false, nil, nil},
		{"except outside the cidr", "10.0.0.0/8", []string{"11.0.0.0/16"}, false, nil, nil},
		{"except that does not parse", "10.0.0.0/8", []string{"nonsense"}, false, nil, nil},
		{"empty except", "10.0.0.0/8", []string{""}, false, nil, nil},
		{"empty cidr", "", nil, false, nil, nil},
		{"no prefix length", "10.0.0.1", nil, false, nil, nil},
		{"signed prefix length", "10.0.0.0/+8", nil, false, nil, nil},
		{"prefix length too long", "10.0.0.0/33", nil, false, nil, nil},
		{"IPv6 prefix length too long", "::ffff:10.0.0.0/129", nil, false, nil, nil},
		{"leading space", " 10.0.0.0/8", nil, false, nil, nil},
		{"trailing space", "10.0.0.0/8 ", nil, false, nil, nil},
		{"IPv6 zone", "fe80::1%eth0/64", nil, false, nil, nil},
		{"hex octet", "0x0a.0.0.0/8", nil, false, nil, nil},
		{"three octets", "10.0.0/8", nil, false, nil, nil},
		{"octet too large", "256.0.0.0/8", nil, false, nil, nil},
		{"IPv6 group too large", "1fd00::/16", nil, false, nil, nil},
		{"IPv4 not at the end of IPv6", "1.2.3.4::/32", nil, false, nil, nil},
	}
	target := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "target"}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	local := policy.Local{Port: 1, Namespace: ns.Name, Name: "target", IPs: []netip.Addr{netip.MustParseAddr("10.244.1.2"), netip.MustParseAddr("fd00:10:244:1::2")}}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			peers := []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: tc.cidr, Except: tc.except}}}
			np := &networkingv1.NetworkPolicy{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: fmt.Sprintf("form-%d", i)},
				Spec: networkingv1.NetworkPolicySpec{
					PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
					Ingress:     []networkingv1.NetworkPolicyIngressRule{{From: peers}},
					Egress:      []networkingv1.NetworkPolicyEgressRule{{To: peers}},
				},
			}
			_, err := api.NetworkingV1().NetworkPolicies(ns.Name).Create(ctx, np, metav1.CreateOptions{})
			canonical, otherWarnings := warnings.take()
			switch {
			case err == nil && !tc.accepted:
				t.Fatalf("the API server took cidr %q except %q, which the table says it refuses: decide what it means", tc.cidr, tc.except)
			case err != nil && tc.accepted:
				t.Fatalf("the API server refused cidr %q except %q: %v", tc.cidr, tc.except, err)
			case err != nil:
				if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), ".ipBlock.") {
					t.Fatalf("cidr %q except %q: %v, want the API server's validation to refuse the ipBlock", tc.cidr, tc.except, err)
				}
				return
			}
			if len(otherWarnings) > 0 {
				t.Errorf("warnings of a shape this test does not know: %q", otherWarnings)
			}
			// What the node's informer would see: the object as stored.
			stored, err := api.NetworkingV1().NetworkPolicies(ns.Name).Get(ctx, np.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			compiled := func(np *networkingv1.NetworkPolicy) policyrules.Pod {
				t.Helper()
				res := policy.Compile(policy.Input{Policies: []*networkingv1.NetworkPolicy{np}, Namespaces: []*corev1.Namespace{ns},
					Pods: []*corev1.Pod{target}, Local: []policy.Local{local}})
				if len(res.Ruleset.Pods) != 1 {
					t.Fatalf("%d pods in the ruleset, want the target", len(res.Ruleset.Pods))
				}
				return res.Ruleset.Pods[0]
			}
			p := compiled(stored)
			for _, d := range []struct {
				name string
				dir  policyrules.Direction
			}{{"ingress", p.Ingress}, {"egress", p.Egress}} {
				if !d.dir.Isolated {
					t.Fatalf("%s not isolated", d.name)
				}
				allowed := func(a netip.Addr) bool {
					return slices.ContainsFunc(d.dir.Allow, func(e policyrules.Entry) bool {
						return e.Ports == nil && a.Is4() == e.Peer.First.Is4() && a.Compare(e.Peer.First) >= 0 && a.Compare(e.Peer.Last) <= 0
					})
				}
				for _, s := range slices.Concat(ipBlockProbes, tc.allow, tc.deny) {
					a := netip.MustParseAddr(s)
					want := slices.Contains(tc.allow, s)
					if got := allowed(a); got != want {
						t.Errorf("cidr %q except %q: %s allows %s = %v, want %v (allowed: %v)", tc.cidr, tc.except, d.name, a, got, want, d.dir.Allow)
					}
				}
			}

			// The same policy in the standard forms the API server's warnings name means the same.
			if len(canonical) == 0 {
				return
			}
			std := stored.DeepCopy()
			for _, peers := range [][]networkingv1.NetworkPolicyPeer{std.Spec.Ingress[0].From, std.Spec.Egress[0].To} {
				b := peers[0].IPBlock
				if c, ok := canonical[b.CIDR]; ok {
					b.CIDR = c
				}
				for j, e := range b.Except {
					if c, ok := canonical[e]; ok {
						b.Except[j] = c
					}
				}
			}
			sp := compiled(std)
			if !slices.Equal(p.Ingress.Allow, sp.Ingress.Allow) || !slices.Equal(p.Egress.Allow, sp.Egress.Allow) {
				t.Errorf("cidr %q except %q allows %v; in the standard forms the API server names (%v) it allows %v",
					tc.cidr, tc.except, p.Ingress.Allow, std.Spec.Ingress[0].From[0].IPBlock, sp.Ingress.Allow)
			}
		})
	}
}
