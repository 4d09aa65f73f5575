package cni

import (
	"errors"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kubenet-dev/kubenet/test/testkit"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/kubenet-dev/kubenet/core"
	"github.com/kubenet-dev/kubenet/shaping"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

// TestShapingConfig checks how the bandwidth capability (both casings) and the pod annotations
// become the limits an attachment gets, and that bad values are refused with code 7 naming them.
func TestShapingConfig(t *testing.T) {
	conf := func(runtimeConfig string) []byte {
		return []byte(`{"cniVersion":"1.1.0","name":"kubenet","type":"kubenet","podCIDRs":["10.244.1.0/24"],
			"runtimeConfig":` + runtimeConfig + `}`)
	}
	cases := []struct {
		name          string
		runtimeConfig string
		want          *core.Bandwidth
		wantErr       string // substring of a code-7 error
	}{
		{name: "nothing", runtimeConfig: `{}`},
		{name: "containerd casing, default burst",
			runtimeConfig: `{"bandwidth":{"IngressRate":10000000,"IngressBurst":4294967295,"EgressRate":0,"EgressBurst":0}}`,
			want:          &core.Bandwidth{IngressRate: 10_000_000}},
		{name: "cri-o casing, default burst",
			runtimeConfig: `{"bandwidth":{"egressRate":50000000,"egressBurst":34359738359}}`,
			want:          &core.Bandwidth{EgressRate: 50_000_000}},
		{name: "explicit burst kept",
			runtimeConfig: `{"bandwidth":{"ingressRate":1000000,"ingressBurst":200000}}`,
			want:          &core.Bandwidth{IngressRate: 1_000_000, IngressBurst: 200_000}},
		{name: "annotations only",
			runtimeConfig: `{"io.kubernetes.cri.pod-annotations":{"kubernetes.io/ingress-bandwidth":"1.5M","kubernetes.io/egress-bandwidth":"100Mi"}}`,
			want:          &core.Bandwidth{IngressRate: 1_500_000, EgressRate: 100 << 20}},
		{name: "capability wins, annotation fills the other direction",
			runtimeConfig: `{"bandwidth":{"IngressRate":10000000,"IngressBurst":4294967295},
				"io.kubernetes.cri.pod-annotations":{"kubernetes.io/ingress-bandwidth":"20M","kubernetes.io/egress-bandwidth":"1G"}}`,
			want: &core.Bandwidth{IngressRate: 10_000_000, EgressRate: 1_000_000_000}},
		{name: "unrelated annotations", runtimeConfig: `{"io.kubernetes.cri.pod-annotations":{"a":"b"}}`},
		{name: "bad annotation",
			runtimeConfig: `{"io.kubernetes.cri.pod-annotations":{"kubernetes.io/ingress-bandwidth":"10Q"}}`,
			wantErr:       `invalid kubernetes.io/ingress-bandwidth "10Q"`},
		{name: "annotation above 1P",
			runtimeConfig: `{"io.kubernetes.cri.pod-annotations":{"kubernetes.io/egress-bandwidth":"2P"}}`,
			wantErr:       `invalid kubernetes.io/egress-bandwidth "2P": above the maximum`},
		{name: "annotation below 1k",
			runtimeConfig: `{"io.kubernetes.cri.pod-annotations":{"kubernetes.io/egress-bandwidth":"500"}}`,
			wantErr:       `invalid kubernetes.io/egress-bandwidth "500": below the minimum`},
		{name: "burst without rate",
			runtimeConfig: `{"bandwidth":{"ingressRate":0,"ingressBurst":80000}}`,
			wantErr:       `invalid runtimeConfig.bandwidth.ingressRate 0`},
		{name: "capability rate above 1P",
			runtimeConfig: `{"bandwidth":{"EgressRate":1000000000000001}}`,
			wantErr:       `invalid runtimeConfig.bandwidth.egressRate 1000000000000001`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := core.ParseConfig(conf(c.runtimeConfig))
			if c.wantErr != "" {
				var te *types.Error
				if !errors.As(err, &te) || te.Code != types.ErrInvalidNetworkConfig || !strings.Contains(te.Msg, c.wantErr) {
					t.Fatalf("ParseConfig error = %v, want code 7 containing %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := cfg.Runtime.Bandwidth; fmt.Sprint(got) != fmt.Sprint(c.want) {
				t.Errorf("bandwidth = %+v, want %+v", got, c.want)
			}
		})
	}
}

// Rates the throughput test shapes to: different per direction, so a swapped direction shows.
const (
	slowRate = 10_000_000 // bit/s
	fastRate = 50_000_000
)

// TestShapingThroughput sends real TCP streams through shaped pods in both directions over IPv4
// and IPv6 and checks the rate that arrives, then checks that DEL leaves nothing and that the
// same attachment, added again without limits, is far faster than the limits.
func TestShapingThroughput(t *testing.T) {
	node, list := dualStackNode(t)
	other := node.NewPod(t, "other")
	node.MustAdd(t, list, other)
	otherSinks := sinks(t, other)
	measured := nettest.Stream{Warmup: 500 * time.Millisecond, Window: 2 * time.Second}

	cases := []struct {
		name            string
		args            map[string]any
		ingress, egress uint64
	}{
		{"containerd capability", map[string]any{"bandwidth": map[string]any{
			"IngressRate": slowRate, "IngressBurst": math.MaxUint32, "EgressRate": fastRate, "EgressBurst": math.MaxUint32,
		}}, slowRate, fastRate},
		{"pod annotations", map[string]any{"io.kubernetes.cri.pod-annotations": map[string]string{
			shaping.IngressAnnotation: "50M", shaping.EgressAnnotation: "10M",
		}}, fastRate, slowRate},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pod := node.NewPod(t, "shaped")
			pod.RT.CapabilityArgs = c.args
			node.MustAdd(t, list, pod)
			names := testkit.KubenetNames(pod)
			limits := shaping.Limits{Ingress: shaping.Limit{Rate: c.ingress}, Egress: shaping.Limit{Rate: c.egress}}
			nettest.Do(t, node.NS, func() error { return checkShaping(names, limits) })

			podSinks := sinks(t, pod)
			for _, fam := range []netip.Addr{nettest.PodCIDR4.Addr(), nettest.PodCIDR6.Addr()} {
				for _, d := range []struct {
					dir  string
					from *nettest.Pod
					to   *nettest.Sink
					rate uint64
				}{
					{"ingress", other, podSinks[fam.Is4()], c.ingress},
					{"egress", pod, otherSinks[fam.Is4()], c.egress},
				} {
					lo, hi := 0.85*float64(d.rate), 1.15*float64(d.rate)
					got, err := medianRate(measured, d.from.NS, d.to, func(r float64) bool { return r >= lo && r <= hi })
					if err != nil {
						t.Fatalf("%s %s: %v", d.dir, family(fam), err)
					}
					t.Logf("%s %s: %.1f Mbit/s (limit %d)", d.dir, family(fam), got/1e6, d.rate/1e6)
					if got < lo || got > hi {
						t.Errorf("%s %s: %.1f Mbit/s, want %d Mbit/s ±15%%", d.dir, family(fam), got/1e6, d.rate/1e6)
					}
				}
			}

			if err := node.Del(list, pod); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			if left := shapingLeftovers(t, node); len(left) > 0 {
				t.Errorf("after DEL: %v", left)
			}

			// The same attachment again, unshaped: same veth and ifb names, so anything DEL left
			// keyed by them would show here as a limit.
			pod.RT.CapabilityArgs = nil
			node.MustAdd(t, list, pod)
			unshaped := sinks(t, pod)
			quick := nettest.Stream{Warmup: 200 * time.Millisecond, Window: time.Second}
			for _, d := range []struct {
				dir  string
				from *nettest.Pod
				to   *nettest.Sink
			}{{"ingress", other, unshaped[true]}, {"egress", pod, otherSinks[true]}} {
				got, err := quick.Measure(d.from.NS, d.to)
				if err != nil {
					t.Fatalf("unshaped %s: %v", d.dir, err)
				}
				t.Logf("unshaped %s IPv4: %.1f Mbit/s", d.dir, got/1e6)
				if got < 4*fastRate {
					t.Errorf("unshaped %s IPv4: %.1f Mbit/s, want far above the old limit", d.dir, got/1e6)
				}
			}
			if err := node.Del(list, pod); err != nil {
				t.Fatalf("DEL: %v", err)
			}
		})
	}
}

// TestShapingFailedAdd makes the shaping step fail (a foreign device holds the attachment's ifb
// name) and checks that ADD rolled everything back and left the foreign device alone; then that
// an invalid annotation is refused with code 7 before anything is created.
func TestShapingFailedAdd(t *testing.T) {
	node, list := dualStackNode(t)
	pod := node.NewPod(t, "blocked")
	pod.RT.CapabilityArgs = map[string]any{"bandwidth": map[string]any{"ingressRate": slowRate, "egressRate": slowRate}}
	names := testkit.KubenetNames(pod)
	nettest.Do(t, node.NS, func() error {
		return netlink.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: names.IFB}})
	})

	err := node.Add(list, pod)
	if err == nil {
		t.Cleanup(func() { _ = node.Del(list, pod) })
		t.Fatal("ADD succeeded although the ifb's name is taken")
	}
	if !strings.Contains(err.Error(), names.IFB) || !strings.Contains(err.Error(), shaping.ErrNotIFB.Error()) {
		t.Errorf("ADD error %q does not name the ifb and the reason", err)
	}
	nettest.Do(t, node.NS, func() error {
		l, err := netlink.LinkByName(names.IFB)
		if err != nil {
			return fmt.Errorf("the foreign device was removed: %w", err)
		}
		if l.Type() != "bridge" {
			return fmt.Errorf("%s is now a %s", names.IFB, l.Type())
		}
		return netlink.LinkDel(l)
	})
	auditRolledBack(t, node, pod)

	// With the name free again the same ADD works, so the rollback released everything.
	node.MustAdd(t, list, pod)
	nettest.Do(t, node.NS, func() error {
		return checkShaping(names, shaping.Limits{Ingress: shaping.Limit{Rate: slowRate}, Egress: shaping.Limit{Rate: slowRate}})
	})
	if err := node.Del(list, pod); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	auditRolledBack(t, node, pod)

	bad := node.NewPod(t, "bad-annotation")
	bad.RT.CapabilityArgs = map[string]any{"io.kubernetes.cri.pod-annotations": map[string]string{shaping.IngressAnnotation: "10Q"}}
	err = node.Add(list, bad)
	var te *types.Error
	if !errors.As(err, &te) || te.Code != types.ErrInvalidNetworkConfig || !strings.Contains(te.Msg, `kubernetes.io/ingress-bandwidth "10Q"`) {
		t.Errorf("ADD with a bad annotation = %v, want code 7 naming the annotation and its value", err)
	}
	auditRolledBack(t, node, bad)
}

// TestShapingCheck: CHECK passes on a shaped pod and fails, naming the piece, once the qdiscs or
// the ifb are not what ADD left.
func TestShapingCheck(t *testing.T) {
	node, list := dualStackNode(t)
	cases := []struct {
		name   string
		tamper func(veth, ifb netlink.Link) error
		want   string
	}{
		{"ifb deleted", func(_, ifb netlink.Link) error { return netlink.LinkDel(ifb) }, "is missing"},
		{"ifb down", func(_, ifb netlink.Link) error { return netlink.LinkSetDown(ifb) }, "is down"},
		{"ingress tbf changed", func(veth, _ netlink.Link) error {
			return netlink.QdiscReplace(&netlink.Tbf{
				QdiscAttrs: netlink.QdiscAttrs{LinkIndex: veth.Attrs().Index, Handle: netlink.MakeHandle(1, 0), Parent: netlink.HANDLE_ROOT},
				Rate:       slowRate / 4, Limit: 100_000, Buffer: 100_000,
			})
		}, "tbf on"},
		{"redirect removed", func(veth, _ netlink.Link) error {
			return netlink.QdiscDel(&netlink.Ingress{QdiscAttrs: netlink.QdiscAttrs{
				LinkIndex: veth.Attrs().Index, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_INGRESS}})
		}, "no filter"},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pod := node.NewPod(t, fmt.Sprintf("checked-%d", i))
			pod.RT.CapabilityArgs = map[string]any{"io.kubernetes.cri.pod-annotations": map[string]string{
				shaping.IngressAnnotation: "10M", shaping.EgressAnnotation: "20M"}}
			node.MustAdd(t, list, pod)
			if err := node.Check(list, pod); err != nil {
				t.Fatalf("CHECK right after ADD: %v", err)
			}
			names := testkit.KubenetNames(pod)
			nettest.Do(t, node.NS, func() error {
				veth, err := netlink.LinkByName(names.HostVeth)
				if err != nil {
					return err
				}
				ifb, err := netlink.LinkByName(names.IFB)
				if err != nil {
					return err
				}
				return c.tamper(veth, ifb)
			})
			if err := node.Check(list, pod); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("CHECK after tampering = %v, want an error containing %q", err, c.want)
			}
		})
	}
}

// dualStackNode is a node with an IPv4 and an IPv6 pod CIDR and its conflist.
func dualStackNode(t *testing.T) (*nettest.Node, *libcni.NetworkConfigList) {
	t.Helper()
	node := nettest.NewNode(t, binDir)
	return node, node.ConfList(t, nettest.NetConf{
		PodCIDRs:           []netip.Prefix{nettest.PodCIDR4, nettest.PodCIDR6},
		NonMasqueradeCIDRs: []netip.Prefix{nettest.NonMasquerade4, nettest.NonMasquerade6},
	})
}

func family(a netip.Addr) string {
	if a.Is4() {
		return "IPv4"
	}
	return "IPv6"
}

// sinks starts a TCP sink on each of the pod's addresses, keyed by "is IPv4". The ports are
// picked by the kernel: an earlier sink of the same pod netns may still hold a fixed one.
func sinks(t *testing.T, p *nettest.Pod) map[bool]*nettest.Sink {
	t.Helper()
	out := map[bool]*nettest.Sink{}
	for _, ip := range p.IPs() {
		out[ip.Is4()] = nettest.StartSink(t, p.NS, netip.AddrPortFrom(ip, 0))
	}
	return out
}

// shapingLeftovers lists every ifb device and every tbf or ingress qdisc in the node's netns.
func shapingLeftovers(t *testing.T, node *nettest.Node) []string {
	t.Helper()
	var left []string
	nettest.Do(t, node.NS, func() error {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		for _, l := range links {
			if l.Type() == "ifb" {
				left = append(left, "ifb "+l.Attrs().Name)
			}
			qdiscs, err := netlink.QdiscList(l)
			if err != nil {
				return err
			}
			for _, q := range qdiscs {
				if q.Type() == "tbf" || q.Type() == "ingress" {
					left = append(left, fmt.Sprintf("%s qdisc on %s", q.Type(), l.Attrs().Name))
				}
			}
		}
		return nil
	})
	return left
}

// auditRolledBack is the leak audit of an attachment that failed or was deleted: the core's
// (veth, ifb name, reservations, record, cache) and no ifb or shaping qdisc of anyone's.
func auditRolledBack(t *testing.T, node *nettest.Node, p *nettest.Pod) {
	t.Helper()
	testkit.AssertNoResidue(t, node, "kubenet", testkit.AttachmentOf(p), nil)
	if left := shapingLeftovers(t, node); len(left) > 0 {
		t.Errorf("shaping left behind: %v", left)
	}
}

// checkShaping runs shaping.Check on the attachment's host veth (inside the node).
func checkShaping(names core.Names, l shaping.Limits) error {
	host, err := netlink.LinkByName(names.HostVeth)
	if err != nil {
		return err
	}
	return shaping.Check(host, names.IFB, l)
}

// medianRate measures the stream once and, when the rate is not ok, twice more and returns the
// median of the three: on a busy 2-core machine one window now and then loses a share of the CPU
// to other processes and reads low, and the median of three tells that from a limit that is
// wrong (which reads wrong every time).
func medianRate(s nettest.Stream, from ns.NetNS, to *nettest.Sink, ok func(float64) bool) (float64, error) {
	first, err := s.Measure(from, to)
	if err != nil || ok(first) {
		return first, err
	}
	rates := []float64{first}
	for range 2 {
		r, err := s.Measure(from, to)
		if err != nil {
			return 0, err
		}
		rates = append(rates, r)
	}
	slices.Sort(rates)
	return rates[1], nil
}
