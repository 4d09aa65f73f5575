package policy

import (
	"maps"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// Incremental compiles like Compile, but keeps its indexes and every local pod's result from one
// call to the next and compiles again only the local pods a change can affect: those of the
// namespace of a policy that changed, those whose own pod or attachment changed, and those whose
// rules were made of a selection that a changed pod or namespace entered, left or changed within
// (or of every pod: an egress rule with a named port and an ipBlock). The result is Compile's
// on the same objects (TestIncrementalAgainstCompile). Not safe for concurrent use.
type Incremental struct {
	nodeName string
	// The objects, by key, as the Set methods left them.
	pods       map[string]*corev1.Pod
	namespaces map[string]*corev1.Namespace
	policies   map[string]*networkingv1.NetworkPolicy

	// What the last Compile made; built false: the next Compile is a full one.
	built    bool
	c        *compiler
	cidrs    []netip.Prefix
	localIPs map[string][]netip.Addr
	byNS     map[string][]*networkingv1.NetworkPolicy // by name
	results  map[localID]compiledLocal
	// compiled counts the local pods the last Compile compiled (the others kept their result);
	// full says it compiled everything from the objects.
	compiled int
	full     bool

	// The changes since the last Compile, by key.
	changedPods       map[string]bool
	changedNamespaces map[string]bool
	changedPolicies   map[string]*networkingv1.NetworkPolicy // key → the policy the compiler has (nil: none)
}

// compiledLocal is what compiling one attachment gave, with the attachment and what it read.
type compiledLocal struct {
	local  Local
	result localResult
	reads  *reads
}

// localID is one attachment as a local pod's result depends on it: its port and its pod.
type localID struct {
	port int
	key  string
}

// NewIncremental is an empty Incremental for the node nodeName (Input.NodeName).
func NewIncremental(nodeName string) *Incremental {
	x := &Incremental{nodeName: nodeName, pods: map[string]*corev1.Pod{}, namespaces: map[string]*corev1.Namespace{},
		policies: map[string]*networkingv1.NetworkPolicy{}}
	x.Reset()
	return x
}

// Reset makes the next Compile a full one (the objects stay).
func (x *Incremental) Reset() {
	x.built = false
	x.changedPods, x.changedNamespaces, x.changedPolicies = map[string]bool{}, map[string]bool{}, map[string]*networkingv1.NetworkPolicy{}
}

// SetPod records the pod of key namespace/name as it is now; nil: deleted.
func (x *Incremental) SetPod(key string, p *corev1.Pod) {
	if p == nil {
		delete(x.pods, key)
	} else {
		x.pods[key] = p
	}
	x.changedPods[key] = true
}

// SetNamespace records the namespace name as it is now; nil: deleted.
func (x *Incremental) SetNamespace(name string, ns *corev1.Namespace) {
	if ns == nil {
		delete(x.namespaces, name)
	} else {
		x.namespaces[name] = ns
	}
	x.changedNamespaces[name] = true
}

// SetPolicy records the policy of key namespace/name as it is now; nil: deleted.
func (x *Incremental) SetPolicy(key string, np *networkingv1.NetworkPolicy) {
	if _, ok := x.changedPolicies[key]; !ok {
		x.changedPolicies[key] = x.policies[key]
	}
	if np == nil {
		delete(x.policies, key)
	} else {
		x.policies[key] = np
	}
}

// Input is the objects as Compile takes them, with the node's attachments.
func (x *Incremental) Input(local []Local, localCIDRs []netip.Prefix) Input {
	in := Input{Local: local, NodeName: x.nodeName, LocalCIDRs: localCIDRs,
		Policies:   make([]*networkingv1.NetworkPolicy, 0, len(x.policies)),
		Namespaces: make([]*corev1.Namespace, 0, len(x.namespaces)),
		Pods:       make([]*corev1.Pod, 0, len(x.pods))}
	for _, np := range x.policies {
		in.Policies = append(in.Policies, np)
	}
	for _, ns := range x.namespaces {
		in.Namespaces = append(in.Namespaces, ns)
	}
	for _, p := range x.pods {
		in.Pods = append(in.Pods, p)
	}
	return in
}

// Built tells whether the next Compile is an incremental one.
func (x *Incremental) Built() bool { return x.built }

// Full tells whether the last Compile compiled everything from the objects.
func (x *Incremental) Full() bool { return x.full }

// Compiled is how many local pods the last Compile compiled; the others kept their result.
func (x *Incremental) Compiled() int { return x.compiled }

// Policies is how many policies there are.
func (x *Incremental) Policies() int { return len(x.policies) }

// Pod is the pod of key namespace/name, if there is one.
func (x *Incremental) Pod(key string) (*corev1.Pod, bool) {
	p, ok := x.pods[key]
	return p, ok
}

// Compile is Compile(x.Input(local, localCIDRs)), compiling again only what the changes since the
// last call can affect.
func (x *Incremental) Compile(local []Local, localCIDRs []netip.Prefix) Result {
	localIPs := localAddrs(local)
	x.full = !x.built || !slices.Equal(x.cidrs, localCIDRs)
	if x.full {
		x.rebuild(localIPs, localCIDRs)
	} else {
		x.update(localIPs)
	}
	dirtyNS := map[string]bool{}
	for key := range x.changedPolicies {
		ns, _, _ := strings.Cut(key, "/")
		dirtyNS[ns] = true
	}
	dirty, allPods := x.applyPodChanges()
	results := make(map[localID]compiledLocal, len(local))
	x.compiled = 0
	var res Result
	for _, l := range local {
		id := localID{l.Port, l.Namespace + "/" + l.Name}
		cl, ok := x.results[id]
		if !ok || !sameLocal(cl.local, l) || dirtyNS[l.Namespace] || x.changedPods[id.key] || cl.reads.stale(dirty, allPods) {
			cl = compiledLocal{local: l, reads: &reads{}}
			x.c.reads = cl.reads
			cl.result = x.c.local(l, x.byNS[l.Namespace])
			x.c.reads = nil
			x.compiled++
		}
		if _, twice := results[id]; !twice {
			results[id] = cl
		}
		res.add(l, cl.result)
	}
	x.results = results
	x.changedPods, x.changedNamespaces, x.changedPolicies = map[string]bool{}, map[string]bool{}, map[string]*networkingv1.NetworkPolicy{}
	return res
}

func sameLocal(a, b Local) bool {
	return a.Port == b.Port && a.Namespace == b.Namespace && a.Name == b.Name && slices.Equal(a.IPs, b.IPs)
}

// stale tells whether what r read changed: one of the dirty selections, or any pod.
func (r *reads) stale(dirty map[*selection]bool, anyPod bool) bool {
	if anyPod && r.allPods {
		return true
	}
	for s := range r.selections {
		if dirty[s] {
			return true
		}
	}
	return false
}

// rebuild makes the indexes from the objects, as Compile does.
func (x *Incremental) rebuild(localIPs map[string][]netip.Addr, cidrs []netip.Prefix) {
	x.c = newCompiler()
	x.cidrs, x.localIPs = slices.Clone(cidrs), localIPs
	for _, ns := range x.namespaces {
		x.c.nsLabels[ns.Name] = labels.Set(ns.Labels)
	}
	for _, p := range x.pods {
		if pp := newPeerPod(p, localIPs, x.nodeName, cidrs); pp != nil {
			x.c.pods = append(x.c.pods, pp)
		}
	}
	x.c.index()
	x.byNS = map[string][]*networkingv1.NetworkPolicy{}
	for _, np := range x.policies {
		x.byNS[np.Namespace] = append(x.byNS[np.Namespace], np)
	}
	for _, nps := range x.byNS {
		slices.SortFunc(nps, func(a, b *networkingv1.NetworkPolicy) int { return strings.Compare(a.Name, b.Name) })
	}
	x.results = map[localID]compiledLocal{}
	x.changedPods, x.changedNamespaces, x.changedPolicies = map[string]bool{}, map[string]bool{}, map[string]*networkingv1.NetworkPolicy{}
	x.built = true
}

// update brings the namespaces and policies of the indexes up to date, and notes the pods
// whose addresses on the node changed as changed.
func (x *Incremental) update(localIPs map[string][]netip.Addr) {
	for key, ips := range localIPs {
		if !slices.Equal(ips, x.localIPs[key]) {
			x.changedPods[key] = true
		}
	}
	for key := range x.localIPs {
		if _, ok := localIPs[key]; !ok {
			x.changedPods[key] = true
		}
	}
	x.localIPs = localIPs

	pruneSelections := false
	for key, old := range x.changedPolicies {
		ns, _, _ := strings.Cut(key, "/")
		if old != nil {
			maps.DeleteFunc(x.c.selCache, func(k selectorKey, _ *selection) bool { return k.policy == old })
			maps.DeleteFunc(x.c.ruleIDs, func(k ruleKey, _ string) bool { return k.policy == old })
			// Their expansions may be other policies' too: pruned below.
			maps.DeleteFunc(x.c.rules, func(k ruleKey, _ *expansion) bool { return k.policy == old })
			delete(x.c.targets, old)
			pruneSelections = true
			x.byNS[ns] = slices.DeleteFunc(x.byNS[ns], func(np *networkingv1.NetworkPolicy) bool { return np == old })
		}
		if np, ok := x.policies[key]; ok {
			nps := x.byNS[ns]
			i, _ := slices.BinarySearchFunc(nps, np.Name, func(a *networkingv1.NetworkPolicy, name string) int { return strings.Compare(a.Name, name) })
			x.byNS[ns] = slices.Insert(nps, i, np)
		}
		if len(x.byNS[ns]) == 0 {
			delete(x.byNS, ns)
		}
	}
	if pruneSelections {
		// Selections no policy has any more: every pod change would be matched against them.
		dropUnused(x.c.selections, x.c.selCache)
		dropUnused(x.c.expansions, x.c.rules)
	}
}

// dropUnused deletes the entries of m whose value is no value of users.
func dropUnused[K1, K2, V comparable](m map[K1]V, users map[K2]V) {
	used := make(map[V]bool, len(users))
	for _, v := range users {
		used[v] = true
	}
	maps.DeleteFunc(m, func(_ K1, v V) bool { return !used[v] })
}

// applyPodChanges brings the pods and namespaces of the indexes up to date and returns the
// selections that changed (a pod entered or left them, or changed within them), and whether a
// pod changed at all.
func (x *Incremental) applyPodChanges() (dirty map[*selection]bool, anyPod bool) {
	dirty = map[*selection]bool{}
	for name := range x.changedNamespaces {
		old, had := x.c.nsLabels[name]
		var now labels.Set
		ns, has := x.namespaces[name]
		if has {
			now = labels.Set(ns.Labels)
			x.c.nsLabels[name] = now
		} else {
			delete(x.c.nsLabels, name)
		}
		for _, s := range x.c.selections {
			if s.nsSel == nil || !s.valid || (had && s.nsSel.Matches(old)) == (has && s.nsSel.Matches(now)) {
				continue
			}
			x.c.fill(s) // the namespace's pods entered or left the selection
			dirty[s] = true
		}
	}
	for key := range x.changedPods {
		old := x.c.byKey[key]
		var now *peerPod
		if p, ok := x.pods[key]; ok {
			now = newPeerPod(p, x.localIPs, x.nodeName, x.cidrs)
		}
		if old == nil && now == nil {
			continue
		}
		if old != nil && now != nil && samePod(old.pod, now.pod) && slices.Equal(old.ips, now.ips) {
			continue
		}
		anyPod = true
		ns, _, _ := strings.Cut(key, "/")
		x.c.setPod(ns, key, now)
		for _, s := range x.c.selections {
			_, was := slices.BinarySearchFunc(s.pods, key, byKey)
			is := now != nil && s.matches(now, x.c.nsLabels)
			if !was && !is {
				continue
			}
			put := now
			if !is {
				put = nil
			}
			s.pods = replaceByKey(s.pods, key, put)
			dirty[s] = true
		}
	}
	for k, e := range x.c.rules {
		if e.reads.stale(dirty, anyPod) {
			delete(x.c.rules, k)
		}
	}
	for id, e := range x.c.expansions {
		if e.reads.stale(dirty, anyPod) {
			delete(x.c.expansions, id)
		}
	}
	return dirty, anyPod
}
