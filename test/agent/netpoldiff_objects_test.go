//go:build kubenet_e2e_agent

package agent

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubenet-dev/kubenet/test/netpoldiff"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

// TestNetpolDiffObjectsValid hands every object of the differential NetworkPolicy tester's cases
// (test/netpoldiff, seeds 1 to 500: its fixed set and more) to a real API server, server-side dry
// run: the generator must make only what the API accepts (selectors, ports, endPort, ipBlock
// excepts, named container ports, host-network pods), or the tester would judge enforcement
// of objects no cluster can hold.
func TestNetpolDiffObjectsValid(t *testing.T) {
	u := nettest.NewUnderlay(t, 0)
	cp := startControlPlane(t, u, controlPlaneAddr)
	api := cp.Admin
	ctx := context.Background()
	topo := netpoldiff.ExampleTopology()
	for _, name := range topo.NamespaceNames {
		if _, err := api.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: name}}
		if _, err := api.CoreV1().ServiceAccounts(name).Create(ctx, sa, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	dryCreate := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	checked := 0
	for seed := uint64(1); seed <= 500; seed++ {
		c := netpoldiff.Generate(seed, topo)
		refused := func(kind, ns, name string, err error) {
			t.Errorf("seed %d: the API server refuses %s %s/%s: %v\n%s", seed, kind, ns, name, err, netpoldiff.Describe(c))
		}
		for _, n := range c.World.Namespaces {
			cur, err := api.CoreV1().Namespaces().Get(ctx, n.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			cur.Labels = n.Labels
			if _, err := api.CoreV1().Namespaces().Update(ctx, cur, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
				refused("Namespace", "", n.Name, err)
			}
		}
		for _, p := range c.World.Pods {
			obj := p.DeepCopy()
			obj.Status = corev1.PodStatus{} // the kubelet's to write
			if _, err := api.CoreV1().Pods(p.Namespace).Create(ctx, obj, dryCreate); err != nil {
				refused("Pod", p.Namespace, p.Name, err)
			}
			checked++
		}
		for _, np := range c.Installed().Policies {
			if _, err := api.NetworkingV1().NetworkPolicies(np.Namespace).Create(ctx, np.DeepCopy(), dryCreate); err != nil {
				refused("NetworkPolicy", np.Namespace, np.Name, err)
			}
			checked++
		}
		if t.Failed() {
			return
		}
	}
	t.Logf("%d pods and policies of 500 cases accepted", checked)
}
