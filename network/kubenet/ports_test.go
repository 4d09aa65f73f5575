package kubenet

import (
	"slices"
	"testing"

	"github.com/kubenet-dev/kubenet/core"
)

func TestPortKeys(t *testing.T) {
	v4, v6, dual := []bool{false}, []bool{true}, []bool{false, true}
	cases := []struct {
		name     string
		mappings []core.PortMapping
		families []bool
		want     []string
	}{
		{"any address, IPv4 pod", []core.PortMapping{{HostPort: 80, Protocol: "tcp"}}, v4, []string{"tcp/0.0.0.0:80"}},
		{"any address, IPv6 pod", []core.PortMapping{{HostPort: 80, Protocol: "tcp"}}, v6, []string{"tcp/[::]:80"}},
		{"any address, dual-stack pod, both protocols", []core.PortMapping{{HostPort: 53, Protocol: "udp"}, {HostPort: 53, Protocol: "tcp"}}, dual,
			[]string{"tcp/0.0.0.0:53", "tcp/[::]:53", "udp/0.0.0.0:53", "udp/[::]:53"}},
		{"hostIP: that address only", []core.PortMapping{{HostPort: 80, Protocol: "tcp", HostIP: "198.18.0.1"}}, dual, []string{"tcp/198.18.0.1:80"}},
		{"unspecified hostIP means any", []core.PortMapping{{HostPort: 80, Protocol: "tcp", HostIP: "::"}}, v6, []string{"tcp/[::]:80"}},
		{"SCTP is not held", []core.PortMapping{{HostPort: 9, Protocol: "sctp"}}, dual, nil},
		{"empty protocol is TCP, duplicates once", []core.PortMapping{{HostPort: 8080}, {HostPort: 8080, Protocol: "tcp"}}, v4, []string{"tcp/0.0.0.0:8080"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var got []string
			for _, k := range portKeys(c.mappings, c.families) {
				got = append(got, k.String())
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("keys %v, want %v", got, c.want)
			}
		})
	}
}
