package ipt

import (
	"os/exec"
	"testing"

	"github.com/kubenet-dev/kubenet/test/nettest"
)

// TestMayHaveTable: a new namespace has no nat table of either family, and MayHaveTable says so;
// a chain made in one family's nat table, by iptables-nft or by iptables-legacy, makes it say
// maybe for that family only. The bridge family, which it cannot tell, is always maybe.
func TestMayHaveTable(t *testing.T) {
	cases := []struct {
		name   string
		tool   string // makes a chain in its nat table; "" makes nothing
		v4, v6 bool
	}{
		{"nothing made", "", false, false},
		{"iptables-nft", "iptables-nft", true, false},
		{"ip6tables-nft", "ip6tables-nft", false, true},
		{"iptables-legacy", "iptables-legacy", true, false},
		{"ip6tables-legacy", "ip6tables-legacy", false, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			n := nettest.NewNS(t)
			nettest.Do(t, n, func() error {
				if c.tool != "" {
					if out, err := exec.Command(c.tool, "-t", "nat", "-N", "KUBENET-TEST").CombinedOutput(); err != nil {
						t.Fatalf("%s: %v: %s", c.tool, err, out)
					}
				}
				if got := IPv4.MayHaveTable("nat"); got != c.v4 {
					t.Errorf("IPv4 nat: %v, want %v", got, c.v4)
				}
				if got := IPv6.MayHaveTable("nat"); got != c.v6 {
					t.Errorf("IPv6 nat: %v, want %v", got, c.v6)
				}
				if !Bridge.MayHaveTable("nat") {
					t.Error("bridge nat: false, want maybe")
				}
				return nil
			})
		})
	}
}
