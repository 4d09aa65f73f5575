// Package policy turns the cluster's NetworkPolicies (networking.k8s.io/v1) into what the node's
// kernel enforces: for every pod on this node, whether each direction is isolated and which peer
// addresses, protocols and ports it allows (policyrules.Ruleset). Compile is pure: the controller
// (controller.go) feeds it from informers and the node's attachment records, and the core
// installs the result (netpol).
//
// The semantics are the API's (k8s.io/api/networking/v1 documentation):
//
//   - a pod is isolated for ingress (egress) when at least one policy in its namespace selects it
//     and has Ingress (Egress) in policyTypes; policyTypes left empty means Ingress, plus Egress
//     when the policy has egress rules;
//   - an isolated pod is allowed the union of the rules of every policy that isolates it; a
//     connection needs the source's egress and the destination's ingress to allow it;
//   - a rule's peers: none listed means every address; a podSelector alone selects pods of the
//     policy's namespace, a namespaceSelector alone every pod of the selected namespaces, both
//     together the selected pods of the selected namespaces; an ipBlock its CIDR minus except;
//   - a rule's ports: none listed means every protocol and port; a port's protocol defaults to
//     TCP; a missing port means every port of the protocol; endPort makes a range; a named port
//     is the container port of that name and protocol of the pod at the receiving end (the
//     selected pod for ingress, each peer pod for egress); a name no container has matches
//     nothing;
//   - hostNetwork pods are not subject to policies and are no pod peers (their address is the
//     node's); pods that have ended (Succeeded, Failed) are no peers.
package policy

import (
	"encoding/json"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kubenet-dev/kubenet/internal/policyrules"
)

// AuditAnnotation on a NetworkPolicy set to AuditMode stages it: compiled, but not enforced —
// what it would drop is counted and logged as such (policyrules.Direction.Audit). Any other
// value, or none, enforces the policy: a typo never leaves a pod open that its author meant to
// protect.
const (
	AuditAnnotation = "kubenet.dev/policy-mode"
	AuditMode       = "audit"
)

// isAudit tells whether a policy is staged.
func isAudit(np *networkingv1.NetworkPolicy) bool {
	return np.Annotations[AuditAnnotation] == AuditMode
}

// Local is one attachment on this node, from its record.
type Local struct {
	// Port is the interface index of the pod's bridge port: the kernel judges every frame of
	// the port by the pod's policies. 0: not attached to the bridge (being set up or torn down);
	// such a pod is left out, and stays denied.
	Port      int
	Namespace string // the pod, from CNI_ARGS; both empty for a container that is no pod
	Name      string
	// IPs are the pod's addresses, its IPv6 link-local one included: as a peer, the pod is all
	// of them.
	IPs []netip.Addr
}

// Input is everything Compile reads.
type Input struct {
	Policies   []*networkingv1.NetworkPolicy
	Namespaces []*corev1.Namespace
	Pods       []*corev1.Pod // every pod of the cluster (peers), this node's among them
	Local      []Local
	// NodeName is this node: its pods' addresses come from Local only, never from the API,
	// whose status.podIPs may still name an address that a deleted pod held and that a new
	// pod of this node has now.
	NodeName string
	// LocalCIDRs are this node's pod CIDRs: an address inside them is a local pod's only if
	// Local says so; the API's word for a pod of another node is not taken for it.
	LocalCIDRs []netip.Prefix
}

// Result is the ruleset and what Compile noticed on the way.
type Result struct {
	Ruleset policyrules.Ruleset
	// Unknown are local attachments that name a pod the API does not have (yet): they are left
	// out of the ruleset, so their addresses stay pending (denied).
	Unknown []Local
	// Isolated counts local pods isolated in at least one direction.
	Isolated int
}

var (
	allIPv4 = policyrules.PrefixRange(netip.MustParsePrefix("0.0.0.0/0"))
	allIPv6 = policyrules.PrefixRange(netip.MustParsePrefix("::/0"))
)

// peerPod is a pod that can be a peer: its labels, addresses and named ports.
type peerPod struct {
	key string // namespace/name
	pod *corev1.Pod
	ips []netip.Addr
}

// compiler holds the indexes of a compile: of one Compile call, or kept from pass to pass by
// Incremental, which updates them with the changes.
type compiler struct {
	nsLabels map[string]labels.Set
	pods     []*peerPod            // every pod that can be a peer, by key: the order of the entries
	byKey    map[string]*peerPod   // namespace/name → pod
	byNS     map[string][]*peerPod // namespace → its pods, by key
	selCache map[selectorKey]*selection
	// selections are the selections by what they select (shared: policies often have the same
	// peers, and a pod change is then matched against each once).
	selections map[string]*selection
	// rules holds the expansions of rules that are the same for every pod the policy selects
	// (all but ingress rules with named ports): a policy with thousands of peers is expanded
	// once per pass, not once per local pod.
	rules map[ruleKey]*expansion
	// expansions are the expansions by what they allow (ruleID), shared by the rules that
	// allow the same.
	expansions map[string]*expansion
	ruleIDs    map[ruleKey]string
	// targets are the policies' own pod selectors, parsed (nil: does not parse).
	targets map[*networkingv1.NetworkPolicy]labels.Selector
	// reads collects what the local pod being compiled reads of the pods (Incremental knows by
	// it which pods' changes call for compiling it again).
	reads *reads
}

type ruleKey struct {
	policy  *networkingv1.NetworkPolicy
	ingress bool
	index   int
}

type selectorKey struct {
	policy *networkingv1.NetworkPolicy
	peer   *networkingv1.NetworkPolicyPeer
}

// selection is the pods one pod or namespace selector peer of a policy selects.
type selection struct {
	namespace     string          // the policy's
	podSel, nsSel labels.Selector // nsSel nil: the policy's namespace only
	valid         bool            // false: a selector did not parse, and selects nothing
	id            string          // what it selects: equal for equal selections
	pods          []*peerPod      // by key
}

// expansion is a rule's entries and what they were made of.
type expansion struct {
	entries []policyrules.Entry
	reads   reads
}

// reads are the selections an expansion or a local pod's ruleset was made of, and whether it
// looked at every pod (an egress rule with a named port and an ipBlock).
type reads struct {
	selections map[*selection]bool
	allPods    bool
}

func (r *reads) add(o *reads) {
	if r == nil {
		return
	}
	for s := range o.selections {
		r.addSelection(s)
	}
	r.allPods = r.allPods || o.allPods
}

func (r *reads) addSelection(s *selection) {
	if r == nil {
		return
	}
	if r.selections == nil {
		r.selections = map[*selection]bool{}
	}
	r.selections[s] = true
}

func newCompiler() *compiler {
	return &compiler{nsLabels: map[string]labels.Set{}, byKey: map[string]*peerPod{}, byNS: map[string][]*peerPod{},
		selCache: map[selectorKey]*selection{}, selections: map[string]*selection{}, rules: map[ruleKey]*expansion{}, expansions: map[string]*expansion{},
		ruleIDs: map[ruleKey]string{}, targets: map[*networkingv1.NetworkPolicy]labels.Selector{}}
}

// index sorts the pods by key and indexes them.
func (c *compiler) index() {
	slices.SortStableFunc(c.pods, func(a, b *peerPod) int { return strings.Compare(a.key, b.key) })
	for _, pp := range c.pods {
		c.byKey[pp.key] = pp
		c.byNS[pp.pod.Namespace] = append(c.byNS[pp.pod.Namespace], pp)
	}
}

// setPod puts pod (nil: none) in place of the peer of key namespace/name in the indexes.
func (c *compiler) setPod(namespace, key string, pod *peerPod) {
	c.pods = replaceByKey(c.pods, key, pod)
	if c.byNS[namespace] = replaceByKey(c.byNS[namespace], key, pod); len(c.byNS[namespace]) == 0 {
		delete(c.byNS, namespace)
	}
	if pod == nil {
		delete(c.byKey, key)
	} else {
		c.byKey[key] = pod
	}
}

// replaceByKey puts pod in place of the pod of key in pods (sorted by key): inserted if there is
// none, removed if pod is nil.
func replaceByKey(pods []*peerPod, key string, pod *peerPod) []*peerPod {
	i, found := slices.BinarySearchFunc(pods, key, byKey)
	switch {
	case found && pod == nil:
		return slices.Delete(pods, i, i+1)
	case found:
		pods[i] = pod
		return pods
	case pod == nil:
		return pods
	}
	return slices.Insert(pods, i, pod)
}

func byKey(p *peerPod, key string) int { return strings.Compare(p.key, key) }

// Compile computes the ruleset of the local pods. Pure: the same input gives the same ruleset,
// whatever the order of its pods and policies.
func Compile(in Input) Result {
	c := newCompiler()
	for _, ns := range in.Namespaces {
		c.nsLabels[ns.Name] = labels.Set(ns.Labels)
	}
	localIPs := localAddrs(in.Local)
	for _, p := range in.Pods {
		if pp := newPeerPod(p, localIPs, in.NodeName, in.LocalCIDRs); pp != nil {
			c.pods = append(c.pods, pp)
		}
	}
	c.index()
	byNamespace := map[string][]*networkingv1.NetworkPolicy{}
	for _, np := range in.Policies {
		byNamespace[np.Namespace] = append(byNamespace[np.Namespace], np)
	}
	for _, nps := range byNamespace {
		slices.SortStableFunc(nps, func(a, b *networkingv1.NetworkPolicy) int { return strings.Compare(a.Name, b.Name) })
	}
	var res Result
	for _, l := range in.Local {
		res.add(l, c.local(l, byNamespace[l.Namespace]))
	}
	return res
}

// localAddrs are the local pods' addresses by namespace/name.
func localAddrs(local []Local) map[string][]netip.Addr {
	out := map[string][]netip.Addr{}
	for _, l := range local {
		if l.Name != "" {
			out[l.Namespace+"/"+l.Name] = append(out[l.Namespace+"/"+l.Name], l.IPs...)
		}
	}
	return out
}

// newPeerPod is p as a peer; nil when it can be none (host network, ended, no address).
func newPeerPod(p *corev1.Pod, localIPs map[string][]netip.Addr, nodeName string, localCIDRs []netip.Prefix) *peerPod {
	if p.Spec.HostNetwork || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return nil
	}
	key := p.Namespace + "/" + p.Name
	// This node's pods are known by their records, before the API's status has them, and
	// only by them: a pod of this node without a record has no address here.
	ips := localIPs[key]
	if ips == nil && (nodeName == "" || p.Spec.NodeName != nodeName) {
		ips = slices.DeleteFunc(podIPs(p), func(a netip.Addr) bool {
			return slices.ContainsFunc(localCIDRs, func(c netip.Prefix) bool { return c.Contains(a) })
		})
	}
	if len(ips) == 0 {
		return nil
	}
	return &peerPod{key: key, pod: p, ips: ips}
}

// localResult is what compiling one local attachment gave.
type localResult struct {
	pod     policyrules.Pod
	skip    bool // not on the bridge: left out
	unknown bool // its pod is not in the API (yet)
}

func (r *Result) add(l Local, lr localResult) {
	switch {
	case lr.skip:
	case lr.unknown:
		r.Unknown = append(r.Unknown, l)
	default:
		if lr.pod.Ingress.Isolated || lr.pod.Egress.Isolated {
			r.Isolated++
		}
		r.Ruleset.Pods = append(r.Ruleset.Pods, lr.pod)
	}
}

// local compiles one local attachment with the policies of its namespace, by name.
func (c *compiler) local(l Local, policies []*networkingv1.NetworkPolicy) localResult {
	if l.Port <= 0 {
		return localResult{skip: true} // not on the bridge (yet, or any more): held
	}
	pp := policyrules.Pod{Port: l.Port, Name: l.Namespace + "/" + l.Name, IPs: l.IPs}
	if l.Name == "" {
		// Not a Kubernetes pod (a container a runtime started outside Kubernetes): no policy
		// can select it.
		return localResult{pod: pp}
	}
	target, ok := c.byKey[l.Namespace+"/"+l.Name]
	if !ok {
		return localResult{unknown: true}
	}
	c.isolate(&pp, target, policies, false)
	if slices.ContainsFunc(policies, isAudit) {
		var audit policyrules.Pod
		c.isolate(&audit, target, policies, true)
		for _, d := range []struct{ pod, audit *policyrules.Direction }{{&pp.Ingress, &audit.Ingress}, {&pp.Egress, &audit.Egress}} {
			if !d.pod.Isolated && d.audit.Isolated {
				*d.pod = *d.audit
				d.pod.Audit = true
			}
		}
	}
	slices.Sort(pp.Ingress.Policies)
	slices.Sort(pp.Egress.Policies)
	return localResult{pod: pp}
}

// isolate adds to pp what the policies (of the pod's namespace) that select it isolate and allow,
// direction by direction: the enforced ones, or (audit) the staged ones.
func (c *compiler) isolate(pp *policyrules.Pod, target *peerPod, policies []*networkingv1.NetworkPolicy, audit bool) {
	for _, np := range policies {
		if isAudit(np) != audit {
			continue
		}
		selected, valid := c.selects(np, target.pod.Labels)
		if !selected {
			continue
		}
		ingress, egress, known := policyTypes(np)
		if !known {
			// A type the API does not have: which directions the policy meant is unknown.
			ingress, egress, valid = true, true, false
		}
		name := np.Namespace + "/" + np.Name
		if ingress {
			pp.Ingress.Policies = append(pp.Ingress.Policies, name)
		}
		if egress {
			pp.Egress.Policies = append(pp.Egress.Policies, name)
		}
		if !valid {
			// Isolated in the policy's directions with nothing allowed by it.
			pp.Ingress.Isolated = pp.Ingress.Isolated || ingress
			pp.Egress.Isolated = pp.Egress.Isolated || egress
			continue
		}
		if ingress {
			pp.Ingress.Isolated = true
			for i := range np.Spec.Ingress {
				r := &np.Spec.Ingress[i]
				pp.Ingress.Allow = c.addRule(pp.Ingress.Allow, ruleKey{np, true, i}, r.From, r.Ports, target)
			}
		}
		if egress {
			pp.Egress.Isolated = true
			for i := range np.Spec.Egress {
				r := &np.Spec.Egress[i]
				pp.Egress.Allow = c.addRule(pp.Egress.Allow, ruleKey{np, false, i}, r.To, r.Ports, target)
			}
		}
	}
}

// addRule appends the entries of one rule of a policy for the local pod target to allow, up to
// one past policyrules.MaxAllowEntries: a direction over the limit reaches the kernel side as such
// and is refused there, and expanding further would be wasted work.
func (c *compiler) addRule(allow []policyrules.Entry, key ruleKey, peers []networkingv1.NetworkPolicyPeer, ports []networkingv1.NetworkPolicyPort, target *peerPod) []policyrules.Entry {
	room := policyrules.MaxAllowEntries + 1 - len(allow)
	if room <= 0 {
		return allow
	}
	samePerPod := !key.ingress || !slices.ContainsFunc(ports, func(p networkingv1.NetworkPolicyPort) bool {
		return p.Port != nil && p.Port.Type == intstr.String
	})
	var id string
	got, ok := c.rules[key]
	if !ok && samePerPod {
		var known bool
		if id, known = c.ruleIDs[key]; !known {
			id = ruleID(key, peers, ports)
			c.ruleIDs[key] = id
		}
		if got, ok = c.expansions[id]; ok {
			c.rules[key] = got
		}
	}
	if ok {
		c.reads.add(&got.reads)
		return appendShared(allow, got.entries[:min(len(got.entries), room)])
	}
	outer := c.reads
	c.reads = &reads{}
	entries := c.rule(key.policy, peers, ports, target, key.ingress, room)
	read := c.reads
	c.reads = outer
	c.reads.add(read)
	if samePerPod && len(entries) < room { // complete: not cut at room
		e := &expansion{entries: entries, reads: *read}
		c.rules[key], c.expansions[id] = e, e
		return appendShared(allow, entries)
	}
	return append(allow, entries...)
}

// appendShared appends an expansion's entries, which are shared, to allow: a direction made of
// one rule is the expansion itself (a hundred pods with the same policy are one list, not a
// hundred copies), clipped so that appending to it copies. Nobody writes into an allow list.
func appendShared(allow, entries []policyrules.Entry) []policyrules.Entry {
	if len(allow) == 0 && len(entries) > 0 {
		return entries[:len(entries):len(entries)]
	}
	return append(allow, entries...)
}

// ruleID says what a rule that is the same for every pod allows: rules with the same ID have the
// same expansion (policies often share rules, "from the monitoring namespace").
func ruleID(key ruleKey, peers []networkingv1.NetworkPolicyPeer, ports []networkingv1.NetworkPolicyPort) string {
	namespace := "" // a peer without a namespace selector selects in the policy's namespace
	if slices.ContainsFunc(peers, func(p networkingv1.NetworkPolicyPeer) bool { return p.IPBlock == nil && p.NamespaceSelector == nil }) {
		namespace = key.policy.Namespace
	}
	id, _ := json.Marshal(struct {
		Namespace string
		Ingress   bool
		Peers     []networkingv1.NetworkPolicyPeer
		Ports     []networkingv1.NetworkPolicyPort
	}{namespace, key.ingress, peers, ports})
	return string(id)
}

// policyTypes says which directions np isolates, and whether every type it lists is one the API
// has (the API server refuses others; such a policy fails closed).
func policyTypes(np *networkingv1.NetworkPolicy) (ingress, egress, known bool) {
	if len(np.Spec.PolicyTypes) == 0 {
		return true, len(np.Spec.Egress) > 0, true
	}
	for _, t := range np.Spec.PolicyTypes {
		switch t {
		case networkingv1.PolicyTypeIngress:
			ingress = true
		case networkingv1.PolicyTypeEgress:
			egress = true
		default:
			return ingress, egress, false
		}
	}
	return ingress, egress, true
}

// selects is policySelects with the policy's selector parsed once.
func (c *compiler) selects(np *networkingv1.NetworkPolicy, l map[string]string) (selected, valid bool) {
	s, ok := c.targets[np]
	if !ok {
		var err error
		if s, err = metav1.LabelSelectorAsSelector(&np.Spec.PodSelector); err != nil {
			s = nil
		}
		c.targets[np] = s
	}
	if s == nil {
		return true, false
	}
	return s.Matches(labels.Set(l)), true
}

// policySelects applies a policy's own podSelector to a pod's labels. The API server validates
// selectors, so one that does not parse is a corrupted object; leaving the policy out would fail
// open (the pods it was written to isolate would not be), so it selects every pod of the
// policy's namespace and reports valid false: the policy then isolates them in its directions and
// allows nothing. (A peer's selector that does not parse selects no peer: that fails closed by
// itself.)
func policySelects(sel *metav1.LabelSelector, l map[string]string) (selected, valid bool) {
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		return true, false
	}
	return s.Matches(labels.Set(l)), true
}

// rule expands one ingress (from) or egress (to) rule of a policy for the local pod
// target into at most room entries (a rule's peers times its ports can be many more than the
// policy's size: the expansion stops where the direction is over policyrules.MaxAllowEntries,
// which refuses it whole).
func (c *compiler) rule(policy *networkingv1.NetworkPolicy, peers []networkingv1.NetworkPolicyPeer, ports []networkingv1.NetworkPolicyPort, target *peerPod, ingress bool, room int) []policyrules.Entry {
	type peerSet struct {
		ranges []policyrules.Range // ipBlocks, or everything
		pods   []*peerPod
	}
	var ps peerSet
	if len(peers) == 0 {
		ps.ranges = []policyrules.Range{allIPv4, allIPv6}
	}
	for i := range peers {
		p := &peers[i]
		if p.IPBlock != nil {
			ps.ranges = append(ps.ranges, blockRanges(p.IPBlock)...)
			continue
		}
		ps.pods = append(ps.pods, c.selectPeers(policy, p)...)
	}

	var out []policyrules.Entry
	// add appends rs on ports, up to room entries in all; false once room is used up.
	add := func(rs []policyrules.Range, ports *policyrules.Ports) bool {
		for _, r := range rs {
			if len(out) == room {
				return false
			}
			out = append(out, policyrules.Entry{Peer: r, Ports: ports})
		}
		return true
	}
	// addAddrs appends single addresses on ports, like add.
	addAddrs := func(ips []netip.Addr, ports *policyrules.Ports) bool {
		for _, a := range ips {
			if len(out) == room {
				return false
			}
			out = append(out, policyrules.Entry{Peer: policyrules.Single(a), Ports: ports})
		}
		return true
	}
	// addPeers appends every peer on ports.
	addPeers := func(ports *policyrules.Ports) bool {
		if !add(ps.ranges, ports) {
			return false
		}
		for _, pod := range ps.pods {
			if !addAddrs(pod.ips, ports) {
				return false
			}
		}
		return true
	}
	if len(ports) == 0 {
		addPeers(nil)
		return out
	}
	for i := range ports {
		pt := &ports[i]
		proto := protocol(pt.Protocol)
		if proto == 0 {
			continue
		}
		if pt.EndPort != nil && (pt.Port == nil || pt.Port.Type != intstr.Int) {
			continue // a range needs a numbered first port (the API server refuses others)
		}
		if pt.Port != nil && pt.Port.Type == intstr.String && pt.Port.StrVal == "" {
			continue // no name: the API server refuses it, and it must not match unnamed ports
		}
		if pt.Port == nil || pt.Port.Type == intstr.Int {
			// A numbered port (or every port of the protocol): the same for every peer.
			first, last := uint16(0), uint16(65535)
			if pt.Port != nil {
				if pt.Port.IntVal < 1 || pt.Port.IntVal > 65535 {
					continue
				}
				first, last = uint16(pt.Port.IntVal), uint16(pt.Port.IntVal)
				if pt.EndPort != nil {
					if *pt.EndPort < pt.Port.IntVal || *pt.EndPort > 65535 {
						continue
					}
					last = uint16(*pt.EndPort)
				}
			}
			if !addPeers(&policyrules.Ports{Protocol: proto, First: first, Last: last}) {
				return out
			}
			continue
		}
		// A named port: resolved on the pod that receives the connection.
		name := pt.Port.StrVal
		if ingress {
			if n, ok := namedPort(target.pod, name, pt.Protocol); ok && !addPeers(&policyrules.Ports{Protocol: proto, First: n, Last: n}) {
				return out
			}
			continue
		}
		// Egress: each destination pod's own port of that name. Address ranges only reach
		// the pods inside them that have the port: other addresses have no named ports.
		inRanges := newRangeSet(ps.ranges)
		selected := make(map[*peerPod]bool, len(ps.pods))
		dests := slices.Clone(ps.pods)
		for _, pod := range ps.pods {
			selected[pod] = true
		}
		if len(ps.ranges) > 0 {
			c.reads.allPods = true
			for _, pod := range c.pods {
				if !selected[pod] && slices.ContainsFunc(pod.ips, inRanges.contains) {
					dests = append(dests, pod)
				}
			}
		}
		for _, pod := range dests {
			if n, ok := namedPort(pod.pod, name, pt.Protocol); ok {
				var ips []netip.Addr
				for _, a := range pod.ips {
					if len(ps.ranges) == 0 || selected[pod] || inRanges.contains(a) {
						ips = append(ips, a)
					}
				}
				if !addAddrs(ips, &policyrules.Ports{Protocol: proto, First: n, Last: n}) {
					return out
				}
			}
		}
	}
	return out
}

// selectPeers returns the pods a pod or namespace selector peer of policy selects.
func (c *compiler) selectPeers(policy *networkingv1.NetworkPolicy, p *networkingv1.NetworkPolicyPeer) []*peerPod {
	key := selectorKey{policy, p}
	s, ok := c.selCache[key]
	if !ok {
		s = newSelection(policy.Namespace, p)
		if shared, ok := c.selections[s.id]; ok {
			s = shared
		} else {
			c.fill(s)
			c.selections[s.id] = s
		}
		c.selCache[key] = s
	}
	c.reads.addSelection(s)
	return s.pods
}

// newSelection parses a peer's selectors; a selector that does not parse selects no pod.
func newSelection(namespace string, p *networkingv1.NetworkPolicyPeer) *selection {
	s := &selection{namespace: namespace, podSel: labels.Everything()}
	if p.PodSelector != nil {
		sel, err := metav1.LabelSelectorAsSelector(p.PodSelector)
		if err != nil {
			s.id = "invalid"
			return s
		}
		s.podSel = sel
	}
	if p.NamespaceSelector != nil {
		sel, err := metav1.LabelSelectorAsSelector(p.NamespaceSelector)
		if err != nil {
			s.id = "invalid"
			return s
		}
		s.nsSel = sel
	}
	s.valid = true
	// What the selection selects, exactly (JSON quotes every value and orders the maps); the
	// policy's namespace counts only without a namespace selector.
	id, _ := json.Marshal(struct {
		Namespace   string                `json:"n,omitempty"`
		PodSelector *metav1.LabelSelector `json:"p,omitempty"`
		NSSelector  *metav1.LabelSelector `json:"s,omitempty"`
	}{PodSelector: p.PodSelector, NSSelector: p.NamespaceSelector})
	if p.NamespaceSelector == nil {
		id, _ = json.Marshal(struct {
			Namespace   string                `json:"n"`
			PodSelector *metav1.LabelSelector `json:"p,omitempty"`
		}{namespace, p.PodSelector})
	}
	s.id = string(id)
	return s
}

// fill finds the selection's pods.
func (c *compiler) fill(s *selection) {
	s.pods = s.pods[:0]
	if !s.valid {
		return
	}
	if s.nsSel == nil {
		for _, pod := range c.byNS[s.namespace] {
			if s.podSel.Matches(labels.Set(pod.pod.Labels)) {
				s.pods = append(s.pods, pod)
			}
		}
		return
	}
	for ns, pods := range c.byNS {
		if nsl, ok := c.nsLabels[ns]; !ok || !s.nsSel.Matches(nsl) {
			continue
		}
		for _, pod := range pods {
			if s.podSel.Matches(labels.Set(pod.pod.Labels)) {
				s.pods = append(s.pods, pod)
			}
		}
	}
	slices.SortFunc(s.pods, func(a, b *peerPod) int { return strings.Compare(a.key, b.key) })
}

// matches tells whether the selection takes pod, with the namespaces' labels nsLabels.
func (s *selection) matches(pod *peerPod, nsLabels map[string]labels.Set) bool {
	if !s.valid {
		return false
	}
	if s.nsSel == nil {
		if pod.pod.Namespace != s.namespace {
			return false
		}
	} else if nsl, ok := nsLabels[pod.pod.Namespace]; !ok || !s.nsSel.Matches(nsl) {
		return false
	}
	return s.podSel.Matches(labels.Set(pod.pod.Labels))
}

// rangeSet answers whether an address is in a union of ranges, in O(log n).
type rangeSet []policyrules.Range // sorted, disjoint

func newRangeSet(rs []policyrules.Range) rangeSet {
	var out rangeSet
	var v4, v6 []policyrules.Range
	for _, r := range rs {
		if r.First.Is4() {
			v4 = append(v4, r)
		} else {
			v6 = append(v6, r)
		}
	}
	out = append(out, policyrules.MergeRanges(v4)...)
	return append(out, policyrules.MergeRanges(v6)...)
}

func (s rangeSet) contains(a netip.Addr) bool {
	// The first range that starts after a; a is in the one before it, or in none.
	i, _ := slices.BinarySearchFunc(s, a, func(r policyrules.Range, a netip.Addr) int {
		if r.First.Compare(a) <= 0 {
			return -1
		}
		return 1
	})
	return i > 0 && inRange(a, s[i-1])
}

func inRange(a netip.Addr, r policyrules.Range) bool {
	return a.Is4() == r.First.Is4() && a.Compare(r.First) >= 0 && a.Compare(r.Last) <= 0
}

// protocol maps a NetworkPolicyPort's protocol (default TCP) to its number; 0 for one the API
// does not know.
func protocol(p *corev1.Protocol) uint8 {
	if p == nil {
		return policyrules.TCP
	}
	switch *p {
	case corev1.ProtocolTCP:
		return policyrules.TCP
	case corev1.ProtocolUDP:
		return policyrules.UDP
	case corev1.ProtocolSCTP:
		return policyrules.SCTP
	}
	return 0
}

// namedPort finds the container port called name with protocol (default TCP) in pod.
func namedPort(pod *corev1.Pod, name string, proto *corev1.Protocol) (uint16, bool) {
	want := corev1.ProtocolTCP
	if proto != nil {
		want = *proto
	}
	for _, cs := range [][]corev1.Container{pod.Spec.Containers, pod.Spec.InitContainers} {
		for _, ctr := range cs {
			for _, p := range ctr.Ports {
				pp := p.Protocol
				if pp == "" {
					pp = corev1.ProtocolTCP
				}
				if p.Name == name && pp == want && p.ContainerPort > 0 && p.ContainerPort <= 65535 {
					return uint16(p.ContainerPort), true
				}
			}
		}
	}
	return 0, false
}

// podIPs are a pod's addresses from its status.
func podIPs(p *corev1.Pod) []netip.Addr {
	var out []netip.Addr
	for _, ip := range p.Status.PodIPs {
		if a, err := netip.ParseAddr(ip.IP); err == nil {
			out = append(out, a.Unmap())
		}
	}
	if len(out) == 0 && p.Status.PodIP != "" {
		if a, err := netip.ParseAddr(p.Status.PodIP); err == nil {
			out = append(out, a.Unmap())
		}
	}
	return out
}
