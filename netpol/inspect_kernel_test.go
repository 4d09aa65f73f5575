package netpol

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/kubenet-dev/kubenet/internal/policyrules"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

func (n *bridgedNode) inspect(t *testing.T) policyrules.Installed {
	t.Helper()
	var in policyrules.Installed
	nettest.Do(t, n.node, func() (err error) { in, err = Inspect(n.network); return err })
	return in
}

func rangeOf(first, last string) policyrules.Range {
	return policyrules.Range{First: netip.MustParseAddr(first), Last: netip.MustParseAddr(last)}
}

// inspectRuleset has groups with single ports and port ranges (overlapping ones, which the
// sets cut), address ranges, both families, and entries on every protocol (ICMP included): a
// allows b TCP 8080-8081 and the node's pod range UDP 5353 and x TCP 9000; b takes TCP 8080
// from a, UDP 5353 from a's IPv4 address, anything from x and from a v6 range, and TCP 8000-8100
// and 8080-9000 from overlapping ranges; c sends nothing.
func (n *bridgedNode) inspectRuleset() policyrules.Ruleset {
	a, b, c := n.pods["a"], n.pods["b"], n.pods["c"]
	tcp := func(first, last uint16) *policyrules.Ports {
		return &policyrules.Ports{Protocol: policyrules.TCP, First: first, Last: last}
	}
	udp := &policyrules.Ports{Protocol: policyrules.UDP, First: 5353, Last: 5353}
	egress := policyrules.Direction{Isolated: true, Policies: []string{"ns/a-out"}, Allow: []policyrules.Entry{
		{Peer: policyrules.Single(b.v4), Ports: tcp(8080, 8081)},
		{Peer: policyrules.Single(b.v6), Ports: tcp(8080, 8081)},
		{Peer: rangeOf("10.3.0.0", "10.3.0.255"), Ports: udp},
		{Peer: policyrules.Single(x4), Ports: tcp(9000, 9000)},
	}}
	ingress := policyrules.Direction{Isolated: true, Policies: []string{"ns/b-in", "ns/b-more"}, Allow: []policyrules.Entry{
		{Peer: policyrules.Single(a.v4), Ports: tcp(8080, 8080)},
		{Peer: policyrules.Single(a.v6), Ports: tcp(8080, 8080)},
		{Peer: policyrules.Single(a.v4), Ports: udp},
		{Peer: policyrules.Single(x4)},
		{Peer: rangeOf("fd00:5::", "fd00:5::ffff")},
		{Peer: rangeOf("10.9.0.0", "10.9.0.127"), Ports: tcp(8000, 8100)},
		{Peer: rangeOf("10.9.0.64", "10.9.0.255"), Ports: tcp(8080, 9000)},
	}}
	rs := with(n.open(), a.port, policyrules.Direction{}, egress)
	rs = with(rs, b.port, ingress, policyrules.Direction{})
	return with(rs, c.port, policyrules.Direction{}, policyrules.Direction{Isolated: true})
}

// TestInspectRoundTrip: what Inspect reads back is what Apply installed: every port's chains
// (those Apply reported), its source addresses, every group's entries as the canonical form of
// the allow list it was made from, and no damage; then damage done behind Apply's back shows.
func TestInspectRoundTrip(t *testing.T) {
	n := newBridgedNode(t)
	rs := n.inspectRuleset()
	res := n.apply(t, rs, Options{})
	in := n.inspect(t)
	if !in.Tables || len(in.Damage) != 0 {
		t.Fatalf("tables %v, damage %v: want the tables, undamaged", in.Tables, in.Damage)
	}
	for _, p := range rs.Pods {
		got := in.Ports[p.Port]
		if want := res.Dispatch[p.Port]; got.Egress != want.Egress || got.Ingress != want.Ingress {
			t.Errorf("%s: egress %q ingress %q, Apply made %+v", p.Name, got.Egress, got.Ingress, want)
		}
		if !sameAddrs(got.Sources, p.IPs) {
			t.Errorf("%s: sources %v, want %v", p.Name, got.Sources, p.IPs)
		}
		for _, d := range []struct {
			chain string
			dir   policyrules.Direction
		}{{got.Egress, p.Egress}, {got.Ingress, p.Ingress}} {
			if !d.dir.Isolated {
				if d.chain != ChainAllowEgress && d.chain != ChainAllowIngress {
					t.Errorf("%s: not isolated, but goes to %q", p.Name, d.chain)
				}
				continue
			}
			g, ok := in.Groups[d.chain]
			if !ok {
				t.Fatalf("%s: group %q not read back (groups %v)", p.Name, d.chain, slices.Collect(maps.Keys(in.Groups)))
			}
			name, want, ok := GroupFor(g.Ingress, g.Audit, d.dir.Allow)
			if !ok || name != d.chain || !slices.EqualFunc(g.Entries, want, policyrules.Entry.Equal) {
				t.Errorf("%s group %s: entries\n%v\nwant %s (%v)\n%v", p.Name, d.chain, g.Entries, name, ok, want)
			}
			if len(g.Damage) != 0 {
				t.Errorf("%s group %s: damage %v on a group Apply just wrote", p.Name, d.chain, g.Damage)
			}
		}
	}
	if len(in.Groups) != 3 {
		t.Errorf("%d groups read back, want 3 (a's egress, b's ingress, c's empty egress)", len(in.Groups))
	}
	// The ranges' cuts are there as the kernel holds them: the overlapping TCP ranges of b's
	// ingress are three disjoint boxes; the pods' addresses on one port (points) and on every
	// port (hosts) are elements of their own, not cut into the boxes.
	bIn := in.Groups[in.Ports[n.pods["b"].port].Ingress]
	for _, want := range []string{"10.9.0.0-10.9.0.127 tcp/8000-8079", "10.9.0.0-10.9.0.255 tcp/8080-8100", "10.9.0.64-10.9.0.255 tcp/8101-9000", "10.4.0.2", "fd00:5::-fd00:5::ffff",
		"10.3.0.2 tcp/8080", "10.3.0.2 udp/5353", "fd00:3::2 tcp/8080"} {
		if !slices.ContainsFunc(bIn.Entries, func(e policyrules.Entry) bool { return strings.TrimSpace(e.Peer.String()+" "+portsString(e)) == want }) {
			t.Errorf("b's ingress %v: no entry %q", bIn.Entries, want)
		}
	}

	// Damage: an element of b's group removed, a's map element removed.
	bSet := n.groupSet(t, bIn.Name, "-points-ipv4")
	nettest.Do(t, n.node, func() error {
		c, err := nftables.New()
		if err != nil {
			return err
		}
		set := &nftables.Set{Table: BridgeTable(n.network), Name: bSet}
		els, err := c.GetSetElements(set)
		if err != nil || len(els) == 0 {
			return fmt.Errorf("elements of %s: %v, %v", set.Name, els, err)
		}
		if err := c.SetDeleteElements(set, els[:1]); err != nil {
			return err
		}
		m := &nftables.Set{Table: BridgeTable(n.network), Name: MapEgress, IsMap: true, KeyType: nftables.TypeIFIndex, DataType: nftables.TypeVerdict}
		if err := c.SetDeleteElements(m, []nftables.SetElement{{Key: portKey(n.pods["a"].port)}}); err != nil {
			return err
		}
		return c.Flush()
	})
	in = n.inspect(t)
	if got := in.Groups[bIn.Name].Damage; len(got) != 1 || !strings.Contains(got[0], "do not hold the allow list its name stands for") {
		t.Errorf("b's group with an element gone: damage %v, want it said", got)
	}
	if got := in.Ports[n.pods["a"].port]; got.Egress != "" || got.Ingress != ChainAllowIngress {
		t.Errorf("a without its egress element: %+v, want egress held", got)
	}
	nftIn(t, n.node, "flush", "chain", "bridge", TableName(n.network), ChainForward)
	if in = n.inspect(t); len(in.Damage) != 1 || !strings.Contains(in.Damage[0], "chain forward") {
		t.Errorf("forward chain flushed: damage %v, want it named", in.Damage)
	}
}

func portsString(e policyrules.Entry) string {
	if e.Ports == nil {
		return ""
	}
	return e.Ports.String()
}

func sameAddrs(a, b []netip.Addr) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.SortFunc(a, netip.Addr.Compare)
	slices.SortFunc(b, netip.Addr.Compare)
	return slices.Equal(a, b)
}

// TestTraceMatchesTraffic: for a table of connections between the pods, an outside host and a
// held pod, Trace's verdict on what Inspect read back is what real traffic does, and is the
// verdict the ruleset means.
func TestTraceMatchesTraffic(t *testing.T) {
	n := newBridgedNode(t)
	a, b := n.pods["a"], n.pods["b"]
	nettest.StartTCPEcho(t, b.ns, netip.AddrPortFrom(netip.IPv6Unspecified(), 8081))
	n.apply(t, n.inspectRuleset(), Options{})
	d := n.addPod(t, "d", 5, 5) // after the apply: held
	in := n.inspect(t)
	type end struct {
		pod  *testPod // nil: the outside host x, or the node
		addr netip.Addr
		node bool
	}
	pod := func(p *testPod, a netip.Addr) end { return end{pod: p, addr: a} }
	xAt := end{addr: x4}
	xAt6 := end{addr: netip.MustParseAddr("fd00:4::2")}
	nodeAt := end{addr: gw4.Addr(), node: true}
	cases := []struct {
		name     string
		src, dst end
		proto    uint8
		port     uint16
		want     bool
	}{
		{"a → b v4 tcp/8080", pod(a, a.v4), pod(b, b.v4), policyrules.TCP, 8080, true},
		{"a → b v6 tcp/8080", pod(a, a.v6), pod(b, b.v6), policyrules.TCP, 8080, true},
		{"a → b tcp/8081: b's ingress", pod(a, a.v4), pod(b, b.v4), policyrules.TCP, 8081, false},
		{"a → b udp/5353", pod(a, a.v4), pod(b, b.v4), policyrules.UDP, 5353, true},
		{"a → b v6 udp/5353: a's egress", pod(a, a.v6), pod(b, b.v6), policyrules.UDP, 5353, false},
		{"a → c tcp/8080: a's egress", pod(a, a.v4), pod(n.pods["c"], n.pods["c"].v4), policyrules.TCP, 8080, false},
		{"a → x tcp/9000", pod(a, a.v4), xAt, policyrules.TCP, 9000, true},
		{"x → b tcp/8080 (every port from x)", xAt, pod(b, b.v4), policyrules.TCP, 8080, true},
		{"x → b tcp/8081 (every port from x)", xAt, pod(b, b.v4), policyrules.TCP, 8081, true},
		{"x → b v6 tcp/8080", xAt6, pod(b, b.v6), policyrules.TCP, 8080, false},
		{"c → b: c's egress", pod(n.pods["c"], n.pods["c"].v4), pod(b, b.v4), policyrules.TCP, 8080, false},
		{"b → a: open both ways", pod(b, b.v4), pod(a, a.v4), policyrules.TCP, 8080, true},
		{"x → a v6: a's ingress is open", xAt6, pod(a, a.v6), policyrules.TCP, 8080, true},
		{"b → d: d is held", pod(b, b.v4), pod(d, d.v4), policyrules.TCP, 8080, false},
		{"node → b: the node's packets pass b's ingress", nodeAt, pod(b, b.v4), policyrules.TCP, 8080, true},
		{"node → d: not to a held pod", nodeAt, pod(d, d.v4), policyrules.TCP, 8080, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srcPort, dstPort := 0, 0
			if c.src.pod != nil {
				srcPort = c.src.pod.port
			}
			if c.dst.pod != nil {
				dstPort = c.dst.pod.port
			}
			v, err := in.Trace(policyrules.Packet{Src: c.src.addr, Dst: c.dst.addr, Protocol: c.proto, Port: c.port, FromNode: c.src.node}, srcPort, dstPort)
			if err != nil {
				t.Fatal(err)
			}
			if v.Allowed != c.want {
				t.Errorf("trace says allowed %v, the ruleset means %v: %+v", v.Allowed, c.want, v.Steps)
			}
			from := n.x
			switch {
			case c.src.pod != nil:
				from = c.src.pod.ns
			case c.src.node:
				from = n.node
			}
			switch c.proto {
			case policyrules.TCP:
				if err := tcpReach(from, c.dst.addr, c.port, v.Allowed); err != nil {
					t.Errorf("traffic disagrees with trace (allowed %v: %+v): %v", v.Allowed, v.Steps, err)
				}
			case policyrules.UDP:
				n.expectUDP(t, c.name, from, c.dst.addr, c.dst.pod, v.Allowed)
			}
		})
	}
}

// TestInspectSeesTamperedVerdicts: another tool changes one verdict of the policy tables so
// that an enforced direction passes what it should drop, or an audit one (staged policies)
// drops what it should pass: the log rule of a drop or audit chain (with logging on, a rate
// rule and a log rule sit between the count and the verdict, and each ends in the chain's
// verdict), or a group's last rule (goto drop-ingress or goto audit-ingress). The traffic shows
// the change took; Inspect must report it as damage (explain trusts what it calls undamaged),
// and the agent's next Apply, without Verify, puts the verdict back.
func TestInspectSeesTamperedVerdicts(t *testing.T) {
	logOn := Options{Log: policyrules.DropLog{Group: 29, Rate: 100, Burst: 100}}
	enforced := func(n *bridgedNode) policyrules.Ruleset {
		return with(n.open(), n.pods["a"].port, policyrules.Direction{Isolated: true}, policyrules.Direction{})
	}
	staged := func(n *bridgedNode) policyrules.Ruleset {
		return with(n.open(), n.pods["a"].port, policyrules.Direction{Isolated: true, Audit: true}, policyrules.Direction{})
	}
	logRule := func(rules []*nftables.Rule) int { return 2 }
	lastRule := func(rules []*nftables.Rule) int { return len(rules) - 1 }
	fixedChain := func(name string) func(policyrules.Installed, *bridgedNode) string {
		return func(policyrules.Installed, *bridgedNode) string { return name }
	}
	aGroup := func(in policyrules.Installed, n *bridgedNode) string { return in.Ports[n.pods["a"].port].Ingress }
	tests := []struct {
		name    string
		ruleset func(n *bridgedNode) policyrules.Ruleset
		chain   func(policyrules.Installed, *bridgedNode) string
		rule    func([]*nftables.Rule) int
		// what the rule does after the tampering, after its first expression (log) or instead
		// of all (a group's goto)
		verdict []expr.Any
		keep    int
		// b → a on UDP 5353 with the tables as Apply wrote them; tampered, the other
		want bool
	}{
		{"drop chain's log rule grants", enforced, fixedChain(ChainDropIngress), logRule, grant(MarkIngress), 1, false},
		{"audit chain's log rule drops", staged, fixedChain(ChainAuditIngress), logRule, []expr.Any{&expr.Verdict{Kind: expr.VerdictDrop}}, 1, true},
		{"enforced group goes to the audit chain", enforced, aGroup, lastRule, []expr.Any{&expr.Verdict{Kind: expr.VerdictGoto, Chain: ChainAuditIngress}}, 0, false},
		{"audit group goes to the drop chain", staged, aGroup, lastRule, []expr.Any{&expr.Verdict{Kind: expr.VerdictGoto, Chain: ChainDropIngress}}, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := newBridgedNode(t)
			a, b := n.pods["a"], n.pods["b"]
			rs := tt.ruleset(n)
			n.apply(t, rs, logOn)
			n.expectUDP(t, "as written", b.ns, a.v4, a, tt.want)
			in := n.inspect(t)
			if len(in.Damage) != 0 {
				t.Fatalf("as written: damage %v", in.Damage)
			}
			chain := tt.chain(in, n)
			nettest.Do(t, n.node, func() error {
				c, err := nftables.New()
				if err != nil {
					return err
				}
				rules, err := c.GetRules(BridgeTable(n.network), &nftables.Chain{Table: BridgeTable(n.network), Name: chain})
				if err != nil {
					return err
				}
				if len(rules) < 3 {
					return fmt.Errorf("chain %s: %d rules", chain, len(rules))
				}
				r := rules[tt.rule(rules)]
				r.Exprs = append(slices.Clone(r.Exprs[:tt.keep]), tt.verdict...)
				c.ReplaceRule(r)
				return c.Flush()
			})
			n.expectUDP(t, "tampered", b.ns, a.v4, a, !tt.want)
			in = n.inspect(t)
			damage := slices.Clone(in.Damage)
			for _, g := range in.Groups {
				damage = append(damage, g.Damage...)
			}
			if !slices.ContainsFunc(in.Damage, func(d string) bool { return strings.Contains(d, "chain "+chain) }) && len(in.Groups[chain].Damage) == 0 {
				t.Errorf("chain %s tampered with: damage %v, want it named", chain, damage)
			}
			n.apply(t, rs, logOn)
			n.expectUDP(t, "applied again", b.ns, a.v4, a, tt.want)
			if in := n.inspect(t); len(in.Damage) != 0 || len(in.Groups[chain].Damage) != 0 {
				t.Errorf("applied again: damage %v, group %v", in.Damage, in.Groups[chain].Damage)
			}
		})
	}
}

// TestGroupForNamesWhatApplyMakes: the name GroupFor gives a direction's list is the chain the
// port's map element goes to, for an enforced and for an audit (staged) direction alike: explain
// compares the API's objects with the kernel by it, and a wrong name says "pending" of an audit
// pod the kernel holds as the API means it.
func TestGroupForNamesWhatApplyMakes(t *testing.T) {
	n := newBridgedNode(t)
	a, b := n.pods["a"], n.pods["b"]
	allow := []policyrules.Entry{{Peer: policyrules.Single(b.v4), Ports: &policyrules.Ports{Protocol: policyrules.TCP, First: 8080, Last: 8080}}}
	for _, audit := range []bool{false, true} {
		dir := policyrules.Direction{Isolated: true, Audit: audit, Allow: allow}
		res := n.apply(t, with(n.open(), a.port, dir, dir), Options{})
		for _, ingress := range []bool{false, true} {
			chain := res.Dispatch[a.port].Egress
			if ingress {
				chain = res.Dispatch[a.port].Ingress
			}
			if name, _, ok := GroupFor(ingress, audit, allow); !ok || name != chain {
				t.Errorf("audit %v, ingress %v: GroupFor names %q (%v), Apply made %q", audit, ingress, name, ok, chain)
			}
		}
	}
}
