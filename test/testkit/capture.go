package testkit

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"

	"github.com/kubenet-dev/kubenet/test/nettest"
)

// htons converts an ether type to network byte order for AF_PACKET.
func htons(v uint16) uint16 { return v<<8 | v>>8 }

// packetSocket opens an AF_PACKET socket for every protocol bound to ifname, inside n (the socket
// stays in n after the thread leaves it).
func packetSocket(n ns.NetNS, ifname string) (fd, ifindex int, err error) {
	err = n.Do(func(ns.NetNS) error {
		ifi, err := net.InterfaceByName(ifname)
		if err != nil {
			return err
		}
		ifindex = ifi.Index
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ALL)))
		if err != nil {
			return fmt.Errorf("packet socket: %w", err)
		}
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifindex}); err != nil {
			unix.Close(fd)
			return fmt.Errorf("bind packet socket to %s: %w", ifname, err)
		}
		return nil
	})
	return fd, ifindex, err
}

// SendFrames writes raw Ethernet frames on ifname inside n, as a pod with CAP_NET_RAW can.
func SendFrames(t testing.TB, n ns.NetNS, ifname string, frames ...[]byte) {
	t.Helper()
	fd, ifindex, err := packetSocket(n, ifname)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	for _, f := range frames {
		to := &unix.SockaddrLinklayer{Ifindex: ifindex, Halen: 6}
		copy(to.Addr[:], f[:6])
		if err := unix.Sendto(fd, f, 0, to); err != nil {
			t.Fatalf("send frame on %s: %v", ifname, err)
		}
	}
}

// Capture records every frame an interface receives (not the ones it sends), from its start
// until the test ends.
type Capture struct {
	mu     sync.Mutex
	frames []Frame
	closed atomic.Bool
}

// StartCapture captures on ifname inside n.
func StartCapture(t testing.TB, n ns.NetNS, ifname string) *Capture {
	t.Helper()
	fd, _, err := packetSocket(n, ifname)
	if err != nil {
		t.Fatal(err)
	}
	// A receive timeout lets the reader notice the end of the test.
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 100_000}); err != nil {
		unix.Close(fd)
		t.Fatal(err)
	}
	c := &Capture{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 65536)
		for !c.closed.Load() {
			n, from, err := unix.Recvfrom(fd, buf, 0)
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
				continue
			}
			if err != nil {
				return
			}
			if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
				continue
			}
			c.mu.Lock()
			c.frames = append(c.frames, Frame(bytes.Clone(buf[:n])))
			c.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		c.closed.Store(true)
		<-done
		unix.Close(fd)
	})
	return c
}

// Matching returns the captured frames for which match is true.
func (c *Capture) Matching(match func(Frame) bool) []Frame {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []Frame
	for _, f := range c.frames {
		if match(f) {
			out = append(out, f)
		}
	}
	return out
}

// WaitFor polls until a frame for which match is true has been captured.
func (c *Capture) WaitFor(timeout time.Duration, what string, match func(Frame) bool) error {
	return nettest.Eventually(timeout, func() error {
		if len(c.Matching(match)) == 0 {
			return fmt.Errorf("no %s captured", what)
		}
		return nil
	})
}

// Frame is one captured Ethernet frame with accessors for the fields the tests look at. Every
// accessor returns a zero value for a frame too short or of another kind.
type Frame []byte

// Src is the Ethernet source address.
func (f Frame) Src() net.HardwareAddr {
	if len(f) < 14 {
		return nil
	}
	return net.HardwareAddr(f[6:12])
}

// EtherType is the frame's ether type (after a VLAN tag the receiver kept, if any).
func (f Frame) EtherType() uint16 {
	if len(f) < 14 {
		return 0
	}
	t := binary.BigEndian.Uint16(f[12:])
	if t == EtherTypeVLAN && len(f) >= 18 {
		return binary.BigEndian.Uint16(f[16:])
	}
	return t
}

func (f Frame) l3() []byte {
	if len(f) < 14 {
		return nil
	}
	if binary.BigEndian.Uint16(f[12:]) == EtherTypeVLAN {
		if len(f) < 18 {
			return nil
		}
		return f[18:]
	}
	return f[14:]
}

// ARP returns the sender and target of an ARP message.
func (f Frame) ARP() (op uint16, sha net.HardwareAddr, spa netip.Addr, tpa netip.Addr, ok bool) {
	p := f.l3()
	if f.EtherType() != EtherTypeARP || len(p) < 28 {
		return 0, nil, netip.Addr{}, netip.Addr{}, false
	}
	spa, _ = netip.AddrFromSlice(p[14:18])
	tpa, _ = netip.AddrFromSlice(p[24:28])
	return binary.BigEndian.Uint16(p[6:]), net.HardwareAddr(p[8:14]), spa, tpa, true
}

// IP returns the addresses, the transport protocol and the transport payload of an IPv4 or
// IPv6 packet (IPv6 extension headers are not followed: the tests send none).
func (f Frame) IP() (src, dst netip.Addr, proto int, l4 []byte, ok bool) {
	p := f.l3()
	switch f.EtherType() {
	case EtherTypeIPv4:
		if len(p) < 20 {
			return
		}
		ihl := int(p[0]&0x0f) * 4
		if len(p) < ihl {
			return
		}
		src, _ = netip.AddrFromSlice(p[12:16])
		dst, _ = netip.AddrFromSlice(p[16:20])
		return src, dst, int(p[9]), p[ihl:], true
	case EtherTypeIPv6:
		if len(p) < 40 {
			return
		}
		src, _ = netip.AddrFromSlice(p[8:24])
		dst, _ = netip.AddrFromSlice(p[24:40])
		return src, dst, int(p[6]), p[40:], true
	}
	return
}

// ICMP returns the type and the body (after the 4-byte header) of an ICMP or ICMPv6 message.
func (f Frame) ICMP() (typ int, body []byte, ok bool) {
	_, _, proto, l4, ok := f.IP()
	if !ok || (proto != 1 && proto != 58) || len(l4) < 4 {
		return 0, nil, false
	}
	return int(l4[0]), l4[4:], true
}

// UDP returns the ports and payload of a UDP datagram.
func (f Frame) UDP() (srcPort, dstPort uint16, payload []byte, ok bool) {
	_, _, proto, l4, ok := f.IP()
	if !ok || proto != 17 || len(l4) < 8 {
		return 0, 0, nil, false
	}
	return binary.BigEndian.Uint16(l4), binary.BigEndian.Uint16(l4[2:]), l4[8:], true
}
