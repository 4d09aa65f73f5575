package kubenet

import (
	"slices"
	"strings"
	"testing"

	"github.com/kubenet-dev/kubenet/core"
)

// TestPortKeys: the sockets held for a pod's host ports are exactly where its DNAT entries steer
// traffic (the core's keys), including the two cases an earlier copy of the key logic got wrong:
// a hostIP of a family the pod lacks (no entry, so no socket), and an explicit 0.0.0.0 or :: on a
// dual-stack pod (an entry of that family only, so no socket on the other).
func TestPortKeys(t *testing.T) {
	v4, v6, dual := []bool{false}, []bool{true}, []bool{false, true}
	cases := []struct {
		name     string
		mappings []core.PortMapping
		families []bool
		want     []string
		wantErr  string
	}{
		{"any address, IPv4 pod", []core.PortMapping{{HostPort: 80, ContainerPort: 80, Protocol: "tcp"}}, v4, []string{"tcp/0.0.0.0:80"}, ""},
		{"any address, IPv6 pod", []core.PortMapping{{HostPort: 80, ContainerPort: 80, Protocol: "tcp"}}, v6, []string{"tcp/[::]:80"}, ""},
		{"any address, dual-stack pod, both protocols", []core.PortMapping{{HostPort: 53, ContainerPort: 53, Protocol: "udp"}, {HostPort: 53, ContainerPort: 53, Protocol: "tcp"}}, dual,
			[]string{"tcp/0.0.0.0:53", "tcp/[::]:53", "udp/0.0.0.0:53", "udp/[::]:53"}, ""},
		{"hostIP: that address only", []core.PortMapping{{HostPort: 80, ContainerPort: 80, Protocol: "tcp", HostIP: "198.18.0.1"}}, dual, []string{"tcp/198.18.0.1:80"}, ""},
		{"IPv4 hostIP on an IPv6-only pod: nothing", []core.PortMapping{{HostPort: 80, ContainerPort: 80, HostIP: "198.18.0.1"}}, v6, nil, ""},
		{"IPv6 hostIP on an IPv4-only pod: nothing", []core.PortMapping{{HostPort: 80, ContainerPort: 80, HostIP: "2001:db8::1"}}, v4, nil, ""},
		{"explicit 0.0.0.0 on a dual-stack pod: IPv4 only", []core.PortMapping{{HostPort: 80, ContainerPort: 80, HostIP: "0.0.0.0"}}, dual, []string{"tcp/0.0.0.0:80"}, ""},
		{"explicit :: on a dual-stack pod: IPv6 only", []core.PortMapping{{HostPort: 80, ContainerPort: 80, HostIP: "::"}}, dual, []string{"tcp/[::]:80"}, ""},
		{"IPv4-mapped hostIP is IPv4", []core.PortMapping{{HostPort: 80, ContainerPort: 80, HostIP: "::ffff:198.18.0.1"}}, dual, []string{"tcp/198.18.0.1:80"}, ""},
		{"SCTP is not held", []core.PortMapping{{HostPort: 9, ContainerPort: 9, Protocol: "sctp"}}, dual, nil, ""},
		{"protocol in capitals, empty is TCP, duplicates once", []core.PortMapping{{HostPort: 8080, ContainerPort: 80}, {HostPort: 8080, ContainerPort: 80, Protocol: "TCP"}, {HostPort: 8081, ContainerPort: 81, Protocol: "UDP"}}, v4,
			[]string{"tcp/0.0.0.0:8080", "udp/0.0.0.0:8081"}, ""},
		{"bad protocol is refused, naming the entry", []core.PortMapping{{HostPort: 80, ContainerPort: 80}, {HostPort: 80, ContainerPort: 80, Protocol: "icmp"}}, v4, nil, "portMappings[1].protocol"},
		{"bad hostIP is refused", []core.PortMapping{{HostPort: 80, ContainerPort: 80, HostIP: "node"}}, v4, nil, "portMappings[0].hostIP"},
		{"port out of range is refused", []core.PortMapping{{HostPort: 70000, ContainerPort: 80}}, v4, nil, "portMappings[0].hostPort"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			keys, err := portKeys(c.mappings, c.families)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("error %v, want one naming %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, k := range keys {
				got = append(got, k.String())
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("keys %v, want %v", got, c.want)
			}
		})
	}
}
