package netpoldiff

import (
	"net/netip"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/kubenet-dev/kubenet/agent/policy"
	"github.com/kubenet-dev/kubenet/core"
	"github.com/kubenet-dev/kubenet/internal/policyrules"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

// install makes the node enforce w's policies, as one pass of kubenet-agent's policy controller
// does: the system under test. It is the only place the tester calls kubenet's policy code
// (the compiler and the kernel side); the model shares nothing with it.
func install(node ns.NetNS, dataDir string, w World) error {
	cidrs := []netip.Prefix{nettest.PodCIDR4, nettest.PodCIDR6}
	in := policy.Input{Policies: w.Policies, Namespaces: w.Namespaces, Pods: w.Pods, LocalCIDRs: cidrs}
	return node.Do(func(ns.NetNS) error {
		_, err := core.ApplyPolicies(core.PolicyNetwork{DataDir: dataDir, Network: Network, Bridge: core.DefaultBridge, PodCIDRs: cidrs},
			func(locals []core.PolicyLocal) policyrules.Ruleset {
				in.Local = policy.LocalsOf(locals)
				return policy.Compile(in).Ruleset
			})
		return err
	})
}

// Install makes the lab's node enforce w's policies and forgets every connection the kernel
// tracks, so that no flow of an earlier case passes as established.
func (l *Lab) Install(w World) error {
	if err := install(l.node.NS, l.node.DataDir(), w); err != nil {
		return err
	}
	return l.flushConntrack()
}
