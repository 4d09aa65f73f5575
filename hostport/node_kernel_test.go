package hostport

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/google/nftables"

	"github.com/kubenet-dev/kubenet/internal/nft"
)

// ensure runs EnsureNode inside the world.
func (w *world) ensure(t testing.TB, all bool) Repair {
	t.Helper()
	var rep Repair
	w.do(t, func() (err error) {
		rep, err = EnsureNode(w.cfg, all)
		return err
	})
	return rep
}

// checkNode runs CheckNode inside the world and returns its error.
func (w *world) checkNode(t testing.TB) error {
	t.Helper()
	var err error
	w.do(t, func() error { err = CheckNode(w.cfg); return nil })
	return err
}

// handles lists the rule handles of the table, which change when a rule is rewritten.
func (w *world) handles(t testing.TB) []string {
	t.Helper()
	return regexp.MustCompile(`# handle \d+`).FindAllString(w.nft(t, "-a", "list", "table", "inet", "kubenet-t"), -1)
}

func sortedReservations(rs []Reservation) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.Entry.String()+" "+r.Owner.String())
	}
	slices.Sort(out)
	return out
}

// TestEnsureNodeReadsBackWhatItWrote: on every pod CIDR configuration the rules EnsureNode
// writes compare equal when read back (expressions and comments), so a healthy node is never
// rewritten: the second call changes nothing, not even a rule handle.
func TestEnsureNodeReadsBackWhatItWrote(t *testing.T) {
	for _, cidrs := range [][]netip.Prefix{{cidr4}, {cidr6}, {cidr4, cidr6}} {
		t.Run(fmt.Sprint(cidrs), func(t *testing.T) {
			w := newWorld(t)
			w.cfg.PodCIDRs = cidrs
			if err := w.checkNode(t); len(nft.Missing(err)) == 0 {
				t.Fatalf("CheckNode on an empty node = %v, want missing chains and maps", err)
			}
			// Per family: the two maps and the hairpin set.
			if rep := w.ensure(t, false); len(rep.Chains) != 6-boolInt(len(cidrs) == 1 && cidrs[0].Addr().Is6()) || len(rep.Maps) != 3*len(cidrs) {
				t.Errorf("first EnsureNode: %v, want every chain with rules and %d maps and sets", rep, 3*len(cidrs))
			}
			if err := w.checkNode(t); err != nil {
				t.Fatalf("CheckNode after EnsureNode: %v", err)
			}
			before := w.handles(t)
			if rep := w.ensure(t, true); rep.Changed() {
				t.Errorf("EnsureNode on a healthy node changed %v", rep)
			}
			if after := w.handles(t); !slices.Equal(before, after) {
				t.Errorf("EnsureNode on a healthy node rewrote rules:\nbefore %v\nafter  %v", before, after)
			}
		})
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestEnsureNodeAfterFlushedRuleset: `nft flush ruleset` takes the chains, the maps and every
// element; CheckNode reports them missing, and EnsureNode (without the full comparison, as ADD
// runs it) puts the rules back and every reservation of the index as an element.
func TestEnsureNodeAfterFlushedRuleset(t *testing.T) {
	w := newWorld(t)
	w.add(t, ownerA, entry("tcp", 80, any4, pod4, 8080), entry("tcp", 80, any6, pod6, 8080), entry("udp", 53, ip6, pod6, 53))
	w.add(t, ownerB, entry("sctp", 9000, ip4, netip.MustParseAddr("10.244.1.3"), 9000))
	elements := sortedReservations(w.kernelElements(t))
	rules := w.nft(t, "list", "table", "inet", "kubenet-t")

	w.nft(t, "flush", "ruleset")
	err := w.checkNode(t)
	missing := nft.Missing(err)
	var objects []string
	for _, d := range missing {
		objects = append(objects, d.Object)
	}
	for _, want := range []string{"chain " + ChainLocalnetInput, "chain " + ChainLocalnetNAT, "chain " + ChainDNAT, "map " + MapIPv4, "map " + MapIPv6Addr, "map " + SetHairpinIPv4} {
		if !slices.Contains(objects, want) {
			t.Errorf("CheckNode after the flush reports missing %v, want %s among them (error: %v)", objects, want, err)
		}
	}
	rep := w.ensure(t, false)
	if rep.Elements != 4 || len(rep.Maps) != 6 {
		t.Errorf("EnsureNode after the flush: %v, want 4 maps, 2 hairpin sets and 4 elements restored", rep)
	}
	if got := sortedReservations(w.kernelElements(t)); !slices.Equal(got, elements) {
		t.Errorf("elements after the repair:\n%q\nwant\n%q", got, elements)
	}
	if got := w.nft(t, "list", "table", "inet", "kubenet-t"); got != rules {
		t.Errorf("table after the repair:\n%s\nwant\n%s", got, rules)
	}
	if err := w.checkNode(t); err != nil {
		t.Errorf("CheckNode after the repair: %v", err)
	}
}

// TestEnsureNodeAfterFlushAndDel: a DEL between the flush and the repair creates the maps
// again (empty) to delete its own elements; the repair still puts back the other pods'.
func TestEnsureNodeAfterFlushAndDel(t *testing.T) {
	w := newWorld(t)
	// Both in the map of IPv6 hostIPs, which the DEL makes again.
	w.add(t, ownerA, entry("tcp", 80, ip6, pod6, 8080))
	elements := sortedReservations(w.kernelElements(t))
	gone := entry("udp", 53, ip6, pod6, 53)
	w.add(t, ownerB, gone)
	w.nft(t, "flush", "ruleset")
	w.do(t, func() error { return Remove(w.cfg, ownerB, []Key{gone.Key}) })
	if rep := w.ensure(t, false); rep.Elements != 1 || slices.Contains(rep.Maps, MapIPv6Addr) {
		t.Errorf("EnsureNode after the flush and a DEL: %v, want A's element restored into the map the DEL made", rep)
	}
	if got := sortedReservations(w.kernelElements(t)); !slices.Equal(got, elements) {
		t.Errorf("elements %q, want %q", got, elements)
	}
	if err := w.checkNode(t); err != nil {
		t.Errorf("CheckNode after the repair: %v", err)
	}
}

// TestEnsureNodeAllRepairsElements: elements deleted or changed one by one (the maps stay) are
// not ADD's business, the full comparison puts them back as the index says, and leaves elements
// kubenet did not make alone.
func TestEnsureNodeAllRepairsElements(t *testing.T) {
	w := newWorld(t)
	w.add(t, ownerA, entry("tcp", 80, any4, pod4, 8080), entry("udp", 53, ip6, pod6, 53))
	elements := sortedReservations(w.kernelElements(t))
	w.nft(t, "delete", "element", "inet", "kubenet-t", MapIPv6Addr, "{ 2001:db8:e::1 . udp . 53 }")
	w.nft(t, "delete", "element", "inet", "kubenet-t", MapIPv4, "{ tcp . 80 }")
	w.nft(t, "add", "element", "inet", "kubenet-t", MapIPv4, `{ tcp . 80 comment "aaa/eth0" : 10.244.1.66 . 8080 }`)
	w.nft(t, "add", "element", "inet", "kubenet-t", MapIPv4, `{ tcp . 99 : 10.244.1.9 . 99 }`)
	if rep := w.ensure(t, false); rep.Changed() {
		t.Errorf("EnsureNode without the full comparison changed %v; it must not read the elements", rep)
	}
	if rep := w.ensure(t, true); rep.Elements != 2 {
		t.Errorf("full EnsureNode: %v, want 2 elements restored", rep)
	}
	foreign := entry("tcp", 99, any4, netip.MustParseAddr("10.244.1.9"), 99).String() + " /"
	if got := sortedReservations(w.kernelElements(t)); !slices.Equal(got, append(slices.Clone(elements), foreign)) {
		t.Errorf("elements after the full repair:\n%q\nwant\n%q and the foreign one", got, elements)
	}
}

// TestRuleChangedInPlace: a rule changed with the nft tool, comment kept, is a difference (not
// a missing one), and EnsureNode rewrites it to the plan.
func TestRuleChangedInPlace(t *testing.T) {
	w := newWorld(t)
	w.add(t, ownerA, entry("tcp", 80, any4, pod4, 8080))
	want := w.nft(t, "list", "chain", "inet", "kubenet-t", ChainLocalnetInput)
	listing := w.nft(t, "-a", "list", "chain", "inet", "kubenet-t", ChainLocalnetInput)
	m := regexp.MustCompile(`(?m)^\s*(.* drop (comment "drop packets from [^"]*")) # handle (\d+)$`).FindStringSubmatch(listing)
	if m == nil {
		t.Fatalf("no localnet drop rule in\n%s", listing)
	}
	edited := strings.Replace(m[1], " drop ", " accept ", 1)
	w.nft(t, "replace", "rule", "inet", "kubenet-t", ChainLocalnetInput, "handle", m[3], edited)
	if got := w.nft(t, "list", "chain", "inet", "kubenet-t", ChainLocalnetInput); !strings.Contains(got, "accept "+m[2]) {
		t.Fatalf("the edit did not take:\n%s", got)
	}

	err := w.checkNode(t)
	var d *nft.Difference
	if !errors.As(err, &d) || d.Missing || d.Object != "chain "+ChainLocalnetInput || !strings.Contains(d.Error(), "changed in place") {
		t.Fatalf("CheckNode after the edit = %v, want a changed (not missing) %s", err, ChainLocalnetInput)
	}
	var checkErr error
	w.do(t, func() error { checkErr = Check(w.cfg, ownerA, []Entry{entry("tcp", 80, any4, pod4, 8080)}); return nil })
	if checkErr == nil || !strings.Contains(checkErr.Error(), ChainLocalnetInput) {
		t.Errorf("Check after the edit = %v, want it to name %s", checkErr, ChainLocalnetInput)
	}
	if rep := w.ensure(t, false); !slices.Equal(rep.Chains, []string{"chain " + ChainLocalnetInput}) {
		t.Errorf("EnsureNode after the edit: %v, want %s rewritten", rep, ChainLocalnetInput)
	}
	if got := w.nft(t, "list", "chain", "inet", "kubenet-t", ChainLocalnetInput); got != want {
		t.Errorf("chain after EnsureNode:\n%s\nwant\n%s", got, want)
	}
}

// TestEnsureNodeReplacesMapOfOtherType: a map of kubenet's name with other types (an older
// release, a person) is replaced, with the rules that use it, and the index's elements go in.
func TestEnsureNodeReplacesMapOfOtherType(t *testing.T) {
	w := newWorld(t)
	if err := NewIndex(w.cfg.Dir).Reserve(ownerA, []Entry{entry("tcp", 80, any4, pod4, 8080)}); err != nil {
		t.Fatal(err)
	}
	w.nft(t, "add", "table", "inet", "kubenet-t")
	w.nft(t, "add", "map", "inet", "kubenet-t", MapIPv4, "{ type inet_service : ipv4_addr ; }")
	if rep := w.ensure(t, false); !slices.Contains(rep.Maps, MapIPv4) || rep.Elements != 1 {
		t.Errorf("EnsureNode: %v, want %s recreated and its element restored", rep, MapIPv4)
	}
	if err := w.checkNode(t); err != nil {
		t.Errorf("CheckNode after the repair: %v", err)
	}
}

// TestRemoveWhenElementChanged: an element whose value somebody changed (owner comment kept)
// makes uninstall's add-then-delete clash; Remove reads the map back and deletes it by key. An
// element of the same key that another owner (or nobody) holds is left alone.
func TestRemoveWhenElementChanged(t *testing.T) {
	w := newWorld(t)
	mine := entry("tcp", 80, any4, pod4, 8080)
	theirs := entry("tcp", 81, any4, pod4, 8081)
	w.add(t, ownerA, mine, theirs)
	w.nft(t, "delete", "element", "inet", "kubenet-t", MapIPv4, "{ tcp . 80 }")
	w.nft(t, "add", "element", "inet", "kubenet-t", MapIPv4, `{ tcp . 80 comment "aaa/eth0" : 10.244.1.66 . 9999 }`)
	w.nft(t, "delete", "element", "inet", "kubenet-t", MapIPv4, "{ tcp . 81 }")
	w.nft(t, "add", "element", "inet", "kubenet-t", MapIPv4, `{ tcp . 81 comment "zzz/eth0" : 10.244.1.77 . 81 }`)
	w.do(t, func() error { return Remove(w.cfg, ownerA, []Key{mine.Key, theirs.Key}) })
	left := sortedReservations(w.kernelElements(t))
	if want := []string{entry("tcp", 81, any4, netip.MustParseAddr("10.244.1.77"), 81).String() + " zzz/eth0"}; !slices.Equal(left, want) {
		t.Errorf("elements after Remove: %q, want only %q", left, want)
	}
	if all, err := NewIndex(w.cfg.Dir).All(); err != nil || len(all) != 0 {
		t.Errorf("index after Remove: %v, %v", all, err)
	}
}

// limitEntries is a pod at the limit: MaxMappings mappings without hostIP on a dual-stack pod,
// two entries each.
func limitEntries(t testing.TB, n int) []Entry {
	t.Helper()
	var ms []Mapping
	for i := range n {
		proto := Protocols()[i%3]
		ms = append(ms, Mapping{HostPort: uint16(20000 + i), ContainerPort: uint16(8000 + i), Protocol: proto})
	}
	es, err := Plan(ms, []netip.Addr{pod4, pod6})
	if err != nil {
		t.Fatal(err)
	}
	return es
}

// TestAddAndRemoveAtTheLimit: a pod with MaxMappings dual-stack mappings (2*MaxMappings
// elements, the most one transaction carries) is installed and removed completely; one entry
// more than a transaction holds is refused before anything is reserved. One message per element
// used to overflow the socket with acknowledgements from about 75 mappings on.
func TestAddAndRemoveAtTheLimit(t *testing.T) {
	w := newWorld(t)
	es := limitEntries(t, MaxMappings)
	if len(es) != MaxEntriesPerTransaction {
		t.Fatalf("%d entries at the limit, want %d", len(es), MaxEntriesPerTransaction)
	}
	w.add(t, ownerA, es...)
	if got := len(w.kernelElements(t)); got != len(es) {
		t.Errorf("%d elements after Add, want %d", got, len(es))
	}
	if err := w.ns.Do(func(ns.NetNS) error { return Check(w.cfg, ownerA, es) }); err != nil {
		t.Errorf("Check at the limit: %v", err)
	}
	w.do(t, func() error { return Remove(w.cfg, ownerA, KeysOf(es)) })
	if got := w.kernelElements(t); len(got) != 0 {
		t.Errorf("%d elements left after Remove", len(got))
	}
	if files := indexFiles(t, w.cfg.Dir); len(files) != 0 {
		t.Errorf("index files left after Remove: %d", len(files))
	}

	over := limitEntries(t, MaxMappings+1)
	err := w.ns.Do(func(ns.NetNS) error { return Add(w.cfg, ownerB, over) })
	if err == nil || !strings.Contains(err.Error(), fmt.Sprint(len(over))) {
		t.Errorf("Add of %d entries = %v, want it refused naming the count", len(over), err)
	}
	if files := indexFiles(t, w.cfg.Dir); len(files) != 0 || len(w.kernelElements(t)) != 0 {
		t.Errorf("the refused Add left %d index files and %d elements", len(files), len(w.kernelElements(t)))
	}
}

// TestUninstallSplitsLargeRemovals: GC of more elements than one transaction carries removes
// them all, in several transactions.
func TestUninstallSplitsLargeRemovals(t *testing.T) {
	w := newWorld(t)
	for i := range 3 {
		owner := Owner{ContainerID: fmt.Sprintf("pod-%d", i), IfName: "eth0"}
		es := limitEntries(t, MaxMappings)
		for j := range es {
			es[j].HostPort += uint16(1000 * i)
		}
		w.add(t, owner, es...)
	}
	if got := len(w.kernelElements(t)); got != 3*MaxEntriesPerTransaction {
		t.Fatalf("%d elements, want %d", got, 3*MaxEntriesPerTransaction)
	}
	w.do(t, func() error {
		_, err := GC(w.cfg, func(Owner) bool { return false })
		return err
	})
	if got := len(w.kernelElements(t)); got != 0 {
		t.Errorf("%d elements left after GC", got)
	}
}

// TestEnsureNodeDeletesRetiredLocalnetChain: a node set up by a release before the guard moved
// off the bridged path holds the old filter prerouting chain, which costs every bridged packet.
// CheckNode reports it (a difference, not a missing object: the node is guarded), EnsureNode
// deletes it, and once gone the node is as planned. An emptied one (`nft flush table` keeps
// chains) goes with the next write too: an empty base chain still costs every packet.
func TestEnsureNodeDeletesRetiredLocalnetChain(t *testing.T) {
	w := newWorld(t)
	w.add(t, ownerA, entry("tcp", 80, any4, pod4, 8080))
	old := `add chain inet kubenet-t hostport-localnet { type filter hook prerouting priority mangle; }
add rule inet kubenet-t hostport-localnet meta nfproto ipv4 iifname != "lo" ip saddr 127.0.0.0/8 drop comment "drop packets from 127.0.0.0/8 that did not arrive on lo (route_localnet is on for localhost hostPorts)"
add rule inet kubenet-t hostport-localnet meta nfproto ipv4 iifname != "lo" ip daddr 127.0.0.0/8 drop comment "drop packets to 127.0.0.0/8 that did not arrive on lo (route_localnet is on for localhost hostPorts)"
`
	chainsOf := func() string { return w.nft(t, "list", "chains", "inet") }
	for _, tc := range []struct {
		name, script string
	}{
		{"with its rules", old},
		{"emptied, beside an emptied table", "add chain inet kubenet-t hostport-localnet { type filter hook prerouting priority mangle; }\nflush table inet kubenet-t\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			script := filepath.Join(t.TempDir(), "retired.nft")
			if err := os.WriteFile(script, []byte(tc.script), 0o600); err != nil {
				t.Fatal(err)
			}
			w.nft(t, "-f", script)
			if !strings.Contains(chainsOf(), "chain hostport-localnet {") {
				t.Fatalf("the retired chain was not made:\n%s", chainsOf())
			}
			err := w.checkNode(t)
			var d *nft.Difference
			if !errors.As(err, &d) {
				t.Fatalf("CheckNode with the retired chain = %v, want a difference", err)
			}
			if tc.script == old && (len(nft.Missing(err)) > 0 || !strings.Contains(err.Error(), "chain hostport-localnet of table")) {
				t.Errorf("CheckNode with the retired chain = %v, want it named as changed, nothing missing", err)
			}
			w.ensure(t, false)
			if got := chainsOf(); strings.Contains(got, "chain hostport-localnet {") || !strings.Contains(got, "chain "+ChainLocalnetInput+" {") {
				t.Errorf("chains after EnsureNode:\n%s\nwant the retired one gone and %s there", got, ChainLocalnetInput)
			}
			if err := w.checkNode(t); err != nil {
				t.Errorf("CheckNode after EnsureNode: %v", err)
			}
		})
	}
}

// TestLocalnetIngressChainRetired: the localnet guard's chain of the previous release hooked the
// bridge device's ingress, which a frame under two VLAN-0 tags passes as a VLAN frame: CheckNode
// names it, and EnsureNode deletes it and leaves the input chain, which no device binds.
func TestLocalnetIngressChainRetired(t *testing.T) {
	w := newWorld(t)
	w.add(t, ownerA, entry("tcp", 80, any4, pod4, 8080))
	w.nft(t, "add", "chain", "inet", "kubenet-t", chainLocalnetIngressRetired, "{ type filter hook ingress device br0 priority 0; }")
	w.nft(t, "add", "rule", "inet", "kubenet-t", chainLocalnetIngressRetired, "ip", "daddr", "127.0.0.0/8", "drop")
	if err := w.checkNode(t); err == nil || !strings.Contains(err.Error(), chainLocalnetIngressRetired) {
		t.Fatalf("CheckNode with the previous release's ingress chain = %v, want it named", err)
	}
	w.ensure(t, false)
	got := w.nft(t, "list", "table", "inet", "kubenet-t")
	if strings.Contains(got, chainLocalnetIngressRetired) || strings.Contains(got, "hook ingress") || !strings.Contains(got, "chain "+ChainLocalnetInput+" {") {
		t.Errorf("the table after EnsureNode:\n%s\nwant the ingress chain gone and %s there", got, ChainLocalnetInput)
	}
	if err := w.checkNode(t); err != nil {
		t.Errorf("CheckNode after EnsureNode: %v", err)
	}
}

// TestEnsureNodeRacesTableCreation: on a node's first ADD the SNAT step creates the network's
// inet table while the host-port step reads the table's maps: a read that finds no table and a
// table that exists when asked right after must not fail the step (the map read is made again).
// Many rounds, each on a fresh node, with the table made at once by another goroutine.
func TestEnsureNodeRacesTableCreation(t *testing.T) {
	for round := range 200 {
		w := newWorld(t)
		var tableErr, ensureErr error
		w.do(t, func() error {
			here, err := ns.GetCurrentNS()
			if err != nil {
				return err
			}
			defer here.Close()
			made := make(chan error, 1)
			go func() {
				made <- here.Do(func(ns.NetNS) error {
					c, err := nftables.New()
					if err != nil {
						return err
					}
					c.AddTable(nft.InetTable(w.cfg.Network))
					return c.Flush()
				})
			}()
			_, ensureErr = EnsureNode(w.cfg, false)
			tableErr = <-made // before here is closed
			return nil
		})
		if err := errors.Join(tableErr, ensureErr); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if err := w.checkNode(t); err != nil {
			t.Fatalf("round %d: CheckNode after EnsureNode: %v", round, err)
		}
	}
}
