package test

import (
	"net/netip"
	"testing"
	"time"

	"github.com/kubenet-dev/kubenet/internal/nettest"
)

func TestSmoke(t *testing.T) {
	node := nettest.NewNode(t, binDir)
	list := node.ConfList(t, nettest.NetConf{
		PodCIDRs:           []netip.Prefix{nettest.PodCIDR4, nettest.PodCIDR6},
		NonMasqueradeCIDRs: []netip.Prefix{nettest.NonMasquerade4, nettest.NonMasquerade6},
	})
	a := node.NewPod(t, "pod-a")
	b := node.NewPod(t, "pod-b")
	node.MustAdd(t, list, a)
	node.MustAdd(t, list, b)
	t.Logf("a=%v b=%v", a.IPs(), b.IPs())
	for _, ip := range b.IPs() {
		srv := nettest.StartTCPEcho(t, b.NS, netip.AddrPortFrom(ip, 8080))
		r, err := nettest.TCPRequest(a.NS, srv.Addr, "hi", 5*time.Second)
		t.Logf("to %s: %+v %v", srv.Addr, r, err)
	}
	ext := nettest.StartTCPEcho(t, node.External, netip.AddrPortFrom(nettest.External4.Addr(), 9000))
	r, err := nettest.TCPRequest(a.NS, ext.Addr, "out", 5*time.Second)
	t.Logf("ext: %+v %v", r, err)
}
