package overlay

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/kubenet-dev/kubenet/test/golden"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

// deviceIn makes the overlay device in a node namespace with an underlay address.
func deviceIn(t *testing.T, n ns.NetNS, d Device) int {
	t.Helper()
	var index int
	nettest.Do(t, n, func() error {
		var err error
		index, err = Ensure(d)
		return err
	})
	return index
}

func entriesIn(t *testing.T, n ns.NetNS, dev int) (fdb, neigh []string) {
	t.Helper()
	nettest.Do(t, n, func() error {
		fs, err := netlink.NeighList(dev, unix.AF_BRIDGE)
		if err != nil {
			return err
		}
		for _, f := range fs {
			if f.IP != nil {
				fdb = append(fdb, f.HardwareAddr.String()+" "+f.IP.String())
			}
		}
		ns, err := netlink.NeighList(dev, netlink.FAMILY_ALL)
		if err != nil {
			return err
		}
		for _, e := range ns {
			if e.Family != unix.AF_BRIDGE && e.State&netlink.NUD_PERMANENT != 0 {
				neigh = append(neigh, e.IP.String()+" "+e.HardwareAddr.String())
			}
		}
		return nil
	})
	slices.Sort(fdb)
	slices.Sort(neigh)
	return fdb, neigh
}

// node makes a namespace with an underlay address on a link of MTU 9000 (a veth whose peer
// stays in the namespace: this kernel has no dummy links).
func node(t *testing.T, addr string) ns.NetNS {
	t.Helper()
	n := nettest.NewNS(t)
	nettest.Run(t, n, "ip", "link", "add", "eth0", "mtu", "9000", "type", "veth", "peer", "name", "eth0peer", "mtu", "9000")
	nettest.Run(t, n, "ip", "link", "set", "eth0peer", "up")
	nettest.Run(t, n, "ip", "link", "set", "eth0", "up")
	nettest.Run(t, n, "ip", "addr", "add", addr, "dev", "eth0")
	return n
}

func TestEnsureAndSync(t *testing.T) {
	nettest.RequireRoot(t)
	n := node(t, "192.0.2.1/24")
	local := netip.MustParseAddr("192.0.2.1")
	d := Device{Name: DefaultDevice, VNI: 7, Port: 8472, Local: local, MTU: 8950}
	dev := deviceIn(t, n, d)
	link := nettest.Run(t, n, "ip", "-d", "link", "show", DefaultDevice)
	for _, want := range []string{"vxlan id 7", "local 192.0.2.1", "dstport 8472", "nolearning", "mtu 8950", "0e:4b:c0:00:02:01", ",UP"} {
		if !strings.Contains(link, want) {
			t.Fatalf("device lacks %q:\n%s", want, link)
		}
	}
	nettest.Do(t, n, func() error {
		mtu, err := UnderlayMTU(local)
		if err != nil || mtu != 9000 {
			t.Errorf("UnderlayMTU = %d, %v; want 9000", mtu, err)
		}
		if _, err := UnderlayMTU(netip.MustParseAddr("192.0.2.99")); err == nil {
			t.Error("UnderlayMTU of an address the node does not have: no error")
		}
		return nil
	})

	peerA := Peer{Node: "a", Underlay: netip.MustParseAddr("198.51.100.1"), PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd00:1::/64")}}
	peerB := Peer{Node: "b", Underlay: netip.MustParseAddr("198.51.100.2"), PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.2.0/24")}}
	// Somebody else's entries on the device: stale ones go.
	nettest.Run(t, n, "bridge", "fdb", "append", "0e:4b:01:02:03:04", "dev", DefaultDevice, "dst", "203.0.113.9", "self", "permanent")
	nettest.Run(t, n, "ip", "neigh", "add", "10.244.9.0", "lladdr", "0e:4b:01:02:03:04", "dev", DefaultDevice, "nud", "permanent")
	// A wrong MAC for a wanted next hop: replaced.
	nettest.Run(t, n, "ip", "neigh", "add", "10.244.1.0", "lladdr", "0e:00:00:00:00:01", "dev", DefaultDevice, "nud", "permanent")
	var failed map[string]error
	nettest.Do(t, n, func() error { failed = Sync(dev, []Peer{peerA, peerB}); return nil })
	if len(failed) != 0 {
		t.Fatalf("Sync failed for %v", failed)
	}
	fdb, neigh := entriesIn(t, n, dev)
	wantFDB := []string{"0e:4b:c6:33:64:01 198.51.100.1", "0e:4b:c6:33:64:02 198.51.100.2"}
	wantNeigh := []string{"10.244.1.0 0e:4b:c6:33:64:01", "10.244.2.0 0e:4b:c6:33:64:02", "fd00:1:: 0e:4b:c6:33:64:01"}
	if !slices.Equal(fdb, wantFDB) || !slices.Equal(neigh, wantNeigh) {
		t.Fatalf("entries:\n fdb %q\nwant %q\nneigh %q\n want %q", fdb, wantFDB, neigh, wantNeigh)
	}

	// A Node that copied another's InternalIP shares its VTEP, as a direct route via that
	// address would: both CIDRs lead to the address's owner, which keeps its path.
	twin := Peer{Node: "twin", Underlay: peerB.Underlay, PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.3.0/24")}}
	nettest.Do(t, n, func() error { failed = Sync(dev, []Peer{peerA, peerB, twin}); return nil })
	if len(failed) != 0 {
		t.Fatalf("Sync with a copied InternalIP failed for %v", failed)
	}
	fdb, neigh = entriesIn(t, n, dev)
	if !slices.Equal(fdb, wantFDB) || !slices.Equal(neigh, []string{wantNeigh[0], wantNeigh[1], "10.244.3.0 0e:4b:c6:33:64:02", wantNeigh[2]}) {
		t.Fatalf("entries with a copied InternalIP: fdb %q neigh %q", fdb, neigh)
	}
	// Two IPv6 addresses whose derived MACs collide (found by a birthday search: the first 40
	// bits of their SHA-256 agree): neither can be told from the other, both are refused.
	c1 := Peer{Node: "c1", Underlay: netip.MustParseAddr("2001:db8::7a74:900:0:0"), PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.4.0/24")}}
	c2 := Peer{Node: "c2", Underlay: netip.MustParseAddr("2001:db8::ef39:1b00:0:0"), PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.5.0/24")}}
	if MAC(c1.Underlay).String() != MAC(c2.Underlay).String() {
		t.Fatalf("the collision's addresses no longer collide: %s %s", MAC(c1.Underlay), MAC(c2.Underlay))
	}
	nettest.Do(t, n, func() error { failed = Sync(dev, []Peer{peerA, c1, c2}); return nil })
	if failed["c1"] == nil || failed["c2"] == nil || failed["a"] != nil {
		t.Fatalf("Sync with a MAC collision failed for %v, want c1 and c2", failed)
	}
	fdb, neigh = entriesIn(t, n, dev)
	if !slices.Equal(fdb, wantFDB[:1]) || !slices.Equal(neigh, []string{wantNeigh[0], wantNeigh[2]}) {
		t.Fatalf("entries after the collision: fdb %q neigh %q: only a's may stay", fdb, neigh)
	}

	// The same device again: left as it is (same index); another VNI: replaced.
	if again := deviceIn(t, n, d); again != dev {
		t.Fatalf("Ensure of an unchanged device re-created it (index %d -> %d)", dev, again)
	}
	d.VNI = 8
	if again := deviceIn(t, n, d); again == dev {
		t.Fatal("Ensure kept a device with another VNI")
	}
	// A link of another kind with the name (a veth): left alone, and an error.
	nettest.Run(t, n, "ip", "link", "del", DefaultDevice)
	nettest.Run(t, n, "ip", "link", "add", DefaultDevice, "type", "veth", "peer", "name", "vxpeer")
	nettest.Do(t, n, func() error {
		if _, err := Ensure(d); err == nil || !strings.Contains(err.Error(), "not a VXLAN device") {
			t.Errorf("Ensure over a veth: %v, want an error naming it", err)
		}
		if err := Remove(DefaultDevice); err == nil {
			t.Error("Remove deleted a veth carrying the overlay's name")
		}
		return nil
	})
	nettest.Run(t, n, "ip", "link", "show", DefaultDevice) // still there
}

// listFirewall is what `nft list table` shows of the firewall.
func listFirewall(t *testing.T, n ns.NetNS) string {
	t.Helper()
	return nettest.Run(t, n, "nft", "list", "table", "inet", FirewallTable.Name)
}

func TestFirewall(t *testing.T) {
	nettest.RequireRoot(t)
	n := nettest.NewNS(t)
	fw := Firewall{Port: 8472, Device: "kubenet-vxlan", Bridge: "cbr0",
		Nodes:       []netip.Addr{netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2"), netip.MustParseAddr("2001:db8::1"), netip.MustParseAddr("192.0.2.1")},
		PodNetworks: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:10:244::/48")}}
	sync := func() bool {
		var changed bool
		nettest.Do(t, n, func() error {
			var err error
			changed, err = fw.Sync()
			return err
		})
		return changed
	}
	if !sync() {
		t.Fatal("the first Sync wrote nothing")
	}
	// The kernel's own listing of what Sync wrote (TestFirewallGolden renders the plan without a
	// kernel, for every option).
	checkListing := func(after string) {
		t.Helper()
		if golden.Check(t, "firewall.list", listFirewall(t, n)); t.Failed() {
			t.Fatalf("the firewall's listing %s", after)
		}
	}
	checkListing("after the first Sync")
	if sync() {
		t.Fatal("a Sync of an unchanged firewall wrote it again")
	}
	// The sets are constant: no tool adds a sender (or removes one) without replacing the table.
	for _, cmd := range [][]string{
		{"nft", "add", "element", "inet", FirewallTable.Name, "nodes4", "{ 203.0.113.66 }"},
		{"nft", "delete", "element", "inet", FirewallTable.Name, "nodes4", "{ 192.0.2.2 }"},
	} {
		if out, err := nettest.Output(n, cmd[0], cmd[1:]...); err == nil {
			t.Fatalf("%q changed a constant set:\n%s", cmd, out)
		}
	}
	// Whatever another tool changes is put back: a rule deleted, a set replaced with another
	// sender in it, the table made dormant (its chains unhooked), the table deleted.
	tamper := [][]string{
		{"nft", "flush", "chain", "inet", FirewallTable.Name, "input"},
		{"sh", "-c", "nft delete table inet " + FirewallTable.Name + " && nft add table inet " + FirewallTable.Name +
			" && nft add set inet " + FirewallTable.Name + " nodes4 '{ type ipv4_addr; elements = { 203.0.113.66 }; }'"},
		{"nft", "add", "table", "inet", FirewallTable.Name, "{ flags dormant; }"},
		{"nft", "delete", "table", "inet", FirewallTable.Name},
	}
	for _, cmd := range tamper {
		nettest.Run(t, n, cmd[0], cmd[1:]...)
		if !sync() {
			t.Fatalf("after %q Sync wrote nothing", cmd)
		}
		checkListing(fmt.Sprintf("after %q", cmd))
	}
	// A chain re-created with another hook priority or policy is replaced too.
	nettest.Run(t, n, "nft", "delete", "chain", "inet", FirewallTable.Name, "forward")
	nettest.Run(t, n, "nft", "add", "chain", "inet", FirewallTable.Name, "forward", "{ type filter hook forward priority 100; policy accept; }")
	if !sync() || !strings.Contains(listFirewall(t, n), "hook forward priority filter - 10") {
		t.Fatalf("a forward chain at another priority was kept:\n%s", listFirewall(t, n))
	}
	nettest.Do(t, n, func() error { return RemoveFirewall() })
	if out, err := nettest.Output(n, "nft", "list", "table", "inet", FirewallTable.Name); err == nil {
		t.Fatalf("RemoveFirewall left the table:\n%s", out)
	}
	nettest.Do(t, n, func() error { return RemoveFirewall() }) // absent is fine
}
