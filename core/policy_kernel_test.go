package core

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/kubenet-dev/kubenet/test/nettest"
)

// TestPolicyLocalsPairEachPortWithItsOwnRecord: a container deleted and added again while a
// policy pass reads the node (its old veth and record gone, a new record with new addresses and
// a new veth of the same name) never gets its old addresses paired with its new port: the pass
// would let the new pod send from the old addresses and flush the wrong addresses' conntrack
// entries before releasing it.
func TestPolicyLocalsPairEachPortWithItsOwnRecord(t *testing.T) {
	const network, bridgeName = "kubenet", "cbr-test"
	node := nettest.NewNS(t)
	records := NewRecords(t.TempDir())
	att := Attachment{ContainerID: "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", IfName: "eth0", NetNS: "/var/run/netns/test"}
	hostVeth := NamesFor(network, att).HostVeth
	record := func(addr string) *Record {
		return &Record{ContainerID: att.ContainerID, IfName: att.IfName, NetNS: att.NetNS, IPs: []netip.Prefix{netip.MustParsePrefix(addr)}}
	}
	// addPod is ADD's order: the record, then the veth on the bridge. It returns the port.
	addPod := func(br *netlink.Bridge, addr string) int {
		if err := records.Save(record(addr)); err != nil {
			t.Fatal(err)
		}
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: hostVeth, MasterIndex: br.Index}, PeerName: "peer-test"}
		if err := netlink.LinkAdd(veth); err != nil {
			t.Fatalf("add veth: %v", err)
		}
		l, err := netlink.LinkByName(hostVeth)
		if err != nil {
			t.Fatal(err)
		}
		return l.Attrs().Index
	}
	// delPod is DEL's order: the veth, then the record.
	delPod := func() {
		l, err := netlink.LinkByName(hostVeth)
		if err != nil {
			t.Fatal(err)
		}
		if err := netlink.LinkDel(l); err != nil {
			t.Fatal(err)
		}
		if err := records.Remove(att); err != nil {
			t.Fatal(err)
		}
	}
	nettest.Do(t, node, func() error {
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: bridgeName}}
		if err := netlink.LinkAdd(br); err != nil {
			return err
		}
		oldPort := addPod(br, "10.244.0.5/24")
		var newPort int
		_, locals, err := readLocals(network, bridgeName, records, func() {
			delPod()
			newPort = addPod(br, "10.244.0.9/24")
		})
		if err != nil {
			return err
		}
		if len(locals) != 1 {
			t.Fatalf("%d locals, want the one attachment: %+v", len(locals), locals)
		}
		l := locals[0]
		if l.Port == newPort && !slices.Equal(l.IPs, record("10.244.0.9/24").IPs) {
			t.Errorf("the new port %d is paired with the old record's addresses %v", newPort, l.IPs)
		}
		if l.Port != oldPort && l.Port != newPort && l.Port != 0 {
			t.Errorf("port %d is neither the old veth's %d nor the new one's %d", l.Port, oldPort, newPort)
		}
		return nil
	})
}
