package conntrack

import (
	"fmt"
	"net"
	"os/exec"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/kubenet-dev/kubenet/test/nettest"
)

// trackingNS makes a namespace whose output path runs through conntrack, as a node's does, with
// more nft rules when given.
func trackingNS(t *testing.T, more ...string) ns.NetNS {
	t.Helper()
	n := nettest.NewNS(t)
	rules := strings.Join(append([]string{"table inet cttest { chain out { type filter hook output priority 0; ct state new accept; }; }"}, more...), "\n")
	cmd := exec.Command("nsenter", "--net="+n.Path(), "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft: %v: %s", err, out)
	}
	nettest.Do(t, n, func() error { return netlink.LinkSetUp(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Name: "lo"}}) })
	return n
}

func TestListAndDelete(t *testing.T) {
	nettest.RequireRoot(t)
	t.Run("namespace without entries", func(t *testing.T) {
		n := nettest.NewNS(t)
		nettest.Do(t, n, func() error {
			if !empty() {
				return fmt.Errorf("a new namespace does not count as empty")
			}
			flows, err := List()
			if err != nil || len(flows) != 0 {
				return fmt.Errorf("List() = %d flows, %v; want none", len(flows), err)
			}
			return nil
		})
	})
	t.Run("delete selected flows only", func(t *testing.T) {
		n := trackingNS(t)
		nettest.Do(t, n, func() error {
			if err := trackUDP(40001, 40002); err != nil {
				return err
			}
			if empty() {
				return fmt.Errorf("namespace with two tracked flows counts as empty")
			}
			if got := count(toPort(40001)); got != 1 {
				return fmt.Errorf("%d flows to 40001 before Delete, want 1", got)
			}
			deleted, err := Delete(toPort(40001))
			if err != nil || deleted != 1 {
				return fmt.Errorf("Delete = %d, %v; want 1 deleted", deleted, err)
			}
			if got := count(toPort(40001)); got != 0 {
				return fmt.Errorf("%d flows to 40001 after Delete, want 0", got)
			}
			if got := count(toPort(40002)); got != 1 {
				return fmt.Errorf("%d flows to 40002 after deleting 40001's, want 1 (untouched)", got)
			}
			return nil
		})
	})
}

// trackUDP sends a datagram from the loopback to each port: one tracked flow each.
func trackUDP(ports ...int) error {
	for _, port := range ports {
		c, err := net.DialUDP("udp4", nil, &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port})
		if err != nil {
			return err
		}
		_, err = c.Write([]byte("x"))
		c.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// toPort matches the UDP flows to port.
func toPort(port uint16) Match {
	return func(f *netlink.ConntrackFlow) bool {
		return f.Forward.Protocol == unix.IPPROTO_UDP && f.Forward.DstPort == port
	}
}

func count(m Match) int {
	flows, err := netlink.ConntrackTableList(netlink.ConntrackTable, 0)
	if err != nil {
		return -1
	}
	n := 0
	for _, f := range flows {
		if m(f) {
			n++
		}
	}
	return n
}

// TestSetMark: the bit is set on the entries the match selects and taken off the others, every
// other bit of their marks kept.
func TestSetMark(t *testing.T) {
	nettest.RequireRoot(t)
	n := trackingNS(t)
	nettest.Do(t, n, func() error {
		if err := trackUDP(40001, 40002); err != nil {
			return err
		}
		all := func(*netlink.ConntrackFlow) bool { return true }
		marks := func() map[uint16]uint32 {
			out := map[uint16]uint32{}
			flows, _ := netlink.ConntrackTableList(netlink.ConntrackTable, 0)
			for _, f := range flows {
				out[f.Forward.DstPort] = f.Mark
			}
			return out
		}
		steps := []struct {
			name       string
			bit        uint32
			match      Match
			wantMarked uint
			want       map[uint16]uint32
		}{
			{"another bit on every entry", 0x1, all, 2, map[uint16]uint32{40001: 0x1, 40002: 0x1}},
			{"the bit on one", 0x8, toPort(40001), 1, map[uint16]uint32{40001: 0x9, 40002: 0x1}},
			{"the same again: nothing to do", 0x8, toPort(40001), 0, map[uint16]uint32{40001: 0x9, 40002: 0x1}},
			{"on the other one only", 0x8, toPort(40002), 1, map[uint16]uint32{40001: 0x1, 40002: 0x9}},
			{"on none", 0x8, func(*netlink.ConntrackFlow) bool { return false }, 0, map[uint16]uint32{40001: 0x1, 40002: 0x1}},
		}
		for _, s := range steps {
			marked, err := SetMark(s.bit, s.match)
			if err != nil || marked != s.wantMarked {
				return fmt.Errorf("%s: SetMark = %d, %v; want %d", s.name, marked, err, s.wantMarked)
			}
			for port, want := range s.want {
				if got := marks()[port]; got != want {
					return fmt.Errorf("%s: mark of the flow to %d = %#x, want %#x", s.name, port, got, want)
				}
			}
		}
		return nil
	})
}
