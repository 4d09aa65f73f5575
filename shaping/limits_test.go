package shaping

import (
	"errors"
	"math"
	"strings"
	"testing"
)

func TestParseRate(t *testing.T) {
	good := []struct {
		in   string
		want uint64
	}{
		{"10M", 10_000_000},
		{"1G", 1_000_000_000},
		{"500k", 500_000},
		{"1.5M", 1_500_000},
		{"100Mi", 100 << 20},
		{"1Ki", 1024},
		{"1k", MinRate},
		{"1P", MaxRate},
		{"1000", 1000},
		{"1e6", 1_000_000},
		{"1E6", 1_000_000},
		{"+2M", 2_000_000},
		{".5M", 500_000},
		{"5.M", 5_000_000},
		{"0.001G", 1_000_000},
		{"1.0005k", 1001}, // rounded up, as resource.Quantity.Value does
		{"1000000000m", 1_000_000},
		{"0.000001P", 1_000_000_000},
	}
	for _, c := range good {
		got, err := ParseRate(c.in)
		if err != nil || got != c.want {
			t.Errorf("ParseRate(%q) = %d, %v; want %d", c.in, got, err, c.want)
		}
	}
	bad := []struct{ in, why string }{
		{"10Q", "suffix"},
		{"", "quantity"},
		{"M", "quantity"},
		{"1K", "suffix"}, // Kubernetes' kilo is lower case
		{"1kb", "suffix"},
		{"1mi", "suffix"},
		{" 1M", "quantity"},
		{"1M ", "suffix"},
		{"1..5M", "quantity"},
		{"1.2.3", "quantity"},
		{"1e", "suffix"},
		{"1e1.5", "quantity"},
		{"1e1001", "quantity"},
		{"0x10M", "suffix"},
		{"-1M", "negative"},
		{"0", "minimum"},
		{"999", "minimum"},
		{"100m", "minimum"}, // 0.1 bit/s, rounded up to 1
		{"1.000001P", "maximum"},
		{"2E", "maximum"},
		{"1Ei", "maximum"},
		{"1e30", "too large"},
	}
	for _, c := range bad {
		if got, err := ParseRate(c.in); err == nil || !strings.Contains(err.Error(), c.why) {
			t.Errorf("ParseRate(%q) = %d, %v; want an error about %q", c.in, got, err, c.why)
		}
	}
}

func TestResolve(t *testing.T) {
	const (
		containerdBurst = math.MaxUint32
		crioBurst       = math.MaxUint32*8 - 1
		crioOldBurst    = math.MaxUint32 * 8
	)
	ann := func(kv ...string) map[string]string {
		m := map[string]string{"unrelated": "x"}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	in := func(rate, burst uint64) Limits { return Limits{Ingress: Limit{rate, burst}} }
	eg := func(rate, burst uint64) Limits { return Limits{Egress: Limit{rate, burst}} }
	cases := []struct {
		name        string
		capability  *Limits
		annotations map[string]string
		want        Limits
		errKey      string // non-empty: expect a ValueError with this key
		errValue    any
	}{
		{name: "nothing", annotations: ann()},
		{name: "empty capability", capability: &Limits{}},
		{name: "ingress annotation", annotations: ann(IngressAnnotation, "10M"), want: in(10e6, 0)},
		{name: "both annotations", annotations: ann(IngressAnnotation, "1.5M", EgressAnnotation, "100Mi"),
			want: Limits{Ingress: Limit{Rate: 1_500_000}, Egress: Limit{Rate: 100 << 20}}},
		{name: "capability with explicit burst", capability: &Limits{Egress: Limit{20e6, 400_000}}, want: eg(20e6, 400_000)},
		{name: "containerd default burst", capability: &Limits{Ingress: Limit{10e6, containerdBurst}}, want: in(10e6, 0)},
		{name: "cri-o default burst", capability: &Limits{Egress: Limit{10e6, crioBurst}}, want: eg(10e6, 0)},
		{name: "older cri-o default burst", capability: &Limits{Egress: Limit{10e6, crioOldBurst}}, want: eg(10e6, 0)},
		{name: "default burst without rate is nothing", capability: &Limits{Egress: Limit{0, containerdBurst}}},
		{name: "capability wins over annotation",
			capability: &Limits{Ingress: Limit{10e6, containerdBurst}}, annotations: ann(IngressAnnotation, "20M"),
			want: in(10e6, 0)},
		{name: "annotation fills the direction the capability leaves out",
			capability: &Limits{Ingress: Limit{10e6, containerdBurst}}, annotations: ann(EgressAnnotation, "50M"),
			want: Limits{Ingress: Limit{Rate: 10e6}, Egress: Limit{Rate: 50e6}}},
		{name: "bad annotation", annotations: ann(IngressAnnotation, "10Q"), errKey: IngressAnnotation, errValue: "10Q"},
		{name: "annotation too small", annotations: ann(EgressAnnotation, "999"), errKey: EgressAnnotation, errValue: "999"},
		{name: "annotation too large", annotations: ann(EgressAnnotation, "2P"), errKey: EgressAnnotation, errValue: "2P"},
		{name: "bad annotation behind a capability",
			capability: &Limits{Ingress: Limit{10e6, 0}}, annotations: ann(IngressAnnotation, "fast"),
			errKey: IngressAnnotation, errValue: "fast"},
		{name: "burst without rate", capability: &Limits{Ingress: Limit{0, 80_000}},
			errKey: "runtimeConfig.bandwidth.ingressRate", errValue: uint64(0)},
		{name: "capability rate too small", capability: &Limits{Egress: Limit{999, 0}},
			errKey: "runtimeConfig.bandwidth.egressRate", errValue: uint64(999)},
		{name: "capability rate too large", capability: &Limits{Ingress: Limit{MaxRate + 1, 0}},
			errKey: "runtimeConfig.bandwidth.ingressRate", errValue: MaxRate + 1},
		{name: "burst tbf cannot hold", capability: &Limits{Egress: Limit{1000, 1_000_000}},
			errKey: "runtimeConfig.bandwidth.egressBurst", errValue: uint64(1_000_000)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := Resolve(c.capability, c.annotations)
			if c.errKey == "" {
				if err != nil || got != c.want {
					t.Fatalf("Resolve = %+v, %v; want %+v", got, err, c.want)
				}
				return
			}
			var ve *ValueError
			if !errors.As(err, &ve) || ve.Key != c.errKey || ve.Value != c.errValue {
				t.Fatalf("Resolve = %+v, %v; want a ValueError for %s %v", got, err, c.errKey, c.errValue)
			}
			if !strings.Contains(err.Error(), c.errKey) {
				t.Errorf("error %q does not name %s", err, c.errKey)
			}
		})
	}
}

func TestBurst(t *testing.T) {
	cases := []struct {
		name  string
		limit Limit
		mtu   int
		want  uint64 // bits
	}{
		{"default is 10 ms of rate", Limit{Rate: 10e6}, 1500, 100_000},
		{"default at 1 Gbit/s", Limit{Rate: 1e9}, 1500, 10_000_000},
		{"default never below two frames", Limit{Rate: 1000}, 1500, 2 * 1514 * 8},
		{"two jumbo frames", Limit{Rate: 10e6}, 9000, 2 * 9014 * 8},
		{"explicit burst kept", Limit{Rate: 10e6, Burst: 1e6}, 1500, 1e6},
		{"explicit burst raised to two frames", Limit{Rate: 10e6, Burst: 8000}, 1500, 2 * 1514 * 8},
	}
	for _, c := range cases {
		if got := c.limit.effectiveBurst(c.mtu); got != c.want {
			t.Errorf("%s: burst = %d bits, want %d", c.name, got, c.want)
		}
	}
}
