package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/google/nftables"
	"golang.org/x/sys/unix"

	"github.com/kubenet-dev/kubenet/core"
	"github.com/kubenet-dev/kubenet/internal/policyrules"
	"github.com/kubenet-dev/kubenet/isolation"
	"github.com/kubenet-dev/kubenet/netpol"
	"github.com/kubenet-dev/kubenet/test/nettest"
	"github.com/kubenet-dev/kubenet/test/testkit"
)

// healWorld is a dual-stack node with pods attached by the core in-process: one holder with a
// TCP and a UDP host port and servers behind them, and an attacker aimed at the node's
// 127.0.0.1.
type healWorld struct {
	node   *nettest.Node
	cfg    *core.Config
	holder *nettest.Pod
	attack func(time.Duration) error
}

func newHealWorld(t testing.TB, extraPods int) *healWorld {
	t.Helper()
	node := nettest.NewNode(t, t.TempDir()) // pods are attached in-process: no plugin binary
	list := node.ConfList(t, nettest.NetConf{PodCIDRs: testkit.DualStack(), NonMasqueradeCIDRs: []netip.Prefix{nettest.NonMasquerade4, nettest.NonMasquerade6}})
	w := &healWorld{node: node, cfg: testkit.PluginConfig(t, list)}
	attach := func(id string, ports ...core.PortMapping) *nettest.Pod {
		pod := node.NewPod(t, id)
		cfg := *w.cfg
		cfg.Runtime.PortMappings = ports
		att := testkit.AttachmentOf(pod)
		nettest.Do(t, node.NS, func() (err error) {
			pod.Result, err = core.Add(context.Background(), &cfg, att)
			return err
		})
		t.Cleanup(func() { _ = node.NS.Do(func(ns.NetNS) error { return core.Del(context.Background(), &cfg, att) }) })
		return pod
	}
	w.holder = attach("holder", core.PortMapping{HostPort: 30280, ContainerPort: 8080, Protocol: "tcp"}, core.PortMapping{HostPort: 30281, ContainerPort: 8081, Protocol: "udp"})
	nettest.StartTCPEcho(t, w.holder.NS, netip.AddrPortFrom(netip.IPv6Unspecified(), 8080))
	nettest.StartUDPEcho(t, w.holder.NS, netip.AddrPortFrom(netip.IPv6Unspecified(), 8081))
	for i := range extraPods {
		attach(fmt.Sprintf("extra-%d", i), core.PortMapping{HostPort: int32(31000 + i), ContainerPort: 80, Protocol: "tcp"}, core.PortMapping{HostPort: int32(32000 + i), ContainerPort: 80, Protocol: "udp"})
	}
	w.attack = testkit.LocalnetAttack(t, node, attach("attacker"), 9999)
	return w
}

// startHealer runs a healer in the node's namespace until the test ends and returns the passes
// it makes.
func (w *healWorld) startHealer(t testing.TB, period, minGap time.Duration) <-chan healPass {
	t.Helper()
	return w.startHealerWith(t, period, minGap, func() (*core.Config, error) { return w.cfg, nil })
}

// startHealerWith is startHealer with the healer's source of the configuration; prepare, when
// given, changes the healer before it runs.
func (w *healWorld) startHealerWith(t testing.TB, period, minGap time.Duration, config func() (*core.Config, error), prepare ...func(*healer)) <-chan healPass {
	t.Helper()
	passes := make(chan healPass, 1000)
	h := newHealer(slog.New(slog.NewTextHandler(io.Discard, nil)), period, minGap, config, func(p healPass) { passes <- p })
	for _, f := range prepare {
		f(h)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		// Do locks the goroutine's thread into the node's namespace: every netlink socket the
		// healer opens is the node's.
		_ = w.node.NS.Do(func(ns.NetNS) error { h.run(ctx); return nil })
	}()
	t.Cleanup(func() { cancel(); wg.Wait() })
	select {
	case p := <-passes:
		if p.err != nil || !p.full {
			t.Fatalf("first pass: %+v, want a full pass without error", p)
		}
	case <-time.After(testkit.TrafficTimeout):
		t.Fatal("the healer made no first pass")
	}
	return passes
}

// podElements are the running pods' elements a heal must put back: the hostPort map elements
// (from the plugin's ownership index) and the bridge's isolation elements (from the attachment
// records), as the nft tool shows them.
type podElements struct {
	hostPorts []testkit.HostPortElement
	isolation []string // sorted
}

func (w *healWorld) elements(t testing.TB) podElements {
	t.Helper()
	return podElements{hostPorts: testkit.HostPortElements(t, w.node), isolation: testkit.SortedIsolationElements(t, w.node)}
}

// healed waits for the node to be as kubenet set it up: node-wide rules as planned and the
// running pods' elements as before.
func (w *healWorld) healed(t testing.TB, want podElements) error {
	t.Helper()
	return nettest.Eventually(10*time.Second, func() error {
		if err := testkit.NodeRulesOK(t, w.node, w.cfg); err != nil {
			return err
		}
		got := w.elements(t)
		if !slices.Equal(got.hostPorts, want.hostPorts) {
			return fmt.Errorf("map elements %v, want %v", got.hostPorts, want.hostPorts)
		}
		if !slices.Equal(got.isolation, want.isolation) {
			return fmt.Errorf("isolation elements %q, want %q", got.isolation, want.isolation)
		}
		return nil
	})
}

// expectWorking checks the attack fails and the holder's host ports answer.
func (w *healWorld) expectWorking(t *testing.T, when string) {
	t.Helper()
	testkit.ExpectAttackFails(t, w.attack, when)
	for _, dst := range []struct {
		proto string
		addr  netip.AddrPort
		from  netip.Addr
	}{
		{"tcp", netip.AddrPortFrom(nettest.NodeUplink4.Addr(), 30280), nettest.External4.Addr()},
		{"tcp", netip.AddrPortFrom(nettest.NodeUplink6.Addr(), 30280), nettest.External6.Addr()},
		{"udp", netip.AddrPortFrom(nettest.NodeUplink4.Addr(), 30281), nettest.External4.Addr()},
	} {
		err := nettest.Eventually(testkit.TrafficTimeout, func() error {
			var r nettest.Reply
			var err error
			if dst.proto == "udp" {
				r, err = nettest.UDPRequest(w.node.External, dst.addr, "heal", time.Second)
			} else {
				r, err = nettest.TCPRequest(w.node.External, dst.addr, "heal", time.Second)
			}
			return nettest.ExpectFrom(r, err, dst.from)
		})
		if err != nil {
			t.Errorf("%s: %s host port %s: %v", when, dst.proto, dst.addr, err)
		}
	}
	var status error
	nettest.Do(t, w.node.NS, func() error { status = core.Status(context.Background(), w.cfg); return nil })
	if status != nil {
		t.Errorf("%s: STATUS = %v", when, status)
	}
}

// TestHealerRestoresFlushedRuleset: with the healer running, `nft flush ruleset` in the node is
// undone without any ADD: the localhost attack fails again and the running pod's host ports
// answer again, from the nftables change events alone (the periodic pass is an hour away).
func TestHealerRestoresFlushedRuleset(t *testing.T) {
	w := newHealWorld(t, 0)
	passes := w.startHealer(t, time.Hour, 50*time.Millisecond)
	elements := w.elements(t)
	if len(elements.hostPorts) != 4 {
		t.Fatalf("map elements %v, want the holder's 4", elements.hostPorts)
	}
	// Per pod: its port twice (pod-ports, anti-spoof-ports), its MAC, its link-local address and
	// its two addresses, and the last three joined with its MAC (the fast paths).
	if len(elements.isolation) != 18 {
		t.Fatalf("isolation elements %q, want the holder's and the attacker's 9 each", elements.isolation)
	}
	w.expectWorking(t, "before the flush")

	for round := range 2 {
		nettest.Run(t, w.node.NS, "nft", "flush", "ruleset")
		if err := w.healed(t, elements); err != nil {
			t.Fatalf("round %d: not healed after the flush: %v", round, err)
		}
		w.expectWorking(t, fmt.Sprintf("round %d, after the healer's reaction", round))
	}
	var repaired int
	for len(passes) > 0 {
		p := <-passes
		if p.full {
			t.Errorf("a periodic pass ran (%+v); the test meant to see the event path alone", p)
		}
		if p.err != nil {
			t.Errorf("pass failed: %v", p.err)
		}
		if p.Found != nil {
			repaired++
		}
	}
	if repaired < 2 {
		t.Errorf("%d passes found something to repair, want one per flush", repaired)
	}
}

// TestHealerOverflowAsksPolicyCheck: a pass that runs because the nftables subscription
// overflowed (here made to end as an overflow ends it) and finds the node intact asks the policy
// controller for a check, not a read-back of every group set; a flushed ruleset, announced by its
// events, still asks for the read-back.
func TestHealerOverflowAsksPolicyCheck(t *testing.T) {
	w := newHealWorld(t, 0)
	overflow := make(chan struct{}, 1)
	passes := w.startHealerWith(t, time.Hour, 50*time.Millisecond, func() (*core.Config, error) { return w.cfg, nil }, func(h *healer) {
		subscribe := h.openTables
		h.openTables = func() (func(context.Context) bool, func(), error) {
			forward, closeFn, err := subscribe()
			if err != nil {
				return nil, nil, err
			}
			return func(ctx context.Context) bool {
				fctx, cancel := context.WithCancel(ctx)
				defer cancel()
				ended := make(chan bool, 1)
				go func() { ended <- forward(fctx) }()
				select {
				case e := <-ended:
					return e
				case <-overflow: // the socket overflowed: the monitor's channel closes
					cancel()
					<-ended
					return true
				}
			}, closeFn, nil
		}
	})
	next := func(what string) healPass {
		t.Helper()
		for {
			select {
			case p := <-passes:
				if !p.full {
					return p
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("%s: no heal pass", what)
			}
		}
	}
	overflow <- struct{}{}
	p := next("after the overflow")
	if !p.eventsLost || p.repaired() || p.err != nil || policyAskOf(p) != policyCheck {
		t.Errorf("after the overflow: pass %+v asks %d of the policy controller, want events lost, nothing repaired, a check (%d)", p, policyAskOf(p), policyCheck)
	}
	nettest.Run(t, w.node.NS, "nft", "flush", "ruleset")
	p = next("after the flush")
	if p.eventsLost || p.Found == nil || policyAskOf(p) != policyVerify {
		t.Errorf("after the flush: pass %+v asks %d of the policy controller, want the flush found and a read-back (%d)", p, policyAskOf(p), policyVerify)
	}
}

// TestHealerFlushStormKeepsGap: another tool flushes the ruleset in a loop while the healer
// runs on a node whose repair takes longer than the healer's minimum gap (50 pods with host
// ports). Each pass the events ask for starts the gap after the previous one ended: the healer
// never runs back to back for as long as the fight lasts. Once the tool stops, the node is healed.
func TestHealerFlushStormKeepsGap(t *testing.T) {
	const gap = 50 * time.Millisecond
	w := newHealWorld(t, 49)
	elements := w.elements(t)
	// The other tool is this test's goroutine: its transactions are this process's, which the
	// healer takes for its own unless told otherwise.
	passes := w.startHealerWith(t, time.Hour, gap, func() (*core.Config, error) { return w.cfg, nil }, func(h *healer) {
		h.ours = func(nftBatch) bool { return false }
	})
	stop, stopped := make(chan struct{}), make(chan error, 1)
	go func() {
		stopped <- w.node.NS.Do(func(ns.NetNS) error {
			c, err := nftables.New()
			if err != nil {
				return err
			}
			for {
				select {
				case <-stop:
					return nil
				case <-time.After(5 * time.Millisecond): // the other tool's pace, not a synchronisation
				}
				c.FlushRuleset()
				if err := c.Flush(); err != nil {
					return err
				}
			}
		})
	}()
	var prevEnd time.Time
	var failed int
	for i := 0; i < 6; {
		select {
		case p := <-passes:
			end := time.Now()
			if p.full {
				continue
			}
			if p.err != nil {
				// A flush between two of the pass's transactions fails it (a map deleted under
				// its elements): it is retried after its backoff, and the node is checked
				// healed once the storm ends.
				failed++
			}
			// The receive comes a little after the pass ended: gap/2 keeps that out of the way,
			// while passes back to back are microseconds apart.
			if idle := end.Add(-p.took).Sub(prevEnd); !prevEnd.IsZero() && idle < gap/2 {
				t.Fatalf("a pass of %s started %s after the previous one ended, want the minimum gap %s", p.took, idle, gap)
			}
			prevEnd = end
			i++
		case <-time.After(10 * time.Second):
			t.Fatal("no heal pass during the flush storm")
		}
	}
	close(stop)
	if err := <-stopped; err != nil {
		t.Fatalf("the flushing tool: %v", err)
	}
	t.Logf("%d of the passes during the storm failed and were retried", failed)
	if err := w.healed(t, elements); err != nil {
		t.Fatal(err)
	}
}

// TestHealerRetriesFailedPass: a pass that fails (here the configuration cannot be read; in life
// another tool deleting a table between two of the pass's transactions) is tried again after its
// backoff, although no event follows it: the node does not wait for the period.
func TestHealerRetriesFailedPass(t *testing.T) {
	w := newHealWorld(t, 0)
	elements := w.elements(t)
	var failing atomic.Bool
	passes := w.startHealerWith(t, time.Hour, 50*time.Millisecond, func() (*core.Config, error) {
		if failing.Load() {
			return nil, errors.New("configuration unreadable for this test")
		}
		return w.cfg, nil
	})
	failing.Store(true)
	nettest.Run(t, w.node.NS, "nft", "flush", "ruleset")
	select {
	case p := <-passes:
		if p.err == nil {
			t.Fatalf("the pass after the flush did not fail: %+v", p)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no heal pass after the flush")
	}
	failing.Store(false) // from here on no event comes: only a retry can heal the node
	if err := w.healed(t, elements); err != nil {
		t.Fatal(err)
	}
	w.expectWorking(t, "after the retried pass")
}

// TestHealerPeriodicPass: elements deleted behind kubenet's back (element events are not
// watched: every pod's ADD and DEL makes them), a hostPort one and an isolation one, and a sysctl
// turned off come back with the periodic pass.
func TestHealerPeriodicPass(t *testing.T) {
	w := newHealWorld(t, 0)
	elements := w.elements(t)
	passes := w.startHealer(t, 300*time.Millisecond, 50*time.Millisecond)
	nettest.Run(t, w.node.NS, "nft", "delete", "element", "inet", testkit.HostPortTable, "hostports-ipv4", "{ tcp . 30280 }")
	holderPort := testkit.KubenetNames(w.holder).HostVeth
	nettest.Run(t, w.node.NS, "nft", "delete", "element", "bridge", testkit.HostPortTable, isolation.SetIPv4, fmt.Sprintf(`{ "%s" . %s }`, holderPort, w.holder.IP(nettest.PodCIDR4.Addr())))
	nettest.WriteSysctl(t, w.node.NS, "net/ipv4/ip_forward", "0")
	if err := w.healed(t, elements); err != nil {
		t.Fatal(err)
	}
	if err := nettest.Eventually(5*time.Second, func() error {
		if v := testkit.Sysctl(t, w.node.NS, "net/ipv4/ip_forward"); v != "1" {
			return fmt.Errorf("ip_forward = %s", v)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	w.expectWorking(t, "after the periodic pass")
	var restored int
	for len(passes) > 0 {
		p := <-passes
		if p.full {
			restored += p.Restored
		}
	}
	if restored != 1 {
		t.Errorf("periodic passes restored %d elements, want 1", restored)
	}
}

// TestHealerReportsPolicyBridge: with NetworkPolicy on, the bridge's nf_call options turned off
// and its policy guard removed come back with the periodic pass, which says so: the agent counts
// it with the policy passes' repairs, and a healer that got there first must not hide it.
func TestHealerReportsPolicyBridge(t *testing.T) {
	w := newHealWorld(t, 0)
	w.cfg.NetworkPolicy = true
	passes := w.startHealer(t, 300*time.Millisecond, 50*time.Millisecond)
	nettest.Run(t, w.node.NS, "ip", "link", "set", w.cfg.Bridge, "type", "bridge", "nf_call_iptables", "0", "nf_call_ip6tables", "0")
	nettest.Run(t, w.node.NS, "tc", "filter", "del", "dev", w.cfg.Bridge, "ingress")
	// The two changes may fall on either side of a pass: what the passes report adds up.
	guards, netfilterCall := 0, false
	deadline := time.After(10 * time.Second)
	for guards == 0 || !netfilterCall {
		select {
		case p := <-passes:
			if p.err != nil {
				t.Fatal(p.err)
			}
			if (p.NetfilterCall || p.PolicyGuards > 0) && !p.repaired() {
				t.Errorf("pass %+v reports a repair but does not count as one", p)
			}
			guards, netfilterCall = guards+p.PolicyGuards, netfilterCall || p.NetfilterCall
		case <-deadline:
			t.Fatalf("the passes reported %d guards put back and nf_call options turned on: %v; want 1 and true", guards, netfilterCall)
		}
	}
	if guards != 1 {
		t.Errorf("the passes reported %d guards put back, want 1", guards)
	}
	if out := nettest.Run(t, w.node.NS, "ip", "-d", "link", "show", w.cfg.Bridge); !strings.Contains(out, "nf_call_iptables 1") || !strings.Contains(out, "nf_call_ip6tables 1") {
		t.Errorf("the bridge's nf_call options are still off:\n%s", out)
	}
	if out := nettest.Run(t, w.node.NS, "tc", "filter", "show", "dev", w.cfg.Bridge, "ingress"); !strings.Contains(out, "kubenet-guard") {
		t.Errorf("the bridge's guard is not back:\n%s", out)
	}
}

// TestHealerSeesBridgeNetfilterCallOff: a bridge option turned off is announced by no nftables
// event, only by the bridge's link change; the healer turns it back on at once instead of at its
// periodic pass (an hour here). The many link changes of a bridge that a port joining and
// leaving makes need no pass, nor does a bridge without NetworkPolicy: the healer asks the bridge
// before it runs one.
func TestHealerSeesBridgeNetfilterCallOff(t *testing.T) {
	for _, option := range []string{"nf_call_iptables", "nf_call_ip6tables"} {
		t.Run(option, func(t *testing.T) {
			w := newHealWorld(t, 0)
			needsHeal := func(policy bool) (need bool) {
				cfg := *w.cfg
				cfg.NetworkPolicy = policy
				asker := &healer{log: slog.New(slog.NewTextHandler(io.Discard, nil)), config: func() (*core.Config, error) { return &cfg, nil }}
				nettest.Do(t, w.node.NS, func() error { need = asker.bridgeNeedsHeal(); return nil })
				return need
			}
			setOption := func(v string) {
				nettest.Run(t, w.node.NS, "ip", "link", "set", w.cfg.Bridge, "type", "bridge", option, v)
			}
			setOption("0")
			if needsHeal(false) {
				t.Error("a bridge without NetworkPolicy asks for a heal of its nf_call options")
			}
			if !needsHeal(true) {
				t.Errorf("a bridge with %s off asks for no heal", option)
			}
			// Both on, as a pass with NetworkPolicy leaves them (this node's pods were added without).
			nettest.Run(t, w.node.NS, "ip", "link", "set", w.cfg.Bridge, "type", "bridge", "nf_call_iptables", "1", "nf_call_ip6tables", "1")
			nettest.Run(t, w.node.NS, "ip", "link", "add", "kt-port0", "type", "veth", "peer", "name", "kt-port1")
			nettest.Run(t, w.node.NS, "ip", "link", "set", "kt-port0", "master", w.cfg.Bridge, "up")
			nettest.Run(t, w.node.NS, "ip", "link", "set", "kt-port1", "up")
			nettest.Run(t, w.node.NS, "ip", "link", "del", "kt-port0")
			if needsHeal(true) {
				t.Error("a port joining and leaving the bridge asks for a heal")
			}

			w.cfg.NetworkPolicy = true
			passes := w.startHealer(t, time.Hour, 50*time.Millisecond)
			setOption("0")
			select {
			case p := <-passes:
				if p.err != nil || !p.NetfilterCall {
					t.Errorf("the pass after the bridge changed: %+v, want the one that turned nf_call back on", p)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("no pass within 10 s of the bridge's nf_call option turned off")
			}
			if out := nettest.Run(t, w.node.NS, "ip", "-d", "link", "show", w.cfg.Bridge); !strings.Contains(out, option+" 1") {
				t.Errorf("%s is still off:\n%s", option, out)
			}
		})
	}
}

// BenchmarkHealAfterFlush measures how long the node stays open after `nft flush ruleset` with
// the healer running: from the flush's commit (over netlink, so no process start is counted) to
// the end of the healer's pass that restored every node-wide rule and the map elements of 50
// pods with two host ports each (200 elements). The state is verified after every round.
//
//	go test ./agent -run '^$' -bench HealAfterFlush -benchtime 20x
func BenchmarkHealAfterFlush(b *testing.B) {
	w := newHealWorld(b, 49)
	passes := w.startHealer(b, time.Hour, 50*time.Millisecond)
	elements := w.elements(b)
	if len(elements.hostPorts) != 200 {
		b.Fatalf("%d map elements, want 200", len(elements.hostPorts))
	}
	var total time.Duration
	b.ResetTimer()
	for range b.N {
		var start time.Time
		nettest.Do(b, w.node.NS, func() error {
			c, err := nftables.New()
			if err != nil {
				return err
			}
			c.FlushRuleset()
			start = time.Now()
			return c.Flush()
		})
		var end time.Time
		for end.IsZero() {
			select {
			case p := <-passes:
				if p.err != nil {
					b.Fatal(p.err)
				}
				if p.Found != nil && p.Restored == len(elements.hostPorts) {
					end = time.Now()
				}
			case <-time.After(10 * time.Second):
				b.Fatal("not healed within 10 s")
			}
		}
		total += end.Sub(start)
		b.StopTimer()
		if err := w.healed(b, elements); err != nil {
			b.Fatal(err)
		}
		// The healer's own writes make one more pass; let it pass before the next flush.
		select {
		case <-passes:
		case <-time.After(10 * time.Second):
			b.Fatal("no pass after the repair")
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(total.Microseconds())/1000/float64(b.N), "ms/heal")
}

// TestCommittedByUsKnowsTheWriter: the kernel's generation message of a transaction this
// process committed names one of its threads (committedByUs: the healer lets it pass), and that
// of the nft tool's does not (the healer wakes): another tool's flush or edit of a kubenet table
// is still repaired (TestHealerRestoresFlushedRuleset), the agent's own writes wake nothing. The
// batches carry each transaction's table and chain changes, not its elements.
func TestCommittedByUsKnowsTheWriter(t *testing.T) {
	n := nettest.NewNS(t)
	next := tableEvents(t, n)
	comm, err := os.ReadFile("/proc/self/comm")
	if err != nil {
		t.Fatal(err)
	}
	for round := range 3 { // the commits run on whichever thread the goroutine has
		own := fmt.Sprintf("kubenet-own-%d", round)
		nettest.Do(t, n, func() error {
			c, err := nftables.New()
			if err != nil {
				return err
			}
			table := c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: own})
			c.AddChain(&nftables.Chain{Name: "c", Table: table})
			set := &nftables.Set{Table: table, Name: "s", KeyType: nftables.TypeInetService}
			if err := c.AddSet(set, []nftables.SetElement{{Key: []byte{0, 80}}, {Key: []byte{1, 187}}}); err != nil {
				return err
			}
			return c.Flush()
		})
		b := next(own)
		if !committedByUs(b) {
			t.Errorf("round %d: this process's transaction (thread %d %q) taken for another's", round, b.pid, b.comm)
		}
		want := []nftChange{{unix.NFT_MSG_NEWTABLE, own}, {unix.NFT_MSG_NEWCHAIN, own}, {unix.NFT_MSG_NEWSET, own}}
		if !slices.Equal(b.changes, want) {
			t.Errorf("round %d: changes %v, want %v (the elements left out)", round, b.changes, want)
		}
		other := fmt.Sprintf("kubenet-other-%d", round)
		nettest.Run(t, n, "nft", "add", "table", "inet", other)
		b = next(other)
		if committedByUs(b) {
			t.Errorf("round %d: the nft tool's transaction (thread %d %q) taken for this process's", round, b.pid, b.comm)
		}
		// A process that took this one's name is still not this one.
		b.comm = strings.TrimSpace(string(comm))
		if committedByUs(b) {
			t.Errorf("round %d: a transaction of thread %d named %q taken for this process's", round, b.pid, b.comm)
		}
	}
}

// tableEvents subscribes to n's nftables notifications and returns a function that waits for
// the batch of the next transaction that touched table.
func tableEvents(t *testing.T, n ns.NetNS) func(table string) nftBatch {
	var events <-chan nftBatch
	var closeEvents func()
	nettest.Do(t, n, func() (err error) { events, closeEvents, err = subscribeTables(tableEventsBuffer); return err })
	t.Cleanup(closeEvents)
	return func(table string) nftBatch {
		t.Helper()
		for {
			select {
			case batch, ok := <-events:
				if !ok {
					t.Fatal("the nftables subscription ended")
				}
				if batch.err != nil {
					t.Fatalf("the nftables subscription failed: %v", batch.err)
				}
				if slices.ContainsFunc(batch.changes, func(c nftChange) bool { return c.table == table }) {
					return batch
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("no event of table %s", table)
			}
		}
	}
}

// TestPolicyCommitsKnownByPortID: the policy controller's passes are the agent's own by the
// committing socket's netlink port id and the process's name, which hold in a PID namespace of
// the agent's own too (a pod without hostPID, where the thread ids the kernel reports are not
// the agent's to read: committedByUs is made to fail here): a pass of the controller's applier
// is; the nft tool's transaction and another applier's pass are not, nor one with our port id
// under another name.
func TestPolicyCommitsKnownByPortID(t *testing.T) {
	n := nettest.NewNS(t)
	next := tableEvents(t, n)
	mine, other := core.NewPolicyApplier(), core.NewPolicyApplier()
	ours := ownedBy(func(nftBatch) bool { return false }, mine.Committed, selfComm())
	pass := func(a *core.PolicyApplier, network string) nftBatch {
		t.Helper()
		nettest.Do(t, n, func() error {
			_, err := core.ApplyPolicies(core.PolicyNetwork{DataDir: t.TempDir(), Network: network, Bridge: "kubenet-none", Applier: a},
				func([]core.PolicyLocal) policyrules.Ruleset { return policyrules.Ruleset{} })
			return err
		})
		return next(netpol.TableName(network))
	}
	for round := range 3 {
		b := pass(mine, fmt.Sprintf("own%d", round))
		if b.portid == 0 || !ours(b) {
			t.Errorf("round %d: the controller's pass (port %d, %q) taken for another's", round, b.portid, b.comm)
		}
		if b2 := pass(other, fmt.Sprintf("other%d", round)); ours(b2) {
			t.Errorf("round %d: another applier's pass (port %d) taken for the controller's", round, b2.portid)
		}
		b.comm = "impostor"
		if ours(b) {
			t.Errorf("round %d: our port id under another name taken for ours", round)
		}
		tool := fmt.Sprintf("kubenetpolicy-tool%d", round)
		nettest.Run(t, n, "nft", "add", "table", "bridge", tool)
		if b := next(tool); ours(b) {
			t.Errorf("round %d: the nft tool's transaction (port %d, %q) taken for ours", round, b.portid, b.comm)
		}
	}
}

// TestTableEventsOverflowEnds: when the subscription's socket overflows (its reader held up,
// here by nobody taking its batches) the subscription reports the loss (ENOBUFS) and ends, and
// the healer subscribes again and makes a pass (TestHealerOverflowAsksPolicyCheck): lost
// notifications are never taken for none.
func TestTableEventsOverflowEnds(t *testing.T) {
	n := nettest.NewNS(t)
	var events <-chan nftBatch
	var closeEvents func()
	nettest.Do(t, n, func() (err error) { events, closeEvents, err = subscribeTables(4096); return err })
	t.Cleanup(closeEvents)
	nettest.Do(t, n, func() error {
		c, err := nftables.New()
		if err != nil {
			return err
		}
		table := c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: "kubenet-overflow"})
		if err := c.Flush(); err != nil {
			return err
		}
		for i := range 1000 { // the channel holds 64 batches, the socket a few
			c.AddChain(&nftables.Chain{Name: fmt.Sprint("c", i), Table: table})
			if err := c.Flush(); err != nil {
				return err
			}
		}
		return nil
	})
	var batches int
	for {
		select {
		case b, ok := <-events:
			if !ok {
				t.Fatalf("the subscription ended after %d batches without reporting a loss", batches)
			}
			if b.err != nil {
				if !errors.Is(b.err, unix.ENOBUFS) {
					t.Errorf("the subscription failed with %v, want ENOBUFS", b.err)
				}
				if _, ok := <-events; ok {
					t.Error("batches after the loss was reported")
				}
				return
			}
			batches++
		case <-time.After(10 * time.Second):
			t.Fatalf("neither a loss nor the end after %d of 1001 transactions", batches)
		}
	}
}
