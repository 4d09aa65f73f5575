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

// TestManyEditsInOneSwitch: a pass that changes every local pod's list by a peer (what pods
// churning between the node's policies do) edits every group in place, in the switch's one
// transaction: the new chains, the element edits, the map elements and the old chains' removal of
// hundreds of groups, more than a socket's default send buffer holds (about 208 KiB). Refused
// by sendmsg (EMSGSIZE) the switch fell back to building every group anew, in every pass.
func TestManyEditsInOneSwitch(t *testing.T) {
	const ports = 300
	n := nettest.NewNS(t)
	network := fmt.Sprintf("me%d", ports)
	lists := func(extra byte) policyrules.Ruleset {
		var rs policyrules.Ruleset
		for i := range ports {
			a := netip.AddrFrom4([4]byte{10, 5, byte(i >> 8), byte(i)})
			p := policyrules.Pod{Port: 1000 + i, Name: fmt.Sprintf("ns/p%d", i), IPs: []netip.Addr{a}}
			var allow []policyrules.Entry
			for k := range 4 {
				peer := policyrules.Single(netip.AddrFrom4([4]byte{10, 6, byte(i), byte(10 * k)}))
				allow = append(allow, policyrules.Entry{Peer: peer, Ports: &policyrules.Ports{Protocol: policyrules.TCP, First: uint16(8000 + i), Last: uint16(8000 + i)}})
			}
			peer := policyrules.Single(netip.AddrFrom4([4]byte{10, 7, byte(i), extra}))
			allow = append(allow, policyrules.Entry{Peer: peer, Ports: &policyrules.Ports{Protocol: policyrules.TCP, First: uint16(8000 + i), Last: uint16(8000 + i)}})
			p.Ingress = policyrules.Direction{Isolated: true, Allow: allow}
			rs.Pods = append(rs.Pods, p)
		}
		return rs
	}
	applier := NewApplier()
	var res policyrules.Applied
	nettest.Do(t, n, func() (err error) { res, err = applier.Apply(network, lists(1), Options{}); return err })
	if res.NewGroups != ports {
		t.Fatalf("first pass: %d new groups, want %d", res.NewGroups, ports)
	}
	for round, extra := range []byte{2, 3} {
		nettest.Do(t, n, func() (err error) { res, err = applier.Apply(network, lists(extra), Options{}); return err })
		if res.EditedGroups != ports || res.NewGroups != 0 {
			t.Errorf("round %d: %d groups edited in place, %d built; want %d edited, none built", round, res.EditedGroups, res.NewGroups, ports)
		}
	}
}
