package isolation

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/google/nftables"

	"github.com/kubenet-dev/kubenet/internal/nft"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

func testPort(i int) Port {
	return Port{
		Name:  fmt.Sprintf("vethtest%07d", i),
		Owner: fmt.Sprintf("c%d/eth0", i),
		MAC:   net.HardwareAddr{0x02, 0, 0, 0, 0, byte(i)},
		Addrs: []netip.Addr{netip.AddrFrom4([4]byte{10, 244, 1, byte(i)}), netip.MustParseAddr(fmt.Sprintf("fd00::%x", i))},
	}
}

// ruleHandles returns every rule handle of the table by chain: a rewritten chain gets new ones.
func ruleHandles(t *testing.T, n ns.NetNS, network string) map[string][]uint64 {
	t.Helper()
	out := map[string][]uint64{}
	nettest.Do(t, n, func() error {
		c, err := nftables.New()
		if err != nil {
			return err
		}
		table := nft.BridgeTable(network)
		for _, name := range append(slices.Clone(chainNames), "dedup") {
			rules, err := c.GetRules(table, &nftables.Chain{Name: name, Table: table})
			if err != nil {
				return err
			}
			for _, r := range rules {
				out[name] = append(out[name], r.Handle)
			}
		}
		return nil
	})
	return out
}

// listedNoMore polls until `nft list table` of the bridge table no longer shows any of words
// (port names, owners), and says what it still shows after a second: an element Remove or GC
// ended stays listed until the kernel's next tick.
func listedNoMore(n ns.NetNS, table string, words ...string) error {
	return nettest.Eventually(time.Second, func() error {
		out, err := nettest.Output(n, "nft", "list", "table", "bridge", table)
		if err != nil {
			return err
		}
		for _, w := range words {
			if strings.Contains(out, w) {
				return fmt.Errorf("%q still listed:\n%s", w, out)
			}
		}
		return nil
	})
}

func in(t *testing.T, n ns.NetNS, f func() error) error {
	t.Helper()
	return n.Do(func(ns.NetNS) error { return f() })
}

// TestEnsureCheckRemoveGC drives the package against the kernel in a namespace: chains are
// written once and then only read, a foreign chain in the same table is left alone, turning
// anti-spoofing off and on adds and removes its chains, CHECK finds missing and stray elements,
// Remove is repeatable and creates nothing, GC removes exactly the ports it is told to.
func TestEnsureCheckRemoveGC(t *testing.T) {
	n := nettest.NewNS(t)
	on, off := Config{Network: "t", AntiSpoofing: true}, Config{Network: "t"}
	p1, p2 := testPort(1), testPort(2)

	// Another package's chain in the same table (hairpin's dedup chain).
	nettest.Run(t, n, "nft", "add table bridge kubenet-t; add chain bridge kubenet-t dedup { type filter hook output priority 0; }; add rule bridge kubenet-t dedup ether saddr 0a:58:00:00:00:01 drop")

	nettest.Do(t, n, func() error { return ensured(on, p1) })
	first := ruleHandles(t, n, "t")
	nettest.Do(t, n, func() error { return ensured(on, p2) })
	if second := ruleHandles(t, n, "t"); fmt.Sprint(second) != fmt.Sprint(first) {
		t.Errorf("a second Ensure rewrote the chains:\n%v\n%v", first, second)
	}
	for _, p := range []Port{p1, p2} {
		if err := in(t, n, func() error { return Check(on, p) }); err != nil {
			t.Errorf("Check %s: %v", p.Name, err)
		}
	}
	for _, name := range []string{ChainGuard, ChainAntiSpoofND} {
		if len(first[name]) != planned(on, name) {
			t.Errorf("chain %s has %d rules, want %d", name, len(first[name]), planned(on, name))
		}
	}

	t.Run("anti-spoofing off and on", func(t *testing.T) {
		nettest.Do(t, n, func() error { return ensured(off) })
		h := ruleHandles(t, n, "t")
		for _, name := range chainNames {
			if want := planned(off, name); len(h[name]) != want {
				t.Errorf("off: chain %s has %d rules, want %d", name, len(h[name]), want)
			}
		}
		if err := in(t, n, func() error { return Check(off, p1) }); err != nil {
			t.Errorf("off: Check: %v", err)
		}
		if err := in(t, n, func() error { return Check(on, p1) }); err == nil {
			t.Error("off: Check with anti-spoofing on passes without its chains")
		}
		nettest.Do(t, n, func() error { return ensured(on) })
		if err := in(t, n, func() error { return Check(on, p1) }); err != nil {
			t.Errorf("on again: Check: %v", err)
		}
		if len(ruleHandles(t, n, "t")["dedup"]) != 1 {
			t.Error("the foreign dedup chain lost its rule")
		}
	})

	t.Run("CHECK finds missing and stray elements", func(t *testing.T) {
		nettest.Run(t, n, "nft", "delete", "element", "bridge", "kubenet-t", SetIPv6, `{ "vethtest0000001" . fd00::1 }`)
		err := in(t, n, func() error { return Check(on, p1) })
		if err == nil || !strings.Contains(err.Error(), "fd00::1") || !strings.Contains(err.Error(), SetIPv6) {
			t.Errorf("Check after deleting an element: %v, want it named", err)
		}
		nettest.Do(t, n, func() error { return ensured(on, p1) })
		nettest.Run(t, n, "nft", "add", "element", "bridge", "kubenet-t", SetIPv4, `{ "vethtest0000001" . 10.244.1.99 }`)
		err = in(t, n, func() error { return Check(on, p1) })
		if err == nil || !strings.Contains(err.Error(), "stray") || !strings.Contains(err.Error(), "10.244.1.99") {
			t.Errorf("Check with a stray element: %v, want it named", err)
		}
		nettest.Run(t, n, "nft", "delete", "element", "bridge", "kubenet-t", SetIPv4, `{ "vethtest0000001" . 10.244.1.99 }`)
	})

	t.Run("Remove is repeatable and leaves the other port", func(t *testing.T) {
		for range 2 {
			nettest.Do(t, n, func() error { return Remove("t", p1) })
		}
		if err := in(t, n, func() error { return Check(on, p1) }); err == nil {
			t.Error("Check passes after Remove")
		}
		if err := in(t, n, func() error { return Check(on, p2) }); err != nil {
			t.Errorf("the other port: %v", err)
		}
		if err := listedNoMore(n, "kubenet-t", p1.Owner, p1.Name); err != nil {
			t.Errorf("elements of %s: %v", p1.Name, err)
		}
	})

	t.Run("GC", func(t *testing.T) {
		stray := Port{Name: "vethdead0000000", Owner: "gone/eth0", MAC: net.HardwareAddr{2, 0, 0, 0, 0, 0xde}, Addrs: []netip.Addr{netip.MustParseAddr("10.244.1.222")}}
		nettest.Do(t, n, func() error { return ensured(on, stray) })
		var removed []string
		nettest.Do(t, n, func() error {
			var err error
			removed, err = GC("t", func(port, owner string) bool { return port == p2.Name && owner == p2.Owner })
			return err
		})
		if !slices.Equal(removed, []string{stray.Name}) {
			t.Errorf("GC removed %v, want [%s]", removed, stray.Name)
		}
		if err := listedNoMore(n, "kubenet-t", stray.Name); err != nil {
			t.Errorf("GC left elements of %s: %v", stray.Name, err)
		}
		if err := in(t, n, func() error { return Check(on, p2) }); err != nil {
			t.Errorf("GC touched a kept port: %v", err)
		}
	})

	t.Run("Remove without a table creates nothing", func(t *testing.T) {
		empty := nettest.NewNS(t)
		if err := in(t, empty, func() error { return Remove("t", p1) }); err != nil {
			t.Errorf("Remove without a table: %v", err)
		}
		if out := nettest.Run(t, empty, "nft", "list", "ruleset"); strings.TrimSpace(out) != "" {
			t.Errorf("Remove created:\n%s", out)
		}
	})

	t.Run("a flushed table is rebuilt and reported", func(t *testing.T) {
		if err := in(t, n, func() error { return CheckNode(on) }); err != nil {
			t.Fatalf("CheckNode on a set-up node: %v", err)
		}
		var rebuilt bool
		nettest.Do(t, n, func() (err error) { rebuilt, err = Ensure(on); return err })
		if rebuilt {
			t.Error("Ensure on a set-up node says it rebuilt the chains")
		}
		// A rule changed in place keeps its comment: only its expressions tell.
		nettest.Run(t, n, "nft", "flush", "chain", "bridge", "kubenet-t", ChainGuardIPv6)
		nettest.Run(t, n, "nft", "add", "rule", "bridge", "kubenet-t", ChainGuardIPv6, "accept")
		err := in(t, n, func() error { return CheckNode(on) })
		if err == nil || len(nft.Missing(err)) != 0 || !strings.Contains(err.Error(), ChainGuardIPv6) {
			t.Errorf("CheckNode after an edit of chain %s: %v, want a difference that is not a missing chain", ChainGuardIPv6, err)
		}
		nettest.Run(t, n, "nft", "flush", "ruleset")
		counts := map[string]int{}
		if missing := MissingNode(on, counts); len(missing) != len(Plan(on)) {
			t.Errorf("MissingNode on a flushed node names %d chains, want %d", len(missing), len(Plan(on)))
		}
		err = in(t, n, func() error { return CheckNode(on) })
		if len(nft.Missing(err)) == 0 {
			t.Errorf("CheckNode after a flush: %v, want missing chains", err)
		}
		nettest.Do(t, n, func() (err error) { rebuilt, err = Ensure(on, p1); return err })
		if !rebuilt {
			t.Error("Ensure after a flush does not say it rebuilt the chains")
		}
		nettest.Do(t, n, func() error { return ensured(on, p2) })
		for _, p := range []Port{p1, p2} {
			if err := in(t, n, func() error { return Check(on, p) }); err != nil {
				t.Errorf("Check %s after the rebuild: %v", p.Name, err)
			}
		}

		// Somebody else's set under one of the names: the planned set cannot be added over it,
		// and Remove cannot work on it; Ensure replaces it.
		for _, ch := range []string{ChainAntiSpoofIPv4, ChainAntiSpoofARP} {
			nettest.Run(t, n, "nft", "flush", "chain", "bridge", "kubenet-t", ch)
		}
		nettest.Run(t, n, "nft", "delete", "set", "bridge", "kubenet-t", SetIPv4)
		nettest.Run(t, n, "nft", "add", "set", "bridge", "kubenet-t", SetIPv4, "{ type ipv4_addr; }")
		if err := in(t, n, func() error { return Remove("t", p2) }); err == nil {
			t.Error("Remove succeeded on a mistyped set")
		}
		// The set made again lacks the running pods' elements (p2's address), as after a
		// flush: Ensure says so, and the caller puts them back.
		nettest.Do(t, n, func() (err error) { rebuilt, err = Ensure(on, p1); return err })
		if !rebuilt {
			t.Error("Ensure does not say it rebuilt where a set was made again")
		}
		if err := in(t, n, func() error { return CheckNode(on) }); err != nil {
			t.Errorf("CheckNode after the mistyped set was replaced: %v", err)
		}
		if err := in(t, n, func() error { return Check(on, p1) }); err != nil {
			t.Errorf("Check %s after the mistyped set was replaced: %v", p1.Name, err)
		}
	})
}

// planned is the number of rules the plan gives chain (0: the plan has no such chain).
func planned(cfg Config, chain string) int {
	for _, c := range Plan(cfg) {
		if c.Name == chain {
			return len(c.Rules)
		}
	}
	return 0
}

// TestEnsureConcurrent: plugin processes add pods at the same time on a fresh node; every port
// gets its elements and every chain its rules once.
func TestEnsureConcurrent(t *testing.T) {
	n := nettest.NewNS(t)
	cfg := Config{Network: "c", AntiSpoofing: true}
	const pods = 8
	var wg sync.WaitGroup
	errs := make(chan error, pods)
	for i := range pods {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- in(t, n, func() error { return ensured(cfg, testPort(i+1)) })
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("Ensure: %v", err)
		}
	}
	h := ruleHandles(t, n, "c")
	for _, c := range Plan(cfg) {
		if len(h[c.Name]) != len(c.Rules) {
			t.Errorf("chain %s has %d rules, want %d", c.Name, len(h[c.Name]), len(c.Rules))
		}
	}
	for i := range pods {
		if err := in(t, n, func() error { return Check(cfg, testPort(i+1)) }); err != nil {
			t.Errorf("port %d: %v", i+1, err)
		}
	}
}

// TestManyPorts: a node re-installing every pod's elements at once (more ports than one
// transaction carries), then removing them, and GC sweeping as many.
func TestManyPorts(t *testing.T) {
	n := nettest.NewNS(t)
	cfg := Config{Network: "m", AntiSpoofing: true}
	ports := make([]Port, 3*portsPerBatch+5)
	for i := range ports {
		ports[i] = testPort(i + 1)
	}
	nettest.Do(t, n, func() error { return ensured(cfg, ports...) })
	for _, p := range []Port{ports[0], ports[len(ports)/2], ports[len(ports)-1]} {
		if err := in(t, n, func() error { return Check(cfg, p) }); err != nil {
			t.Errorf("port %s: %v", p.Name, err)
		}
	}
	nettest.Do(t, n, func() error { return Remove("m", ports[:len(ports)/2]...) })
	var removed []string
	nettest.Do(t, n, func() error {
		var err error
		removed, err = GC("m", func(string, string) bool { return false })
		return err
	})
	if len(removed) != len(ports)-len(ports)/2 {
		t.Errorf("GC removed %d ports, want the %d Remove left", len(removed), len(ports)-len(ports)/2)
	}
	if err := listedNoMore(n, "kubenet-m", "vethtest"); err != nil {
		t.Error(err)
	}
}

// ensured is Ensure for callers that only want its error.
func ensured(cfg Config, ports ...Port) error {
	_, err := Ensure(cfg, ports...)
	return err
}
