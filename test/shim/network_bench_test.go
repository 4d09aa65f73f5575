package shim

import (
	"fmt"
	"testing"

	"github.com/kubenet-dev/kubenet/network"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

// BenchmarkNetworkPluginPod measures one SetUpPod + TearDownPod through the PluginManager, per
// plugin variant, on a dual-stack node with one host port per pod: kubenet in-process against
// cni over the kubenet binary and over the reference plugins (the exec and libcni cost).
func BenchmarkNetworkPluginPod(b *testing.B) {
	for _, v := range []pluginVariant{
		{name: "kubenet", plugin: "kubenet"},
		{name: "cni+kubenet", plugin: "cni"},
		{name: "cni+reference", plugin: "cni"},
	} {
		b.Run(v.name, func(b *testing.B) {
			node := nettest.NewNode(b, binDir)
			host := newShimHost()
			_, plugins := setUpVariant(b, v, node)
			pm := managerFor(b, plugins, v.plugin, host)
			pm.Event(network.PodCIDRChangeEvent, podCIDREvent(dualStackCIDRs))
			if err := pm.Status(); err != nil {
				b.Fatal(err)
			}
			pod := newShimPod(b, host, "bench", &network.PortMapping{HostPort: 30100, ContainerPort: 80})
			b.ResetTimer()
			for i := range b.N {
				pod.id.ID = fmt.Sprintf("sandbox-bench-%d", i)
				host.add(pod.id.ID, pod.NS, &network.PortMapping{HostPort: 30100, ContainerPort: 80})
				if err := pm.SetUpPod(pod.namespace, pod.name, pod.id, nil, nil); err != nil {
					b.Fatal(err)
				}
				if err := pm.TearDownPod(pod.namespace, pod.name, pod.id); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
