package e2e

import (
	"fmt"
	"slices"
	"testing"
)

// These run in `go test ./...` (no build tag, no root), like kube_unit_test.go's.

func TestTopologyFor(t *testing.T) {
	cases := []struct {
		spec, mode string
		want       KubeTopology
		wantErr    bool
	}{
		{"", "iptables", TopologyOneLink, false},
		{"one-link", "nftables", TopologyOneLink, false},
		{"two-subnets", "iptables", TopologyTwoSubnets, false},
		{"nftables=two-subnets", "nftables", TopologyTwoSubnets, false},
		{"nftables=two-subnets", "iptables", TopologyOneLink, false},
		{"iptables=one-link, nftables=two-subnets", "nftables", TopologyTwoSubnets, false},
		{"three-subnets", "iptables", "", true},
		{"nftables=two-subnets,iptables", "nftables", "", true},
		{"iptables=ring", "nftables", "", true}, // every item is checked, not only the mode's
	}
	for _, c := range cases {
		got, err := TopologyFor(c.spec, c.mode)
		if (err != nil) != c.wantErr || got != c.want {
			t.Errorf("TopologyFor(%q, %q) = %q, %v; want %q, error %v", c.spec, c.mode, got, err, c.want, c.wantErr)
		}
	}
}

func TestTopologyAddresses(t *testing.T) {
	hosts := func(k KubeTopology, dual bool) []string {
		out := []string{fmt.Sprint(kubeHostAddrs(0, 10, dual))}
		for i := 1; i <= 3; i++ {
			out = append(out, fmt.Sprint(kubeHostAddrs(k.nodeSubnet(i), 10+i, dual)))
		}
		return out
	}
	for _, c := range []struct {
		k    KubeTopology
		dual bool
		want []string
	}{
		{TopologyOneLink, false, []string{"[10.250.0.10/24]", "[10.250.0.11/24]", "[10.250.0.12/24]", "[10.250.0.13/24]"}},
		{"", false, []string{"[10.250.0.10/24]", "[10.250.0.11/24]", "[10.250.0.12/24]", "[10.250.0.13/24]"}},
		{TopologyTwoSubnets, false, []string{"[10.250.0.10/24]", "[10.250.0.11/24]", "[10.250.1.12/24]", "[10.250.0.13/24]"}},
		{TopologyTwoSubnets, true, []string{"[10.250.0.10/24 fd00:250::a/64]", "[10.250.0.11/24 fd00:250::b/64]",
			"[10.250.1.12/24 fd00:250:1::c/64]", "[10.250.0.13/24 fd00:250::d/64]"}},
	} {
		if got := hosts(c.k, c.dual); !slices.Equal(got, c.want) {
			t.Errorf("%q (dual-stack %v): control plane and nodes at %v, want %v", c.k, c.dual, got, c.want)
		}
	}
}
