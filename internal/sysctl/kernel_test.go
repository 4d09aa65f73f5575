package sysctl

import (
	"os"
	"strings"
	"testing"

	"github.com/kubenet-dev/kubenet/test/nettest"
)

// TestSetAndEnsure: in a new network namespace both ways leave every value as asked, whatever it
// was (accept_ra starts at 1, addr_gen_mode at the kernel's default), and a setting that does
// not exist is an error IsAbsent recognises, with nothing written.
func TestSetAndEnsure(t *testing.T) {
	cases := []struct {
		name  string
		apply func(string, [][2]string) error
	}{
		{"SetIn", SetIn},
		{"EnsureIn", EnsureIn},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			n := nettest.NewNS(t)
			nettest.Do(t, n, func() error {
				values := [][2]string{{"accept_ra", "0"}, {"addr_gen_mode", "1"}, {"hop_limit", "63"}}
				if err := c.apply("net/ipv6/conf/default", values); err != nil {
					t.Fatalf("%s: %v", c.name, err)
				}
				for _, kv := range values {
					b, err := os.ReadFile("/proc/sys/net/ipv6/conf/default/" + kv[0])
					if got := strings.TrimSpace(string(b)); err != nil || got != kv[1] {
						t.Errorf("%s = %q (%v), want %s", kv[0], got, err, kv[1])
					}
				}
				err := c.apply("net/ipv6/conf/default", [][2]string{{"no_such_setting", "1"}})
				if !IsAbsent(err) {
					t.Errorf("a missing setting: %v, want an absent error", err)
				}
				return nil
			})
		})
	}
}
