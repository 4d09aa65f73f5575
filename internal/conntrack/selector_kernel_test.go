package conntrack

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/kubenet-dev/kubenet/test/nettest"
)

// trackedFlows is what each case starts from, in a namespace whose output runs through
// conntrack: one UDP flow from the loopback to each destination, the last one sent by a DNAT
// rule to 127.0.0.3:40011, so that its reply comes from another address than it went to.
var trackedFlows = []struct {
	dst  string
	port uint16
}{{"127.0.0.1", 40001}, {"127.0.0.2", 40002}, {"::1", 40003}, {"127.0.0.1", 40010}}

const dnatRule = "table ip cttestnat { chain out { type nat hook output priority -100; udp dport 40010 dnat to 127.0.0.3:40011; }; }"

// TestDeleteSelected: the kernel's filtered flush deletes exactly the flows a selector names, and
// the fallback for a kernel that cannot filter one (a dump and a delete) deletes the same ones.
func TestDeleteSelected(t *testing.T) {
	nettest.RequireRoot(t)
	ip := netip.MustParseAddr
	udp := uint8(unix.IPPROTO_UDP)
	tests := []struct {
		name string
		sels []Selector
		left []uint16 // original destination ports of the flows that stay
	}{
		{"by original source: every IPv4 flow", []Selector{{Src: ip("127.0.0.1")}}, []uint16{40003}},
		{"by original destination and port", []Selector{{Dst: ip("127.0.0.2"), Proto: udp, DstPort: 40002}}, []uint16{40001, 40003, 40010}},
		{"the port on another address: none", []Selector{{Dst: ip("127.0.0.1"), Proto: udp, DstPort: 40002}}, []uint16{40001, 40002, 40003, 40010}},
		{"another protocol: none", []Selector{{Dst: ip("127.0.0.1"), Proto: unix.IPPROTO_TCP, DstPort: 40001}}, []uint16{40001, 40002, 40003, 40010}},
		{"by reply source: the DNAT flow only", []Selector{{Reply: true, Src: ip("127.0.0.3")}}, []uint16{40001, 40002, 40003}},
		{"by original destination of the DNAT flow", []Selector{{Dst: ip("127.0.0.1"), Proto: udp, DstPort: 40010}}, []uint16{40001, 40002, 40003}},
		{"IPv6 by another source: none", []Selector{{Src: ip("::2")}}, []uint16{40001, 40002, 40003, 40010}},
		{"IPv6 by source", []Selector{{Src: ip("::1")}}, []uint16{40001, 40002, 40010}},
		{"several at once", []Selector{{Src: ip("::1")}, {Reply: true, Src: ip("127.0.0.3")}, {Dst: ip("127.0.0.2")}}, []uint16{40001}},
	}
	refuse := func(Selector) error { return unix.EOPNOTSUPP }
	for _, tt := range tests {
		for _, mode := range []struct {
			name  string
			flush func(Selector) error
		}{{"kernel filter", flushFiltered}, {"fallback", refuse}} {
			t.Run(tt.name+"/"+mode.name, func(t *testing.T) {
				n := trackingNS(t, dnatRule)
				nettest.Do(t, n, func() error {
					var all []uint16
					for _, f := range trackedFlows {
						if err := sendUDP(f.dst, f.port); err != nil {
							return err
						}
						all = append(all, f.port)
					}
					if got := originalPorts(); !slices.Equal(got, all) {
						return fmt.Errorf("flows before: %v, want %v", got, all)
					}
					if err := deleteSelected(tt.sels, mode.flush); err != nil {
						return fmt.Errorf("DeleteSelected(%v): %w", tt.sels, err)
					}
					if got := originalPorts(); !slices.Equal(got, tt.left) {
						return fmt.Errorf("after DeleteSelected(%v) flows to %v stay, want %v", tt.sels, got, tt.left)
					}
					return nil
				})
			})
		}
	}
}

func sendUDP(dst string, port uint16) error {
	c, err := net.DialUDP("udp", nil, &net.UDPAddr{IP: net.ParseIP(dst), Port: int(port)})
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = c.Write([]byte("x"))
	return err
}

// originalPorts lists the original destination ports of the namespace's flows, sorted.
func originalPorts() []uint16 {
	flows, err := netlink.ConntrackTableList(netlink.ConntrackTable, 0)
	if err != nil {
		return nil
	}
	var out []uint16
	for _, f := range flows {
		out = append(out, f.Forward.DstPort)
	}
	slices.Sort(out)
	return out
}
