package conntrack

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/kubenet-dev/kubenet/test/nettest"
)

// zoneRule puts the flows to port 45000 in conntrack zone 7 (before conntrack sees them).
const zoneRule = "table inet cttestzone { chain out { type filter hook output priority -300; udp dport 45000 ct zone set 7; }; }"

// crowd fills the namespace with flows that differ from each other in one field at a time: the
// sources and destinations 127.0.0.1-6, UDP and TCP to the same port, ports that are each
// other's byte swap (40002 = 0x9c42, 17052 = 0x429c), a DNAT flow whose reply comes from
// 127.0.0.3, a flow in another zone, ICMP, IPv6, and a few thousand more UDP flows.
func crowd() error {
	lo := func(i int) string { return fmt.Sprintf("127.0.0.%d", i) }
	for _, p := range []struct {
		src, dst string
		port     uint16
	}{
		{lo(1), lo(2), 40002}, {lo(2), lo(1), 40002}, {lo(1), lo(2), 17052}, {lo(2), lo(1), 17052},
		{lo(4), lo(1), 40010}, {lo(5), lo(1), 45000}, {lo(2), lo(5), 45000}, {"::1", "::1", 40002},
	} {
		if err := sendUDPFrom(p.src, p.dst, p.port); err != nil {
			return err
		}
	}
	for i := range 3000 {
		if err := sendUDPFrom(lo(1+i%6), lo(1+(i/6)%6), uint16(41000+i%97)); err != nil {
			return err
		}
	}
	l, err := net.Listen("tcp4", "127.0.0.2:40002")
	if err != nil {
		return err
	}
	defer l.Close()
	c, err := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(lo(6))}}).Dial("tcp4", "127.0.0.2:40002")
	if err != nil {
		return err
	}
	defer c.Close()
	return pingFrom(lo(3), lo(1))
}

func sendUDPFrom(src, dst string, port uint16) error {
	c, err := net.DialUDP("udp", &net.UDPAddr{IP: net.ParseIP(src)}, &net.UDPAddr{IP: net.ParseIP(dst), Port: int(port)})
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = c.Write([]byte("x"))
	return err
}

// pingFrom sends one ICMP echo request from src to dst over a raw socket.
func pingFrom(src, dst string) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_ICMP)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: netip.MustParseAddr(src).As4()}); err != nil {
		return err
	}
	// Echo request, id 0x1234, seq 1; checksum over the 8 bytes.
	msg := []byte{8, 0, 0, 0, 0x12, 0x34, 0, 1}
	var sum uint32
	for i := 0; i < len(msg); i += 2 {
		sum += uint32(msg[i])<<8 | uint32(msg[i+1])
	}
	sum = (sum >> 16) + (sum & 0xffff)
	cs := ^uint16(sum)
	msg[2], msg[3] = byte(cs>>8), byte(cs)
	return unix.Sendto(fd, msg, 0, &unix.SockaddrInet4{Addr: netip.MustParseAddr(dst).As4()})
}

// flowKeys names each flow by its family, protocol, original tuple and zone, sorted.
func flowKeys(flows []*netlink.ConntrackFlow) []string {
	out := make([]string, 0, len(flows))
	for _, f := range flows {
		o := f.Forward
		out = append(out, fmt.Sprintf("%d/%d %s:%d>%s:%d z%d", f.FamilyType, o.Protocol, o.SrcIP, o.SrcPort, o.DstIP, o.DstPort, f.Zone))
	}
	slices.Sort(out)
	return out
}

// TestDeleteSelectedAgreesWithPredicate: in a crowded table the kernel's filtered flush deletes
// exactly the flows the selectors' predicate (the dump's, and DEL's before the filter) selects,
// and every IPv4 selector is served by the filter itself, not by a silent fallback to the dump.
func TestDeleteSelectedAgreesWithPredicate(t *testing.T) {
	nettest.RequireRoot(t)
	ip := netip.MustParseAddr
	udp, tcp := uint8(unix.IPPROTO_UDP), uint8(unix.IPPROTO_TCP)
	tests := []struct {
		name string
		sels []Selector
	}{
		{"a pod's address, both directions", []Selector{{Src: ip("127.0.0.2")}, {Reply: true, Src: ip("127.0.0.2")}}},
		{"the reply source of the DNAT flow only", []Selector{{Reply: true, Src: ip("127.0.0.3")}}},
		{"original source of ICMP and of a zone-7 flow", []Selector{{Src: ip("127.0.0.3")}, {Src: ip("127.0.0.5")}}},
		{"host port: UDP 40002 on 127.0.0.1", []Selector{{Dst: ip("127.0.0.1"), Proto: udp, DstPort: 40002}}},
		{"host port: its byte swap 17052", []Selector{{Dst: ip("127.0.0.2"), Proto: udp, DstPort: 17052}}},
		{"TCP on the port UDP uses too", []Selector{{Dst: ip("127.0.0.2"), Proto: tcp, DstPort: 40002}}},
		{"UDP from 127.0.0.1 to a port", []Selector{{Src: ip("127.0.0.1"), Proto: udp, DstPort: 41005}}},
		{"destination in the reply direction", []Selector{{Reply: true, Dst: ip("127.0.0.4")}}},
		{"a mapped IPv4 address is the IPv4 one", []Selector{{Src: ip("::ffff:127.0.0.6")}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := trackingNS(t, dnatRule, zoneRule)
			nettest.Do(t, n, func() error {
				if err := crowd(); err != nil {
					return err
				}
				before, err := netlink.ConntrackTableList(netlink.ConntrackTable, 0)
				if err != nil {
					return err
				}
				for what, has := range map[string]func(*netlink.ConntrackFlow) bool{
					"ICMP":    func(f *netlink.ConntrackFlow) bool { return f.Forward.Protocol == unix.IPPROTO_ICMP },
					"TCP":     func(f *netlink.ConntrackFlow) bool { return f.Forward.Protocol == unix.IPPROTO_TCP },
					"zone 7":  func(f *netlink.ConntrackFlow) bool { return f.Zone == 7 },
					"IPv6":    func(f *netlink.ConntrackFlow) bool { return f.FamilyType == unix.AF_INET6 },
					"DNAT":    func(f *netlink.ConntrackFlow) bool { return f.Forward.DstPort == 40010 && f.Reverse.SrcPort == 40011 },
					"swapped": func(f *netlink.ConntrackFlow) bool { return f.Forward.DstPort == 17052 },
				} {
					if !slices.ContainsFunc(before, has) {
						return fmt.Errorf("no %s flow among the %d; the test needs one", what, len(before))
					}
				}
				var want []*netlink.ConntrackFlow
				for _, f := range before {
					if !slices.ContainsFunc(tt.sels, func(s Selector) bool { return s.matches(f) }) {
						want = append(want, f)
					}
				}
				if len(want) == len(before) {
					return fmt.Errorf("the selectors %v select none of the %d flows; the case tests nothing", tt.sels, len(before))
				}
				strict := func(s Selector) error {
					err := flushFiltered(s)
					if err != nil {
						t.Errorf("the kernel refused the filtered flush %v: %v", s, err)
					}
					return err
				}
				if err := deleteSelected(tt.sels, strict); err != nil {
					return err
				}
				after, err := netlink.ConntrackTableList(netlink.ConntrackTable, 0)
				if err != nil {
					return err
				}
				got, wantKeys := flowKeys(after), flowKeys(want)
				for _, k := range got {
					if !slices.Contains(wantKeys, k) {
						t.Errorf("kept a flow the selectors select: %s", k)
					}
				}
				for _, k := range wantKeys {
					if !slices.Contains(got, k) {
						t.Errorf("deleted a flow the selectors do not select: %s", k)
					}
				}
				return nil
			})
		})
	}
}

// TestDeleteSelectedManySelectors: a filtered flush walks every bucket that holds an entry of
// any namespace (~0.14 ms on an idle machine, where a dump takes ~10 ms), so a thousand of them
// (an "any address" host port on a node with a thousand addresses: kube-proxy's IPVS mode puts
// every Service IP on the node) cost many dumps. Past maxFlushes selectors, one dump serves
// them all, and deletes the same flows.
func TestDeleteSelectedManySelectors(t *testing.T) {
	nettest.RequireRoot(t)
	n := trackingNS(t)
	nettest.Do(t, n, func() error {
		for _, dst := range []string{"127.0.0.2", "127.0.0.3"} {
			if err := sendUDPFrom("127.0.0.1", dst, 31000); err != nil {
				return err
			}
		}
		sels := []Selector{{Dst: netip.MustParseAddr("127.0.0.2"), Proto: unix.IPPROTO_UDP, DstPort: 31000}}
		for i := range 1000 {
			sels = append(sels, Selector{Dst: netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)}), Proto: unix.IPPROTO_UDP, DstPort: 31000})
		}
		flushes := 0
		counting := func(s Selector) error {
			flushes++
			return flushFiltered(s)
		}
		if err := deleteSelected(sels, counting); err != nil {
			return err
		}
		if flushes > maxFlushes {
			t.Errorf("%d selectors took %d filtered flushes, want at most %d (a dump is cheaper)", len(sels), flushes, maxFlushes)
		}
		flows, err := netlink.ConntrackTableList(netlink.ConntrackTable, 0)
		if err != nil {
			return err
		}
		if got := flowKeys(flows); len(got) != 1 || !strings.Contains(got[0], "127.0.0.3:31000") {
			t.Errorf("flows left %v, want the one to 127.0.0.3 only", got)
		}
		return nil
	})
}

// TestFlushOnKernelWithoutFilteredFlush: a kernel before 6.12 ignores CTA_FILTER in a delete and
// takes a delete that carries a tuple for the delete of that exact entry. Each selector that
// validates must then be refused (an incomplete tuple: EINVAL, which DeleteSelected takes for a
// kernel that cannot filter and answers with the dump), never be an exact delete: that deletes
// one entry of one zone and reports success, or fails with ENOENT, and DEL with it. The request
// without its CTA_FILTER is what such a kernel reads.
func TestFlushOnKernelWithoutFilteredFlush(t *testing.T) {
	nettest.RequireRoot(t)
	ip := netip.MustParseAddr
	sels := []Selector{
		{Src: ip("127.0.0.2")},
		{Reply: true, Src: ip("127.0.0.2")},
		{Dst: ip("127.0.0.1"), Proto: unix.IPPROTO_UDP, DstPort: 40002},
		{Src: ip("127.0.0.1"), Proto: unix.IPPROTO_UDP, DstPort: 40002},
		{Src: ip("127.0.0.1"), Dst: ip("127.0.0.2"), Proto: unix.IPPROTO_UDP, DstPort: 40002},
		{Src: ip("127.0.0.1"), Dst: ip("127.0.0.2"), Proto: unix.IPPROTO_ICMP},
		{Src: ip("127.0.0.1"), Dst: ip("127.0.0.2")},
		{Src: ip("127.0.0.1"), Dst: ip("127.0.0.2"), Proto: unix.IPPROTO_ESP}, // no ports: a whole tuple
	}
	for _, s := range sels {
		if s.validate() != nil {
			continue
		}
		n := trackingNS(t)
		nettest.Do(t, n, func() error {
			req := flushRequest(s)
			req.Data = req.Data[:len(req.Data)-1]
			_, err := req.Execute(unix.NETLINK_NETFILTER, 0)
			if !errNoFilteredFlush(err) {
				t.Errorf("selector %v, read by a kernel without filtered flush: %v, want EINVAL or EOPNOTSUPP", s, err)
			}
			return nil
		})
	}
}
