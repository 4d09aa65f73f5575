package policy

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kubenet-dev/kubenet/internal/policyrules"
)

// Bounds of the drop log's aggregation: drops of the same pod, direction, peer, protocol and
// port within dropWindow make one line with their count; at most maxOpenBursts are being
// counted at a time (more are lost, and counted as lost): the agent's memory stays bounded
// whatever a hostile pod sends, and the kernel's rate limit bounds what arrives anyway.
const (
	dropWindow    = 500 * time.Millisecond
	maxOpenBursts = 4096
)

// dropNames is what the last pass knew of the node's pods: who is on each port, with the
// policies that isolate it, and the local pods' addresses.
type dropNames struct {
	ports map[int]dropPod
	addrs map[netip.Addr]string // "namespace/name"
}

type dropPod struct {
	name            string   // policyrules.Pod.Name: "namespace/name" or the attachment
	ingress, egress []string // the policies that isolate it in each direction
}

// namesOf takes the pods of a compiled ruleset.
func namesOf(rs policyrules.Ruleset) *dropNames {
	n := &dropNames{ports: make(map[int]dropPod, len(rs.Pods)), addrs: map[netip.Addr]string{}}
	for _, p := range rs.Pods {
		if p.Port > 0 {
			n.ports[p.Port] = dropPod{name: p.Name, ingress: p.Ingress.Policies, egress: p.Egress.Policies}
		}
		for _, a := range p.IPs {
			n.addrs[a.Unmap()] = p.Name
		}
	}
	return n
}

// splitPod splits "namespace/name"; a name without a namespace (an attachment that is no
// Kubernetes pod) is all pod.
func splitPod(name string) (namespace, pod string) {
	if ns, n, ok := strings.Cut(name, "/"); ok {
		return ns, n
	}
	return "", name
}

// dropReader is the network's drop log as the kernel hands it over (core.PolicyDropReader).
type dropReader interface {
	Read() ([]policyrules.Drop, uint64, error)
	Close() error
}

// dropLog turns the kernel's drop log into JSON lines, one per burst.
type dropLog struct {
	out     io.Writer
	network string // the drops of other networks' tables (another agent's) are not this log's
	node    string
	log     *slog.Logger
	names   func() *dropNames
	remote  func(netip.Addr) string // "namespace/name" of another node's pod by address; "" unknown
	lost    *dropLost
	lines   func() // counts a line written
	now     func() time.Time

	mu   sync.Mutex
	open map[burstKey]*burst
}

// dropLost counts the drops the log lost, by reason (read by the metrics' collector).
type dropLost struct {
	overrun, aggregation atomic.Uint64
}

type burstKey struct {
	ingress bool
	audit   bool
	port    int
	peer    netip.Addr
	proto   uint8
	dport   uint16
	icmp    int
}

type burst struct {
	first     policyrules.Drop
	firstSeen time.Time
	last      time.Time
	count     int
	names     *dropNames // who was who when the burst began
}

// run reads r until ctx ends (then closes it) and writes a line for every burst once its window
// is over.
func (l *dropLog) run(ctx context.Context, r dropReader) {
	l.open = map[burstKey]*burst{}
	stop := context.AfterFunc(ctx, func() { _ = r.Close() })
	defer stop()
	var flushing sync.WaitGroup
	flushing.Go(func() {
		tick := time.NewTicker(dropWindow / 4)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				l.flush(true)
				return
			case <-tick.C:
				l.flush(false)
			}
		}
	})
	defer flushing.Wait()
	for {
		ds, lost, err := r.Read()
		l.lost.overrun.Add(lost)
		switch {
		case errors.Is(err, policyrules.ErrOverrun):
			l.lost.overrun.Add(1) // at least one; the next message's sequence number tells the rest
		case err != nil:
			if ctx.Err() == nil {
				l.log.Error("network policy drop log: reading stopped", "err", err)
			}
			return
		}
		l.add(ds)
	}
}

// add counts drops into their bursts.
func (l *dropLog) add(ds []policyrules.Drop) {
	names, network := l.names(), l.network
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	for _, d := range ds {
		if d.Network != network {
			continue
		}
		k := burstKey{ingress: d.Ingress, audit: d.Audit, port: d.Port, proto: d.Proto, dport: d.DstPort, icmp: d.ICMPType, peer: d.Dst}
		if d.Ingress {
			k.peer = d.Src
		}
		if b, ok := l.open[k]; ok {
			b.count++
			b.last = d.Time
			continue
		}
		if len(l.open) >= maxOpenBursts {
			l.lost.aggregation.Add(1)
			continue
		}
		l.open[k] = &burst{first: d, firstSeen: now, last: d.Time, count: 1, names: names}
	}
}

// flush writes the bursts whose window is over (all with final).
func (l *dropLog) flush(final bool) {
	l.mu.Lock()
	var done []*burst
	now := l.now()
	for k, b := range l.open {
		if final || now.Sub(b.firstSeen) >= dropWindow {
			done = append(done, b)
			delete(l.open, k)
		}
	}
	l.mu.Unlock()
	slices.SortFunc(done, func(a, b *burst) int {
		return cmp.Or(a.first.Time.Compare(b.first.Time), cmp.Compare(a.first.Port, b.first.Port), a.first.Src.Compare(b.first.Src), a.first.Dst.Compare(b.first.Dst))
	})
	for _, b := range done {
		line, err := json.Marshal(l.line(b))
		if err != nil {
			continue
		}
		if _, err := l.out.Write(append(line, '\n')); err != nil {
			l.log.Warn("network policy drop log: write", "err", err)
			continue
		}
		l.lines()
	}
}

// dropLine is one line of the drop log.
type dropLine struct {
	Msg       string     `json:"msg"`
	Time      time.Time  `json:"time"`
	Last      *time.Time `json:"last,omitempty"` // the burst's last drop, when it has more than one
	Count     int        `json:"count"`
	Node      string     `json:"node,omitempty"`
	Direction string     `json:"direction"`
	// Verdict is "drop", or "would-drop": the pod's direction is isolated by staged (audit)
	// policies only, which would have dropped it; it passed.
	Verdict  string       `json:"verdict"`
	Src      dropEndpoint `json:"src"`
	Dst      dropEndpoint `json:"dst"`
	Protocol string       `json:"protocol"`
	Port     uint16       `json:"port,omitempty"`     // the destination port (TCP, UDP, SCTP)
	ICMPType *int         `json:"icmpType,omitempty"` // ICMP, ICMPv6
	// Policies are those that isolate the pod in the direction ("namespace/name"): none of
	// them allows the packet (would-drop: the staged ones).
	Policies []string `json:"policies"`
}

type dropEndpoint struct {
	IP        string `json:"ip"`
	Namespace string `json:"namespace,omitempty"`
	Pod       string `json:"pod,omitempty"`
}

// DropLogMsg is the msg field of every drop log line (the agent's other log lines have theirs).
const DropLogMsg = "networkpolicy drop"

func (l *dropLog) line(b *burst) dropLine {
	d := b.first
	out := dropLine{Msg: DropLogMsg, Time: d.Time.UTC(), Count: b.count, Node: l.node, Direction: "egress", Verdict: "drop",
		Protocol: protoName(d.Proto), Port: d.DstPort, Policies: []string{}}
	if d.Audit {
		out.Verdict = "would-drop"
	}
	if b.count > 1 {
		last := b.last.UTC()
		out.Last = &last
	}
	if d.ICMPType >= 0 {
		t := d.ICMPType
		out.ICMPType = &t
	}
	if d.Ingress {
		out.Direction = "ingress"
	}
	pod, known := b.names.ports[d.Port]
	if known {
		out.Policies = pod.egress
		if d.Ingress {
			out.Policies = pod.ingress
		}
		if out.Policies == nil {
			out.Policies = []string{}
		}
	}
	end := func(a netip.Addr, onPort bool) dropEndpoint {
		e := dropEndpoint{IP: a.String()}
		name := ""
		switch {
		case onPort && known:
			name = pod.name
		case b.names.addrs[a.Unmap()] != "":
			name = b.names.addrs[a.Unmap()]
		case l.remote != nil:
			name = l.remote(a.Unmap())
		}
		if name != "" {
			e.Namespace, e.Pod = splitPod(name)
		}
		return e
	}
	out.Src, out.Dst = end(d.Src, !d.Ingress), end(d.Dst, d.Ingress)
	return out
}

func protoName(p uint8) string {
	switch p {
	case 1:
		return "icmp"
	case 6:
		return "tcp"
	case 17:
		return "udp"
	case 58:
		return "icmpv6"
	case 132:
		return "sctp"
	}
	return "ip-proto-" + strconv.Itoa(int(p))
}
