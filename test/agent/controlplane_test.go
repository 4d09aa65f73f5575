//go:build kubenet_e2e_agent

package agent

import (
	"net/netip"
	"testing"

	"github.com/kubenet-dev/kubenet/test/controlplane"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

// startControlPlane starts etcd and kube-apiserver (test/controlplane) in a new namespace
// attached to u with addr, with a token for each of users besides the admin. Nothing else of a
// control plane runs: no controller-manager, so the test sets pod CIDRs itself, and no scheduler
// or kubelet.
func startControlPlane(t testing.TB, u *nettest.Underlay, addr netip.Prefix, users ...controlplane.User) *controlplane.ControlPlane {
	t.Helper()
	n := nettest.NewNS(t)
	u.Attach(t, n, "eth0", addr)
	return controlplane.Start(t, n, controlplane.Config{
		Bins:         testBins.kubernetes,
		Dir:          t.TempDir(),
		Addrs:        []netip.Prefix{addr},
		ServiceCIDRs: []netip.Prefix{serviceCIDR},
		Users:        users,
		// No pod dials the `kubernetes` Service here, and the scale benchmarks time the API
		// server's answers to one client: neither the endpoint lease nor fair queuing is wanted.
		APIServerArgs: []string{"--endpoint-reconciler-type=none", "--enable-priority-and-fairness=false"},
	})
}

// startCluster starts a control plane on a new underlay, creates the objects of
// deploy/kubenet.yaml through it, and returns the user the agents authenticate as: the
// manifest's ServiceAccount, so they run with exactly the manifest's RBAC.
func startCluster(t testing.TB) (*nettest.Underlay, *controlplane.ControlPlane, string) {
	t.Helper()
	objs := manifestObjects(t)
	agentUser := serviceAccountUser(t, objs)
	u := nettest.NewUnderlay(t, 0)
	cp := startControlPlane(t, u, controlPlaneAddr, agentUser)
	applyManifest(t, cp.Admin, objs)
	return u, cp, agentUser.Name
}
