package hostport

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/kubenet-dev/kubenet/test/nettest"
)

// world is a namespace with the network's bridge, in which the package runs against the kernel.
type world struct {
	ns  ns.NetNS
	cfg Config
}

func newWorld(t testing.TB) *world {
	t.Helper()
	w := &world{ns: nettest.NewNS(t), cfg: Config{Network: "t", Dir: t.TempDir(), Bridge: "br0", PodCIDRs: []netip.Prefix{cidr4, cidr6}}}
	w.do(t, func() error { return netlink.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br0"}}) })
	return w
}

func (w *world) do(t testing.TB, f func() error) {
	t.Helper()
	nettest.Do(t, w.ns, f)
}

func (w *world) nft(t testing.TB, args ...string) string {
	t.Helper()
	return nettest.Run(t, w.ns, "nft", args...)
}

// kernelElements lists the reservations in the kernel's maps.
func (w *world) kernelElements(t testing.TB) []Reservation {
	t.Helper()
	var got []Reservation
	w.do(t, func() error {
		_, kernel, err := List(w.cfg)
		got = kernel
		return err
	})
	return got
}

// add is what ADD does: the node-wide state first, then the attachment's entries.
func (w *world) add(t testing.TB, o Owner, es ...Entry) {
	t.Helper()
	w.do(t, func() error {
		if _, err := EnsureNode(w.cfg, false); err != nil {
			return err
		}
		return Add(w.cfg, o, es)
	})
}

// TestCheckFindsDrift: Check passes after Add and names what is missing after someone removes
// an element or a rule.
func TestCheckFindsDrift(t *testing.T) {
	w := newWorld(t)
	es := []Entry{entry("tcp", 80, any4, pod4, 8080), entry("udp", 53, ip6, pod6, 53)}
	w.add(t, ownerA, es...)
	check := func(o Owner) error {
		var err error
		_ = w.ns.Do(func(ns.NetNS) error { err = Check(w.cfg, o, es); return nil })
		return err
	}
	if err := check(ownerA); err != nil {
		t.Fatalf("Check after Add: %v", err)
	}
	if err := check(ownerB); err == nil || !strings.Contains(err.Error(), `"aaa"`) {
		t.Errorf("Check of B = %v, want it to name A as the holder", err)
	}

	w.nft(t, "delete", "element", "inet", "kubenet-t", MapIPv6Addr, "{ 2001:db8:e::1 . udp . 53 }")
	if err := check(ownerA); err == nil || !strings.Contains(err.Error(), "53/udp") {
		t.Errorf("Check after deleting an element = %v, want it to name 53/udp", err)
	}
	w.add(t, ownerA, es...) // ADD's transaction restores it
	if err := check(ownerA); err != nil {
		t.Fatalf("Check after re-Add: %v", err)
	}
	w.nft(t, "flush", "chain", "inet", "kubenet-t", ChainMasquerade)
	if err := check(ownerA); err == nil || !strings.Contains(err.Error(), ChainMasquerade) {
		t.Errorf("Check after flushing %s = %v, want it to name the chain", ChainMasquerade, err)
	}
	w.add(t, ownerB, entry("tcp", 81, any4, pod4, 8080)) // the next ADD rewrites the fixed rules
	if err := check(ownerA); err != nil {
		t.Errorf("Check after the next Add: %v", err)
	}
}

// TestRemoveAfterCrash: Remove succeeds and clears the index whether or not the kernel still
// has the element (an ADD that died before its transaction, a DEL that died after it).
func TestRemoveAfterCrash(t *testing.T) {
	w := newWorld(t)
	installed := entry("tcp", 80, any4, pod4, 8080)
	reservedOnly := entry("udp", 53, ip4, pod4, 53)
	w.add(t, ownerA, installed)
	w.nft(t, "delete", "element", "inet", "kubenet-t", MapIPv4, "{ tcp . 80 }")
	if err := NewIndex(w.cfg.Dir).Reserve(ownerA, []Entry{reservedOnly}); err != nil {
		t.Fatal(err)
	}
	w.do(t, func() error { return Remove(w.cfg, ownerA, []Key{installed.Key, reservedOnly.Key}) })
	if got := w.kernelElements(t); len(got) != 0 {
		t.Errorf("kernel elements after Remove: %v", got)
	}
	if all, err := NewIndex(w.cfg.Dir).All(); err != nil || len(all) != 0 {
		t.Errorf("index after Remove: %v, %v", all, err)
	}
}

// TestAddRefusedByKernelLeavesIndex: when the kernel refuses the transaction (here: an element
// for the key that the index does not know of), Add fails and takes its reservations back.
func TestAddRefusedByKernelLeavesIndex(t *testing.T) {
	w := newWorld(t)
	w.add(t, ownerA, entry("tcp", 81, any4, pod4, 8081)) // creates the maps
	w.nft(t, "add", "element", "inet", "kubenet-t", MapIPv4, "{ tcp . 80 : 10.244.1.9 . 80 }")
	err := w.ns.Do(func(ns.NetNS) error {
		return Add(w.cfg, ownerB, []Entry{entry("udp", 53, any4, pod4, 53), entry("tcp", 80, any4, pod4, 8080)})
	})
	if err == nil {
		t.Fatal("Add succeeded although the kernel holds another element for tcp/80")
	}
	all, err := NewIndex(w.cfg.Dir).All()
	if err != nil || len(all) != 1 || all[0].Owner != ownerA {
		t.Errorf("index after the refused Add: %v, %v; want only A's reservation", all, err)
	}
	if got := w.kernelElements(t); len(got) != 2 {
		t.Errorf("kernel elements after the refused Add: %v; want A's and the foreign one", got)
	}
}

// TestGC: GC removes what the kept owners do not hold, from the index and from the kernel
// (including elements whose index file is gone), and leaves elements it did not make.
func TestGC(t *testing.T) {
	w := newWorld(t)
	a := entry("tcp", 80, any4, pod4, 8080)
	b := entry("udp", 53, ip6, pod6, 53)
	w.add(t, ownerA, a)
	w.add(t, ownerB, b)
	// An element of a container whose index file was lost, and one kubenet did not make.
	w.nft(t, "add", "element", "inet", "kubenet-t", MapIPv4, `{ tcp . 81 comment "ccc/eth0" : 10.244.1.7 . 81 }`)
	w.nft(t, "add", "element", "inet", "kubenet-t", MapIPv4, `{ tcp . 82 : 10.244.1.8 . 82 }`)

	var removed []Reservation
	w.do(t, func() error {
		var err error
		removed, err = GC(w.cfg, func(o Owner) bool { return o == ownerA })
		return err
	})
	var removedOwners []string
	for _, r := range removed {
		removedOwners = append(removedOwners, r.Owner.String())
	}
	slices.Sort(removedOwners)
	if !slices.Equal(removedOwners, []string{"bbb/eth0", "ccc/eth0"}) {
		t.Errorf("GC removed %v, want B's and C's", removed)
	}
	left := sortedReservations(w.kernelElements(t))
	want := []string{a.String() + " aaa/eth0", entry("tcp", 82, any4, netip.MustParseAddr("10.244.1.8"), 82).String() + " /"}
	if !slices.Equal(left, want) {
		t.Errorf("kernel after GC: %q, want %q", left, want)
	}
	if all, err := NewIndex(w.cfg.Dir).All(); err != nil || len(all) != 1 || all[0].Owner != ownerA {
		t.Errorf("index after GC: %v, %v; want only A's", all, err)
	}
}

// TestFixedRulesDoNotGrow: the fixed rules are rewritten by every Add, never duplicated.
func TestFixedRulesDoNotGrow(t *testing.T) {
	w := newWorld(t)
	w.add(t, ownerA, entry("tcp", 80, any4, pod4, 8080))
	first := w.nft(t, "list", "chain", "inet", "kubenet-t", ChainDNAT)
	w.add(t, ownerB, entry("tcp", 81, any4, pod4, 8080))
	if again := w.nft(t, "list", "chain", "inet", "kubenet-t", ChainDNAT); again != first {
		t.Errorf("the DNAT chain changed with a second pod:\n%s\n%s", first, again)
	}
	if n := strings.Count(first, "comment"); n != 11 {
		t.Errorf("%d rules in %s, want 11:\n%s", n, ChainDNAT, first)
	}
}
