//go:build kubenet_e2e_agent

package agent

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/google/nftables"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kubenet-dev/kubenet/agent/policy"
	"github.com/kubenet-dev/kubenet/core"
	"github.com/kubenet-dev/kubenet/netpol"
	"github.com/kubenet-dev/kubenet/test/nettest"
	"github.com/kubenet-dev/kubenet/test/testkit"
)

// The hostile-state faults of issue 24 ("broken state fails closed"): each breaks what the
// policies rest on — the policy tables, the agent, an attachment record, the Pod object, a pass
// half done, bridge netfilter — while a denied client hammers an isolated pod and the pod hammers
// the client back (egress denied too), and asserts that not one connection gets through from
// before the fault until after the repair. A friend the policy allows runs the same hammer as the
// control: it gets through wherever the policy is in force, so a silent hammer means denied, not
// broken.
//
// The pods: client (no policy selects it; every target's policy denies it), friend (allowed to
// and from every target) and targets (app=target, isolated both ways by isolate-targets).

const (
	faultNS   = "faults"
	faultPort = 7777
	// burstPolicies and burstPeers make the passes the agent is killed in: burstPolicies
	// policies created at once, each selecting the targets with burstPeers ipBlock peers per
	// direction, none of them a pod.
	burstPolicies = 50
	burstPeers    = 100
	// basePolicies is isolate-targets.
	basePolicies = 1
)

// faultBed is the cluster, node, agent and pods the faults share. Pods and agents live as long
// as the whole test (outer), not the subtest that starts them.
type faultBed struct {
	outer                  *testing.T
	api                    kubernetes.Interface
	n                      *simNode
	list                   *libcni.NetworkConfigList
	client, friend, target *faultPod
	attached               []*faultPod // in the order of their ADDs, without those deleted since
	pods, ticks            int         // pods made (their address numbers) and tick namespaces
}

// faultPod is a pod sandbox of the bed with its echo server on faultPort.
type faultPod struct {
	*nettest.Pod
	name  string
	addrs []netip.Addr
}

// at is the pod's echo server on each of its addresses.
func (p *faultPod) at() []netip.AddrPort {
	var out []netip.AddrPort
	for _, a := range p.addrs {
		out = append(out, netip.AddrPortFrom(a, faultPort))
	}
	return out
}

func newFaultBed(t *testing.T) *faultBed {
	u, cp, agentUser := startCluster(t)
	f := &faultBed{outer: t, api: cp.Admin}
	f.n = newSimNode(t, u, cp, "node-1", 1, agentUser)
	createNode(t, f.api, nodeObject(f.n.name, f.n.addrs, podCIDRs(1)))
	f.n.startAgent(t)
	expectReady(t, f.n)
	var err error
	if f.list, err = libcni.ConfListFromFile(f.n.confFile()); err != nil {
		t.Fatal(err)
	}
	friend := &metav1.LabelSelector{MatchLabels: map[string]string{"app": "friend"}}
	isolate := netpolOf(faultNS, "isolate-targets", networkingv1.NetworkPolicySpec{
		PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "target"}},
		PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
		Ingress:     []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: friend}}}},
		Egress:      []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{{PodSelector: friend}}}},
	})
	f.client = f.attach(t, "client", "client")
	if _, err := f.api.NetworkingV1().NetworkPolicies(faultNS).Create(context.Background(), isolate, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.friend = f.attach(t, "friend", "friend")
	f.target = f.attach(t, "target", "target")
	f.expectAllowed(t, f.target)
	return f
}

// prepare makes the pod object name (app=app, bound to the node) and its sandbox with an echo
// server listening, without attaching it.
func (f *faultBed) prepare(t *testing.T, name, app string) *faultPod {
	t.Helper()
	f.pods++
	createPod(t, f.api, faultNS, name, f.n.name, map[string]string{"app": app})
	addrs := []netip.Addr{netip.MustParseAddr(fmt.Sprintf("10.244.1.%d", 10+f.pods)), netip.MustParseAddr(fmt.Sprintf("fd00:10:244:1::%d", 10+f.pods))}
	p := &faultPod{Pod: npPod(f.outer, f.n, faultNS, name, addrs...), name: name, addrs: addrs}
	nettest.StartTCPEcho(f.outer, p.NS, netip.AddrPortFrom(netip.IPv6Unspecified(), faultPort))
	return p
}

// add runs the pod's ADD.
func (f *faultBed) add(p *faultPod) {
	f.n.cni.MustAdd(f.outer, f.list, p.Pod)
	f.attached = append(f.attached, p)
}

func (f *faultBed) attach(t *testing.T, name, app string) *faultPod {
	t.Helper()
	p := f.prepare(t, name, app)
	f.add(p)
	return p
}

// del runs the pod's DEL.
func (f *faultBed) del(t *testing.T, p *faultPod) {
	t.Helper()
	if err := f.n.cni.Del(f.list, p.Pod); err != nil {
		t.Fatalf("DEL %s: %v", p.name, err)
	}
	f.forget(p)
}

// forget takes p off the attached pods (its attachment is gone).
func (f *faultBed) forget(p *faultPod) {
	f.attached = slices.DeleteFunc(f.attached, func(q *faultPod) bool { return q == p })
}

// valid is the CNI GC list of the attached pods but skip.
func (f *faultBed) valid(skip *faultPod) []types.GCAttachment {
	var out []types.GCAttachment
	for _, p := range f.attached {
		if p != skip {
			out = append(out, types.GCAttachment{ContainerID: p.RT.ContainerID, IfName: p.RT.IfName})
		}
	}
	return out
}

// reach makes one connection from src to each address of dst.
func reach(src, dst *faultPod, timeout time.Duration) error {
	for _, a := range dst.at() {
		if _, err := nettest.TCPRequest(src.NS, a, "x", timeout); err != nil {
			return fmt.Errorf("%s → %s: %w", src.name, a, err)
		}
	}
	return nil
}

// reachable waits until src reaches dst.
func reachable(t *testing.T, timeout time.Duration, src, dst *faultPod) {
	t.Helper()
	if err := nettest.Eventually(timeout, func() error { return reach(src, dst, 200*time.Millisecond) }); err != nil {
		t.Fatalf("%v (for %v)", err, timeout)
	}
}

// expectAllowed waits until the friend and p reach each other (p's policies are in force).
func (f *faultBed) expectAllowed(t *testing.T, p *faultPod) {
	t.Helper()
	reachable(t, converge, f.friend, p)
	reachable(t, converge, p, f.friend)
}

// expectHeld waits until p's port has no policy elements.
func (f *faultBed) expectHeld(t *testing.T, timeout time.Duration, p *faultPod) {
	t.Helper()
	if err := nettest.Eventually(timeout, func() error {
		if !heldPod(t, f.n, p.Pod) {
			return fmt.Errorf("%s is not held", p.name)
		}
		return nil
	}); err != nil {
		t.Fatalf("%v for %v:\n%s", err, timeout, policyTable(t, f.n))
	}
}

// heldAfter checks a fault that must leave the target p held: with p released and the flows
// going, fault runs; p must be held within timeout — its guards deny even the friend — and stay
// held through the agent's next passes, and nothing denied may get through from before the
// fault to the end.
func (f *faultBed) heldAfter(t *testing.T, p *faultPod, timeout time.Duration, fault func() error) {
	t.Helper()
	f.expectAllowed(t, p)
	fl, before := newFlows(), newFlows()
	denied, allowed := f.deny(fl, p), f.allow(before, p)
	fl.warm(t)
	before.warm(t)
	start := time.Now()
	if err := fault(); err != nil {
		t.Fatal(err)
	}
	f.expectHeld(t, timeout, p)
	held := time.Since(start)
	expectThrough(t, before.halt(t, "before the fault"), allowed...)
	after := newFlows()
	heldFlows := f.allow(after, p)
	after.warm(t)
	f.afterPass(t)
	f.afterPass(t)
	if !heldPod(t, f.n, p.Pod) {
		t.Errorf("%s was released again", p.name)
	}
	expectShut(t, after.halt(t, "held"), heldFlows...)
	expectShut(t, fl.halt(t, "fault to the end"), denied...)
	t.Logf("%s held %v after the fault", p.name, held.Round(time.Millisecond))
}

// flows are hammers (startHammer) running at once, by name ("src → dst").
type flows struct {
	names []string
	h     map[string]*hammer
}

type flowCount struct{ attempts, successes int64 }

func newFlows() *flows { return &flows{h: map[string]*hammer{}} }

// start hammers dst's addresses from src and returns the flow's name.
func (fl *flows) start(src, dst *faultPod) string {
	name := src.name + " → " + dst.name
	fl.names = append(fl.names, name)
	fl.h[name] = startHammer(src.NS, dst.at()...)
	return name
}

// deny starts the flows p's policy denies: from the client and to it.
func (f *faultBed) deny(fl *flows, p *faultPod) []string {
	return []string{fl.start(f.client, p), fl.start(p, f.client)}
}

// allow starts the flows p's policy allows: from the friend and to it.
func (f *faultBed) allow(fl *flows, p *faultPod) []string {
	return []string{fl.start(f.friend, p), fl.start(p, f.friend)}
}

// warm waits until every flow has made an attempt: the window starts before the fault.
func (fl *flows) warm(t *testing.T) {
	t.Helper()
	if err := nettest.Eventually(10*time.Second, func() error {
		for _, name := range fl.names {
			if fl.h[name].attempts.Load() == 0 {
				return fmt.Errorf("%s has made no attempt", name)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// halt stops every flow and logs and returns their counts.
func (fl *flows) halt(t *testing.T, phase string) map[string]flowCount {
	t.Helper()
	out := map[string]flowCount{}
	for _, name := range fl.names {
		a, s := fl.h[name].halt()
		out[name] = flowCount{a, s}
		t.Logf("%s: %s: %d attempts, %d through", phase, name, a, s)
	}
	return out
}

// minAttempts is what a flow must have tried for its silence to mean anything.
const minAttempts = 20

// expectShut fails unless each named flow tried and nothing got through.
func expectShut(t *testing.T, c map[string]flowCount, names ...string) {
	t.Helper()
	for _, name := range names {
		switch got := c[name]; {
		case got.successes > 0:
			t.Errorf("OPEN: %s: %d of %d connections got through; want none", name, got.successes, got.attempts)
		case got.attempts < minAttempts:
			t.Errorf("%s made only %d attempts: not a tight loop", name, got.attempts)
		}
	}
}

// expectThrough fails unless each named flow got through (the control).
func expectThrough(t *testing.T, c map[string]flowCount, names ...string) {
	t.Helper()
	for _, name := range names {
		if c[name].successes == 0 {
			t.Errorf("control %s: none of %d connections got through; want some", name, c[name].attempts)
		}
	}
}

// policyState is the node's policy tables as the faults compare them.
type policyState struct {
	// listing is `nft list table` of both policy tables without the dispatch maps' elements
	// (interface indexes come and go with pods).
	listing string
	// chains is each attached pod's ingress and egress chain ("" for none: held).
	chains map[string][2]string
	// dispatched are the chains the dispatch maps send some port to.
	dispatched map[string]bool
}

var (
	// The dispatch maps, the pods' source sets and drop counters change as pods come and go (a
	// pod added while the agent is down, say); the rest of the listing must come back line for
	// line.
	dispatchMapLine = regexp.MustCompile(`^\s*(?:map (?:` + netpol.MapEgress + `|` + netpol.MapIngress + `)|set (?:` + netpol.SetSourcesIPv4 + `|` + netpol.SetSourcesIPv6 +
		`|` + netpol.SetDropsEgress + `|` + netpol.SetDropsIngress + `)) \{$`)
	groupName  = regexp.MustCompile(`^` + group + `$`)
	groupChain = regexp.MustCompile(`(?m)^\s*chain (` + group + `) \{$`)
	groupSet   = regexp.MustCompile(`(?m)^\s*set (` + group + `)-(?:any|ports)-ipv[46] \{$`)
	// A slot's sets (netpol names a group's sets g<N>-hosts-ipv4 and so on), where a chain looks
	// them up, and where a name is.
	slotSet    = regexp.MustCompile(`(?m)^\s*set (g[0-9]+-(?:hosts|points|any|ports)-ipv[46]) \{$`)
	slotLookup = regexp.MustCompile(`@(g[0-9]+)-`)
	slotName   = regexp.MustCompile(`\bg[0-9]+-`)
)

// group is how a group (an allow list's chain and sets) is named.
const group = `(?:in|out)-[0-9a-f]+`

func (f *faultBed) state() (policyState, error) {
	s := policyState{chains: map[string][2]string{}, dispatched: map[string]bool{}}
	all, err := policyTables(f.n)
	if err != nil {
		return s, err
	}
	var keep []string
	inMap := false
	for _, l := range strings.Split(all, "\n") {
		switch {
		case dispatchMapLine.MatchString(l):
			inMap = true
		case inMap && strings.TrimSpace(l) == "}":
			inMap = false
			continue
		}
		if !inMap {
			keep = append(keep, l)
		}
	}
	s.listing = bySlotUser(keep)
	var maps map[string]map[int]string
	err = f.n.ns.Do(func(ns.NetNS) error {
		maps, err = netpol.Dispatch("kubenet")
		return err
	})
	if err != nil {
		return s, err
	}
	for _, m := range maps {
		for _, chain := range m {
			s.dispatched[chain] = true
		}
	}
	for _, p := range f.attached {
		port, err := testkit.PolicyPort(f.n.ns, "kubenet", p.Pod)
		if err != nil {
			return s, err
		}
		s.chains[p.name] = [2]string{maps[netpol.MapIngress][port], maps[netpol.MapEgress][port]}
	}
	return s, nil
}

// bySlotUser joins the listing's lines with each slot (the g<N> of a group's sets) renamed after
// the group chain that looks its sets up: which slot a group gets depends on the order in which
// passes made groups (a pass killed after building some keeps them where they are), not on what
// the tables do. A slot no chain looks up keeps its number: an orphan.
func bySlotUser(lines []string) string {
	user := map[string]string{}
	chain := ""
	for _, l := range lines {
		if m := groupChain.FindStringSubmatch(l); m != nil {
			chain = m[1]
			continue
		}
		if strings.TrimSpace(l) == "}" {
			chain = ""
		}
		for _, m := range slotLookup.FindAllStringSubmatch(l, -1) {
			if chain != "" {
				user[m[1]] = chain
			}
		}
	}
	out := strings.Join(lines, "\n")
	return slotName.ReplaceAllStringFunc(out, func(name string) string {
		if c, ok := user[strings.TrimSuffix(name, "-")]; ok {
			return "slot-of-" + c + "-"
		}
		return name
	})
}

// orphans are the group chains no port is sent to and the group sets without their chain: what a
// pass that died half-way leaves until the next one.
func (s policyState) orphans() []string {
	var out []string
	chains := map[string]bool{}
	for _, m := range groupChain.FindAllStringSubmatch(s.listing, -1) {
		chains[m[1]] = true
		if !s.dispatched[m[1]] {
			out = append(out, "chain "+m[1])
		}
	}
	for _, m := range groupSet.FindAllStringSubmatch(s.listing, -1) {
		if !chains[m[1]] {
			out = append(out, "set of "+m[1])
		}
	}
	for _, m := range slotSet.FindAllStringSubmatch(s.listing, -1) {
		out = append(out, "set "+m[1]+" (no chain looks it up)") // bySlotUser renamed every set a chain looks up
	}
	return out
}

// within says what of s is missing from now: lines of its listing, pods' chains (pods attached
// since are not compared), and orphans of now.
func (s policyState) within(now policyState) error {
	lines := map[string]bool{}
	for _, l := range strings.Split(now.listing, "\n") {
		lines[l] = true
	}
	for _, l := range strings.Split(s.listing, "\n") {
		if !lines[l] {
			return fmt.Errorf("the policy tables lack %q", l)
		}
	}
	for pod, chains := range s.chains {
		if got, ok := now.chains[pod]; ok && got != chains {
			return fmt.Errorf("pod %s goes to %q, was %q", pod, got, chains)
		}
	}
	if o := now.orphans(); len(o) > 0 {
		return fmt.Errorf("orphans in the policy table: %v", o)
	}
	return nil
}

// whole waits until the tables hold everything of before.
func (f *faultBed) whole(t *testing.T, timeout time.Duration, before policyState) {
	t.Helper()
	if err := nettest.Eventually(timeout, func() error {
		now, err := f.state()
		if err != nil {
			return err
		}
		return before.within(now)
	}); err != nil {
		t.Fatalf("%v for %v", err, timeout)
	}
}

// groupChains are the names of the bridge policy table's group chains (netlink, no nft process:
// cheap enough to poll for the first group a pass makes).
func (f *faultBed) groupChains() (map[string]bool, error) {
	out := map[string]bool{}
	err := f.n.ns.Do(func(ns.NetNS) error {
		c, err := nftables.New()
		if err != nil {
			return err
		}
		chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyBridge)
		for _, ch := range chains {
			if ch.Table.Name == netpol.TableName("kubenet") && groupName.MatchString(ch.Name) {
				out[ch.Name] = true
			}
		}
		return err
	})
	return out, err
}

// passes is how many policy passes the running agent has finished.
func (f *faultBed) passes() (float64, error) {
	m, err := f.n.metrics()
	return m["kubenet_agent_network_policy_pass_seconds_count"], err
}

// afterPass makes the agent pass (a namespace created wakes it) and returns the state once a
// pass has finished since.
func (f *faultBed) afterPass(t *testing.T) policyState {
	t.Helper()
	var s policyState
	before, err := f.passes()
	if err != nil {
		t.Fatal(err)
	}
	f.ticks++
	tick := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("tick-%d", f.ticks)}}
	if _, err := f.api.CoreV1().Namespaces().Create(context.Background(), tick, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := nettest.WhileRunning(converge, func() error {
		now, err := f.passes()
		if err != nil || now <= before {
			return fmt.Errorf("no pass after the tick (%v)", err)
		}
		s, err = f.state()
		return err
	}, f.n.agent); err != nil {
		t.Fatal(err)
	}
	return s
}

// settle waits until the agent has seen policies policies and two passes in a row leave the
// same tables without orphans, and returns that state.
func (f *faultBed) settle(t *testing.T, policies int) policyState {
	t.Helper()
	if err := nettest.WhileRunning(converge, func() error {
		m, err := f.n.metrics()
		if err != nil {
			return err
		}
		if got := m["kubenet_agent_network_policies"]; got != float64(policies) {
			return fmt.Errorf("the agent's last pass saw %v policies, want %d", got, policies)
		}
		return nil
	}, f.n.agent); err != nil {
		t.Fatal(err)
	}
	s := f.afterPass(t)
	for range 10 {
		next := f.afterPass(t)
		if next.listing == s.listing && fmt.Sprint(next.chains) == fmt.Sprint(s.chains) && len(next.orphans()) == 0 {
			return next
		}
		s = next
	}
	t.Fatalf("the policy tables keep changing or hold orphans %v:\n%s", s.orphans(), s.listing)
	return s
}

// restartAgent starts the agent again after a kill and waits until it answers.
func (f *faultBed) restartAgent(t *testing.T) {
	t.Helper()
	f.n.startAgent(f.outer)
	if err := nettest.WhileRunning(converge, func() error { _, err := f.n.metrics(); return err }, f.n.agent); err != nil {
		t.Fatal(err)
	}
}

// TestAgentNetworkPolicyFaults breaks the state NetworkPolicy enforcement rests on, in every way
// issue 24 names, with kubenet-agent running against a real API server, and asserts "denied,
// never open" with the hammers of TestAgentNetworkPolicy: no connection of a denied flow gets
// through from before the fault until after the repair.
func TestAgentNetworkPolicyFaults(t *testing.T) {
	f := newFaultBed(t)
	ctx := context.Background()

	t.Run("nft flush ruleset while the agent runs", func(t *testing.T) {
		before := f.settle(t, basePolicies)
		fl := newFlows()
		denied, allowed := f.deny(fl, f.target), f.allow(fl, f.target)
		fl.warm(t)
		start := time.Now()
		nettest.Run(t, f.n.ns, "nft", "flush", "ruleset")
		// The healer sees the flush and wakes the policy controller: well before its resync.
		reachable(t, policy.DefaultResync/3, f.friend, f.target)
		back := time.Since(start)
		f.whole(t, policy.DefaultResync/3, before)
		whole := time.Since(start)
		time.Sleep(time.Second) // part of the window: the hammers go on after the repair
		c := fl.halt(t, "flush")
		expectShut(t, c, denied...)
		expectThrough(t, c, allowed...)
		t.Logf("after the flush: the allowed flow back in %v, the tables whole in %v (%v in all)",
			back.Round(time.Millisecond), whole.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	})

	for i, fault := range []struct {
		name string
		nft  []string
	}{
		{"nft flush ruleset", []string{"flush", "ruleset"}},
		{"nft delete table bridge " + netpol.TableName("kubenet"), []string{"delete", "table", "bridge", netpol.TableName("kubenet")}},
	} {
		t.Run(fault.name+" while the agent is down, and an ADD meanwhile", func(t *testing.T) {
			before := f.settle(t, basePolicies)
			fl := newFlows()
			denied := f.deny(fl, f.target)
			fl.warm(t)
			f.n.agent.Kill()
			start := time.Now()
			nettest.Run(t, f.n.ns, "nft", fault.nft...)
			// With the rules gone, the guards hold every pod: what the policy allows too.
			down := newFlows()
			heldWhileDown := f.allow(down, f.target)
			// A pod that no policy selects: open as soon as the agent knows it, held until then.
			late := f.prepare(t, fmt.Sprintf("late-%d", i), "other")
			heldWhileDown = append(heldWhileDown, down.start(f.client, late), down.start(late, f.client))
			down.warm(t)
			f.add(late)
			time.Sleep(3 * time.Second) // the agent stays down a while: part of the window
			if !heldPod(t, f.n, late.Pod) {
				t.Errorf("the pod added while the agent was down is not held")
			}
			c := down.halt(t, "agent down")
			expectShut(t, c, heldWhileDown...)

			restart := time.Now()
			f.restartAgent(t)
			after := newFlows()
			allowed := append(f.allow(after, f.target), after.start(f.client, late), after.start(late, f.client))
			reachable(t, converge, f.friend, f.target)
			back := time.Since(restart)
			reachable(t, converge, f.client, late)
			reachable(t, converge, late, f.client)
			lateBack := time.Since(restart)
			f.whole(t, converge, before)
			whole := time.Since(restart)
			time.Sleep(time.Second)
			expectShut(t, fl.halt(t, "fault to repair"), denied...)
			expectThrough(t, after.halt(t, "after the restart"), allowed...)
			t.Logf("down %v; after the restart: the allowed flow back in %v, the late pod released both ways in %v, the tables whole in %v",
				restart.Sub(start).Round(time.Millisecond), back.Round(time.Millisecond), lateBack.Round(time.Millisecond), whole.Round(time.Millisecond))
			f.del(t, late)
		})
	}

	recordOf := func(p *faultPod) string {
		return core.RecordPath(filepath.Join(f.n.cni.DataDir(), "kubenet"), testkit.AttachmentOf(p.Pod))
	}
	for _, damage := range []struct {
		name    string
		corrupt func(path string) error
		// then is what the node does with the attachment afterwards: DEL or GC.
		then string
	}{
		{"overwritten with garbage", func(path string) error {
			return os.WriteFile(path, []byte("\x00\xff{\"containerID\": garbage\n\x7f"), 0o644)
		}, "DEL"},
		{"truncated to nothing", func(path string) error { return os.Truncate(path, 0) }, "GC without it"},
		{"cut in half", func(path string) error {
			st, err := os.Stat(path)
			if err != nil {
				return err
			}
			return os.Truncate(path, st.Size()/2)
		}, "GC with it, then DEL"},
	} {
		t.Run("record "+damage.name, func(t *testing.T) {
			p := f.attach(t, "rec-"+strings.ReplaceAll(damage.name, " ", "-"), "target")
			// The record's change wakes the agent: well before its resync.
			f.heldAfter(t, p, policy.DefaultResync/3, func() error { return damage.corrupt(recordOf(p)) })

			att := testkit.AttachmentOf(p.Pod)
			switch damage.then {
			case "DEL":
				f.del(t, p)
			case "GC without it":
				if err := f.n.cni.GC(f.list, f.valid(p)); err != nil {
					t.Fatalf("GC: %v", err)
				}
				f.forget(p)
			case "GC with it, then DEL":
				if err := f.n.cni.GC(f.list, f.valid(nil)); err != nil {
					t.Fatalf("GC: %v", err)
				}
				if !testkit.LinkExists(t, f.n.ns, core.NamesFor("kubenet", att).HostVeth) || !heldPod(t, f.n, p.Pod) {
					t.Errorf("GC that lists the attachment did not leave it held in place")
				}
				if _, err := os.Stat(recordOf(p)); err != nil {
					t.Errorf("GC that lists the attachment removed its record: %v", err)
				}
				f.del(t, p)
			}
			testkit.AssertNoResidue(t, f.n.cni, "kubenet", att, p.addrs)
		})
	}

	t.Run("pod force-deleted while its sandbox runs", func(t *testing.T) {
		p := f.attach(t, "forced", "target")
		zero := int64(0)
		f.heldAfter(t, p, converge, func() error {
			return f.api.CoreV1().Pods(faultNS).Delete(ctx, p.name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
		})
		if m, err := f.n.metrics(); err != nil || m["kubenet_agent_network_policy_unknown_pods"] != 1 {
			t.Errorf("kubenet_agent_network_policy_unknown_pods = %v (%v), want 1", m["kubenet_agent_network_policy_unknown_pods"], err)
		}
		f.del(t, p)
	})

	t.Run("agent killed during passes", func(t *testing.T) {
		base := f.settle(t, basePolicies)
		burst := func() error {
			return parallel(8, burstPolicies, func(i int) error {
				_, err := f.api.NetworkingV1().NetworkPolicies(faultNS).Create(ctx, burstPolicy(i), metav1.CreateOptions{})
				return err
			})
		}
		unburst := func() error {
			return f.api.NetworkingV1().NetworkPolicies(faultNS).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: "fault=burst"})
		}
		// The state a clean pass leaves with the burst in place: what every restart must reach.
		fl := newFlows()
		denied, allowed := f.deny(fl, f.target), f.allow(fl, f.target)
		fl.warm(t)
		start := time.Now()
		if err := burst(); err != nil {
			t.Fatal(err)
		}
		withBurst := f.settle(t, basePolicies+burstPolicies)
		t.Logf("a clean pass over %d policies of %d peers each: settled in %v", burstPolicies, 2*burstPeers, time.Since(start).Round(time.Millisecond))
		if withBurst.chains[f.target.name] == base.chains[f.target.name] {
			t.Fatalf("the burst did not change the target's groups: %q", base.chains[f.target.name])
		}
		want := map[bool]policyState{false: base, true: withBurst}
		present := true
		left := 0
		// Each kill lands a while after the pass that follows the change has made its first new
		// group chain: between its transactions, before or after the map switch, or after it.
		for round, delay := range []time.Duration{0, 0, time.Millisecond, 3 * time.Millisecond, 10 * time.Millisecond, 30 * time.Millisecond, 100 * time.Millisecond, 300 * time.Millisecond} {
			change, what := unburst, "deleting"
			if !present {
				change, what = burst, "creating"
			}
			old, err := f.groupChains()
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- change() }()
			if err := nettest.Eventually(10*time.Second, func() error {
				now, err := f.groupChains()
				if err != nil {
					return err
				}
				for c := range now {
					if !old[c] {
						return nil
					}
				}
				return fmt.Errorf("no new group chain after %s the burst", what)
			}); err != nil {
				t.Fatal(err)
			}
			time.Sleep(delay) // the fault's timing: where in the pass the kill lands
			f.n.agent.Kill()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			present = !present
			killed, err := f.state()
			if err != nil {
				t.Fatal(err)
			}
			orphans := killed.orphans()
			if len(orphans) > 0 {
				left++
			}
			restart := time.Now()
			f.restartAgent(t)
			if err := nettest.WhileRunning(converge, func() error {
				now, err := f.state()
				if err != nil {
					return err
				}
				if err := want[present].within(now); err != nil {
					return err
				}
				return now.within(want[present])
			}, f.n.agent); err != nil {
				t.Fatalf("round %d: after the restart: %v", round, err)
			}
			consistent := time.Since(restart)
			got := f.settle(t, basePolicies+map[bool]int{false: 0, true: burstPolicies}[present])
			if err := want[present].within(got); err != nil {
				t.Errorf("round %d: after the restart's passes: %v", round, err)
			}
			if err := got.within(want[present]); err != nil {
				t.Errorf("round %d: after the restart's passes, more than a clean pass leaves: %v", round, err)
			}
			t.Logf("round %d: killed %v after the first new group chain while %s the burst: %d orphans left; as a clean pass leaves it %v after the restart",
				round, delay, what, len(orphans), consistent.Round(time.Millisecond))
		}
		c := fl.halt(t, "kills")
		expectShut(t, c, denied...)
		expectThrough(t, c, allowed...)
		t.Logf("%d of the kills left orphans (a pass cut between building its groups and removing the old ones)", left)
		if present {
			if err := unburst(); err != nil {
				t.Fatal(err)
			}
		}
	})

	t.Run("bridge netfilter turned off", func(t *testing.T) {
		const repaired = `kubenet_agent_network_policy_repairs_total{what="bridge_netfilter_call"}`
		f.settle(t, basePolicies) // no pass under way that would turn them on before the check below
		m, err := f.n.metrics()
		if err != nil {
			t.Fatal(err)
		}
		repairsBefore := m[repaired]
		fl := newFlows()
		denied, allowed := f.deny(fl, f.target), f.allow(fl, f.target)
		fl.warm(t)
		sysctls := []string{"net.bridge.bridge-nf-call-iptables", "net.bridge.bridge-nf-call-ip6tables"}
		for _, s := range sysctls {
			was := strings.TrimSpace(nettest.Run(t, f.n.ns, "sysctl", "-n", s))
			t.Cleanup(func() { nettest.Run(t, f.n.ns, "sysctl", "-qw", s+"="+was) })
			nettest.Run(t, f.n.ns, "sysctl", "-qw", s+"=0")
		}
		start := time.Now()
		nettest.Run(t, f.n.ns, "ip", "link", "set", core.DefaultBridge, "type", "bridge", "nf_call_iptables", "0", "nf_call_ip6tables", "0")
		on := func() error {
			out, err := nettest.Output(f.n.ns, "ip", "-d", "link", "show", core.DefaultBridge)
			if err != nil {
				return err
			}
			if !strings.Contains(out, "nf_call_iptables 1") || !strings.Contains(out, "nf_call_ip6tables 1") {
				return fmt.Errorf("the bridge's nf_call options are off:\n%s", out)
			}
			return nil
		}
		// No look at them off: the agent may have put them back already. Its repair counter
		// (checked below) says they were off.
		// The agent's healer sees the bridge change (a link event) and turns them back on at
		// once; its periodic pass and the policy resync (30 s) would be far beyond this bound.
		if err := nettest.WhileRunning(10*time.Second, on, f.n.agent); err != nil {
			t.Fatal(err)
		}
		back := time.Since(start)
		time.Sleep(time.Second)
		c := fl.halt(t, "bridge netfilter off")
		expectShut(t, c, denied...)
		expectThrough(t, c, allowed...)
		if m, err = f.n.metrics(); err != nil {
			t.Fatal(err)
		}
		if m[repaired] <= repairsBefore {
			t.Errorf("%s = %v, was %v: the repair is not counted", repaired, m[repaired], repairsBefore)
		}
		t.Logf("%s: %v, was %v", repaired, m[repaired], repairsBefore)
		for _, s := range sysctls {
			t.Logf("%s = %s (kubenet does not depend on it)", s, strings.TrimSpace(nettest.Run(t, f.n.ns, "sysctl", "-n", s)))
		}
		t.Logf("the bridge's nf_call options back on %v after they were turned off", back.Round(time.Millisecond))
	})
}

// burstPolicy is policy i of the burst: the targets may also talk to burstPeers single
// addresses of 172.16.i.0/24 and 2001:db8:i::/48 (none of them a pod) each way.
func burstPolicy(i int) *networkingv1.NetworkPolicy {
	var from, to []networkingv1.NetworkPolicyPeer
	for j := range burstPeers {
		from = append(from, networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: fmt.Sprintf("172.16.%d.%d/32", i, 2*j+1)}})
		to = append(to, networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: fmt.Sprintf("2001:db8:%x::%x/128", i, 2*j+1)}})
	}
	np := netpolOf(faultNS, fmt.Sprintf("burst-%02d", i), networkingv1.NetworkPolicySpec{
		PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "target"}},
		PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
		Ingress:     []networkingv1.NetworkPolicyIngressRule{{From: from}},
		Egress:      []networkingv1.NetworkPolicyEgressRule{{To: to}},
	})
	np.Labels = map[string]string{"fault": "burst"}
	return np
}
