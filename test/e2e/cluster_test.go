//go:build e2e

package e2e

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/kubenet-dev/kubenet/core"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

// Ports of the servers every cluster pod runs, and the hostPort of pod a1.
const (
	podTCPPort      = 8080
	podUDPPort      = 8081
	externalPort    = 9000
	clusterHostPort = 30080
	servicePort     = 80
)

// Service addresses of the kube-proxy stand-in.
var serviceIP = map[bool]netip.Addr{false: netip.MustParseAddr("10.96.0.10"), true: netip.MustParseAddr("fd00:96::10")}

// clusterPod is a pod of the cluster test and the node it runs on.
type clusterPod struct {
	*nettest.Pod
	name string
	node *ClusterNode
}

func (p *clusterPod) String() string { return p.name + "@" + p.node.Name }

// families are the address families of the dual-stack cluster, keyed by "is IPv6".
var families = []bool{false, true}

func familyName(is6 bool) string {
	if is6 {
		return "IPv6"
	}
	return "IPv4"
}

// TestCluster runs pods on three simulated nodes and checks the traffic matrix a Kubernetes
// cluster on kubenet relies on, for both families, then deletes every pod and audits every
// node for residue.
func TestCluster(t *testing.T) {
	c := NewCluster(t, binDir, 3)
	Check(t, nil, "3 nodes (netns) on an underlay bridge inside its own netns (MTU %d); node i has pod CIDRs 10.244.i.0/24 and fd00:10:244:i::/64 from cluster CIDRs %s and %s, and routes to the other nodes' pod CIDRs; netfilter backends %s, %s, %s",
		UnderlayMTU, ClusterCIDR4, ClusterCIDR6, c.Nodes[0].Backend, c.Nodes[1].Backend, c.Nodes[2].Backend)

	pods := []*clusterPod{{name: "a1", node: c.Nodes[0]}, {name: "a2", node: c.Nodes[0]}, {name: "b1", node: c.Nodes[1]}, {name: "c1", node: c.Nodes[2]}}
	for _, p := range pods {
		p.Pod = p.node.NewPod(t, "e2e-"+p.name)
		if p.name == "a1" {
			p.RT.CapabilityArgs = map[string]any{"portMappings": []map[string]any{
				{"hostPort": clusterHostPort, "containerPort": podTCPPort, "protocol": "tcp"}}}
		}
		p.node.MustAdd(t, p.node.List, p.Pod)
		var err error
		for _, ip := range p.IPs() {
			if !containsAddr(p.node.PodCIDRs, ip) {
				err = errors.Join(err, fmt.Errorf("%s is outside %v", ip, p.node.PodCIDRs))
			}
		}
		if len(p.IPs()) != 2 {
			err = errors.Join(err, fmt.Errorf("addresses %v, want one per family", p.IPs()))
		}
		Require(t, err, "ADD %s through libcni on %s: %v", p.name, p.node.Name, p.IPs())
		nettest.StartTCPEcho(t, p.NS, netip.AddrPortFrom(netip.IPv6Unspecified(), podTCPPort))
		nettest.StartUDPEcho(t, p.NS, netip.AddrPortFrom(netip.IPv6Unspecified(), podUDPPort))
	}
	nettest.StartTCPEcho(t, c.External, netip.AddrPortFrom(netip.IPv6Unspecified(), externalPort))

	t.Run("pod to pod", func(t *testing.T) {
		for _, src := range pods {
			for _, dst := range pods {
				if src == dst {
					continue
				}
				where := "across nodes"
				if src.node == dst.node {
					where = "same node"
				}
				for _, is6 := range families {
					to := netip.AddrPortFrom(dst.IP(serviceIP[is6]), podTCPPort)
					want := src.IP(serviceIP[is6])
					Check(t, ExpectEchoFrom(src.NS, to, false, want), "%s -> %s (%s, %s): source %s preserved", src, dst, where, familyName(is6), want)
				}
			}
		}
	})

	t.Run("node to pod", func(t *testing.T) {
		for _, n := range c.Nodes {
			for _, dst := range pods {
				for _, is6 := range families {
					to := netip.AddrPortFrom(dst.IP(serviceIP[is6]), podTCPPort)
					// To its own pods a node speaks from its bridge address, to others' from
					// its underlay address: the route to the pod decides.
					want, how := n.Addr[is6], "node address"
					if dst.node == n {
						want, how = n.Gateway(serviceIP[is6]), "bridge address"
					}
					Check(t, ExpectEchoFrom(n.NS, to, false, want), "%s -> %s (%s): reached, from the %s %s", n.Name, dst, familyName(is6), how, want)
				}
			}
		}
	})

	t.Run("pod to external", func(t *testing.T) {
		for _, src := range pods {
			for _, is6 := range families {
				ext := ExternalHost4
				if is6 {
					ext = ExternalHost6
				}
				want := src.node.Addr[is6]
				Check(t, ExpectEchoFrom(src.NS, netip.AddrPortFrom(ext, externalPort), false, want),
					"%s -> external host %s (%s): SNATed to its node's address %s", src, ext, familyName(is6), want)
			}
		}
	})

	a1, b1, c1 := pods[0], pods[2], pods[3]
	t.Run("hostPort from another node", func(t *testing.T) {
		for _, is6 := range families {
			to := netip.AddrPortFrom(a1.node.Addr[is6], clusterHostPort)
			Check(t, ExpectEchoFrom(c.Nodes[1].NS, to, false, c.Nodes[1].Addr[is6]),
				"%s -> hostPort %s of %s (%s): reached, client address %s kept", c.Nodes[1].Name, to, a1, familyName(is6), c.Nodes[1].Addr[is6])
			Check(t, ExpectEchoFrom(c1.NS, to, false, c1.IP(serviceIP[is6])),
				"%s -> hostPort %s of %s (%s): reached, pod address %s kept", c1, to, a1, familyName(is6), c1.IP(serviceIP[is6]))
		}
	})

	t.Run("service DNAT", func(t *testing.T) {
		// kube-proxy runs on every node; here on a1's node and on b1's, both sending the
		// service to a1.
		for _, n := range []*ClusterNode{a1.node, b1.node} {
			for _, is6 := range families {
				installService(t, n.NS, serviceIP[is6], netip.AddrPortFrom(a1.IP(serviceIP[is6]), podTCPPort))
			}
		}
		for _, is6 := range families {
			svc := netip.AddrPortFrom(serviceIP[is6], servicePort)
			gw := a1.node.Gateway(serviceIP[is6])
			Check(t, ExpectEchoFrom(a1.NS, svc, false, gw),
				"%s -> service %s -> itself (%s, hairpin): reached, from the bridge address %s (kube-proxy's hairpin masquerade)", a1, svc, familyName(is6), gw)
			want := b1.IP(serviceIP[is6])
			Check(t, ExpectEchoFrom(b1.NS, svc, false, want),
				"%s -> service %s -> %s on another node (%s): reached, source %s preserved", b1, svc, a1, familyName(is6), want)
		}
	})

	t.Run("MTU", func(t *testing.T) {
		for _, n := range c.Nodes {
			Check(t, linkMTUs(n.NS, UnderlayMTU, "eth0", "cbr0"), "%s: uplink eth0 and bridge cbr0 have MTU %d (detected from the default route's link)", n.Name, UnderlayMTU)
		}
		for _, p := range pods {
			veth := core.NamesFor("kubenet", core.Attachment{ContainerID: p.RT.ContainerID, IfName: p.RT.IfName}).HostVeth
			err := errors.Join(linkMTUs(p.node.NS, UnderlayMTU, veth), linkMTUs(p.NS, UnderlayMTU, "eth0"))
			Check(t, err, "%s: host veth %s and pod eth0 have MTU %d", p, veth, UnderlayMTU)
		}
		for _, pair := range [][2]*clusterPod{{a1, b1}, {b1, c1}} {
			for _, is6 := range families {
				to := netip.AddrPortFrom(pair[1].IP(serviceIP[is6]), podUDPPort)
				Check(t, UDPDontFragment(pair[0].NS, to, UnderlayMTU, 5*time.Second),
					"%s -> %s (%s): a %d-byte packet with fragmentation forbidden crosses the underlay", pair[0], pair[1], familyName(is6), UnderlayMTU)
				err := UDPDontFragment(pair[0].NS, to, UnderlayMTU+1, 5*time.Second)
				if errors.Is(err, unix.EMSGSIZE) {
					err = nil
				} else {
					err = fmt.Errorf("want EMSGSIZE, got %v", err)
				}
				Check(t, err, "%s -> %s (%s): a %d-byte packet is refused by the pod's own MTU", pair[0], pair[1], familyName(is6), UnderlayMTU+1)
			}
		}
	})

	t.Run("teardown", func(t *testing.T) {
		for _, p := range pods {
			Check(t, p.node.Del(p.node.List, p.Pod), "DEL %s through libcni on %s", p.name, p.node.Name)
		}
		for _, n := range c.Nodes {
			left, err := Residue(NodeState{NS: n.NS, DataDir: n.DataDir(), Network: "kubenet", PodCIDRs: n.PodCIDRs})
			if err == nil {
				left = append(left, cacheEntries(n)...)
			}
			if err == nil && len(left) > 0 {
				err = fmt.Errorf("left behind:\n  %s", strings.Join(left, "\n  "))
			}
			Check(t, err, "%s: zero residue (veths, ifbs, qdiscs, reservations, records, hostPort index, nftables elements of the hostPort, isolation and policy tables, iptables/ebtables rules and chains of pods, conntrack entries of pod addresses, libcni cache)", n.Name)
		}
	})
}

// installService emulates kube-proxy in iptables mode on a node: DNAT of svc:servicePort to
// the pod, and the masquerade kube-proxy adds for a pod that reaches itself through a service.
func installService(t *testing.T, node ns.NetNS, svc netip.Addr, pod netip.AddrPort) {
	t.Helper()
	ipt := map[bool]string{false: "iptables", true: "ip6tables"}[svc.Is6()]
	for _, rule := range [][]string{
		{"-t", "nat", "-A", "PREROUTING", "-d", svc.String(), "-p", "tcp", "--dport", fmt.Sprint(servicePort), "-j", "DNAT", "--to-destination", pod.String()},
		{"-t", "nat", "-A", "POSTROUTING", "-s", pod.Addr().String(), "-d", pod.Addr().String(), "-j", "MASQUERADE"},
	} {
		nettest.Run(t, node, ipt, rule...)
	}
}

// linkMTUs checks the MTU of links inside n.
func linkMTUs(n ns.NetNS, want int, names ...string) error {
	return n.Do(func(ns.NetNS) error {
		var errs []error
		for _, name := range names {
			l, err := netlink.LinkByName(name)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if got := l.Attrs().MTU; got != want {
				errs = append(errs, fmt.Errorf("%s has MTU %d, want %d", name, got, want))
			}
		}
		return errors.Join(errs...)
	})
}

// cacheEntries lists libcni's cached results left on a node.
func cacheEntries(n *ClusterNode) []string {
	entries, _ := os.ReadDir(filepath.Join(n.Dir, "cache", "results"))
	var out []string
	for _, e := range entries {
		out = append(out, "libcni cache "+e.Name())
	}
	return out
}

func containsAddr(prefixes []netip.Prefix, a netip.Addr) bool {
	for _, p := range prefixes {
		if p.Contains(a) {
			return true
		}
	}
	return false
}
