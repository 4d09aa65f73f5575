package netpol

import (
	"errors"
	"testing"

	"github.com/google/nftables"
)

// fakeGenerations answers Read with reads, one after the other (an error for the rest).
type fakeGenerations struct{ reads []uint32 }

func (f *fakeGenerations) Read() (uint32, error) {
	if len(f.reads) == 0 {
		return 0, errors.New("no more generations")
	}
	g := f.reads[0]
	f.reads = f.reads[1:]
	return g, nil
}

// TestTrailTrustsOnlyItsOwnCommits: a trail that started at generation 10 sends one transaction
// (reading the generation before and after it); it leaves its rules to the next pass only when
// the generation moved by that transaction alone, and takes the transaction's changes only when
// it was committed.
func TestTrailTrustsOnlyItsOwnCommits(t *testing.T) {
	rule := &nftables.Rule{UserData: []byte("x")}
	for _, tc := range []struct {
		name      string
		reads     []uint32 // before, after
		committed bool
		trusted   bool
		gen       uint32
	}{
		{"committed a change", []uint32{10, 11}, true, true, 11},
		{"committed nothing (the kernel does not count it)", []uint32{10, 10}, true, true, 10},
		{"another commit before it", []uint32{11, 12}, true, false, 0},
		{"another commit before it, and nothing of its own", []uint32{11, 11}, true, false, 0},
		{"another commit right after it", []uint32{10, 12}, true, false, 0},
		{"refused by the kernel", []uint32{10, 10}, false, false, 0},
		{"the generation unreadable before", nil, true, false, 0},
		{"the generation unreadable after", []uint32{10}, true, false, 0},
		{"the generation went back (another namespace's?)", []uint32{10, 9}, true, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := &ruleTrail{gens: &fakeGenerations{reads: tc.reads}, gen: 10, trusted: true, rules: map[nftables.TableFamily]map[string][]*nftables.Rule{
				nftables.TableFamilyBridge: {"kept": {rule}, "gone": {rule}},
				nftables.TableFamilyINet:   {"inet": {rule}},
			}}
			tr.queue(chainChange{family: nftables.TableFamilyBridge, chain: "new", rules: []*nftables.Rule{rule, rule}})
			tr.queue(chainChange{family: nftables.TableFamilyBridge, chain: "gone", gone: true})
			tr.queue(chainChange{family: nftables.TableFamilyBridge, chain: "emptied"})
			tr.queue(chainChange{family: nftables.TableFamilyINet, table: true})
			tr.beforeCommit()
			tr.afterCommit(tc.committed)
			left := tr.left()
			if !tc.trusted {
				if left != nil {
					t.Fatalf("left rules of generation %d to the next pass", left.gen)
				}
				return
			}
			if left == nil {
				t.Fatal("left nothing to the next pass")
			}
			if left.gen != tc.gen {
				t.Errorf("generation %d, want %d", left.gen, tc.gen)
			}
			if len(left.bridge) != 2 || len(left.bridge["kept"]) != 1 || len(left.bridge["new"]) != 2 {
				t.Errorf("bridge chains %v, want kept (1 rule) and new (2)", left.bridge)
			}
			if len(left.inet) != 0 {
				t.Errorf("inet chains %v after the table's deletion", left.inet)
			}
		})
	}
}

// TestTrailWithPendingChanges: changes queued and never sent leave nothing trusted.
func TestTrailWithPendingChanges(t *testing.T) {
	tr := &ruleTrail{gens: &fakeGenerations{}, gen: 10, trusted: true, rules: map[nftables.TableFamily]map[string][]*nftables.Rule{nftables.TableFamilyBridge: {}}}
	tr.queue(chainChange{family: nftables.TableFamilyBridge, chain: "new"})
	if left := tr.left(); left != nil {
		t.Errorf("left rules of generation %d with a change queued and not sent", left.gen)
	}
}
