package shim

import (
	"strings"
	"sync"
	"testing"

	"github.com/kubenet-dev/kubenet/masq"
	"github.com/kubenet-dev/kubenet/network"
	knet "github.com/kubenet-dev/kubenet/network/kubenet"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

// TestKubenetPluginIPTablesStatusInNode: the in-process plugin on the iptables backend answers
// Status from the node's namespace (its calls run on a thread moved there; the chains are
// counted over netlink from goroutines of their own): ready while the node holds the chains,
// whatever the test process's own namespace holds, and not ready, naming the chain, once another
// tool flushed it in the node. Many Status calls at once: none may read another namespace.
func TestKubenetPluginIPTablesStatusInNode(t *testing.T) {
	t.Parallel()
	node := nettest.NewNode(t, binDir)
	host := newShimHost()
	kn := knet.New(knet.Options{NodeNS: node.NS, DataDir: node.DataDir(), Logger: testLogger(t), NetfilterBackend: "iptables"})
	t.Cleanup(func() { _ = kn.Close() })
	pm := managerFor(t, []network.NetworkPlugin{kn}, "kubenet", host)
	pm.Event(network.PodCIDRChangeEvent, podCIDREvent(dualStackCIDRs))
	setUp(t, pm, newShimPod(t, host, "st-ipt"), nil)

	statusAll := func() []error {
		errs := make([]error, 32)
		var wg sync.WaitGroup
		for i := range errs {
			wg.Go(func() { errs[i] = pm.Status() })
		}
		wg.Wait()
		return errs
	}
	for i, err := range statusAll() {
		if err != nil {
			t.Fatalf("Status %d with the node's chains in place: %v", i, err)
		}
	}
	chain := masq.IPTablesChain("kubenet")
	nettest.Run(t, node.NS, "iptables", "-t", "nat", "-F", chain)
	for i, err := range statusAll() {
		if err == nil || !strings.Contains(err.Error(), chain) {
			t.Errorf("Status %d with %s emptied in the node: %v, want it named", i, chain, err)
		}
	}
}
