package netpol

import (
	"fmt"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/kubenet-dev/kubenet/internal/policyrules"
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
// new Applier, without Verify. The lists mean the same in both layouts, so an agent killed after
// any transaction of that pass leaves every pod with exactly its list (no pod open, no peer
// lost), and the pass of the next agent ends with the new layout: no damage, nothing unused, a
// Verify pass after it changes nothing.
func TestUpgradeFromMergedPoints(t *testing.T) {
	type probe struct {
		src, dst string
		want     bool
	}
	probes := []probe{{"a", "b", true}, {"c", "b", false}, {"x", "b", true}, {"a", "c", true}, {"b", "c", true}, {"x", "c", false}}
	for crashAfter := 1; ; crashAfter++ {
		done := false
		t.Run(fmt.Sprintf("killed after transaction %d", crashAfter), func(t *testing.T) {
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

			res, crashed := n.applyCrashing(t, rs, Options{crashAfter: crashAfter})
			if !crashed {
				done = true
				check("upgraded")
				n.expectSettled(t, fmt.Sprintf("after the upgrade (%+v)", res), rs)
				return
			}
			check("killed mid-upgrade")
			res = n.apply(t, rs, Options{})
			check("the next agent's pass")
			n.expectSettled(t, fmt.Sprintf("after the next agent's pass (%+v)", res), rs)
		})
		if done || t.Failed() || crashAfter > 10 {
			break
		}
	}
}
