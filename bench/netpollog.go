package bench

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"

	"github.com/kubenet-dev/kubenet/core"
	"github.com/kubenet-dev/kubenet/internal/policyrules"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

// The drop log's workload: the data path's two pods with 100 policies, logging off (A) and on
// (B); and a flood of denied datagrams from a third pod with logging on.
const (
	npLogGroup = 2727
	npLogRate  = 100
)

// logCounter reads the node's drop log (as the agent would) and counts the messages and the
// losses the sequence numbers show.
type logCounter struct {
	received, lost, overruns atomic.Int64
	done                     chan struct{}
	r                        *core.PolicyDropReader
}

func startLogCounter(b *testing.B, node ns.NetNS) *logCounter {
	r, err := core.OpenPolicyDropLog("kubenet", npLogGroup, int(node.Fd()))
	if err != nil {
		b.Fatal(err)
	}
	lc := &logCounter{done: make(chan struct{}), r: r}
	go func() {
		defer close(lc.done)
		for {
			ds, lost, err := r.Read()
			lc.received.Add(int64(len(ds)))
			lc.lost.Add(int64(lost))
			if errors.Is(err, policyrules.ErrOverrun) {
				lc.overruns.Add(1)
				continue
			}
			if err != nil {
				return
			}
		}
	}()
	b.Cleanup(func() { _ = r.Close(); <-lc.done })
	return lc
}

// flooder sends UDP datagrams from inside src to dst as fast as one socket can, until stopped,
// and counts them.
type flooder struct {
	sent atomic.Int64
	stop atomic.Bool
	wg   sync.WaitGroup
}

func startFlood(src ns.NetNS, dst netip.AddrPort) (*flooder, error) {
	f := &flooder{}
	ready := make(chan error, 1)
	f.wg.Go(func() {
		err := src.Do(func(ns.NetNS) error {
			fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
			if err != nil {
				return err
			}
			defer unix.Close(fd)
			ready <- nil
			to := &unix.SockaddrInet4{Port: int(dst.Port()), Addr: dst.Addr().As4()}
			payload := []byte("flood")
			for !f.stop.Load() {
				if unix.Sendto(fd, payload, 0, to) == nil {
					f.sent.Add(1)
				}
			}
			return nil
		})
		if err != nil {
			ready <- err
		}
	})
	return f, <-ready
}

func (f *flooder) halt() int64 {
	f.stop.Store(true)
	f.wg.Wait()
	return f.sent.Load()
}

// logResult are the drop log workload's results.
type logResult struct {
	off, on, flood []connResult
	// floodOff and floodOn: logging off and on while the flood goes on.
	floodOff, floodOn []connResult
	// One per round: logging on / off, flood / no flood (both with logging on), and logging on /
	// off during a flood, each the ratio of the means of the round's two samples per mode.
	onWall, onCPU, floodWall, floodLogWall             []float64
	floodSent, floodDropped, floodLogged, floodLimited []float64 // per second, one per flood sample
	lost, overruns                                     int64
	// overBound counts the flood samples that logged more than the limit allows: its burst and
	// its rate over the sample's time (and a tenth of a second for messages in flight).
	overBound int
}

// npDropLog runs the drop log workload: per round, new connections with 100 policies and
// logging off (A) and on (B), A B B A (B A A B in odd rounds); then, logging on, without (A)
// and with a flood of denied datagrams from a third pod (B), A B B A, counting what the flood
// sent, what the kernel dropped, logged and left unlogged for the rate.
func npDropLog(b *testing.B, nPolicies, rounds int) logResult {
	nn := newNPNode(b)
	flood := nn.pod(b, "flooder")
	w := npObjects(nPolicies, "bench-node", nn.clientIP, nn.serverIP)
	// The flooder is a pod of the node that no policy selects (else it is held: its guard, not a
	// policy, drops what it sends).
	fp := w.pods[0].DeepCopy()
	fp.Name, fp.UID, fp.Labels = "flooder", "uid-flooder", map[string]string{"app": "flooder"}
	fp.Status.PodIP, fp.Status.PodIPs = flood.IPs()[0].String(), []corev1.PodIP{{IP: flood.IPs()[0].String()}}
	w.pods = append(w.pods, fp)
	lc := startLogCounter(b, nn.node.NS)
	logOn := policyrules.DropLog{Group: npLogGroup, Rate: npLogRate, Burst: npLogRate}
	set := func(log policyrules.DropLog) {
		nettest.Do(b, nn.node.NS, func() error { _, err := applyPoliciesLogging(nn.node.DataDir(), w, log); return err })
	}
	set(logOn)
	if _, err := nettest.TCPRequest(nn.client.NS, nn.denied, "x", 700*time.Millisecond); answered(err) {
		b.Fatalf("a port no policy allows answers: the policies are not in force")
	}
	if err := nettest.Eventually(2*time.Second, func() error {
		if lc.received.Load() == 0 {
			return errors.New("the denied connection is not in the drop log")
		}
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	counts := func() (dropped, limited uint64) {
		nettest.Do(b, nn.node.NS, func() error {
			ds, l, err := core.PolicyDropCounts("kubenet")
			for _, d := range ds {
				dropped += d.Packets
			}
			limited = l
			return err
		})
		return dropped, limited
	}
	var res logResult
	for round := range rounds {
		order := []bool{false, true, true, false}
		if round%2 == 1 {
			order = []bool{true, false, false, true}
		}
		// Logging off (A) and on (B) in the round's order: each sample, and the round's samples
		// in order.
		loggingOffOn := func(off, on *[]connResult) []connResult {
			var cr []connResult
			for _, logging := range order {
				set(map[bool]policyrules.DropLog{false: {}, true: logOn}[logging])
				c := connRate(nn.client.NS, nn.conns, 4, time.Second, cpuMeter{})
				cr = append(cr, c)
				if logging {
					*on = append(*on, c)
				} else {
					*off = append(*off, c)
				}
				b.Logf("round %d logging %v: %.0f connections/s (%d failed)", round, logging, c.perSecond, c.failed)
			}
			return cr
		}
		cr := loggingOffOn(&res.off, &res.on)
		res.onWall = append(res.onWall, boolRatio(order, func(i int) float64 { return cr[i].perSecond }))
		res.onCPU = append(res.onCPU, 1/boolRatio(order, func(i int) float64 { return float64(cr[i].cpuEach) }))

		set(logOn)
		cr = cr[:0]
		for _, flooding := range order {
			if !flooding {
				c := connRate(nn.client.NS, nn.conns, 4, time.Second, cpuMeter{})
				cr = append(cr, c)
				continue
			}
			dropped0, limited0 := counts()
			logged0 := lc.received.Load()
			f, err := startFlood(flood.NS, nn.denied)
			if err != nil {
				b.Fatal(err)
			}
			start := time.Now()
			c := connRate(nn.client.NS, nn.conns, 4, time.Second, cpuMeter{})
			sent := f.halt()
			took := time.Since(start).Seconds()
			dropped1, limited1 := counts()
			cr = append(cr, c)
			res.flood = append(res.flood, c)
			res.floodSent = append(res.floodSent, float64(sent)/took)
			res.floodDropped = append(res.floodDropped, float64(dropped1-dropped0)/took)
			res.floodLimited = append(res.floodLimited, float64(limited1-limited0)/took)
			logged := lc.received.Load() - logged0
			res.floodLogged = append(res.floodLogged, float64(logged)/took)
			if float64(logged) > npLogRate+npLogRate*(took+0.1) {
				res.overBound++
			}
			b.Logf("round %d flood: %.0f sent/s, %.0f dropped/s, %.0f logged/s, %.0f rate-limited/s; %.0f connections/s (%d failed)",
				round, float64(sent)/took, float64(dropped1-dropped0)/took, float64(lc.received.Load()-logged0)/took, float64(limited1-limited0)/took, c.perSecond, c.failed)
		}
		res.floodWall = append(res.floodWall, boolRatio(order, func(i int) float64 { return cr[i].perSecond }))

		// The flood throughout, logging off (A) and on (B): what the log, saturated, costs the
		// allowed connections, apart from what the flood itself takes of the two cores.
		f, err := startFlood(flood.NS, nn.denied)
		if err != nil {
			b.Fatal(err)
		}
		cr = loggingOffOn(&res.floodOff, &res.floodOn)
		f.halt()
		res.floodLogWall = append(res.floodLogWall, boolRatio(order, func(i int) float64 { return cr[i].perSecond }))
		set(logOn)
	}
	res.lost, res.overruns = lc.lost.Load(), lc.overruns.Load()
	return res
}

// boolRatio is roundRatio for modes that are on (true) or off.
func boolRatio(order []bool, x func(i int) float64) float64 {
	names := make([]string, len(order))
	for i, on := range order {
		names[i] = fmt.Sprint(on)
	}
	return roundRatio(names, "true", x)
}

// npLogReport renders the drop log workload's results, with the goals of issue 27.
func npLogReport(r logResult, nPolicies, rounds int, env []string, began time.Time) string {
	var b []byte
	out := func(format string, args ...any) { b = fmt.Appendf(b, format, args...) }
	out("Run %s, %s in all. %s.\n\n", began.UTC().Format("2006-01-02 15:04 MST"), time.Since(began).Round(time.Second), strings.Join(env, "; "))
	out("Two pods on one node with %d policies, %d rounds. Each round measures new connections (1 s samples, four workers) with logging off (A) and on (B), A B B A (B A A B in odd rounds); then, logging on (%d/s and direction, burst %d), without (A) and with (B) a third pod flooding a port no policy allows with UDP datagrams from one socket, A B B A; then, the flood going on throughout, logging off (A) and on (B), A B B A. A reader of the NFLOG group stands in for the agent.\n\n", nPolicies, rounds, npLogRate, npLogRate)
	out("| mode | new TCP connections/s (median) | failed |\n|---|--:|--:|\n")
	for _, m := range []struct {
		name string
		c    []connResult
	}{{"logging off", r.off}, {"logging on", r.on}, {"logging on, flood of denied datagrams", r.flood},
		{"flood throughout: logging off", r.floodOff}, {"flood throughout: logging on", r.floodOn}} {
		var rate []float64
		var failed int64
		for _, c := range m.c {
			rate, failed = append(rate, c.perSecond), failed+c.failed
		}
		out("| %s | %.0f | %d |\n", m.name, nettest.Median(rate), failed)
	}
	out("\nThe flood (medians per second of its samples): %.0f datagrams sent, %.0f dropped by the policy (counted), %.0f logged, %.0f left unlogged for the rate; over the run the reader lost %d messages (sequence gaps) and saw %d buffer overruns.\n",
		nettest.Median(r.floodSent), nettest.Median(r.floodDropped), nettest.Median(r.floodLogged), nettest.Median(r.floodLimited), r.lost, r.overruns)
	out("\n| goal | measured | met |\n|---|---|---|\n")
	med, ci := nettest.Median(r.onWall), ratioCI(r.onWall, 0.98)
	out("| new connections/s with logging on and %d policies ≥ 0.98 × off | median of the rounds' ratios %.3f (by CPU %.3f), rounds %.3f – %.3f; %s | %s |\n",
		nPolicies, med, nettest.Median(r.onCPU), slices.Min(r.onWall), slices.Max(r.onWall), ci, yesNo(med >= 0.98))
	maxLogged := slices.Max(r.floodLogged)
	out("| a flood of denied packets keeps the log bounded | at most %.0f drops/s logged in a sample (the flood is the server's ingress: %d/s and a burst of %d at most; %d of %d samples over that) while %.0f drops/s | %s |\n",
		maxLogged, npLogRate, npLogRate, r.overBound, len(r.floodLogged), nettest.Median(r.floodDropped), yesNo(r.overBound == 0))
	logMed := nettest.Median(r.floodLogWall)
	out("| allowed traffic during the flood is not the log's to slow (≥ 0.98 × the same flood without logging) | new connections/s during the flood, logging on / off: median of the rounds' ratios %.3f, rounds %.3f – %.3f; %s. For scale: with the flood / without it, both logging, %.3f (rounds %.3f – %.3f): the flood and the connections share the machine's two cores | %s |\n",
		logMed, slices.Min(r.floodLogWall), slices.Max(r.floodLogWall), ratioCI(r.floodLogWall, 0.98),
		nettest.Median(r.floodWall), slices.Min(r.floodWall), slices.Max(r.floodWall), yesNo(logMed >= 0.98))
	return string(b)
}

// ratioCI describes the 95 % confidence interval of the median of ratios against bound.
func ratioCI(ratios []float64, bound float64) string {
	lo, hi, cov, ok := medianCI(ratios, 0.95)
	if !ok {
		return "too few rounds"
	}
	ci := fmt.Sprintf("confidence interval of the median %.3f – %.3f (%.1f%%)", lo, hi, 100*cov)
	if lo < bound && hi >= bound {
		ci += ": reaches across the bound, so this run cannot tell the outcome from noise"
	}
	return ci
}

func yesNo(ok bool) string {
	if ok {
		return "yes"
	}
	return "**no**"
}
