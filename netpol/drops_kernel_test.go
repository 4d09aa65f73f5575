package netpol

import (
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"

	"github.com/kubenet-dev/kubenet/internal/policyrules"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

// dropKey names one drop counter: a port in a direction.
type dropKey struct {
	port    int
	ingress bool
}

// dropCounts reads the node's drop counters, by port and direction, and the rate-limited count.
func (n *bridgedNode) dropCounts(t *testing.T) (map[dropKey]policyrules.PortDrops, uint64) {
	t.Helper()
	out := map[dropKey]policyrules.PortDrops{}
	var limited uint64
	nettest.Do(t, n.node, func() error {
		ds, l, err := DropCounts(n.network)
		for _, d := range ds {
			out[dropKey{d.Port, d.Ingress}] = d
		}
		limited = l
		return err
	})
	return out, limited
}

var udp5353 = &policyrules.Ports{Protocol: policyrules.UDP, First: 5353, Last: 5353}

// dropsRuleset isolates a for ingress (only b, on UDP 5353) and c for egress (nothing allowed),
// but for the IPv6 link's own chatter, which would count as drops at moments no test controls
// (router solicitations and MLD reports of the pods' stacks, from link-local or unspecified
// sources to link-scope groups).
func (n *bridgedNode) dropsRuleset() policyrules.Ruleset {
	a, b, c := n.pods["a"], n.pods["b"], n.pods["c"]
	in := allowFrom(udp5353, b.v4, b.v6)
	in.Allow = append(in.Allow, policyrules.Entry{Peer: policyrules.PrefixRange(netip.MustParsePrefix("fe80::/10"))},
		policyrules.Entry{Peer: policyrules.Single(netip.IPv6Unspecified())})
	out := policyrules.Direction{Isolated: true, Allow: []policyrules.Entry{{Peer: policyrules.PrefixRange(netip.MustParsePrefix("ff00::/8"))}}}
	return with(with(n.open(), a.port, in, policyrules.Direction{}), c.port, policyrules.Direction{}, out)
}

// TestDropCounters: a packet a policy drops adds one to exactly its pod's counter in its
// direction (the sender's egress, or the receiver's ingress, bridged or routed in); an allowed
// one, and the node's own, add nothing. Counters exist only for isolated directions.
func TestDropCounters(t *testing.T) {
	n := newBridgedNode(t)
	a, b, c := n.pods["a"], n.pods["b"], n.pods["c"]
	n.apply(t, n.dropsRuleset(), Options{})
	have, _ := n.dropCounts(t)
	if len(have) != 2 || have[dropKey{a.port, true}].Pod != "a" || have[dropKey{c.port, false}].Pod != "c" {
		t.Fatalf("drop counters %v, want a's ingress and c's egress only", have)
	}
	tests := []struct {
		name string
		src  ns.NetNS
		dst  netip.Addr
		to   *testPod
		port int
		want bool     // delivered
		hit  *dropKey // the one counter that must grow by one
	}{
		{"b → a, allowed", b.ns, a.v4, a, 5353, true, nil},
		{"b → a over IPv6, allowed", b.ns, a.v6, a, 5353, true, nil},
		{"node → a", n.node, a.v4, a, 5353, true, nil},
		{"a → b, a not isolated for egress", a.ns, b.v4, b, 5353, true, nil},
		{"b → a on another port", b.ns, a.v4, a, 5354, false, &dropKey{a.port, true}},
		{"c → b, c's egress denies", c.ns, b.v4, b, 5353, false, &dropKey{c.port, false}},
		{"c → a, c's egress denies before a's ingress", c.ns, a.v4, a, 5353, false, &dropKey{c.port, false}},
		{"x → a, routed in", n.x, a.v4, a, 5353, false, &dropKey{a.port, true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before, _ := n.dropCounts(t)
			if tt.port == 5353 {
				n.expectUDP(t, tt.name, tt.src, tt.dst, tt.to, tt.want)
			} else {
				sendUDP(t, tt.src, tt.dst, tt.port, "other-port")
			}
			// The counter is written before the packet is dropped: when it grew, it is done.
			if tt.hit != nil {
				if err := nettest.Eventually(2*time.Second, func() error {
					if after, _ := n.dropCounts(t); after[*tt.hit].Packets == before[*tt.hit].Packets {
						return errors.New("no drop counted yet")
					}
					return nil
				}); err != nil {
					t.Errorf("%s: %v", tt.name, err)
				}
			}
			after, _ := n.dropCounts(t)
			for k, d := range after {
				want := before[k].Packets
				if tt.hit != nil && k == *tt.hit {
					want++
				}
				if d.Packets != want {
					t.Errorf("%s: counter of port %d (%s, ingress %v) went from %d to %d, want %d", tt.name, k.port, d.Pod, k.ingress, before[k].Packets, d.Packets, want)
				}
			}
		})
	}
}

// TestDropCountersFollowPorts: a counter comes and goes with its port's elements: a pod no longer
// isolated, forgotten (DEL) or gone from the ruleset leaves none (the residue audit's view), and
// a port index that comes back for another pod gets a new counter, not the old pod's count.
func TestDropCountersFollowPorts(t *testing.T) {
	n := newBridgedNode(t)
	a, b, c := n.pods["a"], n.pods["b"], n.pods["c"]
	rs := n.dropsRuleset()
	n.apply(t, rs, Options{})
	sendUDP(t, b.ns, a.v4, 5354, "denied")
	if err := nettest.Eventually(2*time.Second, func() error {
		if have, _ := n.dropCounts(t); have[dropKey{a.port, true}].Packets == 0 {
			return errors.New("a's drop not counted")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	// The same port, another pod (its name): a new counter.
	renamed := rs
	renamed.Pods = nil
	for _, p := range rs.Pods {
		if p.Port == a.port {
			p.Name = "a-again"
		}
		renamed.Pods = append(renamed.Pods, p)
	}
	n.apply(t, renamed, Options{})
	if have, _ := n.dropCounts(t); have[dropKey{a.port, true}].Pod != "a-again" || have[dropKey{a.port, true}].Packets != 0 {
		t.Errorf("port %d given to another pod: counter %+v, want a-again's, at 0", a.port, have[dropKey{a.port, true}])
	}

	// a no longer isolated: its counter goes with its group.
	n.apply(t, with(renamed, a.port, policyrules.Direction{}, policyrules.Direction{}), Options{})
	if have, _ := n.dropCounts(t); len(have) != 1 || have[dropKey{c.port, false}].Pod != "c" {
		t.Errorf("a not isolated: counters %v, want c's egress only", have)
	}
	// c forgotten by DEL: nothing of it stays.
	nettest.Do(t, n.node, func() error { return Forget(n.network, []int{c.port}) })
	if have, _ := n.dropCounts(t); len(have) != 0 {
		t.Errorf("after Forget of c: counters %v, want none", have)
	}
	n.apply(t, n.dropsRuleset(), Options{})
	n.apply(t, n.open(), Options{})
	if have, _ := n.dropCounts(t); len(have) != 0 {
		t.Errorf("no pod isolated: counters %v, want none", have)
	}
}

// logCollector reads the drop log in the node's namespace into a list.
type logCollector struct {
	mu    sync.Mutex
	drops []policyrules.Drop
	lost  uint64
	errs  []error
}

func (n *bridgedNode) readDropLog(t *testing.T, group uint16) *logCollector {
	t.Helper()
	r, err := OpenDropLog(group, int(n.node.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	lc := &logCollector{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			ds, lost, err := r.Read()
			lc.mu.Lock()
			lc.drops, lc.lost = append(lc.drops, ds...), lc.lost+lost
			if err != nil && !errors.Is(err, policyrules.ErrOverrun) {
				lc.mu.Unlock()
				return
			}
			if err != nil {
				lc.errs = append(lc.errs, err)
			}
			lc.mu.Unlock()
		}
	}()
	t.Cleanup(func() { _ = r.Close(); <-done })
	return lc
}

func (lc *logCollector) find(match func(policyrules.Drop) bool) (policyrules.Drop, int) {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	var found policyrules.Drop
	n := 0
	for _, d := range lc.drops {
		if match(d) {
			found, n = d, n+1
		}
	}
	return found, n
}

// TestDropLog: with logging on, a dropped packet reaches the reader (NFLOG from the bridge
// family: the payload starts at the IP header, the port is the physical device) with its
// direction, port, addresses, protocol and ports; an allowed one never does; off, the rules have
// no log action and nothing is sent; a flood is cut at the rate, the rest counted.
func TestDropLog(t *testing.T) {
	n := newBridgedNode(t)
	a, b, c := n.pods["a"], n.pods["b"], n.pods["c"]
	logOn := Options{Log: policyrules.DropLog{Group: 27, Rate: 20, Burst: 20}}
	n.apply(t, n.dropsRuleset(), logOn)
	lc := n.readDropLog(t, 27)

	n.expectUDP(t, "b → a allowed", b.ns, a.v4, a, true)
	tests := []struct {
		name     string
		src      ns.NetNS
		dst      netip.Addr
		port     int
		want     policyrules.Drop
		wantFrom netip.Addr
	}{
		{"b → a on another port (ingress)", b.ns, a.v4, 5354, policyrules.Drop{Ingress: true, Port: a.port, Src: b.v4, Dst: a.v4, Proto: unix.IPPROTO_UDP, DstPort: 5354}, b.v4},
		{"b → a over IPv6 on another port", b.ns, a.v6, 5355, policyrules.Drop{Ingress: true, Port: a.port, Src: b.v6, Dst: a.v6, Proto: unix.IPPROTO_UDP, DstPort: 5355}, b.v6},
		{"c → b (egress)", c.ns, b.v4, 5353, policyrules.Drop{Ingress: false, Port: c.port, Src: c.v4, Dst: b.v4, Proto: unix.IPPROTO_UDP, DstPort: 5353}, c.v4},
		{"x → a, routed in (ingress)", n.x, a.v4, 5356, policyrules.Drop{Ingress: true, Port: a.port, Src: x4, Dst: a.v4, Proto: unix.IPPROTO_UDP, DstPort: 5356}, x4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sendUDP(t, tt.src, tt.dst, tt.port, tt.name)
			match := func(d policyrules.Drop) bool {
				return d.Src == tt.want.Src && d.Dst == tt.want.Dst && d.DstPort == tt.want.DstPort
			}
			if err := nettest.Eventually(time.Second, func() error {
				if _, k := lc.find(match); k == 0 {
					return errors.New("not in the drop log within 1 s")
				}
				return nil
			}); err != nil {
				t.Fatalf("%s: %v", tt.name, err)
			}
			got, _ := lc.find(match)
			if got.Network != n.network || got.Ingress != tt.want.Ingress || got.Port != tt.want.Port || got.Proto != tt.want.Proto || got.SrcPort == 0 || time.Since(got.Time) > 5*time.Second {
				t.Errorf("%s: logged %+v, want %+v from network %s", tt.name, got, tt.want, n.network)
			}
		})
	}
	if _, k := lc.find(func(d policyrules.Drop) bool { return d.DstPort == 5353 && d.Dst == a.v4 && d.Src == b.v4 }); k != 0 {
		t.Errorf("an allowed datagram was logged")
	}

	// A flood: the log stays within the burst and the rate, the rest is counted as rate-limited,
	// and allowed traffic passes meanwhile.
	_, limitedBefore := n.dropCounts(t)
	_, before := lc.find(func(policyrules.Drop) bool { return true })
	start := time.Now()
	flood(t, c.ns, b.v4, 2000)
	n.expectUDP(t, "b → a allowed during the flood", b.ns, a.v4, a, true)
	took := time.Since(start)
	if err := nettest.Eventually(2*time.Second, func() error {
		if _, limited := n.dropCounts(t); limited-limitedBefore < 1000 {
			return fmt.Errorf("%d rate-limited, want most of 2000", limited-limitedBefore)
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
	// The egress limiter spent a token on c → b above; it had refilled at most partly.
	if err := nettest.Eventually(time.Second, func() error {
		if _, after := lc.find(func(policyrules.Drop) bool { return true }); after-before < 10 {
			return fmt.Errorf("flood of 2000 drops: %d logged, want about the burst (20)", after-before)
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
	_, after := lc.find(func(policyrules.Drop) bool { return true })
	if max := 20 + int(20*(time.Since(start).Seconds()+1)); after-before > max {
		t.Errorf("flood of 2000 drops: %d logged in %v, want at most %d (burst 20, 20/s)", after-before, took, max)
	}

	// Logging off: no log action in the rules, nothing reaches the reader.
	n.apply(t, n.dropsRuleset(), Options{})
	if out := nftOut(t, n.node, "list", "chain", "bridge", TableName(n.network), ChainDropEgress); strings.Contains(out, "log prefix") {
		t.Errorf("logging off, the drop chain still logs:\n%s", out)
	}
	_, logged := lc.find(func(policyrules.Drop) bool { return true })
	counted, _ := n.dropCounts(t)
	sendUDP(t, c.ns, b.v4, 5353, "unlogged")
	n.expectUDP(t, "b → a allowed, logging off", b.ns, a.v4, a, true)
	if after, _ := n.dropCounts(t); after[dropKey{c.port, false}].Packets != counted[dropKey{c.port, false}].Packets+1 {
		t.Errorf("logging off: c's drop not counted (%d, then %d)", counted[dropKey{c.port, false}].Packets, after[dropKey{c.port, false}].Packets)
	}
	// A logged drop is sent as it is dropped (queue threshold 1); half a second later none came.
	deadline := time.Now().Add(500 * time.Millisecond)
	for time.Now().Before(deadline) {
		if _, k := lc.find(func(policyrules.Drop) bool { return true }); k != logged {
			t.Fatalf("logging off: %d drops logged", k-logged)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// On again: the rules follow.
	n.apply(t, n.dropsRuleset(), logOn)
	if out := nftOut(t, n.node, "list", "chain", "bridge", TableName(n.network), ChainDropEgress); !strings.Contains(out, "group 27") {
		t.Errorf("logging on again, the drop chain does not log:\n%s", out)
	}
}

// flood sends count UDP datagrams from src to dst:5353 as fast as one socket can.
func flood(t *testing.T, src ns.NetNS, dst netip.Addr, count int) {
	t.Helper()
	nettest.Do(t, src, func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		to := &unix.SockaddrInet4{Port: 5353, Addr: dst.As4()}
		for i := range count {
			if err := unix.Sendto(fd, []byte(fmt.Sprint("flood-", i)), 0, to); err != nil && !errors.Is(err, unix.ENOBUFS) {
				return err
			}
		}
		return nil
	})
}

func nftOut(t *testing.T, n ns.NetNS, args ...string) string {
	t.Helper()
	var out []byte
	nettest.Do(t, n, func() (err error) {
		out, err = exec.Command("nft", args...).CombinedOutput()
		if err != nil {
			err = fmt.Errorf("nft %v: %w: %s", args, err, out)
		}
		return err
	})
	return string(out)
}

// TestDropLogLongNetworkName: a network name may have 128 bytes, the kernel's NFLOG prefix 127
// at most (ERANGE past it): with logging on, the policy tables of a network with the longest
// name are still written, and its drops still reach the reader under its LogNetwork name (the
// start of the name and a hash of it), which no other network's name gives.
func TestDropLogLongNetworkName(t *testing.T) {
	n := newBridgedNode(t)
	n.network = strings.Repeat("n", 128)
	a, b := n.pods["a"], n.pods["b"]
	n.apply(t, with(n.open(), a.port, policyrules.Direction{Isolated: true}, policyrules.Direction{}), Options{Log: policyrules.DropLog{Group: 30, Rate: 100, Burst: 100}})
	lc := n.readDropLog(t, 30)
	sendUDP(t, b.ns, a.v4, 5353, "long name")
	if err := nettest.Eventually(time.Second, func() error {
		if _, k := lc.find(func(d policyrules.Drop) bool { return d.Src == b.v4 && d.Network == LogNetwork(n.network) && d.Ingress }); k == 0 {
			return errors.New("b → a not in the drop log within 1 s")
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
	if other := strings.Repeat("n", 127) + "m"; LogNetwork(other) == LogNetwork(n.network) {
		t.Errorf("LogNetwork(%q) = LogNetwork(%q) = %q", other, n.network, LogNetwork(other))
	}
}
