package cni

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kubenet-dev/kubenet/core"
	"github.com/kubenet-dev/kubenet/isolation"
	"github.com/kubenet-dev/kubenet/test/nettest"
	"github.com/kubenet-dev/kubenet/test/testkit"
)

// The NetworkPolicy attack tests: a pod with CAP_NET_RAW writes raw frames on its interface to
// get past the policies that isolate it, or to reach a pod whose policies deny it. Each case
// first shows, with an allowed sender, that the frame it sends is one the receiver takes, so a
// frame that does not arrive was stopped by the policy, not malformed.

// attackUDPPort is the port of the UDP echo servers the attack tests start on the node and the
// peer host.
const attackUDPPort = 7777

// macOf is a pod's interface MAC, and bridgeMAC the bridge's, from ADD's result.
func macOf(t *testing.T, p *nettest.Pod, i int) net.HardwareAddr {
	t.Helper()
	mac, err := net.ParseMAC(p.Result.Interfaces[i].Mac)
	if err != nil {
		t.Fatal(err)
	}
	return mac
}

// delivered sends frame from the pod's eth0 until the server has seen payload or the timeout
// passes, and says whether it did.
func delivered(t *testing.T, from *nettest.Pod, srv *nettest.EchoServer, payload string, frame []byte, timeout time.Duration) bool {
	t.Helper()
	err := nettest.Eventually(timeout, func() error {
		testkit.SendFrames(t, from.NS, "eth0", frame)
		if srv.Received(payload) == 0 {
			return errors.New("not received")
		}
		return nil
	})
	return err == nil
}

// TestAttackLinkLocalGroupMAC: frames to the IEEE 802.1 reserved group addresses
// (01:80:c2:00:00:0X) are not bridged: the bridge hands them back to its port, the pod's host veth,
// without its prerouting hook (LLDP, 0e) or with only its input hook, and the host veth's own IP
// stack takes what they carry. No policy chain, no anti-spoofing chain and no guard sees them.
// A pod whose egress policy denies everything must still not reach the node or, through the
// node's routing, the hosts behind it.
func TestAttackLinkLocalGroupMAC(t *testing.T) {
	c := newNPCluster(t)
	peer := map[bool]*nettest.EchoServer{}
	for _, is6 := range []bool{false, true} {
		peer[is6] = nettest.StartUDPEcho(t, c.node.Peer, netip.AddrPortFrom(byFamily(is6, nettest.Peer4, nettest.Peer6).Addr(), attackUDPPort))
	}
	clientMAC, bridgeMAC := macOf(t, c.client, 2), macOf(t, c.client, 0)
	denyEgress := policyOf("a", "deny-out", networkingv1.NetworkPolicySpec{PodSelector: *labelSel("app", "client"),
		PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}})
	for _, is6 := range []bool{false, true} {
		src, dst := c.client.IP(byFamily(is6, netip.IPv4Unspecified(), netip.IPv6Unspecified())), peer[is6].Addr.Addr()
		for i, tc := range []struct {
			name    string
			dstMAC  net.HardwareAddr
			policy  []*networkingv1.NetworkPolicy
			arrives bool
		}{
			{"to the gateway, egress open (control)", bridgeMAC, nil, true},
			{"to the gateway, egress denied", bridgeMAC, []*networkingv1.NetworkPolicy{denyEgress}, false},
			{"to LLDP's group address, egress denied", net.HardwareAddr{0x01, 0x80, 0xc2, 0, 0, 0x0e}, []*networkingv1.NetworkPolicy{denyEgress}, false},
			{"to 802.1X's group address, egress denied", net.HardwareAddr{0x01, 0x80, 0xc2, 0, 0, 0x03}, []*networkingv1.NetworkPolicy{denyEgress}, false},
			{"to the bridge group address, egress denied", net.HardwareAddr{0x01, 0x80, 0xc2, 0, 0, 0x00}, []*networkingv1.NetworkPolicy{denyEgress}, false},
		} {
			t.Run(fmt.Sprintf("%s/%s", byFamily(is6, "ipv4", "ipv6"), tc.name), func(t *testing.T) {
				c.apply(t, tc.policy...)
				// Each case its own source port: a flow conntrack knows passes whatever the policies.
				payload := fmt.Sprintf("group-mac-%d", time.Now().UnixNano())
				frame := testkit.IPFrame(tc.dstMAC, clientMAC, testkit.UDPPacket(src, dst, uint16(40000+10*i+byFamily(is6, 0, 1)), attackUDPPort, []byte(payload)))
				timeout := testkit.UnreachableTimeout
				if tc.arrives {
					timeout = testkit.TrafficTimeout
				}
				if got := delivered(t, c.client, peer[is6], payload, frame, timeout); got != tc.arrives {
					t.Errorf("UDP from the client to the peer host %s in a frame to %s: arrived %v, want %v", dst, tc.dstMAC, got, tc.arrives)
				}
			})
		}
	}
}

// TestAttackSpoofedPeerWithoutAntiSpoofing: the server's ingress allows only the pod "other"
// (UDP 5353). The client writes datagrams that carry other's address as their source. The
// policies judge a packet's peer by that address, so what keeps the client from borrowing
// other's rights must hold whatever another tool does to the node's nftables: a deleted bridge
// table of the network (anti-spoofing's chains) or one deleted anti-spoofing element must leave
// the forged datagrams dropped, as the policies fail closed for everything else.
func TestAttackSpoofedPeerWithoutAntiSpoofing(t *testing.T) {
	c := newNPCluster(t)
	clientMAC, serverMAC := macOf(t, c.client, 2), macOf(t, c.server, 2)
	c.apply(t, policyOf("a", "from-other", networkingv1.NetworkPolicySpec{PodSelector: *labelSel("app", "server"),
		PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
		Ingress: []networkingv1.NetworkPolicyIngressRule{{
			From:  []networkingv1.NetworkPolicyPeer{{NamespaceSelector: labelSel("team", "y")}},
			Ports: []networkingv1.NetworkPolicyPort{npPort(corev1.ProtocolUDP, intstr.FromInt32(5353))},
		}}}))
	clientPort := core.NamesFor("kubenet", testkit.AttachmentOf(c.client)).HostVeth
	for _, tc := range []struct {
		name   string
		tamper []string // an nft command run in the node before the forged datagram
	}{
		{"anti-spoofing in place (control)", nil},
		{"the network's bridge table deleted", []string{"delete", "table", "bridge", testkit.HostPortTable}},
		{"the client's anti-spoofing port element deleted", []string{"delete", "element", "bridge", testkit.HostPortTable, isolation.SetAntiSpoofPorts, `{ "` + clientPort + `" }`}},
	} {
		for _, is6 := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/%s", byFamily(is6, "ipv4", "ipv6"), tc.name), func(t *testing.T) {
				like := byFamily(is6, netip.IPv4Unspecified(), netip.IPv6Unspecified())
				srv := netip.AddrPortFrom(c.server.IP(like), 5353)
				// The allowed peer reaches the server: the path and the port are open to it.
				r, err := nettest.UDPRequest(c.other.NS, srv, "honest", testkit.TrafficTimeout)
				if err := nettest.ExpectFrom(r, err, c.other.IP(like)); err != nil {
					t.Fatalf("other to the server: %v", err)
				}
				if tc.tamper != nil {
					nettest.Run(t, c.node.NS, "nft", tc.tamper...)
					// Put anti-spoofing back for the next case, as the agent's healer would.
					t.Cleanup(func() {
						if err := c.node.Check(c.list, c.client); err == nil {
							return
						}
						nettest.Do(t, c.node.NS, func() error {
							_, err := core.HealNode(context.Background(), testkit.PluginConfig(t, c.list), true)
							return err
						})
					})
				}
				payload := fmt.Sprintf("spoofed-%d", time.Now().UnixNano())
				forged := testkit.IPFrame(serverMAC, clientMAC, testkit.UDPPacket(c.other.IP(like), srv.Addr(), 41000, 5353, []byte(payload)))
				if delivered(t, c.client, c.udp5353, payload, forged, testkit.UnreachableTimeout) {
					t.Errorf("the client's datagram forged with other's source %s reached the server", c.other.IP(like))
				}
			})
		}
	}
}

// TestAttackPriorityTaggedToAService: the client's egress allows only the Services' range
// (10.96.0.0/12, fd00:96::/108 here), not the peer host that the node DNATs a Service address to
// (as kube-proxy does for an endpoint elsewhere). An egress policy is judged after that DNAT, so
// the client cannot reach the peer host through the Service. A frame with a priority tag (VLAN 0)
// bypasses br_netfilter, and with it the DNAT before the policy: it must get no egress either,
// with or without the isolation chains that drop tagged frames from pods.
func TestAttackPriorityTaggedToAService(t *testing.T) {
	c := newNPCluster(t)
	clientMAC, bridgeMAC := macOf(t, c.client, 2), macOf(t, c.client, 0)
	vip := map[bool]netip.Addr{false: netip.MustParseAddr("10.96.0.53"), true: netip.MustParseAddr("fd00:96::53")}
	peer := map[bool]*nettest.EchoServer{}
	for _, is6 := range []bool{false, true} {
		peer[is6] = nettest.StartUDPEcho(t, c.node.Peer, netip.AddrPortFrom(byFamily(is6, nettest.Peer4, nettest.Peer6).Addr(), attackUDPPort))
		family := byFamily(is6, "ip", "ip6")
		table := "svc-emu-" + family
		nettest.Run(t, c.node.NS, "nft", "add table "+family+" "+table)
		nettest.Run(t, c.node.NS, "nft", "add chain "+family+" "+table+" pre { type nat hook prerouting priority dstnat; }")
		nettest.Run(t, c.node.NS, "nft", fmt.Sprintf("add rule %s %s pre %s daddr %s udp dport 53 dnat to %s", family, table, family, vip[is6], peer[is6].Addr))
		t.Cleanup(func() { _, _ = nettest.Output(c.node.NS, "nft", "delete", "table", family, table) })
	}
	servicesOnly := policyOf("a", "services-only", networkingv1.NetworkPolicySpec{PodSelector: *labelSel("app", "client"),
		PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
		Egress: []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{
			{IPBlock: &networkingv1.IPBlock{CIDR: "10.96.0.0/12"}}, {IPBlock: &networkingv1.IPBlock{CIDR: "fd00:96::/108"}},
		}}}})
	deleteIsolation := []string{"delete", "table", "bridge", testkit.HostPortTable}
	for i, tc := range []struct {
		name     string
		policies []*networkingv1.NetworkPolicy
		tagged   bool
		tamper   []string
		arrives  bool
	}{
		{"untagged, no policy (control)", nil, false, nil, true},
		// Pods send no tagged frames: a tagged one gets no egress even from a pod that is not
		// isolated. (The same frame reached the peer host before the policy refused tagged
		// frames: it is well-formed.)
		{"priority-tagged, no policy, the network's bridge table deleted", nil, true, deleteIsolation, false},
		{"untagged", []*networkingv1.NetworkPolicy{servicesOnly}, false, nil, false},
		{"priority-tagged", []*networkingv1.NetworkPolicy{servicesOnly}, true, nil, false},
		{"priority-tagged, the network's bridge table deleted", []*networkingv1.NetworkPolicy{servicesOnly}, true, deleteIsolation, false},
	} {
		for _, is6 := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/%s", byFamily(is6, "ipv4", "ipv6"), tc.name), func(t *testing.T) {
				c.apply(t, tc.policies...)
				if tc.tamper != nil {
					nettest.Run(t, c.node.NS, "nft", tc.tamper...)
					t.Cleanup(func() {
						nettest.Do(t, c.node.NS, func() error {
							_, err := core.HealNode(context.Background(), testkit.PluginConfig(t, c.list), true)
							return err
						})
					})
				}
				payload := fmt.Sprintf("tagged-%d", time.Now().UnixNano())
				src := c.client.IP(vip[is6])
				frame := testkit.IPFrame(bridgeMAC, clientMAC, testkit.UDPPacket(src, vip[is6], uint16(42000+10*i+byFamily(is6, 0, 1)), 53, []byte(payload)))
				if tc.tagged {
					frame = testkit.PriorityTagged(frame)
				}
				timeout := testkit.UnreachableTimeout
				if tc.arrives {
					timeout = testkit.TrafficTimeout
				}
				if got := delivered(t, c.client, peer[is6], payload, frame, timeout); got != tc.arrives {
					t.Errorf("the client's datagram to the Service %s reached the peer host behind it: %v, want %v", vip[is6], got, tc.arrives)
				}
			})
		}
	}
}
