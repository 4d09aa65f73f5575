package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/kubenet-dev/kubenet/internal/nettest"
)

// The datapath workload: what a chain's per-packet work costs pod traffic. Two pods on the node,
// A sends to B over the bridge (IPv4):
//
//   - throughput: one TCP stream from A to B with iperf3 (Debian's), its first second omitted,
//     the rate the receiver saw;
//   - request/response: one TCP connection, a 1-byte request answered by a 1-byte response, back
//     to back (netperf's TCP_RR shape), in transactions per second; a small Go loop, since
//     netperf is not in Debian main.
//
// For kubenet with anti-spoofing (its default), kubenet with "antiSpoofing": false, and the
// reference chain; the order rotates round by round, so drift hits all alike.

// noAntiSpoofChain names the kubenet chain with anti-spoofing off.
const noAntiSpoofChain = "kubenet, antiSpoofing off"

// Ports of the two servers in pod B.
const (
	iperfPort = 5201
	rrPort    = 5202
)

// datapathResult holds one chain's samples, one per round.
type datapathResult struct {
	chain string
	gbps  []float64 // TCP throughput A to B, Gbit/s
	rr    []float64 // request/response transactions per second
}

// datapath runs the workload for chains and returns a result per chain, in the chains' order.
func (r *runner) datapath(chains []*chain) []datapathResult {
	r.t.Helper()
	results := make([]datapathResult, len(chains))
	for i, c := range chains {
		results[i].chain = c.name
	}
	for round := range r.opts.datapathRounds {
		for k := range chains {
			i := (k + round) % len(chains)
			gbps, rr, err := r.datapathSession(chains[i], round)
			if err != nil {
				r.t.Fatalf("datapath, %s: %v", chains[i].name, err)
			}
			results[i].gbps = append(results[i].gbps, gbps)
			results[i].rr = append(results[i].rr, rr)
		}
	}
	return results
}

// datapathSession attaches two pods with c on an empty node, measures, and deletes them.
func (r *runner) datapathSession(c *chain, round int) (gbps, rr float64, err error) {
	if err := r.node.reset(c); err != nil {
		return 0, 0, err
	}
	a, b := r.attach(c, 0, podSpec{}), r.attach(c, 1, podSpec{})
	var ips []netip.Addr
	for _, p := range []*pod{a, b} {
		ip, err := r.node.addForIP(c, p)
		if err != nil {
			return 0, 0, err
		}
		ips = append(ips, ip)
	}
	defer func() {
		for _, p := range []*pod{a, b} {
			if _, derr := r.node.del(c, p); derr != nil {
				err = errors.Join(err, derr)
			}
		}
	}()
	window := r.opts.datapathWindow
	log := filepath.Join(r.node.Dir, fmt.Sprintf("iperf3-%d-%s.log", round, strings.ReplaceAll(c.name, " ", "")))
	if gbps, err = iperfThroughput(r, a.ns, b.ns, ips[1], window, log); err != nil {
		return 0, 0, err
	}
	if rr, err = requestResponse(a.ns, b.ns, ips[1], window); err != nil {
		return 0, 0, err
	}
	return gbps, rr, nil
}

// addForIP runs ADD for p and returns its IPv4 address from the result.
func (n benchNode) addForIP(c *chain, p *pod) (netip.Addr, error) {
	var ip netip.Addr
	_, err := n.timed(func(ctx context.Context) error {
		res, err := c.cni.AddNetworkList(ctx, c.list, p.rt)
		if err != nil {
			return err
		}
		r, err := current.NewResultFromResult(res)
		if err != nil {
			return err
		}
		for _, cfg := range r.IPs {
			if a, ok := netip.AddrFromSlice(cfg.Address.IP); ok && a.Unmap().Is4() {
				ip = a.Unmap()
			}
		}
		if !ip.IsValid() {
			return fmt.Errorf("no IPv4 address in the result %v", r.IPs)
		}
		return nil
	})
	if err != nil {
		return ip, fmt.Errorf("%s ADD %s: %w", c.name, p.rt.ContainerID, err)
	}
	return ip, nil
}

// iperfThroughput runs an iperf3 server in to and a client in from for window (after a second
// that is not counted), and returns the rate the server received, in Gbit/s.
func iperfThroughput(r *runner, from, to ns.NetNS, dst netip.Addr, window time.Duration, log string) (float64, error) {
	srv := nettest.StartProcess(r.t, to, log, "iperf3", "-s", "--forceflush", "-B", dst.String(), "-p", strconv.Itoa(iperfPort))
	defer func() { _ = srv.Stop() }()
	err := nettest.Eventually(10*time.Second, func() error {
		if b, _ := os.ReadFile(log); !strings.Contains(string(b), "Server listening") {
			return fmt.Errorf("iperf3 server in pod B not listening yet: %s", b)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	secs := strconv.Itoa(max(1, int(window.Seconds())))
	out, err := nettest.Output(from, "iperf3", "-c", dst.String(), "-p", strconv.Itoa(iperfPort), "-t", secs, "-O", "1", "-J")
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

// requestResponse serves 1-byte responses in to and sends 1-byte requests from from, one at a
// time over one TCP connection, for window; it returns the transactions per second.
func requestResponse(from, to ns.NetNS, dst netip.Addr, window time.Duration) (float64, error) {
	var l net.Listener
	err := to.Do(func(ns.NetNS) error {
		var err error
		l, err = net.Listen("tcp", netip.AddrPortFrom(dst, rrPort).String())
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
	c, err := nettest.DialIn(from)(ctx, "tcp", netip.AddrPortFrom(dst, rrPort).String())
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

// median of xs (the mean of the middle two for an even count).
func median(xs []float64) float64 {
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

// datapathMarkdown renders the results; the ratios are to the chain named base.
func datapathMarkdown(results []datapathResult, base string, o options) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\nDatapath, pod to pod on the node over the bridge (IPv4): %d rounds per chain, %s per measurement; median of the rounds, min–max in brackets. Throughput: one iperf3 TCP stream (first second omitted). Request/response: 1 byte each way over one TCP connection, one transaction at a time.\n\n", o.datapathRounds, o.datapathWindow)
	b.WriteString("| chain | TCP throughput, Gbit/s | TCP request/response, transactions/s | throughput vs " + base + " | request/response vs " + base + " |\n|---|--:|--:|--:|--:|\n")
	var ref datapathResult
	for _, r := range results {
		if r.chain == base {
			ref = r
		}
	}
	for _, r := range results {
		fmt.Fprintf(&b, "| %s (n=%d) | %.2f [%.2f–%.2f] | %.0f [%.0f–%.0f] | %s | %s |\n", r.chain, len(r.gbps),
			median(r.gbps), slices.Min(r.gbps), slices.Max(r.gbps), median(r.rr), slices.Min(r.rr), slices.Max(r.rr),
			fratio(median(r.gbps), median(ref.gbps)), fratio(median(r.rr), median(ref.rr)))
	}
	return b.String()
}

func fratio(a, b float64) string {
	if b == 0 {
		return "–"
	}
	return fmt.Sprintf("%.3f", a/b)
}
