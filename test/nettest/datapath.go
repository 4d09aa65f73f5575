package nettest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
)

// The pod-to-pod measurements of the benchmarks (bench/'s datapath workload, test/agent's
// overlay-against-direct one), so that their figures compare:
//
//   - throughput: one TCP stream with iperf3 (Debian's), its first second omitted, the rate the
//     receiver saw;
//   - request/response: one TCP connection, a 1-byte request answered by a 1-byte response, back
//     to back (netperf's TCP_RR shape), in transactions per second; a small Go loop, since
//     netperf is not in Debian main.
//
// DatapathWindow is how long each sends, DatapathRounds how many samples a benchmark takes of
// each thing it compares.
const (
	DatapathWindow = 3 * time.Second
	DatapathRounds = 5
)

// Ports of the two servers in the receiving pod.
const (
	IperfPort = 5201
	RRPort    = 5202
)

// IperfThroughput runs an iperf3 server in to and a client in from for window (after a second
// that is not counted), and returns the rate the server received, in Gbit/s. The server's output
// goes to log.
func IperfThroughput(t testing.TB, from, to ns.NetNS, dst netip.Addr, window time.Duration, log string) (float64, error) {
	srv := StartProcess(t, to, log, "iperf3", "-s", "--forceflush", "-B", dst.String(), "-p", strconv.Itoa(IperfPort))
	defer func() { _ = srv.Stop() }()
	err := Eventually(10*time.Second, func() error {
		if b, _ := os.ReadFile(log); !strings.Contains(string(b), "Server listening") {
			return fmt.Errorf("iperf3 server not listening yet: %s", b)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	secs := strconv.Itoa(max(1, int(window.Seconds())))
	out, err := Output(from, "iperf3", "-c", dst.String(), "-p", strconv.Itoa(IperfPort), "-t", secs, "-O", "1", "-J")
	if err != nil {
		return 0, err
	}
	var doc struct {
		End struct {
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		return 0, fmt.Errorf("iperf3 output: %w\n%s", err, out)
	}
	if doc.End.SumReceived.BitsPerSecond <= 0 {
		return 0, fmt.Errorf("iperf3 measured nothing:\n%s", out)
	}
	return doc.End.SumReceived.BitsPerSecond / 1e9, nil
}

// RequestResponse serves 1-byte responses in to and sends 1-byte requests from from, one at a
// time over one TCP connection, for window; it returns the transactions per second.
func RequestResponse(from, to ns.NetNS, dst netip.Addr, window time.Duration) (float64, error) {
	var l net.Listener
	err := to.Do(func(ns.NetNS) error {
		var err error
		l, err = net.Listen("tcp", netip.AddrPortFrom(dst, RRPort).String())
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("request/response server: %w", err)
	}
	defer l.Close()
	served := make(chan error, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			served <- err
			return
		}
		defer c.Close()
		buf := make([]byte, 1)
		for {
			if _, err := io.ReadFull(c, buf); err != nil {
				served <- nil // the client closed the connection
				return
			}
			if _, err := c.Write(buf); err != nil {
				served <- err
				return
			}
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := DialIn(from)(ctx, "tcp", netip.AddrPortFrom(dst, RRPort).String())
	if err != nil {
		return 0, fmt.Errorf("request/response client: %w", err)
	}
	buf := make([]byte, 1)
	n := 0
	start := time.Now()
	deadline := start.Add(window)
	for time.Now().Before(deadline) {
		if _, err := c.Write(buf); err != nil {
			c.Close()
			return 0, err
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			c.Close()
			return 0, err
		}
		n++
	}
	elapsed := time.Since(start)
	c.Close()
	if err := <-served; err != nil {
		return 0, fmt.Errorf("request/response server: %w", err)
	}
	return float64(n) / elapsed.Seconds(), nil
}

// Median of xs (the mean of the middle two for an even count; 0 for none).
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
