package isolation

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/google/nftables"

	"github.com/kubenet-dev/kubenet/internal/nft"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

// setsAndElements reads the network's isolation sets as the kernel holds them, and the elements
// of each (ended ones included) by set name.
func setsAndElements(t *testing.T, n ns.NetNS, network string) (map[string]*nftables.Set, map[string][]nftables.SetElement) {
	t.Helper()
	found := map[string]*nftables.Set{}
	els := map[string][]nftables.SetElement{}
	nettest.Do(t, n, func() error {
		c, err := nftables.New()
		if err != nil {
			return err
		}
		have, err := c.GetSets(nft.BridgeTable(network))
		if err != nil {
			return err
		}
		for _, s := range have {
			found[s.Name] = s
			if els[s.Name], err = c.GetSetElements(s); err != nil {
				return err
			}
		}
		return nil
	})
	return found, els
}

// elementsOfPort returns the elements of els (by set) whose key starts with port's name.
func elementsOfPort(els map[string][]nftables.SetElement, port string) []nftables.SetElement {
	var out []nftables.SetElement
	for _, e := range els {
		for _, el := range e {
			if nameOf(el.Key) == port {
				out = append(out, el)
			}
		}
	}
	return out
}

// TestRemoveEndsElementsByExpiry: on a kernel that applies element timeout updates (the probe
// says which), the sets are made with the timeout flag, a pod's elements are added with a
// century's timeout, Remove ends them (they leave the listings at the next tick, the other pod's
// stay), and adding a port again right after its Remove resets the expiry instead of keeping it.
func TestRemoveEndsElementsByExpiry(t *testing.T) {
	n := nettest.NewNS(t)
	cfg := Config{Network: "x", AntiSpoofing: true}
	p1, p2 := testPort(1), testPort(2)
	var probe error
	nettest.Do(t, n, func() error {
		probe = nft.ProbeElementExpiry(&nftables.Table{Family: nftables.TableFamilyBridge, Name: "probe"})
		return ensured(cfg, p1, p2)
	})
	expiring := probe == nil

	found, els := setsAndElements(t, n, "x")
	for _, want := range sets(nft.BridgeTable("x"), false) {
		s := found[want.Name]
		if s == nil {
			t.Fatalf("set %s missing", want.Name)
		}
		if s.HasTimeout != expiring {
			t.Errorf("set %s has the timeout flag %v, want %v (the probe's answer)", s.Name, s.HasTimeout, expiring)
		}
	}
	if !expiring {
		t.Fatalf("this kernel does not apply element timeout updates (%v): the rest of this test needs one that does", probe)
	}
	for _, el := range elementsOfPort(els, p1.Name) {
		if el.Timeout < 50*365*24*time.Hour || el.Expires < 50*365*24*time.Hour {
			t.Errorf("element %x: timeout %v, expires in %v, want about %v", el.Key, el.Timeout, el.Expires, nft.Forever)
		}
	}
	if got := len(elementsOfPort(els, p1.Name)); got != 9 {
		t.Fatalf("port %s has %d elements, want 9 (pod ports, anti-spoofing ports, MAC, IPv4, IPv6, link-local, and the fast paths' IPv4, IPv6, link-local)", p1.Name, got)
	}

	nettest.Do(t, n, func() error { return Remove("x", p1) })
	_, els = setsAndElements(t, n, "x")
	for _, el := range elementsOfPort(els, p1.Name) {
		if !nft.IsEnded(el) {
			t.Errorf("element %x after Remove: timeout %v, want it ended", el.Key, el.Timeout)
		}
	}
	if err := listedNoMore(n, "kubenet-x", p1.Name, p1.Owner); err != nil {
		t.Errorf("after Remove: %v", err)
	}
	if err := in(t, n, func() error { return Check(cfg, p1) }); err == nil {
		t.Error("Check passes after Remove")
	}
	if err := in(t, n, func() error { return Check(cfg, p2) }); err != nil {
		t.Errorf("the other port after Remove: %v", err)
	}

	// The same attachment again at once (a retried ADD): its elements must not stay ended.
	nettest.Do(t, n, func() error {
		if err := Remove("x", p2); err != nil {
			return err
		}
		return ensured(cfg, p2)
	})
	_, els = setsAndElements(t, n, "x")
	again := elementsOfPort(els, p2.Name)
	if len(again) != 9 {
		t.Errorf("port %s added again has %d elements, want 9", p2.Name, len(again))
	}
	for _, el := range again {
		if el.Expires < time.Hour {
			t.Errorf("element %x added again right after its Remove expires in %v: it stays ended", el.Key, el.Expires)
		}
	}
}

// TestSetsOfAnEarlierKubenet: sets without the timeout flag (made by a kubenet that deleted
// elements, or where the kernel cannot end them by expiry) keep working: ADD adds elements
// without a timeout, a rewrite of the chains keeps the sets' flags (the kernel refuses a set
// over one with other flags), and Remove and GC delete: the elements are gone at once.
func TestSetsOfAnEarlierKubenet(t *testing.T) {
	n := nettest.NewNS(t)
	on, off := Config{Network: "o", AntiSpoofing: true}, Config{Network: "o"}
	p1, p2, stray := testPort(1), testPort(2), testPort(3)
	table := nft.BridgeTable("o")
	nettest.Do(t, n, func() error {
		return addElements(on, table, sets(table, false), nil, &chainWrite{plan: Plan(on)})
	})

	nettest.Do(t, n, func() error { return ensured(on, p1, p2, stray) })
	nettest.Do(t, n, func() error { return ensured(off) })
	nettest.Do(t, n, func() error { return ensured(on) })
	found, els := setsAndElements(t, n, "o")
	for name, s := range found {
		if s.HasTimeout {
			t.Errorf("set %s got the timeout flag", name)
		}
	}
	for _, el := range elementsOfPort(els, p1.Name) {
		if el.Timeout != 0 {
			t.Errorf("element %x has timeout %v in a set without the flag", el.Key, el.Timeout)
		}
	}
	for _, p := range []Port{p1, p2} {
		if err := in(t, n, func() error { return Check(on, p) }); err != nil {
			t.Errorf("Check %s: %v", p.Name, err)
		}
	}

	nettest.Do(t, n, func() error { return Remove("o", p1) })
	nettest.Do(t, n, func() error {
		_, err := GC("o", func(port, _ string) bool { return port != stray.Name })
		return err
	})
	// Deleted, not ended: gone from the very next listing.
	out := nettest.Run(t, n, "nft", "list", "table", "bridge", "kubenet-o")
	for _, gone := range []Port{p1, stray} {
		if strings.Contains(out, gone.Name) {
			t.Errorf("elements of %s remain after their deletion:\n%s", gone.Name, out)
		}
	}
	if !strings.Contains(out, p2.Name) {
		t.Errorf("the kept port %s lost its elements:\n%s", p2.Name, out)
	}
}

// TestProbeElementExpiry holds the probe to what the kernel does: an element given a timeout
// of nft.EndTimeout after being added with nft.Forever leaves the listings within a second if and
// only if the probe says the kernel applies such updates. The probe leaves nothing but its set in
// the table it probed in (and, where the kernel keeps timeouts, its element), and two probes do
// not read each other's elements.
func TestProbeElementExpiry(t *testing.T) {
	n := nettest.NewNS(t)
	table := &nftables.Table{Family: nftables.TableFamilyBridge, Name: "kubenet-probed"}
	var probes [2]error
	nettest.Do(t, n, func() error {
		for i := range probes {
			probes[i] = nft.ProbeElementExpiry(table)
		}
		return nil
	})
	probe := probes[0]
	if probes[1] != probe && (probes[1] == nil) != (probe == nil) {
		t.Errorf("a second probe in the same table answered %v, the first %v", probes[1], probe)
	}
	out := nettest.Run(t, n, "nft", "list", "ruleset")
	if strings.Count(out, "table ") != 1 || strings.Count(out, "set ") != 1 || !strings.Contains(out, "set "+nft.ProbeSet+" ") {
		t.Errorf("the probe left more than its set in the caller's namespace:\n%s", out)
	}
	if probe == nil {
		// The elements end at the next tick.
		if err := nettest.Eventually(time.Second, func() error {
			if out := nettest.Run(t, n, "nft", "list", "set", "bridge", table.Name, nft.ProbeSet); strings.Contains(out, "elements") {
				return fmt.Errorf("the probe's elements are still listed:\n%s", out)
			}
			return nil
		}); err != nil {
			t.Error(err)
		}
	}
	nettest.Run(t, n, "nft", "add table bridge t; add set bridge t s { type ipv4_addr; flags timeout; }; add element bridge t s { 10.0.0.1 timeout 36500d }")
	nettest.Run(t, n, "nft", "add element bridge t s { 10.0.0.1 timeout 1ms }")
	gone := nettest.Eventually(time.Second, func() error {
		out := nettest.Run(t, n, "nft", "list", "set", "bridge", "t", "s")
		if strings.Contains(out, "10.0.0.1") {
			return fmt.Errorf("still listed:\n%s", out)
		}
		return nil
	})
	if applied := gone == nil; applied != (probe == nil) {
		t.Errorf("the kernel applies the update: %v; the probe says: %v", applied, probe)
	}
	if probe != nil {
		t.Logf("this kernel keeps element timeouts (%v): DEL deletes isolation elements", probe)
	}
}

// TestEnsureRecognizesOnlyWhatItVerified: with Known, the chains Ensure writes are remembered
// as verified once a later Ensure has read them back and found them as planned (not by the
// writer: a node's first ADD does not wait for the read), a healthy table is then recognised
// without adding anything to remember, a rule changed in place is still found and rewritten, and
// a new configuration is a new plan; known by the binary or, without one, by digesting the plan.
func TestEnsureRecognizesOnlyWhatItVerified(t *testing.T) {
	for name, binary := range map[string]string{"build ID": nft.BuildID(), "no build ID": ""} {
		t.Run(name, func(t *testing.T) {
			n := nettest.NewNS(t)
			known := &nft.Remembered{BinaryID: binary}
			on := Config{Network: "v", AntiSpoofing: true, Known: known}
			off := Config{Network: "v", Known: known}
			nettest.Do(t, n, func() error { return ensured(on, testPort(1)) })
			if known.Len() != 0 {
				t.Fatalf("the writer remembered %d pairs before anyone read the chains back", known.Len())
			}
			nettest.Do(t, n, func() error { return ensured(on, testPort(2)) })
			if known.Len() != 1 {
				t.Fatalf("after the chains were read back as planned %d pairs are remembered, want 1", known.Len())
			}
			nettest.Do(t, n, func() error { return ensured(on, testPort(4)) })
			if known.Len() != 1 {
				t.Errorf("a healthy table added a pair: %d", known.Len())
			}
			listing := nettest.Run(t, n, "nft", "-a", "list", "chain", "bridge", "kubenet-v", ChainGuardIPv6)
			var handle string
			for _, line := range strings.Split(listing, "\n") {
				if strings.Contains(line, "nd-router-advert drop") {
					handle = line[strings.LastIndex(line, " ")+1:]
				}
			}
			nettest.Run(t, n, "nft", "replace", "rule", "bridge", "kubenet-v", ChainGuardIPv6, "handle", handle,
				`icmpv6 type nd-router-advert accept comment "router advertisement from a pod dropped"`)
			if err := in(t, n, func() error { return CheckNode(on) }); err == nil {
				t.Fatal("the rule changed in place is not found by CheckNode")
			}
			nettest.Do(t, n, func() error { return ensured(on, testPort(3)) })
			if err := in(t, n, func() error { return CheckNode(on) }); err != nil {
				t.Errorf("Ensure with Known left the rule changed in place: %v", err)
			}
			nettest.Do(t, n, func() error { return ensured(off) })
			if err := in(t, n, func() error { return CheckNode(off) }); err != nil {
				t.Errorf("Ensure with Known did not apply the new configuration: %v", err)
			}
			nettest.Do(t, n, func() error { return ensured(off) })
			if known.Len() != 2 {
				t.Errorf("after a second configuration %d pairs are remembered, want 2", known.Len())
			}
		})
	}
}

// TestProbeSetOfAnotherDefinition: another tool made the probe's set with another definition (no
// timeout flag, another key). The probe cannot answer, and the answer it falls back to is the one
// that is safe on every kernel: the sets are made without the timeout flag, and Remove deletes a
// pod's elements (gone from the next listing) instead of relying on an expiry the kernel might
// ignore.
func TestProbeSetOfAnotherDefinition(t *testing.T) {
	n := nettest.NewNS(t)
	cfg := Config{Network: "p", AntiSpoofing: true}
	p1, p2 := testPort(1), testPort(2)
	nettest.Run(t, n, "nft", "add table bridge kubenet-p; add set bridge kubenet-p "+nft.ProbeSet+" { type ipv4_addr; }")
	nettest.Do(t, n, func() error { return ensured(cfg, p1, p2) })
	found, _ := setsAndElements(t, n, "p")
	for _, want := range sets(nft.BridgeTable("p"), false) {
		s := found[want.Name]
		if s == nil {
			t.Fatalf("set %s missing", want.Name)
		}
		if s.HasTimeout {
			t.Errorf("set %s has the timeout flag although the probe could not answer", s.Name)
		}
	}
	nettest.Do(t, n, func() error { return Remove("p", p1) })
	if err := listedNoMore(n, "kubenet-p", p1.Name, p1.Owner); err != nil {
		t.Errorf("after Remove: %v", err)
	}
	if err := in(t, n, func() error { return Check(cfg, p2) }); err != nil {
		t.Errorf("the other port after Remove: %v", err)
	}
}
