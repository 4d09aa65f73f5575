package bench

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"

	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/kubenet-dev/kubenet/test/nettest"
)

// The datapath workload: what a chain's per-packet work costs pod traffic. Two pods on the node,
// A sends to B over the bridge (IPv4), measured with nettest's IperfThroughput and
// RequestResponse (TCP throughput and 1-byte request/response, as test/agent's overlay benchmark
// measures pods on two nodes).
//
// For kubenet with anti-spoofing (its default), kubenet with "antiSpoofing": false, and the
// reference chain; the order rotates round by round, so drift hits all alike.

// noAntiSpoofChain names the kubenet chain with anti-spoofing off.
const noAntiSpoofChain = "kubenet, antiSpoofing off"

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
	if gbps, err = nettest.IperfThroughput(r.t, a.ns, b.ns, ips[1], window, log); err != nil {
		return 0, 0, err
	}
	if rr, err = nettest.RequestResponse(a.ns, b.ns, ips[1], window); err != nil {
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
			nettest.Median(r.gbps), slices.Min(r.gbps), slices.Max(r.gbps), nettest.Median(r.rr), slices.Min(r.rr), slices.Max(r.rr),
			fratio(nettest.Median(r.gbps), nettest.Median(ref.gbps)), fratio(nettest.Median(r.rr), nettest.Median(ref.rr)))
	}
	return b.String()
}

func fratio(a, b float64) string {
	if b == 0 {
		return "–"
	}
	return fmt.Sprintf("%.3f", a/b)
}
