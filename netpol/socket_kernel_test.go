package netpol

import (
	"errors"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/kubenet-dev/kubenet/internal/policyrules"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

// commitPorts subscribes to the nftables notifications of network namespace n; each call of the
// function it returns gives the netlink port ids of the transactions committed since the last
// call (the header of each generation message).
func commitPorts(t *testing.T, n ns.NetNS) func() []uint32 {
	t.Helper()
	var c *netlink.Conn
	nettest.Do(t, n, func() (err error) {
		c, err = netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{Groups: 1 << (unix.NFNLGRP_NFTABLES - 1)})
		return err
	})
	t.Cleanup(func() { _ = c.Close() })
	newGen := netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_NEWGEN)
	return func() []uint32 {
		t.Helper()
		var ports []uint32
		for {
			// The kernel queues a commit's notifications before the committing sendmsg returns:
			// what is not in the socket now was not committed (the deadline only ends the read
			// that finds the socket empty; an expired one would not read at all).
			if err := c.SetReadDeadline(time.Now().Add(50 * time.Millisecond)); err != nil {
				t.Fatal(err)
			}
			msgs, err := c.Receive()
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return ports
			}
			if err != nil {
				t.Fatalf("nftables notifications: %v", err)
			}
			for _, m := range msgs {
				if m.Header.Type == newGen {
					ports = append(ports, m.Header.PID)
				}
			}
		}
	}
}

// TestApplierKeepsOneSocket: an Applier's passes commit through one netlink socket (the close of
// a netfilter socket waits for a grace period after a transaction that removed anything), so
// that every transaction of every pass carries one port id, which Committed knows, also after
// Close; an Applier called in another network namespace writes there, through a socket of that
// namespace, and not into the first one's tables.
func TestApplierKeepsOneSocket(t *testing.T) {
	n := newBridgedNode(t)
	a, b := n.pods["a"], n.pods["b"]
	other := nettest.NewNS(t)
	ports := commitPorts(t, n.node)
	otherPorts := commitPorts(t, other)
	applier := NewApplier()
	t.Cleanup(applier.Close)
	apply := func(in ns.NetNS, rs policyrules.Ruleset) {
		t.Helper()
		rs.PodCIDRs, rs.NodeAddrs = []netip.Prefix{gw4.Masked(), gw6.Masked()}, []netip.Addr{gw4.Addr(), gw6.Addr()}
		nettest.Do(t, in, func() error { _, err := applier.Apply(n.network, rs, Options{}); return err })
	}

	isolated := with(n.open(), b.port, allowFrom(tcp8080, a.v4), policyrules.Direction{})
	apply(n.node, isolated)
	apply(n.node, with(n.open(), b.port, allowFrom(tcp8080, a.v4, a.v6), policyrules.Direction{})) // an edit in place
	apply(n.node, n.open())                                                                        // a removal
	seen := ports()
	if len(seen) < 3 {
		t.Fatalf("three passes that changed the tables committed %d transactions (ports %v)", len(seen), seen)
	}
	for _, p := range seen {
		if p != seen[0] {
			t.Errorf("the passes committed through sockets %v: want one", seen)
			break
		}
	}
	if !applier.Committed(seen[0]) {
		t.Errorf("port %d of the passes not known as the Applier's", seen[0])
	}

	apply(other, isolated)
	if got := ports(); len(got) > 0 {
		t.Errorf("a pass in another network namespace committed %d transactions in the first one", len(got))
	}
	otherSeen := otherPorts()
	if len(otherSeen) == 0 {
		t.Fatal("a pass in another network namespace committed nothing there")
	}
	nettest.Run(t, other, "nft", "list", "table", "bridge", TableName(n.network))

	apply(n.node, isolated)
	back := ports()
	if len(back) == 0 {
		t.Fatal("the pass back in the first namespace committed nothing")
	}
	applier.Close()
	for _, p := range append(back, otherSeen...) {
		if !applier.Committed(p) {
			t.Errorf("port %d of a socket closed just now not known as the Applier's", p)
		}
	}
	n.expectTCP(t, "isolated again: a → b", a.ns, b.v4, 8080, true)
}
