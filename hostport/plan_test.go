package hostport

import (
	"errors"
	"net/netip"
	"slices"
	"testing"
)

var (
	pod4 = netip.MustParseAddr("10.244.1.2")
	pod6 = netip.MustParseAddr("fd00:10:244:1::2")
	any4 = netip.IPv4Unspecified()
	any6 = netip.IPv6Unspecified()
	ip4  = netip.MustParseAddr("198.18.0.1")
	ip6  = netip.MustParseAddr("2001:db8:e::1")
)

func entry(proto string, hostPort uint16, hostIP, podIP netip.Addr, containerPort uint16) Entry {
	return Entry{Key: Key{Protocol: proto, HostPort: hostPort, HostIP: hostIP}, PodIP: podIP, ContainerPort: containerPort}
}

func TestPlan(t *testing.T) {
	dual := []netip.Addr{pod4, pod6}
	cases := []struct {
		name     string
		mappings []Mapping
		podIPs   []netip.Addr
		want     []Entry
		wantErr  bool
	}{
		{
			name:     "no hostIP: every family of the pod",
			mappings: []Mapping{{HostPort: 80, ContainerPort: 8080, Protocol: "tcp"}},
			podIPs:   dual,
			want:     []Entry{entry("tcp", 80, any4, pod4, 8080), entry("tcp", 80, any6, pod6, 8080)},
		},
		{
			name:     "0.0.0.0: any IPv4 address only",
			mappings: []Mapping{{HostPort: 80, ContainerPort: 8080, Protocol: "udp", HostIP: any4}},
			podIPs:   dual,
			want:     []Entry{entry("udp", 80, any4, pod4, 8080)},
		},
		{
			name:     ":: : any IPv6 address only",
			mappings: []Mapping{{HostPort: 80, ContainerPort: 8080, Protocol: "sctp", HostIP: any6}},
			podIPs:   dual,
			want:     []Entry{entry("sctp", 80, any6, pod6, 8080)},
		},
		{
			name:     "hostIP selects the pod address of its family",
			mappings: []Mapping{{HostPort: 80, ContainerPort: 8080, Protocol: "tcp", HostIP: ip6}},
			podIPs:   dual,
			want:     []Entry{entry("tcp", 80, ip6, pod6, 8080)},
		},
		{
			name:     "IPv4-mapped hostIP is IPv4",
			mappings: []Mapping{{HostPort: 80, ContainerPort: 8080, Protocol: "tcp", HostIP: netip.MustParseAddr("::ffff:198.18.0.1")}},
			podIPs:   dual,
			want:     []Entry{entry("tcp", 80, ip4, pod4, 8080)},
		},
		{
			name:     "hostIP of a family the pod lacks: skipped",
			mappings: []Mapping{{HostPort: 80, ContainerPort: 8080, Protocol: "tcp", HostIP: ip6}},
			podIPs:   []netip.Addr{pod4},
			want:     nil,
		},
		{
			name: "identical mappings merge, and the result is sorted",
			mappings: []Mapping{
				{HostPort: 90, ContainerPort: 9090, Protocol: "udp"},
				{HostPort: 80, ContainerPort: 8080, Protocol: "tcp", HostIP: ip4},
				{HostPort: 80, ContainerPort: 8080, Protocol: "tcp", HostIP: ip4},
			},
			podIPs: []netip.Addr{pod4},
			want:   []Entry{entry("udp", 90, any4, pod4, 9090), entry("tcp", 80, ip4, pod4, 8080)},
		},
		{
			name: "wildcard and hostIP of one pod may overlap (the hostIP one wins in the kernel)",
			mappings: []Mapping{
				{HostPort: 80, ContainerPort: 8080, Protocol: "tcp"},
				{HostPort: 80, ContainerPort: 8081, Protocol: "tcp", HostIP: ip4},
			},
			podIPs: []netip.Addr{pod4},
			want:   []Entry{entry("tcp", 80, any4, pod4, 8080), entry("tcp", 80, ip4, pod4, 8081)},
		},
		{
			name: "one key, two destinations",
			mappings: []Mapping{
				{HostPort: 80, ContainerPort: 8080, Protocol: "tcp"},
				{HostPort: 80, ContainerPort: 8081, Protocol: "tcp", HostIP: any6},
			},
			podIPs:  dual,
			wantErr: true,
		},
		{
			name:     "unknown protocol",
			mappings: []Mapping{{HostPort: 80, ContainerPort: 8080, Protocol: "dccp"}},
			podIPs:   dual,
			wantErr:  true,
		},
		{
			name:     "port 0",
			mappings: []Mapping{{HostPort: 0, ContainerPort: 8080, Protocol: "tcp"}},
			podIPs:   dual,
			wantErr:  true,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Plan(tc.mappings, tc.podIPs)
			if tc.wantErr {
				if err == nil {
					t.Fatalf("Plan = %v, want an error", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("Plan =\n %v\nwant\n %v", got, tc.want)
			}
		})
	}
}

func TestPlanDuplicateError(t *testing.T) {
	_, err := Plan([]Mapping{
		{HostPort: 80, ContainerPort: 8080, Protocol: "tcp"},
		{HostPort: 80, ContainerPort: 8081, Protocol: "tcp"},
	}, []netip.Addr{pod4})
	var dup *DuplicateError
	if !errors.As(err, &dup) || dup.Key != (Key{"tcp", 80, any4}) || dup.First.Port() != 8080 || dup.Second.Port() != 8081 {
		t.Errorf("error %v, want a DuplicateError for tcp/80 naming both destinations", err)
	}
}

// Keys is the superset DEL works from when it knows the mappings but not the pod's addresses.
func TestKeys(t *testing.T) {
	mappings := []Mapping{
		{HostPort: 80, ContainerPort: 8080, Protocol: "tcp"},
		{HostPort: 53, ContainerPort: 53, Protocol: "udp", HostIP: ip4},
		{HostPort: 53, ContainerPort: 53, Protocol: "udp", HostIP: ip4},
	}
	got := Keys(mappings, []bool{false, true, false})
	want := []Key{{"tcp", 80, any4}, {"udp", 53, ip4}, {"tcp", 80, any6}}
	slices.SortFunc(want, compareKeys)
	if !slices.Equal(got, want) {
		t.Errorf("Keys = %v, want %v", got, want)
	}
	// Every key Plan makes for any pod of those families is among Keys.
	entries, err := Plan(mappings, []netip.Addr{pod4, pod6})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range KeysOf(entries) {
		if !slices.Contains(got, k) {
			t.Errorf("Plan's key %v missing from Keys", k)
		}
	}
}

func TestKeyOverlaps(t *testing.T) {
	cases := []struct {
		a, b Key
		want bool
	}{
		{Key{"tcp", 80, any4}, Key{"tcp", 80, any4}, true},
		{Key{"tcp", 80, any4}, Key{"tcp", 80, ip4}, true},
		{Key{"tcp", 80, ip4}, Key{"tcp", 80, any4}, true},
		{Key{"tcp", 80, ip4}, Key{"tcp", 80, ip4}, true},
		{Key{"tcp", 80, ip4}, Key{"tcp", 80, netip.MustParseAddr("10.200.0.1")}, false},
		{Key{"tcp", 80, any4}, Key{"udp", 80, any4}, false},
		{Key{"tcp", 80, any4}, Key{"tcp", 81, any4}, false},
		{Key{"tcp", 80, any4}, Key{"tcp", 80, any6}, false},
		{Key{"tcp", 80, any4}, Key{"tcp", 80, ip6}, false},
		{Key{"tcp", 80, any6}, Key{"tcp", 80, ip6}, true},
	}
	for _, tc := range cases {
		if got := tc.a.overlaps(tc.b); got != tc.want {
			t.Errorf("%v overlaps %v = %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
}
