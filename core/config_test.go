package core

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/kubenet-dev/kubenet/hairpin"
)

func TestParseConfigDefaults(t *testing.T) {
	cfg, err := ParseConfig([]byte(`{"cniVersion":"1.0.0","name":"kubenet","type":"kubenet","podCIDRs":["10.244.1.0/24"]}`))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Bridge != "cbr0" || cfg.DataDir != "/var/lib/cni/networks" || cfg.Hairpin != hairpin.HairpinVeth || cfg.MTU != 0 {
		t.Errorf("defaults: bridge %q dataDir %q hairpin %q mtu %d", cfg.Bridge, cfg.DataDir, cfg.Hairpin, cfg.MTU)
	}
	if cfg.Log != (LogSettings{MaxBytes: DefaultLogMaxBytes}) || cfg.Owner != OwnerCNI {
		t.Errorf("defaults: log %+v (want off, %d bytes), owner %q", cfg.Log, DefaultLogMaxBytes, cfg.Owner)
	}
	if got := cfg.Gateways(); len(got) != 1 || got[0] != netip.MustParsePrefix("10.244.1.1/24") {
		t.Errorf("gateways %v, want [10.244.1.1/24]", got)
	}
}

func TestParseConfigRanges(t *testing.T) {
	cases := []struct {
		name string
		conf string
		want []string // pod CIDRs in order
		gw   []string
	}{
		{"dual stack keeps IPv4 first", `"podCIDRs":["fd00:1::/64","10.1.0.0/16"]`, []string{"10.1.0.0/16", "fd00:1::/64"}, []string{"10.1.0.1", "fd00:1::1"}},
		{"IPv6 only", `"podCIDRs":["fd00:1::/64"]`, []string{"fd00:1::/64"}, []string{"fd00:1::1"}},
		{"ipRanges capability wins over podCIDRs", `"podCIDRs":["10.1.0.0/16"],"runtimeConfig":{"ipRanges":[[{"subnet":"10.9.0.0/24","gateway":"10.9.0.254"}]]}`, []string{"10.9.0.0/24"}, []string{"10.9.0.254"}},
		{"null capability arguments and prevResult", `"podCIDRs":["10.1.0.0/16"],"runtimeConfig":null,"prevResult":null`, []string{"10.1.0.0/16"}, []string{"10.1.0.1"}},
		{"ipRanges in containerd's casing", `"runtimeConfig":{"IPRanges":[[{"Subnet":"10.9.0.0/24"}]]}`, []string{"10.9.0.0/24"}, []string{"10.9.0.1"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := ParseConfig([]byte(`{"cniVersion":"1.0.0","name":"n",` + tc.conf + `}`))
			if err != nil {
				t.Fatal(err)
			}
			var got, gws []string
			for _, p := range cfg.PodCIDRs() {
				got = append(got, p.String())
			}
			for _, g := range cfg.Gateways() {
				gws = append(gws, g.Addr().String())
			}
			if strings.Join(got, ",") != strings.Join(tc.want, ",") || strings.Join(gws, ",") != strings.Join(tc.gw, ",") {
				t.Errorf("pod CIDRs %v gateways %v, want %v %v", got, gws, tc.want, tc.gw)
			}
		})
	}
}

func TestParseConfigRejects(t *testing.T) {
	cases := []struct {
		name, conf string
		code       uint
		names      []string
	}{
		{"malformed", `{"name":`, types.ErrDecodingFailure, nil},
		{"no name", `{"cniVersion":"1.0.0","podCIDRs":["10.0.0.0/24"]}`, types.ErrInvalidNetworkConfig, []string{"name"}},
		{"no CIDR", `{"name":"n"}`, types.ErrInvalidNetworkConfig, []string{"podCIDRs"}},
		{"host bits", `{"name":"n","podCIDRs":["10.0.0.7/24"]}`, types.ErrInvalidNetworkConfig, []string{"podCIDRs", "10.0.0.7/24", "10.0.0.0/24"}},
		{"three CIDRs", `{"name":"n","podCIDRs":["10.0.0.0/24","fd00::/64","10.1.0.0/24"]}`, types.ErrInvalidNetworkConfig, []string{"podCIDRs"}},
		{"two IPv6", `{"name":"n","podCIDRs":["fd00::/64","fd01::/64"]}`, types.ErrInvalidNetworkConfig, []string{"podCIDRs", "fd01::/64"}},
		{"/32", `{"name":"n","podCIDRs":["10.0.0.0/32"]}`, types.ErrInvalidNetworkConfig, []string{"10.0.0.0/32"}},
		{"/127", `{"name":"n","podCIDRs":["fd00::/127"]}`, types.ErrInvalidNetworkConfig, []string{"fd00::/127"}},
		{"mtu too small", `{"name":"n","podCIDRs":["10.0.0.0/24"],"mtu":100}`, types.ErrInvalidNetworkConfig, []string{"mtu", "100"}},
		{"mtu wrong type", `{"name":"n","podCIDRs":["10.0.0.0/24"],"mtu":"1500"}`, types.ErrInvalidNetworkConfig, []string{"mtu"}},
		{"podCIDRs wrong type", `{"name":"n","podCIDRs":"10.0.0.0/24"}`, types.ErrInvalidNetworkConfig, []string{"podCIDRs"}},
		{"hairpin", `{"name":"n","podCIDRs":["10.0.0.0/24"],"hairpinMode":"HAIRPIN"}`, types.ErrInvalidNetworkConfig, []string{"hairpinMode", "HAIRPIN"}},
		{"bridge", `{"name":"n","podCIDRs":["10.0.0.0/24"],"bridge":"a b"}`, types.ErrInvalidNetworkConfig, []string{"bridge", "a b"}},
		{"dataDir", `{"name":"n","podCIDRs":["10.0.0.0/24"],"dataDir":"rel"}`, types.ErrInvalidNetworkConfig, []string{"dataDir", "rel"}},
		{"nonMasq", `{"name":"n","podCIDRs":["10.0.0.0/24"],"nonMasqueradeCIDRs":["x"]}`, types.ErrInvalidNetworkConfig, []string{"nonMasqueradeCIDRs", "x"}},
		{"ipRanges gateway outside", `{"name":"n","runtimeConfig":{"ipRanges":[[{"subnet":"10.9.0.0/24","gateway":"10.8.0.1"}]]}}`, types.ErrInvalidNetworkConfig, []string{"gateway", "10.8.0.1"}},
		{"ipRanges start after end", `{"name":"n","runtimeConfig":{"ipRanges":[[{"subnet":"10.9.0.0/24","rangeStart":"10.9.0.9","rangeEnd":"10.9.0.3"}]]}}`, types.ErrInvalidNetworkConfig, []string{"rangeEnd", "10.9.0.3"}},
		{"port 0", `{"name":"n","podCIDRs":["10.0.0.0/24"],"runtimeConfig":{"portMappings":[{"hostPort":0,"containerPort":80}]}}`, types.ErrInvalidNetworkConfig, []string{"hostPort", "0"}},
		{"containerPort too big", `{"name":"n","podCIDRs":["10.0.0.0/24"],"runtimeConfig":{"portMappings":[{"hostPort":80,"containerPort":65536}]}}`, types.ErrInvalidNetworkConfig, []string{"containerPort", "65536"}},
		{"protocol", `{"name":"n","podCIDRs":["10.0.0.0/24"],"runtimeConfig":{"portMappings":[{"hostPort":80,"containerPort":80,"protocol":"gre"}]}}`, types.ErrInvalidNetworkConfig, []string{"protocol", "gre"}},
		{"hostIP", `{"name":"n","podCIDRs":["10.0.0.0/24"],"runtimeConfig":{"portMappings":[{"hostPort":80,"containerPort":80,"hostIP":"1.2.3"}]}}`, types.ErrInvalidNetworkConfig, []string{"hostIP", "1.2.3"}},
		{"hostPort beyond int32", `{"name":"n","podCIDRs":["10.0.0.0/24"],"runtimeConfig":{"portMappings":[{"hostPort":4294967376,"containerPort":80}]}}`, types.ErrInvalidNetworkConfig, []string{"hostPort"}},
		{"logFile relative", `{"name":"n","podCIDRs":["10.0.0.0/24"],"logFile":"kubenet.log"}`, types.ErrInvalidNetworkConfig, []string{"logFile", "kubenet.log"}},
		{"logFile not clean", `{"name":"n","podCIDRs":["10.0.0.0/24"],"logFile":"/var/log/../kubenet.log"}`, types.ErrInvalidNetworkConfig, []string{"logFile"}},
		{"logMaxBytes too small", `{"name":"n","podCIDRs":["10.0.0.0/24"],"logFile":"/var/log/kubenet.log","logMaxBytes":100}`, types.ErrInvalidNetworkConfig, []string{"logMaxBytes", "100"}},
		{"runtimeConfig not an object", `{"name":"n","podCIDRs":["10.0.0.0/24"],"runtimeConfig":"ports"}`, types.ErrInvalidNetworkConfig, []string{"runtimeConfig", "string"}},
		{"hostPort wrong type", `{"name":"n","podCIDRs":["10.0.0.0/24"],"runtimeConfig":{"portMappings":[{"hostPort":"80","containerPort":80}]}}`, types.ErrInvalidNetworkConfig, []string{"runtimeConfig.portMappings.hostPort", "string"}},
		{"bandwidth wrong type", `{"name":"n","podCIDRs":["10.0.0.0/24"],"runtimeConfig":{"bandwidth":{"ingressRate":true}}}`, types.ErrInvalidNetworkConfig, []string{"runtimeConfig.bandwidth.ingressRate", "bool"}},
		{"prevResult not an object", `{"name":"n","podCIDRs":["10.0.0.0/24"],"prevResult":[1]}`, types.ErrInvalidNetworkConfig, []string{"prevResult", "array"}},
		{"prevResult malformed", `{"cniVersion":"1.0.0","name":"n","podCIDRs":["10.0.0.0/24"],"prevResult":{"cniVersion":"1.0.0","ips":"x"}}`, types.ErrDecodingFailure, []string{"prevResult"}},
		{"logMaxBytes negative", `{"name":"n","podCIDRs":["10.0.0.0/24"],"logMaxBytes":-1}`, types.ErrInvalidNetworkConfig, []string{"logMaxBytes", "-1"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(tc.conf))
			var e *types.Error
			if !errors.As(err, &e) {
				t.Fatalf("got %v, want a CNI error", err)
			}
			if e.Code != tc.code {
				t.Errorf("code %d, want %d (%s)", e.Code, tc.code, e.Msg)
			}
			for _, n := range tc.names {
				if !strings.Contains(e.Msg, n) {
					t.Errorf("message %q does not name %q", e.Msg, n)
				}
			}
		})
	}
}

func TestPortMappingNormalisation(t *testing.T) {
	cfg, err := ParseConfig([]byte(`{"name":"n","podCIDRs":["10.0.0.0/24"],"runtimeConfig":{"portMappings":[
		{"HostPort":8080,"ContainerPort":80,"Protocol":"UDP","HostIP":"::ffff:10.1.2.3"},
		{"hostPort":8443,"containerPort":443}]}}`))
	if err != nil {
		t.Fatal(err)
	}
	got := cfg.Runtime.PortMappings
	want := []PortMapping{{8080, 80, "udp", "10.1.2.3"}, {8443, 443, "tcp", ""}}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("port mappings %+v, want %+v", got, want)
	}
}

func TestNamesFor(t *testing.T) {
	a := NamesFor("kubenet", Attachment{ContainerID: "abc", IfName: "eth0"})
	b := NamesFor("kubenet", Attachment{ContainerID: "abc", IfName: "eth1"})
	c := NamesFor("other", Attachment{ContainerID: "abc", IfName: "eth0"})
	if a == b || a == c {
		t.Errorf("names collide across interfaces or networks: %v %v %v", a, b, c)
	}
	if again := NamesFor("kubenet", Attachment{ContainerID: "abc", IfName: "eth0", NetNS: "/x"}); again != a {
		t.Errorf("names depend on the netns: %v vs %v", again, a)
	}
	for _, n := range []string{a.HostVeth, a.IFB, b.HostVeth, b.IFB, c.HostVeth, c.IFB} {
		if len(n) > 15 {
			t.Errorf("%q is longer than an interface name may be", n)
		}
		if !isAttachmentLinkName(n) {
			t.Errorf("%q is not recognised as a name NamesFor gives", n)
		}
	}
}
