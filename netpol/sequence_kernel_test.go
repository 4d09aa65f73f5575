package netpol

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	"github.com/kubenet-dev/kubenet/internal/policyrules"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

// TestRandomSequence: random rulesets applied one after another by one Applier (pods that keep,
// share, swap and edit their lists, turn audit or open; small transactions now and then, so that
// some edits are too big for one and fall back to building): after each Apply, Inspect reads
// back exactly the planned groups, undamaged, with the planned entries, no group object left
// over, every port's chains are those a fresh Apply of the same ruleset into an empty
// namespace gives, with the same entries, and what the Applier knows of the chains' rules for
// its next pass (the trail of its commits) is what the kernel holds.
func TestRandomSequence(t *testing.T) {
	const network, pods, steps = "seq", 8, 30
	kept, fresh := nettest.NewNS(t), nettest.NewNS(t)
	for _, seed := range []uint64{1, 2} {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 27))
			pool := make([][]policyrules.Entry, 6)
			for i := range pool {
				pool[i] = randomAllow(rng, rng.IntN(8))
			}
			lists := make([]policyrules.Direction, 2*pods)
			applier := NewApplier()
			edited, built, trusted := 0, 0, 0
			for step := range steps {
				for i := range lists {
					switch r := rng.IntN(10); {
					case r < 3: // keeps its list
					case r < 5:
						lists[i] = policyrules.Direction{Isolated: true, Allow: pool[rng.IntN(len(pool))]}
					case r < 8: // its list changes by an entry or two
						allow := slices.Clone(lists[i].Allow)
						if len(allow) > 0 && rng.IntN(2) == 0 {
							k := rng.IntN(len(allow))
							allow = slices.Delete(allow, k, k+1)
						}
						allow = append(allow, randomAllow(rng, 1+rng.IntN(2))...)
						lists[i] = policyrules.Direction{Isolated: true, Audit: lists[i].Audit, Allow: allow}
					case r < 9:
						lists[i] = policyrules.Direction{}
					default:
						lists[i].Audit = !lists[i].Audit && lists[i].Isolated
					}
				}
				var rs policyrules.Ruleset
				for p := range pods {
					rs.Pods = append(rs.Pods, policyrules.Pod{Port: 100 + p, Name: fmt.Sprint("ns/p", p),
						IPs:     []netip.Addr{netip.AddrFrom4([4]byte{10, 9, 0, byte(p + 1)})},
						Ingress: lists[2*p], Egress: lists[2*p+1]})
				}
				opt := Options{Verify: rng.IntN(4) == 0}
				if rng.IntN(3) == 0 {
					opt.transactionElements = 4
				}
				var res policyrules.Applied
				var got, want policyrules.Installed
				nettest.Do(t, kept, func() (err error) {
					if res, err = applier.Apply(network, rs, opt); err != nil {
						return err
					}
					got, err = Inspect(network)
					return err
				})
				if trusts(t, kept, applier) {
					trusted++
				}
				expectKnownRules(t, kept, network, applier, fmt.Sprint("step ", step))
				nettest.Do(t, fresh, func() (err error) {
					if err := Remove(network); err != nil {
						return err
					}
					if _, err := Apply(network, rs, Options{}); err != nil {
						return err
					}
					want, err = Inspect(network)
					return err
				})
				edited, built = edited+res.EditedGroups, built+res.NewGroups
				what := fmt.Sprintf("step %d (%+v)", step, res)
				if len(res.Refused) > 0 || len(got.Damage) > 0 {
					t.Fatalf("%s: refused %v, damage %v", what, res.Refused, got.Damage)
				}
				planned := plan(rs, newGroupMemo())
				if g, w := slices.Sorted(maps.Keys(got.Groups)), slices.Sorted(maps.Keys(planned.groups)); !slices.Equal(g, w) {
					t.Fatalf("%s: groups read back %v, planned %v", what, g, w)
				}
				for name, g := range got.Groups {
					if len(g.Damage) > 0 || !slices.EqualFunc(g.Entries, planned.groups[name].group.entries(), policyrules.Entry.Equal) {
						t.Fatalf("%s: group %s: damage %v, entries %v, want %v", what, name, g.Damage, g.Entries, planned.groups[name].group.entries())
					}
					if w := want.Groups[name]; !slices.EqualFunc(g.Entries, w.Entries, policyrules.Entry.Equal) || g.Audit != w.Audit || g.Ingress != w.Ingress {
						t.Fatalf("%s: group %s is %+v, a fresh Apply's %+v", what, name, g, w)
					}
				}
				for _, p := range rs.Pods {
					if g, w := got.Ports[p.Port], want.Ports[p.Port]; g.Ingress != w.Ingress || g.Egress != w.Egress {
						t.Fatalf("%s: port %d goes to %+v, after a fresh Apply to %+v", what, p.Port, g, w)
					}
				}
			}
			t.Logf("%d groups edited in place, %d built", edited, built)
			if edited == 0 || built == 0 {
				t.Errorf("%d groups edited in place, %d built over %d steps: want both paths taken", edited, built, steps)
			}
			if trusted < steps/2 {
				t.Errorf("the Applier knew the rules after %d steps of %d: want most", trusted, steps)
			}
		})
	}
}
