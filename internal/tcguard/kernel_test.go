package tcguard

import (
	"errors"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"

	"github.com/kubenet-dev/kubenet/test/nettest"
)

const testBit = 0x02000000

// guardedLink is a node namespace joined to a pod namespace by a veth whose node end ("pod0")
// will carry the guard; the pod listens on TCP 8080 on both families.
type guardedLink struct {
	node, pod ns.NetNS
	podAddrs  []netip.AddrPort
}

func newGuardedLink(t *testing.T) *guardedLink {
	t.Helper()
	g := &guardedLink{node: nettest.NewNS(t), pod: nettest.NewNS(t)}
	nettest.Link(t, nettest.Endpoint{NS: g.node, IfName: "pod0", Addrs: []netip.Prefix{netip.MustParsePrefix("10.7.0.1/24"), netip.MustParsePrefix("fd00:7::1/64")}},
		nettest.Endpoint{NS: g.pod, IfName: "eth0", Addrs: []netip.Prefix{netip.MustParsePrefix("10.7.0.2/24"), netip.MustParsePrefix("fd00:7::2/64")}})
	for _, a := range []string{"10.7.0.2", "fd00:7::2"} {
		ap := netip.AddrPortFrom(netip.MustParseAddr(a), 8080)
		nettest.StartTCPEcho(t, g.pod, ap)
		g.podAddrs = append(g.podAddrs, ap)
	}
	return g
}

func (g *guardedLink) index(t *testing.T) int {
	t.Helper()
	var idx int
	nettest.Do(t, g.node, func() error {
		l, err := netlink.LinkByName("pod0")
		if err == nil {
			idx = l.Attrs().Index
		}
		return err
	})
	return idx
}

// reachable tells, per pod address, whether the node gets a TCP answer from the pod.
func (g *guardedLink) reachable(t *testing.T, want bool) {
	t.Helper()
	for _, a := range g.podAddrs {
		timeout := 500 * time.Millisecond
		if want {
			timeout = 3 * time.Second
		}
		_, err := nettest.TCPRequest(g.node, a, "guard", timeout)
		if want && err != nil {
			t.Errorf("node → %s: %v, want an answer", a, err)
		}
		if !want && err == nil {
			t.Errorf("node → %s answered, want it dropped by the guard", a)
		}
	}
}

// markNodeTraffic adds (or, with on false, removes) an nftables table in the node that sets
// bit on every packet the node sends: the grant the guard waits for.
func (g *guardedLink) markNodeTraffic(t *testing.T, on bool) {
	t.Helper()
	nettest.Do(t, g.node, func() error {
		c, err := nftables.New()
		if err != nil {
			return err
		}
		tbl := &nftables.Table{Family: nftables.TableFamilyINet, Name: "guardtest"}
		if !on {
			c.DelTable(tbl)
			return c.Flush()
		}
		c.AddTable(tbl)
		accept := nftables.ChainPolicyAccept
		ch := c.AddChain(&nftables.Chain{Table: tbl, Name: "out", Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter, Policy: &accept})
		c.AddRule(&nftables.Rule{Table: tbl, Chain: ch, Exprs: []expr.Any{
			&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: binaryutil.NativeEndian.PutUint32(^uint32(testBit)), Xor: binaryutil.NativeEndian.PutUint32(testBit)},
			&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1},
		}})
		return c.Flush()
	})
}

// TestGuardDropsUnmarkedTraffic: with the guard on the node end, the node's packets reach the
// pod only while a netfilter rule marks them; ARP (neighbour resolution) passes unmarked, since
// the first connection after the mark appears succeeds.
func TestGuardDropsUnmarkedTraffic(t *testing.T) {
	g := newGuardedLink(t)
	g.reachable(t, true)
	idx := g.index(t)
	nettest.Do(t, g.node, func() error { return Ensure(idx, Egress, testBit) })
	g.reachable(t, false)
	g.markNodeTraffic(t, true)
	g.reachable(t, true)
	g.markNodeTraffic(t, false) // another tool flushes the ruleset: the guard holds
	g.reachable(t, false)
	nettest.Do(t, g.node, func() error { return Remove(idx, Egress) })
	g.reachable(t, true)
}

func TestGuardCheck(t *testing.T) {
	g := newGuardedLink(t)
	idx := g.index(t)
	nettest.Do(t, g.node, func() error {
		if err := Check(idx, Egress, testBit); !errors.Is(err, ErrMissing) {
			t.Errorf("Check before Ensure = %v, want ErrMissing", err)
		}
		if err := Ensure(idx, Egress, testBit); err != nil {
			return err
		}
		if err := Ensure(idx, Egress, testBit); err != nil {
			t.Errorf("second Ensure: %v", err)
		}
		if err := Check(idx, Egress, testBit); err != nil {
			t.Errorf("Check after Ensure: %v", err)
		}
		if err := Check(idx, Egress, testBit<<1); !errors.Is(err, ErrMissing) {
			t.Errorf("Check of another bit = %v, want ErrMissing (the program tests one bit)", err)
		}
		if err := Check(idx, Ingress, testBit); !errors.Is(err, ErrMissing) {
			t.Errorf("Check of the other direction = %v, want ErrMissing", err)
		}
		fs, err := netlink.FilterList(&netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Index: idx}}, netlink.HANDLE_MIN_EGRESS)
		if err != nil || len(fs) != 1 {
			t.Fatalf("filters on egress: %v, %v; want exactly the guard", fs, err)
		}
		if b := fs[0].(*netlink.BpfFilter); !slices.Contains(Tags(testBit), b.Tag) {
			t.Errorf("kernel tag %s, Tags() %v: Check would never match", b.Tag, Tags(testBit))
		}
		// Someone replaces the gate with a program of their own at the same priority.
		if err := Ensure(idx, Egress, testBit<<1); err != nil {
			return err
		}
		if err := Check(idx, Egress, testBit); !errors.Is(err, ErrMissing) {
			t.Errorf("Check with another program in place = %v, want ErrMissing", err)
		}
		if err := Ensure(idx, Egress, testBit); err != nil {
			return err
		}
		if err := Check(idx, Egress, testBit); err != nil {
			t.Errorf("Check after repair: %v", err)
		}
		if err := Remove(idx, Egress); err != nil {
			return err
		}
		if err := Remove(idx, Egress); err != nil {
			t.Errorf("second Remove: %v", err)
		}
		if err := Check(idx, Egress, testBit); !errors.Is(err, ErrMissing) {
			t.Errorf("Check after Remove = %v, want ErrMissing", err)
		}
		return nil
	})
}

// TestGuardEnsureConcurrently: ADD guards a new pod's port while the agent's pass, woken by the
// pod's record, finds the same port without its guard and puts it on too. Both must succeed (the
// loser of the race finds the winner's identical guard), or the pod's ADD fails.
func TestGuardEnsureConcurrently(t *testing.T) {
	g := newGuardedLink(t)
	idx := g.index(t)
	const rounds, writers = 100, 4
	for round := range rounds {
		nettest.Do(t, g.node, func() error { return Remove(idx, Egress) })
		errs := make(chan error, writers)
		for range writers {
			go func() { errs <- g.node.Do(func(ns.NetNS) error { return Ensure(idx, Egress, testBit) }) }()
		}
		for range writers {
			if err := <-errs; err != nil {
				t.Fatalf("round %d: one of %d concurrent Ensure calls failed: %v", round, writers, err)
			}
		}
		nettest.Do(t, g.node, func() error { return Check(idx, Egress, testBit) })
	}
}

// TestGuardRefusesForeignIngressQdisc: an ingress qdisc (not clsact) holds the handle the guard
// needs; Ensure says so instead of replacing it.
func TestGuardRefusesForeignIngressQdisc(t *testing.T) {
	g := newGuardedLink(t)
	idx := g.index(t)
	nettest.Do(t, g.node, func() error {
		q := &netlink.Ingress{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: idx, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_INGRESS}}
		if err := netlink.QdiscAdd(q); err != nil {
			return err
		}
		if err := Ensure(idx, Egress, testBit); err == nil {
			t.Errorf("Ensure over an ingress qdisc succeeded")
		}
		return nil
	})
}
