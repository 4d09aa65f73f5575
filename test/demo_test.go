package test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/kubenet-dev/kubenet/internal/nettest"
)

// TestDemo is what `make demo` shows: a node namespace with two pods, their addresses, and
// traffic between them and out of the node. It asserts every step it prints, so the demo can
// not show something that does not work; it runs in `make test` too.
func TestDemo(t *testing.T) {
	say := func(format string, args ...any) { fmt.Printf(format+"\n", args...) }
	node := nettest.NewNode(t, binDir)
	say("node: network namespace %s", node.NS.Path())
	say("      uplink %s and %s to an external host %s / %s", nettest.NodeUplink4, nettest.NodeUplink6, nettest.External4.Addr(), nettest.External6.Addr())
	list := node.ConfList(t, nettest.NetConf{
		PodCIDRs:           []netip.Prefix{nettest.PodCIDR4, nettest.PodCIDR6},
		NonMasqueradeCIDRs: []netip.Prefix{nettest.NonMasquerade4, nettest.NonMasquerade6},
	})
	var pretty bytes.Buffer
	_ = json.Indent(&pretty, list.Bytes, "    ", "  ")
	say("conflist (/etc/cni/net.d/10-kubenet.conflist on a real node):\n    %s", pretty.String())

	a, b := node.NewPod(t, "demo-a"), node.NewPod(t, "demo-b")
	for _, p := range []*nettest.Pod{a, b} {
		start := time.Now()
		node.MustAdd(t, list, p)
		say("ADD %s -> %v (%s)", p.RT.ContainerID, p.IPs(), time.Since(start).Round(time.Millisecond))
	}
	say("bridge cbr0: %v", addrs(t, node.NS, "cbr0"))

	for _, ip := range b.IPs() {
		srv := nettest.StartTCPEcho(t, b.NS, netip.AddrPortFrom(ip, 8080))
		r, err := nettest.TCPRequest(a.NS, srv.Addr, "hello", trafficTimeout)
		if err := nettest.ExpectFrom(r, err, a.IP(ip)); err != nil {
			t.Fatalf("pod-to-pod %s: %v", srv.Addr, err)
		}
		say("pod-to-pod   demo-a -> %-24s server saw source %s", srv.Addr, r.From)
	}
	for _, ext := range []netip.Prefix{nettest.External4, nettest.External6} {
		uplink := nettest.NodeUplink4.Addr()
		if ext.Addr().Is6() {
			uplink = nettest.NodeUplink6.Addr()
		}
		srv := nettest.StartTCPEcho(t, node.External, netip.AddrPortFrom(ext.Addr(), 9000))
		r, err := nettest.TCPRequest(a.NS, srv.Addr, "hello", trafficTimeout)
		if err := nettest.ExpectFrom(r, err, uplink); err != nil {
			t.Fatalf("SNAT to %s: %v", srv.Addr, err)
		}
		say("SNAT         demo-a -> %-24s server saw source %s (the node)", srv.Addr, r.From)
	}

	for _, p := range []*nettest.Pod{a, b} {
		if err := node.Del(list, p); err != nil {
			t.Fatalf("DEL %s: %v", p.RT.ContainerID, err)
		}
		assertNoResidue(t, node, "kubenet", attachmentOf(p), p.IPs())
		say("DEL %s: no veth, reservation, record, conntrack or cache entry left", p.RT.ContainerID)
	}
	say("tearing down the node namespaces")
}
