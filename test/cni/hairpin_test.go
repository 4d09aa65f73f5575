package cni

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/kubenet-dev/kubenet/test/testkit"

	"github.com/kubenet-dev/kubenet/hairpin"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

// Service addresses the tests' kube-proxy stand-in translates to pods.
var (
	serviceIP4 = netip.MustParseAddr("10.96.0.10")
	serviceIP6 = netip.MustParseAddr("fd00:96::10")
)

// installService emulates kube-proxy in iptables mode on the node: DNAT of svc:port to the pod,
// and the hairpin masquerade kube-proxy adds for traffic from a pod to itself.
func installService(t *testing.T, node *nettest.Node, svc netip.Addr, proto string, port uint16, pod netip.AddrPort) {
	t.Helper()
	ipt := "iptables"
	if svc.Is6() {
		ipt = "ip6tables"
	}
	nettest.Run(t, node.NS, ipt, "-t", "nat", "-A", "PREROUTING", "-d", svc.String(), "-p", proto,
		"--dport", fmt.Sprint(port), "-j", "DNAT", "--to-destination", pod.String())
	nettest.Run(t, node.NS, ipt, "-t", "nat", "-A", "POSTROUTING", "-s", pod.Addr().String(), "-d", pod.Addr().String(),
		"-j", "MASQUERADE")
}

// TestHairpinModes checks that a pod reaches itself through a service address in hairpin-veth and
// promiscuous-bridge mode and not in none, for both families.
func TestHairpinModes(t *testing.T) {
	for _, mode := range []string{"hairpin-veth", "promiscuous-bridge", "none"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			node := nettest.NewNode(t, binDir)
			list := node.ConfList(t, nettest.NetConf{
				PodCIDRs:    []netip.Prefix{nettest.PodCIDR4, nettest.PodCIDR6},
				HairpinMode: mode,
			})
			pod := node.NewPod(t, "self")
			node.MustAdd(t, list, pod)
			for _, svc := range []netip.Addr{serviceIP4, serviceIP6} {
				ip := pod.IP(svc)
				srv := nettest.StartTCPEcho(t, pod.NS, netip.AddrPortFrom(ip, 8080))
				installService(t, node, svc, "tcp", 80, srv.Addr)
				r, err := nettest.TCPRequest(pod.NS, netip.AddrPortFrom(svc, 80), "self", testkit.UnreachableTimeout*2)
				switch {
				case mode == "none" && err == nil:
					t.Errorf("%s: pod reached itself through service %s without hairpin (server saw %s)", mode, svc, r.From)
				case mode != "none" && err != nil:
					t.Errorf("%s: pod cannot reach itself through service %s: %v", mode, svc, err)
				}
			}
			br := testkit.Link(t, node.NS, "cbr0")
			if promisc := br.Attrs().Promisc != 0; promisc != (mode == "promiscuous-bridge") {
				t.Errorf("cbr0 promiscuous=%v in mode %s", promisc, mode)
			}
			// The bridge table also holds the isolation chains, in every mode.
			rules, err := nettest.Output(node.NS, "nft", "list", "chain", "bridge", "kubenet-kubenet", hairpin.DedupChain)
			if hasDedup := err == nil && testkit.ContainsAll(rules, "drop"); hasDedup != (mode == "promiscuous-bridge") {
				t.Errorf("dedup rules present=%v in mode %s:\n%s", hasDedup, mode, rules)
			}
		})
	}
}

// TestPromiscuousNoDuplicates sends datagrams from one pod through a service to another pod and
// to itself on a promiscuous bridge and counts what arrives: every datagram exactly once, with
// either backend. The control cases empty the dedup chain and must see duplicates, which shows
// the count can fail.
func TestPromiscuousNoDuplicates(t *testing.T) {
	for _, backend := range backends {
		for _, tc := range []struct {
			name      string
			dropDedup bool
		}{{"with dedup rules", false}, {"control without dedup rules", true}} {
			t.Run(backend+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				node := nettest.NewNode(t, binDir)
				list := node.ConfList(t, nettest.NetConf{
					PodCIDRs:         []netip.Prefix{nettest.PodCIDR4, nettest.PodCIDR6},
					HairpinMode:      "promiscuous-bridge",
					NetfilterBackend: backend,
				})
				a, b := node.NewPod(t, "dup-a"), node.NewPod(t, "dup-b")
				node.MustAdd(t, list, a)
				node.MustAdd(t, list, b)
				if tc.dropDedup && backend == "nftables" {
					nettest.Run(t, node.NS, "nft", "flush", "chain", "bridge", "kubenet-kubenet", hairpin.DedupChain)
				}
				if tc.dropDedup && backend == "iptables" {
					nettest.Run(t, node.NS, "ebtables", "-t", "filter", "-F", hairpin.EbtablesDedupChain("kubenet"))
				}
				dups := countDuplicates(t, node, a, b)
				if !tc.dropDedup && dups != 0 {
					t.Errorf("%d duplicate datagrams arrived with the dedup rules in place", dups)
				}
				if tc.dropDedup && dups == 0 {
					t.Errorf("no duplicates without the dedup rules: the kernel no longer duplicates, so the test above proves nothing")
				}
			})
		}
	}
}

// countDuplicates sends 20 datagrams from a through a service to each of a and b, for both
// families, and returns how many extra copies arrived.
func countDuplicates(t *testing.T, node *nettest.Node, a, b *nettest.Pod) int {
	t.Helper()
	dups := 0
	for _, svc := range []netip.Addr{serviceIP4, serviceIP6} {
		for i, target := range []*nettest.Pod{a, b} {
			srv := nettest.StartUDPEcho(t, target.NS, netip.AddrPortFrom(target.IP(svc), 0))
			port := uint16(5300 + i)
			installService(t, node, svc, "udp", port, srv.Addr)
			dst := netip.AddrPortFrom(svc, port)
			const n = 20
			for i := range n {
				if _, err := nettest.UDPRequest(a.NS, dst, fmt.Sprintf("d%d", i), testkit.TrafficTimeout); err != nil {
					t.Fatalf("UDP %d to %s via %s: %v", i, target.RT.ContainerID, dst, err)
				}
			}
			// A last datagram on the same path: duplicates of earlier ones would have arrived
			// before its echo came back.
			if _, err := nettest.UDPRequest(a.NS, dst, "marker", testkit.TrafficTimeout); err != nil {
				t.Fatal(err)
			}
			for i := range n {
				dups += srv.Received(fmt.Sprintf("d%d", i)) - 1
			}
		}
	}
	return dups
}
