package main

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	typednetworkingv1 "k8s.io/client-go/kubernetes/typed/networking/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kubenet-dev/kubenet/agent/policy"
	"github.com/kubenet-dev/kubenet/core"
	"github.com/kubenet-dev/kubenet/internal/policyrules"
)

// This file is explain's --kubeconfig: what the API's objects mean for the pod now, compiled as
// the agent compiles them (agent/policy.Compile, with the node's records), against what the
// kernel holds.

// apiTimeout bounds the lists from the API server.
const apiTimeout = 30 * time.Second

// apiComparison is the answer to "does the kernel hold what the API's objects mean now?".
type apiComparison struct {
	Compared bool          `json:"compared"`
	InSync   bool          `json:"inSync"`
	Summary  string        `json:"summary"`
	Ingress  *apiDirection `json:"ingress,omitempty"`
	Egress   *apiDirection `json:"egress,omitempty"`
}

// apiDirection is one direction where the kernel differs from the API's objects.
type apiDirection struct {
	// Want is the chain the API's objects mean (a group, the allow chain, "" held); Have the
	// kernel's.
	Want     string   `json:"want"`
	Have     string   `json:"have"`
	Policies []string `json:"policies,omitempty"` // those that isolate the pod, by the API
	// Missing are the entries the API's objects allow that the kernel's group lacks; Extra
	// those the kernel's group allows that they no longer do.
	Missing []allowed `json:"missing,omitempty"`
	Extra   []allowed `json:"extra,omitempty"`
	Note    string    `json:"note,omitempty"`
}

var notCompared = apiComparison{Summary: "not compared: only the kernel and the node's data dir were read (--kubeconfig compares with the API's objects)"}

// loadKubeconfig reads --kubeconfig, before anything else is read: a bad file is bad usage.
func loadKubeconfig(kubeconfig string) (*rest.Config, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, usagef("--kubeconfig %q: %v", kubeconfig, err)
	}
	cfg.Timeout = apiTimeout
	return cfg, nil
}

// fetchAPIInput lists what Compile reads from the API server: the policies, the namespaces and
// the pods of the cluster.
func fetchAPIInput(cfg *rest.Config) (policy.Input, error) {
	var in policy.Input
	server := cfg.Host
	coreClient, err := typedcorev1.NewForConfig(cfg)
	if err != nil {
		return in, fmt.Errorf("API server %s: %w", server, err)
	}
	netClient, err := typednetworkingv1.NewForConfig(cfg)
	if err != nil {
		return in, fmt.Errorf("API server %s: %w", server, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	policies, err := netClient.NetworkPolicies("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return in, fmt.Errorf("list NetworkPolicies: %w", err)
	}
	namespaces, err := coreClient.Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		return in, fmt.Errorf("list Namespaces: %w", err)
	}
	pods, err := coreClient.Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return in, fmt.Errorf("list Pods: %w", err)
	}
	in.Policies = pointers[networkingv1.NetworkPolicy](policies.Items)
	in.Namespaces = pointers[corev1.Namespace](namespaces.Items)
	in.Pods = pointers[corev1.Pod](pods.Items)
	return in, nil
}

func pointers[T any](items []T) []*T {
	out := make([]*T, len(items))
	for i := range items {
		out[i] = &items[i]
	}
	return out
}

// compareWithAPI compiles in (the API's objects) with the node's attachments, as the agent
// does, and compares what it means for the pod l with what the kernel holds. podCIDRs are the
// node's pod CIDRs. Pure.
func (v nodeView) compareWithAPI(in policy.Input, podCIDRs []netip.Prefix, l core.PolicyLocal) apiComparison {
	in.Local, in.LocalCIDRs = policy.LocalsOf(v.locals), podCIDRs
	for _, p := range in.Pods {
		if p.Namespace+"/"+p.Name == l.Pod {
			in.NodeName = p.Spec.NodeName
		}
	}
	cmp := apiComparison{Compared: true}
	if l.Port <= 0 {
		cmp.Summary = "the pod's veth is not a port of the bridge: it is held whatever the API's objects say"
		return cmp
	}
	res := policy.Compile(in)
	have := v.installed.Ports[l.Port]
	i := slices.IndexFunc(res.Ruleset.Pods, func(p policyrules.Pod) bool { return p.Port == l.Port })
	if i < 0 {
		cmp.InSync = have.Ingress == "" && have.Egress == ""
		cmp.Summary = fmt.Sprintf("the API has no pod %s (not yet, or not any more): it stays held", l.Pod)
		if !cmp.InSync {
			cmp.Summary += "; the kernel still has elements for its port: pending"
		}
		return cmp
	}
	pod := res.Ruleset.Pods[i]
	cmp.Ingress = v.compareDirection(true, pod.Ingress, have.Ingress)
	cmp.Egress = v.compareDirection(false, pod.Egress, have.Egress)
	cmp.InSync = cmp.Ingress == nil && cmp.Egress == nil
	if cmp.InSync {
		cmp.Summary = "in sync: the kernel holds what the API's objects mean now"
	} else {
		cmp.Summary = "pending: the kernel differs from what the API's objects mean now (the agent's next pass applies them; is it running?)"
	}
	return cmp
}

// compareDirection is nil when the kernel's chain is the one dir means.
func (v nodeView) compareDirection(ingress bool, dir policyrules.Direction, have string) *apiDirection {
	d := &apiDirection{Have: have, Policies: dir.Policies}
	chain, want, ok := core.PolicyDispatch(ingress, dir)
	if !ok {
		d.Note = "the API's objects mean an allow list over a limit: the agent refuses it, the pod keeps what it had (or is denied)"
		return d
	}
	d.Want = chain
	if d.Want == have {
		return nil
	}
	var held []policyrules.Entry
	if g, ok := v.installed.Groups[have]; ok {
		held = g.Entries
	}
	d.Missing, d.Extra = entriesDiff(want, held), entriesDiff(held, want)
	return d
}

// entriesDiff lists the entries of a that b lacks.
func entriesDiff(a, b []policyrules.Entry) []allowed {
	var out []allowed
	for _, e := range a {
		if !slices.ContainsFunc(b, e.Equal) {
			out = append(out, allowedOf(e))
		}
	}
	return out
}

func allowedOf(e policyrules.Entry) allowed {
	a := allowed{Peer: e.Peer.String(), Ports: "any"}
	if e.Ports != nil {
		a.Ports = e.Ports.String()
	}
	return a
}

func (c apiComparison) print(w io.Writer) {
	fmt.Fprintln(w, "API:", c.Summary)
	for _, dir := range []struct {
		name string
		d    *apiDirection
	}{{"ingress", c.Ingress}, {"egress", c.Egress}} {
		if dir.d == nil {
			continue
		}
		what := "isolated by " + strings.Join(dir.d.Policies, ", ")
		if len(dir.d.Policies) == 0 {
			what = "not isolated"
		}
		fmt.Fprintf(w, "  %s: the API's objects mean %s (%s), the kernel has %s\n", dir.name, chainName(dir.d.Want), what, chainName(dir.d.Have))
		if dir.d.Note != "" {
			fmt.Fprintln(w, "   ", dir.d.Note)
		}
		for _, e := range dir.d.Missing {
			fmt.Fprintf(w, "    to allow, not in the kernel: %s %s\n", e.Peer, e.Ports)
		}
		for _, e := range dir.d.Extra {
			fmt.Fprintf(w, "    in the kernel, no longer allowed: %s %s\n", e.Peer, e.Ports)
		}
	}
}

// nodePodCIDRs are the node's pod CIDRs as the network's node settings record them.
func nodePodCIDRs(o *options) ([]netip.Prefix, error) {
	s, err := core.ReadNodeSettings(o.dataDir, o.network)
	if err != nil || s == nil {
		return nil, err
	}
	var out []netip.Prefix
	for _, c := range s.PodCIDRs {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			return nil, fmt.Errorf("node settings of network %q: pod CIDR %q: %w", o.network, c, err)
		}
		out = append(out, p)
	}
	return out, nil
}
