package cni

import (
	"encoding/json"
	"net/netip"
	"strings"
	"testing"

	"github.com/kubenet-dev/kubenet/network"
)

// TestCapabilityArgs checks the runtimeConfig a pod gets, as JSON a plugin would read.
func TestCapabilityArgs(t *testing.T) {
	dual := []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd00:10:244:1::/64")}
	cases := []struct {
		name        string
		pms         []*network.PortMapping
		annotations map[string]string
		cidrs       []netip.Prefix
		want        string
		wantErr     string
	}{
		{name: "nothing: an empty portMappings list only", want: `{"portMappings":[]}`},
		{
			name: "port mappings: protocol lower case, TCP default, no hostPort skipped",
			pms: []*network.PortMapping{
				{HostPort: 80, ContainerPort: 8080, Protocol: "TCP"},
				{HostPort: 53, ContainerPort: 53, Protocol: "UDP", HostIP: "10.0.0.1"},
				{HostPort: 0, ContainerPort: 9090},
				{HostPort: 443, ContainerPort: 443},
			},
			want: `{"portMappings":[{"hostPort":80,"containerPort":8080,"protocol":"tcp"},{"hostPort":53,"containerPort":53,"protocol":"udp","hostIP":"10.0.0.1"},{"hostPort":443,"containerPort":443,"protocol":"tcp"}]}`,
		},
		{
			name:    "a bad mapping is refused before any plugin runs, naming it",
			pms:     []*network.PortMapping{{HostPort: 80, ContainerPort: 80}, {HostPort: 81, ContainerPort: 81, Protocol: "icmp"}},
			wantErr: `runtimeConfig.portMappings[1].protocol "icmp"`,
		},
		{
			name: "hostIP in canonical form, as the kubenet binary keys it",
			pms:  []*network.PortMapping{{HostPort: 80, ContainerPort: 80, HostIP: "::ffff:10.0.0.1"}},
			want: `{"portMappings":[{"hostPort":80,"containerPort":80,"protocol":"tcp","hostIP":"10.0.0.1"}]}`,
		},
		{
			name:  "dual-stack pod CIDR: one range set per family",
			cidrs: dual,
			want:  `{"ipRanges":[[{"subnet":"10.244.1.0/24"}],[{"subnet":"fd00:10:244:1::/64"}]],"portMappings":[]}`,
		},
		{
			name:        "bandwidth annotations: bit/s, containerd's default burst, annotations passed on",
			annotations: map[string]string{"kubernetes.io/ingress-bandwidth": "10M", "kubernetes.io/egress-bandwidth": "1k"},
			want:        `{"bandwidth":{"ingressRate":10000000,"ingressBurst":4294967295,"egressRate":1000,"egressBurst":4294967295},"io.kubernetes.cri.pod-annotations":{"kubernetes.io/egress-bandwidth":"1k","kubernetes.io/ingress-bandwidth":"10M"},"portMappings":[]}`,
		},
		{
			name:        "other annotations: no bandwidth",
			annotations: map[string]string{"team": "net"},
			want:        `{"io.kubernetes.cri.pod-annotations":{"team":"net"},"portMappings":[]}`,
		},
		{
			name:        "invalid bandwidth annotation",
			annotations: map[string]string{"kubernetes.io/ingress-bandwidth": "lots"},
			wantErr:     "kubernetes.io/ingress-bandwidth",
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			caps, err := capabilityArgs(c.pms, c.annotations, c.cidrs)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("error %v, want one naming %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got, err := json.Marshal(caps)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != c.want {
				t.Errorf("runtimeConfig\n got %s\nwant %s", got, c.want)
			}
		})
	}
}

// TestPodCIDREvent: the event's CIDRs become IPv4-first ranges; invalid ones leave the last good
// ones in place.
func TestPodCIDREvent(t *testing.T) {
	p := New(Options{ConfDir: t.TempDir()})
	send := func(s string) {
		p.Event(network.PodCIDRChangeEvent, map[string]interface{}{network.PodCIDRChangeDetailCIDR: s})
	}
	for _, c := range []struct{ send, want string }{
		{"fd00:10:244:1::/64, 10.244.1.0/24", "[10.244.1.0/24 fd00:10:244:1::/64]"},
		{"10.244.1.5/24", "[10.244.1.0/24 fd00:10:244:1::/64]"},               // host bits: ignored
		{"10.244.2.0/24,10.244.3.0/24", "[10.244.1.0/24 fd00:10:244:1::/64]"}, // two IPv4: ignored
		{"10.244.9.0/24", "[10.244.9.0/24]"},
	} {
		send(c.send)
		p.mu.Lock()
		got := fmtPrefixes(p.podCIDRs)
		p.mu.Unlock()
		if got != c.want {
			t.Errorf("after %q: pod CIDRs %s, want %s", c.send, got, c.want)
		}
	}
}

func fmtPrefixes(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return "[" + strings.Join(s, " ") + "]"
}

// TestAddDNS: SetUpPod's options["dns"] (the CRI DNSConfig as JSON) becomes the dns capability
// with CNI's key names; a malformed one is refused, naming it.
func TestAddDNS(t *testing.T) {
	for _, c := range []struct {
		name, option string
		none         bool // no "dns" option at all
		want         string
		wantErr      string
	}{
		{name: "no option", none: true, want: `{}`},
		{name: "full", option: `{"servers":["10.96.0.10","fd00:96::a"],"searches":["default.svc.cluster.local","svc.cluster.local"],"options":["ndots:5"]}`,
			want: `{"dns":{"servers":["10.96.0.10","fd00:96::a"],"searches":["default.svc.cluster.local","svc.cluster.local"],"options":["ndots:5"]}}`},
		{name: "empty config adds nothing", option: `{}`, want: `{}`},
		{name: "not JSON", option: `nameserver 10.96.0.10`, wantErr: `option dns "nameserver 10.96.0.10"`},
		{name: "server not an address", option: `{"servers":["kube-dns"]}`, wantErr: `server "kube-dns" is not an IP address`},
	} {
		t.Run(c.name, func(t *testing.T) {
			options := map[string]string{"dns": c.option}
			if c.none {
				options = nil
			}
			caps := map[string]interface{}{}
			err := addDNS(caps, options)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("error %v, want %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got, _ := json.Marshal(caps); string(got) != c.want {
				t.Errorf("capabilities %s, want %s", got, c.want)
			}
		})
	}
}
