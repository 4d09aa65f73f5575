package netpoldiff

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kubenet-dev/kubenet/agent/policy"
)

// Topology is the physical lab a case is generated for: the node's sandboxes (their pod names
// are fixed when they are attached), the addresses of other nodes' pods that the peer host
// carries, and the addresses of the node and the hosts.
type Topology struct {
	Sandboxes []Sandbox
	// Remote are addresses of another node's pod CIDR carried by the peer host, one pair (IPv4,
	// IPv6) per slot; a case gives each slot a pod of another node, an ended pod, or nothing.
	Remote                                   [][2]netip.Addr
	PodCIDR4, PodCIDR6                       netip.Prefix // the node's
	RemoteCIDR4, RemoteCIDR6                 netip.Prefix // the other node's, holding Remote
	Gateway4, Gateway6, BridgeLL             netip.Addr   // the node's addresses on the pods' link
	NodePeer4, NodePeer6                     netip.Addr   // the node's address towards the peer host
	NodeUplink4, NodeUplink6                 netip.Addr   // the node's address towards the external host
	Peer4, Peer6                             netip.Addr   // the peer host (also hostNetwork pods' address)
	External4, External6                     netip.Addr   // the external host
	Multicast4, Multicast6                   []netip.Addr // groups the receivers listen on
	Broadcast4                               []netip.Addr // the pod subnet's broadcast and 255.255.255.255
	TCPPorts, UDPPorts, SCTPPorts            []uint16     // ports with a receiver, per protocol
	GroupPort                                uint16       // the UDP port of broadcast and multicast receivers
	PortNames                                []string     // container port names the generator uses
	NamespaceNames                           []string     // namespaces a case may create, in order
	SandboxNamespaces                        int          // the sandboxes live in the first this many
	LabelKeys, LabelValues                   []string
	NamespaceLabelKeys, NamespaceLabelValues []string
}

// Case is one generated cluster.
type Case struct {
	Seed  uint64
	World World
	// Staged are policies annotated as audit ones (agent/policy.AuditAnnotation), installed
	// with the World's but not part of it: the model judges without them, since staged policies
	// never change a verdict. Odd seeds have one to three, even seeds none.
	Staged []*networkingv1.NetworkPolicy
}

// Installed is the world the node gets: the World's policies and the staged ones.
func (c *Case) Installed() World {
	w := c.World
	w.Policies = slices.Concat(c.World.Policies, c.Staged)
	return w
}

// Generate builds the case of seed on topo. Everything it makes is valid for the API server
// (selectors, ports, endPort, ipBlock excepts strictly inside their cidr); the same seed and
// topology give the same case.
func Generate(seed uint64, topo *Topology) *Case {
	g := &generator{r: rand.New(rand.NewPCG(seed, 0x6e6574706f6c)), topo: topo}
	c := &Case{Seed: seed, World: World{Sandboxes: topo.Sandboxes}}
	// The namespaces of the sandboxes always exist (their pods' names are fixed at ADD); the
	// others, which hold only pods of the other node, half the time each.
	var namespaces []string
	for _, name := range topo.NamespaceNames {
		if !slices.ContainsFunc(topo.Sandboxes, func(s Sandbox) bool { return s.Namespace == name }) && g.chance(0.5) {
			continue
		}
		labels := map[string]string{"kubernetes.io/metadata.name": name}
		for _, k := range topo.NamespaceLabelKeys {
			if g.chance(0.6) {
				labels[k] = g.pick(topo.NamespaceLabelValues)
			}
		}
		namespaces = append(namespaces, name)
		c.World.Namespaces = append(c.World.Namespaces, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}})
	}
	for _, s := range topo.Sandboxes {
		// Rarely the API has no Pod object for a sandbox (force-deleted, or not seen yet): the
		// sandbox is held.
		if g.chance(0.04) {
			continue
		}
		p := g.pod(s.Namespace, s.Name)
		if g.chance(0.85) { // else the API's status lags: the node knows the addresses from its records
			p.Status.PodIPs = podIPs(s.Addrs...)
		}
		c.World.Pods = append(c.World.Pods, p)
	}
	for i, slot := range topo.Remote {
		switch x := g.r.Float64(); {
		case x < 0.15: // an address no pod has (now)
		case x < 0.3:
			p := g.pod(g.pick(namespaces), fmt.Sprintf("ended%d", i))
			p.Status.Phase = pickFrom(g.r, []corev1.PodPhase{corev1.PodSucceeded, corev1.PodFailed})
			p.Status.PodIPs = podIPs(slot[0], slot[1])
			c.World.Pods = append(c.World.Pods, p)
		default:
			p := g.pod(g.pick(namespaces), fmt.Sprintf("remote%d", i))
			p.Status.PodIPs = podIPs(slot[0], slot[1])
			c.World.Pods = append(c.World.Pods, p)
		}
	}
	if g.chance(0.4) { // a hostNetwork pod on the peer host (another node): no pod peer
		p := g.pod(g.pick(namespaces), "hostnet")
		p.Spec.HostNetwork = true
		p.Status.PodIPs = podIPs(topo.Peer4, topo.Peer6)
		c.World.Pods = append(c.World.Pods, p)
	}
	for i := range g.r.IntN(7) {
		c.World.Policies = append(c.World.Policies, g.policy(fmt.Sprintf("np%d", i), g.pick(namespaces), namespaces))
	}
	if seed%2 == 1 {
		// From a stream of their own, so that the enforced case of a seed stays what it was.
		s := &generator{r: rand.New(rand.NewPCG(seed, 0x7374616765)), topo: topo}
		for i := range s.r.IntN(3) + 1 {
			np := s.policy(fmt.Sprintf("staged%d", i), s.pick(namespaces), namespaces)
			np.Annotations = map[string]string{policy.AuditAnnotation: policy.AuditMode}
			c.Staged = append(c.Staged, np)
		}
	}
	return c
}

func podIPs(addrs ...netip.Addr) []corev1.PodIP {
	var out []corev1.PodIP
	for _, a := range addrs {
		out = append(out, corev1.PodIP{IP: a.String()})
	}
	return out
}

type generator struct {
	r    *rand.Rand
	topo *Topology
	// the named container ports of the case's pods, which rules name more often than others
	named []corev1.ContainerPort
}

func (g *generator) chance(p float64) bool { return g.r.Float64() < p }

func pickFrom[T any](r *rand.Rand, s []T) T { return s[r.IntN(len(s))] }

func (g *generator) pick(s []string) string { return pickFrom(g.r, s) }

// pod is a running Pod object with random labels and named container ports.
func (g *generator) pod(namespace, name string) *corev1.Pod {
	labels := map[string]string{}
	for _, k := range g.topo.LabelKeys {
		if g.chance(0.5) {
			labels[k] = g.pick(g.topo.LabelValues)
		}
	}
	var containers []corev1.Container
	type portKey struct {
		port  int32
		proto corev1.Protocol
	}
	used := map[portKey]bool{} // a port and protocol once per pod (a host-network pod's host ports)
	names := slices.Clone(g.topo.PortNames)
	g.r.Shuffle(len(names), func(i, j int) { names[i], names[j] = names[j], names[i] })
	for c := range 1 + g.r.IntN(2) {
		ctr := corev1.Container{Name: fmt.Sprintf("c%d", c), Image: "registry.k8s.io/pause:3.10"}
		for range g.r.IntN(3) {
			var cp corev1.ContainerPort
			switch g.r.IntN(5) {
			case 0, 1: // protocol left to its default, TCP
				cp.ContainerPort = int32(pickFrom(g.r, g.topo.TCPPorts))
			case 2:
				cp.Protocol, cp.ContainerPort = corev1.ProtocolTCP, int32(pickFrom(g.r, g.topo.TCPPorts))
			case 3:
				cp.Protocol, cp.ContainerPort = corev1.ProtocolUDP, int32(pickFrom(g.r, g.topo.UDPPorts))
			default:
				cp.Protocol, cp.ContainerPort = corev1.ProtocolSCTP, int32(pickFrom(g.r, g.topo.SCTPPorts))
			}
			key := portKey{cp.ContainerPort, cp.Protocol}
			if key.proto == "" {
				key.proto = corev1.ProtocolTCP
			}
			if used[key] {
				continue
			}
			used[key] = true
			if len(names) > 0 && g.chance(0.85) { // names are unique within a pod
				cp.Name, names = names[0], names[1:]
				g.named = append(g.named, cp)
			}
			ctr.Ports = append(ctr.Ports, cp)
		}
		containers = append(containers, ctr)
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, Labels: labels},
		Spec:       corev1.PodSpec{Containers: containers},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning},
	}
}

// selector is a random label selector over keys and values: empty, matchLabels,
// matchExpressions of every operator, or both.
func (g *generator) selector(keys, values []string) *metav1.LabelSelector {
	s := &metav1.LabelSelector{}
	if g.chance(0.3) {
		return s
	}
	if g.chance(0.6) {
		s.MatchLabels = map[string]string{g.pick(keys): g.pick(values)}
		if g.chance(0.2) {
			s.MatchLabels[g.pick(keys)] = g.pick(values)
		}
	}
	if len(s.MatchLabels) == 0 || g.chance(0.3) {
		for range 1 + g.r.IntN(2) {
			r := metav1.LabelSelectorRequirement{Key: g.pick(keys)}
			switch g.r.IntN(4) {
			case 0:
				r.Operator, r.Values = metav1.LabelSelectorOpIn, g.values(values)
			case 1:
				r.Operator, r.Values = metav1.LabelSelectorOpNotIn, g.values(values)
			case 2:
				r.Operator = metav1.LabelSelectorOpExists
			default:
				r.Operator = metav1.LabelSelectorOpDoesNotExist
			}
			s.MatchExpressions = append(s.MatchExpressions, r)
		}
	}
	return s
}

// values is a non-empty set of distinct values.
func (g *generator) values(values []string) []string {
	v := slices.Clone(values)
	g.r.Shuffle(len(v), func(i, j int) { v[i], v[j] = v[j], v[i] })
	return v[:1+g.r.IntN(len(v))]
}

func (g *generator) podSelector() *metav1.LabelSelector {
	return g.selector(g.topo.LabelKeys, g.topo.LabelValues)
}

func (g *generator) namespaceSelector(namespaces []string) *metav1.LabelSelector {
	if g.chance(0.3) { // by name, as most manifests do
		return &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": g.pick(namespaces)}}
	}
	return g.selector(g.topo.NamespaceLabelKeys, g.topo.NamespaceLabelValues)
}

// policy is a random valid NetworkPolicy of namespace.
func (g *generator) policy(name, namespace string, namespaces []string) *networkingv1.NetworkPolicy {
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}
	np.Spec.PodSelector = *g.podSelector()
	switch x := g.r.Float64(); {
	case x < 0.25: // missing: the API's default
	case x < 0.35:
		np.Spec.PolicyTypes = []networkingv1.PolicyType{}
	case x < 0.6:
		np.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
	case x < 0.8:
		np.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
	case x < 0.9:
		np.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}
	default:
		np.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress, networkingv1.PolicyTypeIngress}
	}
	for range g.ruleCount() {
		np.Spec.Ingress = append(np.Spec.Ingress, networkingv1.NetworkPolicyIngressRule{From: g.peers(namespaces), Ports: g.ports()})
	}
	if np.Spec.Ingress == nil && g.chance(0.1) {
		np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{}
	}
	for range g.ruleCount() {
		np.Spec.Egress = append(np.Spec.Egress, networkingv1.NetworkPolicyEgressRule{To: g.peers(namespaces), Ports: g.ports()})
	}
	if np.Spec.Egress == nil && g.chance(0.1) {
		np.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{}
	}
	return np
}

func (g *generator) ruleCount() int {
	if g.chance(0.35) {
		return 0
	}
	return 1 + g.r.IntN(3)
}

// peers is a rule's from or to: missing, empty, or 1–3 peers of every kind.
func (g *generator) peers(namespaces []string) []networkingv1.NetworkPolicyPeer {
	switch x := g.r.Float64(); {
	case x < 0.25:
		return nil
	case x < 0.3:
		return []networkingv1.NetworkPolicyPeer{}
	}
	var out []networkingv1.NetworkPolicyPeer
	for range 1 + g.r.IntN(3) {
		var p networkingv1.NetworkPolicyPeer
		switch g.r.IntN(5) {
		case 0:
			p.PodSelector = g.podSelector()
		case 1:
			p.NamespaceSelector = g.namespaceSelector(namespaces)
		case 2:
			p.PodSelector, p.NamespaceSelector = g.podSelector(), g.namespaceSelector(namespaces)
		default:
			p.IPBlock = g.ipBlock()
		}
		out = append(out, p)
	}
	return out
}

// ports is a rule's ports: missing, empty, or 1–3 ports with every protocol (or the default),
// numbers, ranges, names, or none.
func (g *generator) ports() []networkingv1.NetworkPolicyPort {
	switch x := g.r.Float64(); {
	case x < 0.35:
		return nil
	case x < 0.4:
		return []networkingv1.NetworkPolicyPort{}
	}
	var out []networkingv1.NetworkPolicyPort
	for range 1 + g.r.IntN(3) {
		var p networkingv1.NetworkPolicyPort
		numbers := g.topo.TCPPorts
		if x := g.r.IntN(6); x >= 2 { // else the protocol is left to its default, TCP
			proto := pickFrom(g.r, []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolUDP, corev1.ProtocolSCTP})
			p.Protocol = &proto
			switch proto {
			case corev1.ProtocolUDP:
				numbers = append(slices.Clone(g.topo.UDPPorts), g.topo.GroupPort)
			case corev1.ProtocolSCTP:
				numbers = g.topo.SCTPPorts
			}
		}
		switch x := g.r.Float64(); {
		case x < 0.15: // every port of the protocol
		case x < 0.4:
			port := intstr.FromString(g.pick(g.topo.PortNames))
			if len(g.named) > 0 && g.chance(0.7) {
				// a name a pod of the case has, with its protocol (or the default, when TCP)
				cp := pickFrom(g.r, g.named)
				port = intstr.FromString(cp.Name)
				switch {
				case cp.Protocol != "" && cp.Protocol != corev1.ProtocolTCP || g.chance(0.5):
					proto := cp.Protocol
					if proto == "" {
						proto = corev1.ProtocolTCP
					}
					p.Protocol = &proto
				default:
					p.Protocol = nil
				}
			}
			p.Port = &port
		default:
			n := int32(pickFrom(g.r, numbers)) + int32(pickFrom(g.r, []int{0, 0, 0, -1, 1}))
			port := intstr.FromInt32(n)
			p.Port = &port
			if g.chance(0.35) {
				// Half the ranges end on a port with a receiver, where an off-by-one shows.
				var ends []int32
				for _, x := range numbers {
					if int32(x) >= n {
						ends = append(ends, int32(x))
					}
				}
				end := n + int32(pickFrom(g.r, []int{0, 1, 10, 100, 1000, 10000}))
				if len(ends) > 0 && g.chance(0.5) {
					end = pickFrom(g.r, ends)
				}
				p.EndPort = &end
			}
		}
		out = append(out, p)
	}
	return out
}

// ipBlock is a random block (either family) over the lab's addresses: parts of the node's pod
// CIDR, single pods, the other node's pods, the hosts, link-local, broadcast and multicast
// ranges, everything; with 0–2 excepts strictly inside it, mostly around an address of the lab.
func (g *generator) ipBlock() *networkingv1.IPBlock {
	t := g.topo
	var interesting []netip.Addr // addresses the lab uses, of the chosen family
	var cidrs []netip.Prefix
	if g.chance(0.5) {
		for _, s := range t.Sandboxes {
			interesting = append(interesting, s.Addrs[0])
		}
		for _, r := range t.Remote {
			interesting = append(interesting, r[0])
		}
		interesting = append(interesting, t.Gateway4, t.NodePeer4, t.NodeUplink4, t.Peer4, t.External4)
		interesting = append(interesting, t.Multicast4...)
		interesting = append(interesting, t.Broadcast4...)
		cidrs = []netip.Prefix{t.PodCIDR4, t.RemoteCIDR4, pfx("10.244.0.0/16"), pfx("10.0.0.0/8"), pfx("0.0.0.0/0"),
			pfx("10.200.0.0/24"), pfx("198.18.0.0/24"), pfx("224.0.0.0/4"), pfx("239.0.0.0/8"), pfx("224.0.0.0/24")}
	} else {
		for _, s := range t.Sandboxes {
			interesting = append(interesting, s.Addrs[1], s.LinkLocal)
		}
		for _, r := range t.Remote {
			interesting = append(interesting, r[1])
		}
		interesting = append(interesting, t.Gateway6, t.BridgeLL, t.NodePeer6, t.NodeUplink6, t.Peer6, t.External6)
		interesting = append(interesting, t.Multicast6...)
		cidrs = []netip.Prefix{t.PodCIDR6, t.RemoteCIDR6, pfx("fd00:10:244::/48"), pfx("fd00::/8"), pfx("::/0"),
			pfx("fd00:200::/64"), pfx("2001:db8:e::/64"), pfx("fe80::/10"), pfx("fe80::/64"), pfx("ff00::/8"), pfx("ff02::/16")}
	}
	var cidr netip.Prefix
	switch x := g.r.Float64(); {
	case x < 0.45:
		cidr = pickFrom(g.r, cidrs)
	default: // around one address: the address alone, or a block of a random size that holds it
		a := pickFrom(g.r, interesting)
		bits := a.BitLen() - g.r.IntN(a.BitLen()/4+1)
		if g.chance(0.4) {
			bits = a.BitLen()
		}
		cidr = netip.PrefixFrom(a, bits).Masked()
	}
	b := &networkingv1.IPBlock{CIDR: cidr.String()}
	if cidr.Bits() == cidr.Addr().BitLen() {
		return b
	}
	for range g.r.IntN(3) {
		var inside []netip.Addr
		for _, a := range interesting {
			if cidr.Contains(a) {
				inside = append(inside, a)
			}
		}
		var a netip.Addr
		if len(inside) > 0 && g.chance(0.8) {
			a = pickFrom(g.r, inside)
		} else {
			a = randomIn(g.r, cidr)
		}
		// Strictly longer than the cidr, as the API requires.
		bits := cidr.Bits() + 1 + g.r.IntN(a.BitLen()-cidr.Bits())
		if g.chance(0.5) {
			bits = a.BitLen()
		}
		ex := netip.PrefixFrom(a, bits).Masked().String()
		if !slices.Contains(b.Except, ex) {
			b.Except = append(b.Except, ex)
		}
	}
	return b
}

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }

// randomIn is a random address of p.
func randomIn(r *rand.Rand, p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		if r.IntN(2) == 1 {
			b[i/8] |= 0x80 >> (i % 8)
		}
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}
