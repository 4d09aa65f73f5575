package nettest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
)

// Sink is a TCP server that reads and discards everything it is sent and counts the bytes, so a
// test can measure the rate at which a stream actually arrives (after any shaper on the way).
type Sink struct {
	Addr     netip.AddrPort // the address the sink listens on
	received atomic.Int64
	open     atomic.Int64 // connections accepted and not yet ended
}

// StartSink listens on addr (port 0 picks one) inside n until the test ends.
func StartSink(t testing.TB, n ns.NetNS, addr netip.AddrPort) *Sink {
	t.Helper()
	l := listenIn(t, n, func() (net.Listener, error) { return net.Listen("tcp", addr.String()) })
	t.Cleanup(func() { _ = l.Close() })
	s := &Sink{Addr: netip.MustParseAddrPort(l.Addr().String())}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			s.open.Add(1)
			go s.drain(c)
		}
	}()
	return s
}

func (s *Sink) drain(c net.Conn) {
	defer s.open.Add(-1)
	defer c.Close()
	buf := make([]byte, 256<<10)
	for {
		n, err := c.Read(buf)
		s.received.Add(int64(n))
		if err != nil {
			return
		}
	}
}

// Received is the number of bytes the sink has read so far, over all connections.
func (s *Sink) Received() int64 { return s.received.Load() }

// Stream is one measurement: a TCP stream from one namespace into a sink.
type Stream struct {
	Warmup time.Duration // sent but not counted: slow start, the shaper's initial burst
	Window time.Duration // counted
}

// Measure sends as fast as TCP allows from inside n to sink and returns the rate (bit/s) at which
// the sink received data during the window that follows the warmup. Run one stream per sink at a
// time: the sink counts every connection. The sending is bounded by Warmup+Window. The stream is
// over when Measure returns: the sender resets it and Measure waits until the sink has seen that,
// so neither end sends any more (a graceful close would keep draining the send buffer through a
// shaper for seconds, and the sink's acknowledgements would outlive a DEL of the sender).
func (st Stream) Measure(n ns.NetNS, sink *Sink) (float64, error) {
	var conn net.Conn
	err := n.Do(func(ns.NetNS) error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var d net.Dialer
		var err error
		conn, err = d.DialContext(ctx, "tcp", sink.Addr.String())
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("connect to sink %s: %w", sink.Addr, err)
	}
	sent := make(chan error, 1)
	go func() {
		buf := make([]byte, 64<<10)
		for {
			if _, err := conn.Write(buf); err != nil {
				sent <- err
				return
			}
		}
	}()
	// Sample the sink's counter at the start and the end of the window; the waits are the
	// measurement itself, not synchronisation.
	wait := func(d time.Duration) error {
		select {
		case err := <-sent:
			return fmt.Errorf("stream to %s ended early: %w", sink.Addr, err)
		case <-time.After(d):
			return nil
		}
	}
	if err := wait(st.Warmup); err != nil {
		abort(conn)
		return 0, err
	}
	start, startBytes := time.Now(), sink.Received()
	werr := wait(st.Window)
	end, endBytes := time.Now(), sink.Received()
	abort(conn)
	if werr != nil {
		return 0, werr
	}
	if err := Eventually(5*time.Second, func() error {
		if open := sink.open.Load(); open > 0 {
			return fmt.Errorf("sink %s still has %d connection(s) open after the sender reset its stream", sink.Addr, open)
		}
		return nil
	}); err != nil {
		return 0, err
	}
	if err := <-sent; err != nil && !errors.Is(err, net.ErrClosed) && !errors.Is(err, io.ErrClosedPipe) {
		return 0, fmt.Errorf("stream to %s: %w", sink.Addr, err)
	}
	return float64(endBytes-startBytes) * 8 / end.Sub(start).Seconds(), nil
}

// abort closes conn with a reset instead of a FIN, dropping whatever it has not sent yet.
func abort(conn net.Conn) {
	if tcp, ok := conn.(*net.TCPConn); ok {
		_ = tcp.SetLinger(0)
	}
	_ = conn.Close()
}
