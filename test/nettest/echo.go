package nettest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
)

// EchoServer answers every TCP line or UDP datagram with "<payload> from <source address>", so a
// client learns both that it reached the server and which source address the server saw.
type EchoServer struct {
	Addr netip.AddrPort // the address the server listens on

	ns       ns.NetNS // where it listens
	mu       sync.Mutex
	received map[string]int // UDP payload -> times received (duplicate detection)
	barriers int
}

// Barrier sends datagrams to the UDP server from its own namespace until one arrives, so that a
// test asserting that something did NOT arrive knows that what was sent before had its chance,
// without sleeping.
func (s *EchoServer) Barrier() error {
	s.mu.Lock()
	s.barriers++
	tag := fmt.Sprintf("kubenet-barrier-%d", s.barriers)
	s.mu.Unlock()
	to := s.Addr
	if to.Addr().IsUnspecified() {
		to = netip.AddrPortFrom(netip.IPv6Loopback(), to.Port())
		if s.Addr.Addr().Is4() {
			to = netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), to.Port())
		}
	}
	return Eventually(10*time.Second, func() error {
		_, _ = UDPRequest(s.ns, to, tag, 100*time.Millisecond)
		if s.Received(tag) == 0 {
			return fmt.Errorf("barrier datagram to %s not received", to)
		}
		return nil
	})
}

// Received returns how often the UDP server has seen payload.
func (s *EchoServer) Received(payload string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.received[payload]
}

func (s *EchoServer) count(payload string) {
	s.mu.Lock()
	s.received[payload]++
	s.mu.Unlock()
}

// listenIn opens a socket inside n. The socket stays in n after the thread leaves it, so the
// goroutines serving it may run anywhere.
func listenIn[T any](t testing.TB, n ns.NetNS, open func() (T, error)) T {
	t.Helper()
	var l T
	Do(t, n, func() error {
		var err error
		l, err = open()
		return err
	})
	return l
}

// StartTCPEcho listens on addr (port 0 picks one) inside n until the test ends.
func StartTCPEcho(t testing.TB, n ns.NetNS, addr netip.AddrPort) *EchoServer {
	t.Helper()
	l := listenIn(t, n, func() (net.Listener, error) { return net.Listen("tcp", addr.String()) })
	t.Cleanup(func() { _ = l.Close() })
	s := &EchoServer{Addr: netip.MustParseAddrPort(l.Addr().String()), received: map[string]int{}}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go serveTCP(c)
		}
	}()
	return s
}

func serveTCP(c net.Conn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	from := remoteIP(c.RemoteAddr())
	r := bufio.NewReader(c)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		if _, err := fmt.Fprintf(c, "%s from %s\n", strings.TrimSpace(line), from); err != nil {
			return
		}
	}
}

// StartUDPEcho listens on addr (port 0 picks one) inside n until the test ends.
func StartUDPEcho(t testing.TB, n ns.NetNS, addr netip.AddrPort) *EchoServer {
	t.Helper()
	pc := listenIn(t, n, func() (net.PacketConn, error) { return net.ListenPacket("udp", addr.String()) })
	t.Cleanup(func() { _ = pc.Close() })
	s := &EchoServer{Addr: netip.MustParseAddrPort(pc.LocalAddr().String()), ns: n, received: map[string]int{}}
	go func() {
		buf := make([]byte, 64<<10)
		for {
			nr, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			payload := string(buf[:nr])
			s.count(payload)
			_, _ = pc.WriteTo([]byte(fmt.Sprintf("%s from %s", payload, remoteIP(from))), from)
		}
	}()
	return s
}

func remoteIP(a net.Addr) string {
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return a.String()
	}
	return ap.Addr().Unmap().String()
}

// Reply is what an echo server answered.
type Reply struct {
	Payload string
	From    netip.Addr // the source address the server saw
}

func parseReply(s string) (Reply, error) {
	payload, from, ok := strings.Cut(strings.TrimSpace(s), " from ")
	if !ok {
		return Reply{}, fmt.Errorf("malformed echo reply %q", s)
	}
	a, err := netip.ParseAddr(from)
	if err != nil {
		return Reply{}, fmt.Errorf("malformed echo reply %q: %w", s, err)
	}
	return Reply{Payload: payload, From: a}, nil
}

// TCPRequest connects from inside n to dst, sends payload and returns the server's reply.
// It fails within timeout when dst is unreachable; it never fails the test itself, so callers can
// assert on unreachability too.
func TCPRequest(n ns.NetNS, dst netip.AddrPort, payload string, timeout time.Duration) (Reply, error) {
	var reply Reply
	err := n.Do(func(ns.NetNS) error {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", dst.String())
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(timeout))
		if _, err := io.WriteString(c, payload+"\n"); err != nil {
			return err
		}
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			return fmt.Errorf("read reply from %s: %w", dst, err)
		}
		reply, err = parseReply(line)
		return err
	})
	return reply, err
}

// UDPRequest sends payload from inside n to dst and waits up to timeout for the echo.
func UDPRequest(n ns.NetNS, dst netip.AddrPort, payload string, timeout time.Duration) (Reply, error) {
	var reply Reply
	err := n.Do(func(ns.NetNS) error {
		c, err := net.Dial("udp", dst.String())
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(timeout))
		if _, err := io.WriteString(c, payload); err != nil {
			return err
		}
		buf := make([]byte, 64<<10)
		nr, err := c.Read(buf)
		if err != nil {
			return fmt.Errorf("read reply from %s: %w", dst, err)
		}
		reply, err = parseReply(string(buf[:nr]))
		return err
	})
	return reply, err
}

// ErrUnexpectedSource is returned by ExpectFrom when the server saw another source address.
var ErrUnexpectedSource = errors.New("unexpected source address")

// ExpectFrom checks that a request reached the server from want.
func ExpectFrom(r Reply, err error, want netip.Addr) error {
	if err != nil {
		return err
	}
	if r.From != want {
		return fmt.Errorf("%w: server saw %s, want %s", ErrUnexpectedSource, r.From, want)
	}
	return nil
}

// Session is one TCP connection to an echo server (StartTCPEcho), kept open across changes
// of the rules: what an established connection sees of them.
type Session struct {
	Conn net.Conn
	r    *bufio.Reader
}

// OpenSession connects from n to an echo server at dst, retrying until deadline; the
// connection is closed when the test ends.
func OpenSession(t testing.TB, n ns.NetNS, dst netip.AddrPort, deadline time.Duration) *Session {
	t.Helper()
	s := &Session{}
	if err := Eventually(deadline, func() (err error) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		s.Conn, err = DialIn(n)(ctx, "tcp", dst.String())
		return err
	}); err != nil {
		t.Fatalf("connect to %s: %v", dst, err)
	}
	t.Cleanup(func() { _ = s.Conn.Close() })
	s.r = bufio.NewReader(s.Conn)
	return s
}

// Catches sends one line and tells whether its echo comes back within wait, skipping the
// echoes of earlier lines that arrive first (lines a blocked connection delivers late).
func (s *Session) Catches(line string, wait time.Duration) bool {
	_ = s.Conn.SetDeadline(time.Now().Add(wait))
	if _, err := fmt.Fprintln(s.Conn, line); err != nil {
		return false
	}
	for {
		got, err := s.r.ReadString('\n')
		if err != nil {
			return false
		}
		if strings.HasPrefix(got, line+" ") {
			return true
		}
	}
}

// RoundTrip sends one line and tells whether its echo came back within wait.
func (s *Session) RoundTrip(line string, wait time.Duration) bool {
	_ = s.Conn.SetDeadline(time.Now().Add(wait))
	if _, err := fmt.Fprintln(s.Conn, line); err != nil {
		return false
	}
	got, err := s.r.ReadString('\n')
	return err == nil && strings.HasPrefix(got, line+" ")
}
