package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"

	"github.com/kubenet-dev/kubenet/test/nettest"
)

// PollTimeout bounds every wait for something to come up: generous, because the machine is
// shared and a container can take seconds to start under load. Polls return as soon as the
// condition holds.
const PollTimeout = time.Minute

// Check reports one assertion: "ok" with what was checked when err is nil, so a run's output
// lists everything it verified, else a test error. It returns whether the check passed.
func Check(t testing.TB, err error, format string, args ...any) bool {
	t.Helper()
	what := fmt.Sprintf(format, args...)
	if err != nil {
		t.Errorf("FAIL %s: %v", what, err)
		return false
	}
	t.Logf("ok   %s", what)
	return true
}

// Require is Check that stops the test when the assertion fails (later steps depend on it).
func Require(t testing.TB, err error, format string, args ...any) {
	t.Helper()
	if !Check(t, err, format, args...) {
		t.FailNow()
	}
}

// HTTPFrom asks the busybox image's server at dst, from inside n, which client address it saw.
// It speaks plain HTTP/1.0 over a socket opened in n, so no tool in the node or the image takes
// part on the client side.
func HTTPFrom(n ns.NetNS, dst netip.AddrPort, timeout time.Duration) (netip.Addr, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var c net.Conn
	err := n.Do(func(ns.NetNS) error {
		var d net.Dialer
		var err error
		c, err = d.DialContext(ctx, "tcp", dst.String())
		return err
	})
	if err != nil {
		return netip.Addr{}, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.0\r\nHost: %s\r\n\r\n", ServerPath, dst); err != nil {
		return netip.Addr{}, err
	}
	resp, err := io.ReadAll(bufio.NewReader(c))
	if err != nil {
		return netip.Addr{}, fmt.Errorf("read reply from %s: %w", dst, err)
	}
	return parseFrom(string(resp))
}

// parseFrom finds the "from <address>" line of the server's reply. busybox httpd listens on an
// IPv6 socket, so it names IPv4 clients as "[::ffff:a.b.c.d]".
func parseFrom(resp string) (netip.Addr, error) {
	for _, line := range strings.Split(resp, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "from ")
		if !ok {
			continue
		}
		a, err := netip.ParseAddr(strings.Trim(rest, "[]"))
		if err != nil {
			return netip.Addr{}, fmt.Errorf("reply names client %q: %w", rest, err)
		}
		return a.Unmap(), nil
	}
	return netip.Addr{}, fmt.Errorf("no \"from\" line in reply %q", resp)
}

// ExpectHTTPFrom polls dst from n until the server answers (a container's server starts a
// moment after the runtime reports it started) and checks the client address it saw.
func ExpectHTTPFrom(n ns.NetNS, dst netip.AddrPort, want netip.Addr) error {
	var got netip.Addr
	err := nettest.Eventually(PollTimeout, func() error {
		var err error
		got, err = HTTPFrom(n, dst, 5*time.Second)
		return err
	})
	if err != nil {
		return err
	}
	if got != want {
		return fmt.Errorf("server saw client %s, want %s", got, want)
	}
	return nil
}

// ExpectEchoFrom polls a request from n to the echo server at dst (nettest's TCP echo, or UDP
// when udp is set) until a reply arrives, then checks the source address the server saw. Only
// reachability is retried: a wrong source fails at once.
func ExpectEchoFrom(n ns.NetNS, dst netip.AddrPort, udp bool, want netip.Addr) error {
	var r nettest.Reply
	err := nettest.Eventually(PollTimeout, func() error {
		var err error
		if udp {
			r, err = nettest.UDPRequest(n, dst, "ping", 2*time.Second)
		} else {
			r, err = nettest.TCPRequest(n, dst, "ping", 5*time.Second)
		}
		return err
	})
	return nettest.ExpectFrom(r, err, want)
}

// UDPDontFragment sends one UDP datagram whose IP packet is exactly size bytes from inside n to
// a nettest UDP echo server at dst with fragmentation forbidden (DF for IPv4, no local
// fragmentation for IPv6), and waits for the echo. A hop with a smaller MTU drops it, so an
// echo proves the whole path carries packets of that size. A send larger than the sender's
// own MTU fails at once with EMSGSIZE.
func UDPDontFragment(n ns.NetNS, dst netip.AddrPort, size int, timeout time.Duration) error {
	header := 20 + 8
	level, opt, val := unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO
	if dst.Addr().Is6() {
		header = 40 + 8
		level, opt, val = unix.IPPROTO_IPV6, unix.IPV6_MTU_DISCOVER, unix.IPV6_PMTUDISC_DO
	}
	return n.Do(func(ns.NetNS) error {
		c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(dst))
		if err != nil {
			return err
		}
		defer c.Close()
		raw, err := c.SyscallConn()
		if err != nil {
			return err
		}
		var sockErr error
		if err := raw.Control(func(fd uintptr) { sockErr = unix.SetsockoptInt(int(fd), level, opt, val) }); err != nil {
			return err
		}
		if sockErr != nil {
			return fmt.Errorf("forbid fragmentation: %w", sockErr)
		}
		_ = c.SetDeadline(time.Now().Add(timeout))
		if _, err := c.Write(bytes.Repeat([]byte("m"), size-header)); err != nil {
			return fmt.Errorf("send %d-byte packet: %w", size, err)
		}
		buf := make([]byte, 64<<10)
		if _, err := c.Read(buf); err != nil {
			return fmt.Errorf("no echo of the %d-byte packet: %w", size, err)
		}
		return nil
	})
}
