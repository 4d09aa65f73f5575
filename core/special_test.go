package core

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/kubenet-dev/kubenet/internal/ipnet"
)

// TestPodCIDRInEverySpecialRange: every range of the one list the agent checks Node pod CIDRs
// against is refused in the plugin's own podCIDRs too, with the range and its reason named; and
// so are the narrow ranges the agent's list used to spell out (::1, ::).
func TestPodCIDRInEverySpecialRange(t *testing.T) {
	type refusal struct{ cidr, names string }
	var cases []refusal
	for _, r := range ipnet.SpecialRanges() {
		cases = append(cases, refusal{r.Prefix.String(), r.Prefix.String() + ", which is " + r.What})
	}
	cases = append(cases,
		refusal{"::1/128", "::/96"},
		refusal{"::/128", "::/96"},
		refusal{"64:ff9b:1:ff::/64", "64:ff9b:1::/48, which is the local-use NAT64 prefix"},
		refusal{"::ffff:0:a00:0/120", "::ffff:0:0:0/96, which is IPv4-translated addresses"},
	)
	for _, tc := range cases {
		t.Run(tc.cidr, func(t *testing.T) {
			_, err := ParseConfig(conf(fmt.Sprintf(`"podCIDRs":[%q]`, tc.cidr)))
			var e *types.Error
			if !errors.As(err, &e) || e.Code != types.ErrInvalidNetworkConfig {
				t.Fatalf("got %v, want a code 7 error", err)
			}
			if !strings.Contains(e.Msg, "podCIDRs") || !strings.Contains(e.Msg, tc.names) {
				t.Errorf("message %q does not name podCIDRs and %q", e.Msg, tc.names)
			}
		})
	}
}
