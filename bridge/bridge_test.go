package bridge

import (
	"net/netip"
	"testing"
)

func TestMAC(t *testing.T) {
	for _, c := range []struct {
		gateways []string
		want     string
	}{
		{[]string{"10.244.1.1/24"}, "0a:58:0a:f4:01:01"},
		{[]string{"fd00:10:244:1::1/64", "10.244.1.1/24"}, "0a:58:00:00:00:01"}, // the first gateway's last four bytes
		{nil, "0a:58:00:00:00:00"},
	} {
		var gws []netip.Prefix
		for _, g := range c.gateways {
			gws = append(gws, netip.MustParsePrefix(g))
		}
		if got := MAC(gws).String(); got != c.want {
			t.Errorf("MAC(%v) = %s, want %s", c.gateways, got, c.want)
		}
	}
}
