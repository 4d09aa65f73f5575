// Package netpoldiff is kubenet's differential NetworkPolicy tester. From a seed it generates a
// random cluster (namespaces, pods of the node under test and of other nodes, NetworkPolicies
// using every feature of the API), computes the verdict of every probe from an executable model
// of the API's semantics (this file: written from the networking.k8s.io/v1 reference and
// docs/networkpolicy.md, sharing no code with agent/policy), installs the policies on a simulated
// node through the system under test (install.go, the one place that calls it) and sends real
// packets between network namespaces (lab.go, probe.go). Every disagreement is a failure that
// names its seed and how to replay it.
package netpoldiff

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Proto is the protocol of a probe. ICMP stands for ICMP echo in IPv4 and ICMPv6 echo in IPv6.
type Proto string

// The protocols probes use.
const (
	TCP  Proto = "TCP"
	UDP  Proto = "UDP"
	SCTP Proto = "SCTP"
	ICMP Proto = "ICMP"
)

// Role says what an endpoint of a flow is, as far as the node under test is concerned.
type Role int

// The roles. Only the node's own pods (RoleLocal) are subject to this node's enforcement; a pod of
// another node (RoleRemote) is judged by its own node, so the model leaves its side out.
const (
	RoleLocal    Role = iota // a pod sandbox attached on the node under test
	RoleRemote               // an address of another node's pod network (a pod there, or none)
	RoleNode                 // the node under test itself (any of its addresses)
	RolePeerHost             // a host of the cluster network outside the pod CIDRs (another node)
	RoleExternal             // a host outside the cluster
)

func (r Role) String() string {
	return [...]string{"pod", "remote", "node", "peer-host", "external-host"}[r]
}

// Endpoint is one end of a flow. Sandbox names a local pod sandbox ("namespace/name", as its
// CNI_ARGS say); the other roles need no name: the model knows them by address.
type Endpoint struct {
	Role    Role
	Sandbox string
}

func (e Endpoint) String() string {
	if e.Role == RoleLocal {
		return e.Sandbox
	}
	return e.Role.String()
}

// Sandbox is a pod sandbox attached on the node under test, as the node knows it from its
// attachment record: the pod's name from CNI_ARGS, its primary addresses, and the IPv6
// link-local address of its interface (EUI-64 of its MAC).
type Sandbox struct {
	Namespace, Name string
	Addrs           []netip.Addr
	LinkLocal       netip.Addr
}

// Key is "namespace/name".
func (s Sandbox) Key() string { return s.Namespace + "/" + s.Name }

// World is everything the model judges from: the API's objects and the node's sandboxes.
type World struct {
	Namespaces []*corev1.Namespace
	Pods       []*corev1.Pod // every Pod object of the cluster, this node's among them
	Policies   []*networkingv1.NetworkPolicy
	Sandboxes  []Sandbox
}

// Flow is one packet (the first of a connection, or a datagram) as the model judges it: who
// sends it, from which address, to which address, and which endpoint receives it (for broadcast
// and multicast each receiver is a flow of its own).
type Flow struct {
	From, To Endpoint
	Src, Dst netip.Addr
	Proto    Proto
	Port     uint16 // destination port; unused for ICMP
}

func (f Flow) String() string {
	port := ""
	if f.Proto != ICMP {
		port = fmt.Sprintf(":%d", f.Port)
	}
	return fmt.Sprintf("%s %s (%s) -> %s%s (%s)", f.Proto, f.Src, f.From, f.Dst, port, f.To)
}

// Verdict is the model's answer and why, in words a reader of a failure can check.
type Verdict struct {
	Allowed bool
	Why     string
}

// Model answers, for a World, whether the node under test must let a flow through.
//
// The semantics (the API's, and kubenet's documented extensions):
//   - a pod is isolated for ingress (egress) when a policy of its namespace selects it and has
//     Ingress (Egress) in policyTypes; empty policyTypes means Ingress, plus Egress when the
//     policy has egress rules. A pod not isolated in a direction is allowed everything in it;
//   - an isolated pod is allowed the union of the rules of the policies that isolate it; a flow
//     needs the sender's egress and the receiver's ingress;
//   - peers: none listed means everything; podSelector alone selects pods of the policy's
//     namespace, namespaceSelector alone every pod of the selected namespaces, both the selected
//     pods of the selected namespaces; ipBlock is its cidr minus every except, by address.
//     hostNetwork pods and ended pods are no pod peers;
//   - ports: none listed means every protocol and port (ICMP included); protocol defaults to TCP;
//     no port means every port of the protocol; endPort makes a range; a named port is the
//     container port of that name and protocol on the receiving pod (for ingress the selected
//     pod, for egress the pod that owns the destination address: an egress ipBlock with a named
//     port reaches only pods inside the block that have the port). A rule with ports never
//     matches ICMP;
//   - replies of allowed flows pass (the prober checks that; the model judges first packets);
//   - the node always reaches its pods; a pod reaching the node is judged by its egress with the
//     node's address as the destination; a host reaching a pod by the pod's ingress with the
//     host's address as the peer;
//   - a pod's IPv6 link-local address is one of its addresses: it has the pod's identity for pod
//     peers, and an ipBlock matches it only when its cidr covers it. The bridge's link-local
//     address is a node address;
//   - broadcast and multicast: the receiving pod's ingress judges the sender (source address as
//     peer), the sender's egress judges the destination address (an ipBlock covering it, or no
//     peers), on the protocol and port; no pod owns such an address, so a named port never
//     matches it;
//   - fragments have the verdict of their datagram (the model judges datagrams);
//   - a sandbox whose Pod object the API does not have is held: it sends and receives nothing.
type Model struct {
	nsLabels  map[string]map[string]string
	objects   map[string]*corev1.Pod // namespace/name → Pod object
	owners    map[netip.Addr]*corev1.Pod
	sandboxes map[string]Sandbox
	policies  []*networkingv1.NetworkPolicy
}

// NewModel indexes w.
func NewModel(w World) *Model {
	m := &Model{nsLabels: map[string]map[string]string{}, objects: map[string]*corev1.Pod{},
		owners: map[netip.Addr]*corev1.Pod{}, sandboxes: map[string]Sandbox{}, policies: w.Policies}
	for _, n := range w.Namespaces {
		m.nsLabels[n.Name] = n.Labels
	}
	for _, s := range w.Sandboxes {
		m.sandboxes[s.Key()] = s
	}
	for _, p := range w.Pods {
		key := p.Namespace + "/" + p.Name
		m.objects[key] = p
		if !isPeer(p) {
			continue
		}
		// A pod of this node is known by its sandbox's addresses (the node has them before the
		// API's status does), link-local included; a pod of another node by its status.
		if s, ok := m.sandboxes[key]; ok {
			for _, a := range append(slices.Clone(s.Addrs), s.LinkLocal) {
				m.owners[a] = p
			}
			continue
		}
		for _, ip := range p.Status.PodIPs {
			if a, err := netip.ParseAddr(ip.IP); err == nil {
				m.owners[a.Unmap()] = p
			}
		}
	}
	return m
}

// isPeer tells whether a pod can be a pod peer: not on the host's network, not ended.
func isPeer(p *corev1.Pod) bool {
	return !p.Spec.HostNetwork && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed
}

// Held tells whether the sandbox key is held: the API has no Pod object for it.
func (m *Model) Held(sandbox string) bool {
	_, ok := m.objects[sandbox]
	return !ok
}

// Judge is the model's verdict on f.
func (m *Model) Judge(f Flow) Verdict {
	for _, e := range []Endpoint{f.From, f.To} {
		if e.Role == RoleLocal && m.Held(e.Sandbox) {
			return Verdict{false, fmt.Sprintf("%s is held: the API has no Pod object for it, so its policies are not in force", e.Sandbox)}
		}
	}
	if f.From.Role == RoleNode {
		return Verdict{true, "the node always reaches its pods"}
	}
	var why []string
	if f.From.Role == RoleLocal {
		// The destination pod, if a pod owns the address: the peer for pod selectors, and the
		// pod whose named ports an egress rule means.
		v := m.direction(m.objects[f.From.Sandbox], egress, f.Dst, m.owners[f.Dst], f)
		if !v.Allowed {
			return v
		}
		why = append(why, v.Why)
	}
	if f.To.Role == RoleLocal {
		to := m.objects[f.To.Sandbox]
		v := m.direction(to, ingress, f.Src, to, f)
		if !v.Allowed {
			return v
		}
		why = append(why, v.Why)
	}
	if len(why) == 0 {
		return Verdict{true, "no pod of this node at either end"}
	}
	return Verdict{true, strings.Join(why, "; ")}
}

type direction string

const (
	ingress direction = "ingress"
	egress  direction = "egress"
)

// direction judges one side of f: pod's policies in direction dir, peer being the other end's
// address, and namedPortsOf the pod whose container ports named ports mean (nil: none).
func (m *Model) direction(pod *corev1.Pod, dir direction, peer netip.Addr, namedPortsOf *corev1.Pod, f Flow) Verdict {
	var isolating []string
	for _, np := range m.policies {
		if np.Namespace != pod.Namespace || !Selects(&np.Spec.PodSelector, pod.Labels) {
			continue
		}
		in, out := PolicyTypes(np)
		if (dir == ingress && !in) || (dir == egress && !out) {
			continue
		}
		isolating = append(isolating, np.Name)
		rules := rulesOf(np, dir)
		for i, r := range rules {
			if m.peersMatch(np.Namespace, r.peers, peer) && portsMatch(r.ports, f.Proto, f.Port, namedPortsOf) {
				return Verdict{true, fmt.Sprintf("%s of %s/%s allowed by %s/%s %s rule %d", dir, pod.Namespace, pod.Name, np.Namespace, np.Name, dir, i)}
			}
		}
	}
	if len(isolating) == 0 {
		return Verdict{true, fmt.Sprintf("%s/%s not isolated for %s", pod.Namespace, pod.Name, dir)}
	}
	return Verdict{false, fmt.Sprintf("%s/%s isolated for %s by %v, no rule allows peer %s on %s/%d", pod.Namespace, pod.Name, dir, isolating, peer, f.Proto, f.Port)}
}

// rule is an ingress or an egress rule: its peers (from or to) and ports.
type rule struct {
	peers []networkingv1.NetworkPolicyPeer
	ports []networkingv1.NetworkPolicyPort
}

func rulesOf(np *networkingv1.NetworkPolicy, dir direction) []rule {
	var out []rule
	if dir == ingress {
		for _, r := range np.Spec.Ingress {
			out = append(out, rule{r.From, r.Ports})
		}
		return out
	}
	for _, r := range np.Spec.Egress {
		out = append(out, rule{r.To, r.Ports})
	}
	return out
}

// PolicyTypes tells which directions np isolates, with the API's default for an empty list.
func PolicyTypes(np *networkingv1.NetworkPolicy) (in, out bool) {
	if len(np.Spec.PolicyTypes) == 0 {
		return true, len(np.Spec.Egress) > 0
	}
	for _, t := range np.Spec.PolicyTypes {
		switch t {
		case networkingv1.PolicyTypeIngress:
			in = true
		case networkingv1.PolicyTypeEgress:
			out = true
		}
	}
	return in, out
}

// peersMatch tells whether addr is one of peers of a rule of a policy in namespace.
func (m *Model) peersMatch(namespace string, peers []networkingv1.NetworkPolicyPeer, addr netip.Addr) bool {
	if len(peers) == 0 {
		return true
	}
	owner := m.owners[addr]
	for _, p := range peers {
		if p.IPBlock != nil {
			if inBlock(p.IPBlock, addr) {
				return true
			}
			continue
		}
		if owner == nil {
			continue
		}
		nsOK := owner.Namespace == namespace
		if p.NamespaceSelector != nil {
			nsOK = Selects(p.NamespaceSelector, m.nsLabels[owner.Namespace])
		}
		podOK := p.PodSelector == nil || Selects(p.PodSelector, owner.Labels)
		if nsOK && podOK {
			return true
		}
	}
	return false
}

// inBlock tells whether a lies in b's cidr and in none of its excepts.
func inBlock(b *networkingv1.IPBlock, a netip.Addr) bool {
	cidr, err := netip.ParsePrefix(b.CIDR)
	if err != nil || !cidr.Contains(a) {
		return false
	}
	for _, e := range b.Except {
		if ex, err := netip.ParsePrefix(e); err == nil && ex.Contains(a) {
			return false
		}
	}
	return true
}

// portsMatch tells whether proto and port are among ports, named ports being pod's.
func portsMatch(ports []networkingv1.NetworkPolicyPort, proto Proto, port uint16, pod *corev1.Pod) bool {
	if len(ports) == 0 {
		return true
	}
	if proto == ICMP {
		return false
	}
	for _, p := range ports {
		want := TCP
		if p.Protocol != nil {
			want = Proto(*p.Protocol)
		}
		if want != proto {
			continue
		}
		switch {
		case p.Port == nil:
			return true
		case p.Port.Type == intstr.Int:
			lo, hi := p.Port.IntVal, p.Port.IntVal
			if p.EndPort != nil {
				hi = *p.EndPort
			}
			if int32(port) >= lo && int32(port) <= hi {
				return true
			}
		default:
			if n, ok := containerPort(pod, p.Port.StrVal, proto); ok && n == port {
				return true
			}
		}
	}
	return false
}

// containerPort is the number of pod's container port name of protocol proto.
func containerPort(pod *corev1.Pod, name string, proto Proto) (uint16, bool) {
	if pod == nil {
		return 0, false
	}
	for _, c := range pod.Spec.Containers {
		for _, cp := range c.Ports {
			p := TCP
			if cp.Protocol != "" {
				p = Proto(cp.Protocol)
			}
			if cp.Name == name && p == proto {
				return uint16(cp.ContainerPort), true
			}
		}
	}
	return 0, false
}

// Selects is label selector matching as the API defines it: every matchLabels pair and every
// matchExpressions requirement holds; the empty selector selects everything. A nil selector
// selects nothing (callers treat "not set" themselves).
func Selects(s *metav1.LabelSelector, l map[string]string) bool {
	if s == nil {
		return false
	}
	for k, v := range s.MatchLabels {
		if have, ok := l[k]; !ok || have != v {
			return false
		}
	}
	for _, r := range s.MatchExpressions {
		v, ok := l[r.Key]
		switch r.Operator {
		case metav1.LabelSelectorOpIn:
			if !ok || !slices.Contains(r.Values, v) {
				return false
			}
		case metav1.LabelSelectorOpNotIn:
			if ok && slices.Contains(r.Values, v) {
				return false
			}
		case metav1.LabelSelectorOpExists:
			if !ok {
				return false
			}
		case metav1.LabelSelectorOpDoesNotExist:
			if ok {
				return false
			}
		default:
			return false
		}
	}
	return true
}

// Focused tells whether f is a probe worth more than a random one: a rule with ports of a
// policy that isolates one of its ends matches its protocol and port (named ports resolved as
// for the verdict), so the verdict hinges on that rule's peers, on the address family, on the
// other end. Random probes rarely hit a rule's port; these do.
func (m *Model) Focused(f Flow) bool {
	check := func(pod *corev1.Pod, dir direction, namedPortsOf *corev1.Pod) bool {
		if pod == nil {
			return false
		}
		for _, np := range m.policies {
			in, out := PolicyTypes(np)
			if np.Namespace != pod.Namespace || !Selects(&np.Spec.PodSelector, pod.Labels) || (dir == ingress && !in) || (dir == egress && !out) {
				continue
			}
			for _, r := range rulesOf(np, dir) {
				if len(r.ports) > 0 && portsMatch(r.ports, f.Proto, f.Port, namedPortsOf) {
					return true
				}
			}
		}
		return false
	}
	if f.From.Role == RoleLocal && check(m.objects[f.From.Sandbox], egress, m.owners[f.Dst]) {
		return true
	}
	return f.To.Role == RoleLocal && check(m.objects[f.To.Sandbox], ingress, m.objects[f.To.Sandbox])
}
