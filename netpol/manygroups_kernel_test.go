package netpol

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/kubenet-dev/kubenet/internal/policyrules"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

// TestManyGroupsInOneTransaction: a pass that removes hundreds of groups at once (a pod change
// that gives every local pod of a big node a new list, a policy deleted) sends their chains'
// and sets' deletions in one transaction, which the kernel acknowledges message by message
// before the agent reads any acknowledgement. With the socket's default receive buffer the
// acknowledgements overflowed it (ENOBUFS): the transaction was committed, but the pass failed
// and was retried. Both passes succeed, and the second leaves no group behind.
func TestManyGroupsInOneTransaction(t *testing.T) {
	const ports = 150
	n := nettest.NewNS(t)
	network := fmt.Sprintf("mg%d", ports)
	isolated, open := policyrules.Ruleset{}, policyrules.Ruleset{}
	for i := range ports {
		a := netip.AddrFrom4([4]byte{10, 5, byte(i >> 8), byte(i)})
		p := policyrules.Pod{Port: 1000 + i, Name: fmt.Sprintf("ns/p%d", i), IPs: []netip.Addr{a}}
		open.Pods = append(open.Pods, p)
		// Each its own ingress list (one peer of its own) and an egress list of its own: two
		// groups per pod.
		peer := policyrules.Single(netip.AddrFrom4([4]byte{10, 6, byte(i >> 8), byte(i)}))
		p.Ingress = policyrules.Direction{Isolated: true, Allow: []policyrules.Entry{{Peer: peer}}}
		p.Egress = policyrules.Direction{Isolated: true, Allow: []policyrules.Entry{{Peer: peer, Ports: &policyrules.Ports{Protocol: policyrules.UDP, First: 53, Last: 53}}}}
		isolated.Pods = append(isolated.Pods, p)
	}
	for _, step := range []struct {
		name        string
		rs          policyrules.Ruleset
		wantGroups  int
		wantRemoved int
	}{
		{"every pod isolated", isolated, 2 * ports, 0},
		{"every pod open again", open, 0, 2 * ports},
	} {
		var res policyrules.Applied
		nettest.Do(t, n, func() (err error) { res, err = Apply(network, step.rs, Options{}); return err })
		if res.Groups != step.wantGroups || res.RemovedGroups != step.wantRemoved {
			t.Fatalf("%s: %d groups, %d removed; want %d, %d", step.name, res.Groups, res.RemovedGroups, step.wantGroups, step.wantRemoved)
		}
	}
	var left map[string]map[int]string
	nettest.Do(t, n, func() (err error) { left, err = Dispatch(network); return err })
	for m, ports := range left {
		for port, chain := range ports {
			if chain != ChainAllowIngress && chain != ChainAllowEgress {
				t.Errorf("map %s: port %d still goes to group %s", m, port, chain)
			}
		}
	}
}
