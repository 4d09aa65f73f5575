package netpol

import (
	"fmt"
	"slices"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/google/nftables"

	"github.com/kubenet-dev/kubenet/internal/policyrules"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

// toMergedPoints rewrites the network's groups, in one transaction, as the layout before hash
// sets wrote them: every entry in the interval sets (single peers merged with their neighbours
// into the ports set's boxes), the group named after those alone, in slots of its own.
func (n *bridgedNode) toMergedPoints(t *testing.T) {
	t.Helper()
	n.rewriteGroups(t, func(i int, name string, ig policyrules.InstalledGroup) (string, string, group) {
		var g group
		if !g.setRanges(ig.Entries, maxGroupCost) {
			t.Errorf("group %s: too big", name)
		}
		return g.name(groupKind(name)), slotStem(40 + i), g
	})
}

// TestUpgradeFromMergedPoints: tables the layout before hash sets wrote (single peers merged
// into the interval sets, the groups named after those) are taken over by the first pass of a
// new Applier, with and without Verify. The lists mean the same in both layouts, so an agent
// killed after any transaction of that pass leaves every pod with exactly its list (no pod open,
// no peer lost), and the pass of the next agent ends with the new layout: no damage, nothing
// unused, a Verify pass after it changes nothing.
func TestUpgradeFromMergedPoints(t *testing.T) {
	type probe struct {
		src, dst string
		want     bool
	}
	probes := []probe{{"a", "b", true}, {"c", "b", false}, {"x", "b", true}, {"a", "c", true}, {"b", "c", true}, {"x", "c", false}}
	for _, verify := range []bool{false, true} {
		for crashAfter := 1; ; crashAfter++ {
			done := false
			t.Run(fmt.Sprintf("Verify %v, killed after transaction %d", verify, crashAfter), func(t *testing.T) {
				n := newBridgedNode(t)
				a, b, c := n.pods["a"], n.pods["b"], n.pods["c"]
				nsOf := func(name string) ns.NetNS {
					if name == "x" {
						return n.x
					}
					return n.pods[name].ns
				}
				check := func(when string) {
					t.Helper()
					for _, p := range probes {
						n.expectTCP(t, when+": "+p.src+" → "+p.dst, nsOf(p.src), n.pods[p.dst].v4, 8080, p.want)
					}
				}
				bAllow := allowFrom(tcp8080, a.v4)
				bAllow.Allow = append(bAllow.Allow, policyrules.Entry{Peer: policyrules.Single(x4)})
				rs := with(with(n.open(), b.port, bAllow, policyrules.Direction{}), c.port, allowFrom(tcp8080, a.v4, b.v4), policyrules.Direction{})
				n.apply(t, rs, Options{})
				n.toMergedPoints(t)
				check("previous layout")

				res, crashed := n.applyCrashing(t, rs, Options{crashAfter: crashAfter, Verify: verify})
				if !crashed {
					done = true
					check("upgraded")
					n.expectSettled(t, fmt.Sprintf("after the upgrade (%+v)", res), rs)
					return
				}
				check("killed mid-upgrade")
				res = n.apply(t, rs, Options{Verify: verify})
				check("the next agent's pass")
				n.expectSettled(t, fmt.Sprintf("after the next agent's pass (%+v)", res), rs)
			})
			if done || t.Failed() || crashAfter > 10 {
				break
			}
		}
	}
}

// TestTraceOfAPointWithPadding: the kernel's hash sets compare every byte of a key, the padding
// of the protocol and the port to 32 bits included, and a packet's key has it zero. Another
// tool swaps the element of a's point in b's points set for one with a padding byte set: the
// kernel drops a, and trace, which reads the sets back, must say so (and the group is damaged).
func TestTraceOfAPointWithPadding(t *testing.T) {
	n := newBridgedNode(t)
	a, b, c := n.pods["a"], n.pods["b"], n.pods["c"]
	n.apply(t, with(n.open(), b.port, allowFrom(tcp8080, a.v4, c.v4), policyrules.Direction{}), Options{})
	chain := groupNames(t, n)[MapIngress][b.port]
	set := &nftables.Set{Table: BridgeTable(n.network), Name: n.groupSet(t, chain, "-points-ipv4")}
	swap := func(from, to []byte) {
		t.Helper()
		nettest.Do(t, n.node, func() error {
			nc, err := nftables.New()
			if err != nil {
				return err
			}
			if err := nc.SetDeleteElements(set, []nftables.SetElement{{Key: from}}); err != nil {
				return err
			}
			if err := nc.SetAddElements(set, []nftables.SetElement{{Key: to}}); err != nil {
				return err
			}
			return nc.Flush()
		})
	}
	for _, pad := range []int{1, 3, 6, 7} { // after the protocol's byte, after the port's two
		key := portsKey(a.v4, policyrules.TCP, 8080)
		padded := slices.Clone(key)
		padded[4+pad] = 1
		swap(key, padded)
		in := n.inspect(t)
		v, err := in.Trace(policyrules.Packet{Src: a.v4, Dst: b.v4, Protocol: policyrules.TCP, Port: 8080}, a.port, b.port)
		if err != nil {
			t.Fatal(err)
		}
		if err := tcpReach(a.ns, b.v4, 8080, v.Allowed); err != nil {
			t.Errorf("padding byte %d: traffic disagrees with trace (allowed %v: %+v): %v", pad, v.Allowed, v.Steps, err)
		}
		if len(in.Groups[chain].Damage) == 0 {
			t.Errorf("padding byte %d: group %s shows no damage", pad, chain)
		}
		n.expectTCP(t, fmt.Sprintf("padding byte %d: c → b", pad), c.ns, b.v4, 8080, true)
		swap(padded, key) // back as it was, for the next byte
	}
}
