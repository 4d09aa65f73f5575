package hostport

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/kubenet-dev/kubenet/internal/ipt"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

// iptWorld is a world on the iptables backend. cfg returns the configuration of one operation:
// a backend with a fresh read of the tables, as each verb gets one.
type iptWorld struct{ *world }

func newIPTWorld(t testing.TB, cidrs ...netip.Prefix) iptWorld {
	t.Helper()
	w := iptWorld{newWorld(t)}
	if len(cidrs) > 0 {
		w.world.cfg.PodCIDRs = cidrs
	}
	return w
}

func (w iptWorld) cfg() Config {
	c := w.world.cfg
	c.Backend = IPTables(&ipt.State{})
	return c
}

func (w iptWorld) save(t testing.TB, f ipt.Family, table string) *ipt.Table {
	t.Helper()
	cmd := "iptables-save"
	if f == ipt.IPv6 {
		cmd = "ip6tables-save"
	}
	return ipt.Parse(f, table, []byte(nettest.Run(t, w.ns, cmd, "-t", table)))
}

func (w iptWorld) entries(t testing.TB) []Reservation {
	t.Helper()
	var got []Reservation
	w.do(t, func() (err error) { _, got, err = List(w.cfg()); return err })
	return got
}

func (w iptWorld) add(t testing.TB, o Owner, es ...Entry) {
	t.Helper()
	w.do(t, func() error {
		if _, err := EnsureNode(w.cfg(), false); err != nil {
			return err
		}
		return Add(w.cfg(), o, es)
	})
}

// TestIPTablesNodeReadsBack: on every pod CIDR configuration the fixed chains EnsureNode writes
// read back as planned (the plan is in the tools' canonical form), a second EnsureNode writes
// nothing, and a fixed rule changed in place is found and rewritten.
func TestIPTablesNodeReadsBack(t *testing.T) {
	for _, cidrs := range [][]netip.Prefix{{cidr4}, {cidr6}, {cidr4, cidr6}} {
		t.Run(fmtPrefixes(cidrs), func(t *testing.T) {
			w := newIPTWorld(t, cidrs...)
			var rep Repair
			w.do(t, func() (err error) { rep, err = EnsureNode(w.cfg(), false); return err })
			if len(rep.Chains) == 0 {
				t.Fatal("first EnsureNode wrote nothing")
			}
			w.do(t, func() error { return CheckNode(w.cfg()) })
			w.do(t, func() (err error) { rep, err = EnsureNode(w.cfg(), false); return err })
			if rep.Changed() {
				t.Errorf("EnsureNode on a healthy node changed %v", rep)
			}
			if !slices.Contains(cidrs, cidr4) {
				return
			}
			// The localnet guard's drop becomes an accept, its comment kept.
			chain := chainLOCALNET(w.world.cfg.Network)
			old := w.save(t, ipt.IPv4, "mangle").Chains[chain][0]
			nettest.Run(t, w.ns, "sh", "-c", "iptables -t mangle -R "+chain+" 1 "+strings.Replace(old, "-j DROP", "-j ACCEPT", 1))
			var err error
			w.do(t, func() error { err = CheckNode(w.cfg()); return nil })
			if err == nil || !strings.Contains(err.Error(), "changed in place") {
				t.Errorf("CheckNode after the edit = %v, want the rule named changed in place", err)
			}
			w.do(t, func() (err error) { _, err = EnsureNode(w.cfg(), false); return err })
			if got := w.save(t, ipt.IPv4, "mangle").Chains[chain][0]; !ipt.Same(got, old) {
				t.Errorf("after EnsureNode the rule is %q, want %q", got, old)
			}
		})
	}
}

// fmtPrefixes names a subtest by its pod CIDRs, comma-separated.
func fmtPrefixes(ps []netip.Prefix) string {
	var s []string
	for _, p := range ps {
		s = append(s, p.String())
	}
	return strings.Join(s, ",")
}

// TestIPTablesAddCheckRemove: entries of both families (any address and a hostIP) become one
// DNAT rule each and one hairpin rule per pod address; Check passes and names a removed rule;
// Remove leaves no rule, hairpin rule or index file.
func TestIPTablesAddCheckRemove(t *testing.T) {
	w := newIPTWorld(t)
	es := []Entry{entry("tcp", 80, any4, pod4, 8080), entry("udp", 53, ip6, pod6, 53), entry("sctp", 9000, any6, pod6, 9000), entry("tcp", 81, ip4, pod4, 81)}
	w.add(t, ownerA, es...)
	got := w.entries(t)
	if want := reservations(ownerA, es); !slices.Equal(sortedReservations(got), sortedReservations(want)) {
		t.Fatalf("entries in the kernel %v, want %v", got, want)
	}
	hair4 := w.save(t, ipt.IPv4, "nat").Chains[chainHPHAIR(w.world.cfg.Network)]
	hair6 := w.save(t, ipt.IPv6, "nat").Chains[chainHPHAIR(w.world.cfg.Network)]
	if len(hair4) != 1 || len(hair6) != 1 {
		t.Errorf("hairpin rules %q and %q, want one per family", hair4, hair6)
	}
	check := func() error {
		var err error
		_ = w.ns.Do(func(ns.NetNS) error { err = Check(w.cfg(), ownerA, es); return nil })
		return err
	}
	if err := check(); err != nil {
		t.Fatalf("Check after Add: %v", err)
	}
	nettest.Run(t, w.ns, "ip6tables", "-t", "nat", "-D", chainHPDNAT(w.world.cfg.Network), "1")
	if err := check(); err == nil {
		t.Error("Check passed with a DNAT rule deleted")
	}
	w.do(t, func() error { return Remove(w.cfg(), ownerA, KeysOf(es)) })
	for _, f := range []ipt.Family{ipt.IPv4, ipt.IPv6} {
		nat := w.save(t, f, "nat")
		if n := len(nat.Chains[chainHPDNAT(w.world.cfg.Network)]) + len(nat.Chains[chainHPHAIR(w.world.cfg.Network)]); n != 0 {
			t.Errorf("%s: %d rules left after Remove", f, n)
		}
	}
	if files := indexFiles(t, w.world.cfg.Dir); len(files) != 0 {
		t.Errorf("index files left after Remove: %v", files)
	}
}

// TestIPTablesGC: GC removes the rules of owners keep rejects, their hairpin rules with them, and
// leaves rules without an owner kubenet could have written.
func TestIPTablesGC(t *testing.T) {
	w := newIPTWorld(t)
	a, b := entry("tcp", 80, any4, pod4, 8080), entry("tcp", 81, any4, netip.MustParseAddr("10.244.1.3"), 81)
	w.add(t, ownerA, a)
	w.add(t, ownerB, b)
	nettest.Run(t, w.ns, "iptables", "-t", "nat", "-A", chainHPDNAT(w.world.cfg.Network), "-p", "tcp", "-m", "tcp", "--dport", "82", "-j", "DNAT", "--to-destination", "10.244.1.8:82")
	w.do(t, func() error {
		_, err := GC(w.cfg(), func(o Owner) bool { return o == ownerA })
		return err
	})
	left := sortedReservations(w.entries(t))
	want := []string{a.String() + " aaa/eth0", entry("tcp", 82, any4, netip.MustParseAddr("10.244.1.8"), 82).String() + " /"}
	if !slices.Equal(left, want) {
		t.Errorf("after GC: %q, want %q", left, want)
	}
	if hair := w.save(t, ipt.IPv4, "nat").Chains[chainHPHAIR(w.world.cfg.Network)]; len(hair) != 1 || !strings.Contains(hair[0], ownerA.String()) {
		t.Errorf("hairpin rules after GC: %q, want A's only", hair)
	}
}

// TestIPTablesFlushRestores: a firewall reload empties and deletes every chain; CheckNode
// reports them missing and EnsureNode (as ADD runs it) puts back the chains and every running
// pod's rules from the index.
func TestIPTablesFlushRestores(t *testing.T) {
	w := newIPTWorld(t)
	es := []Entry{entry("tcp", 80, any4, pod4, 8080), entry("tcp", 80, any6, pod6, 8080)}
	w.add(t, ownerA, es...)
	before := sortedReservations(w.entries(t))
	for _, cmd := range []string{"iptables", "ip6tables"} {
		for _, table := range []string{"nat", "mangle"} {
			nettest.Run(t, w.ns, cmd, "-t", table, "-F")
			nettest.Run(t, w.ns, cmd, "-t", table, "-X")
		}
	}
	var err error
	w.do(t, func() error { err = CheckNode(w.cfg()); return nil })
	var d *ipt.Difference
	if !errors.As(err, &d) || !d.Missing {
		t.Fatalf("CheckNode after the flush = %v, want missing chains", err)
	}
	var rep Repair
	w.do(t, func() (err error) { rep, err = EnsureNode(w.cfg(), false); return err })
	if rep.Elements != len(es) {
		t.Errorf("EnsureNode restored %d entries, want %d (%v)", rep.Elements, len(es), rep)
	}
	if got := sortedReservations(w.entries(t)); !slices.Equal(got, before) {
		t.Errorf("after the repair: %v, want %v", got, before)
	}
	w.do(t, func() error { return CheckNode(w.cfg()) })
}

// TestIPTablesAtTheLimit: a pod with MaxMappings dual-stack mappings is installed and removed
// completely, one restore per family each way.
func TestIPTablesAtTheLimit(t *testing.T) {
	w := newIPTWorld(t)
	es := limitEntries(t, MaxMappings)
	w.add(t, ownerA, es...)
	if got := len(w.entries(t)); got != len(es) {
		t.Errorf("%d entries after Add, want %d", got, len(es))
	}
	w.do(t, func() error { return Check(w.cfg(), ownerA, es) })
	w.do(t, func() error { return Remove(w.cfg(), ownerA, KeysOf(es)) })
	if got := w.entries(t); len(got) != 0 {
		t.Errorf("%d entries left after Remove", len(got))
	}
}
