package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"k8s.io/client-go/rest"

	"github.com/kubenet-dev/kubenet/core"
	"github.com/kubenet-dev/kubenet/internal/policyrules"
)

// This file is `kubenetctl policy explain` and `policy trace`: a pod's NetworkPolicy state and
// the verdict on a connection, read back from the node's kernel (core.InspectPolicies) and data dir,
// with the agent up or down. The agent's record of its last pass (core.PolicyStateFile) only
// adds the policies' names, and only where the kernel agrees with it.

// nodeView is what explain and trace read of the node.
type nodeView struct {
	locals    []core.PolicyLocal
	installed policyrules.Installed
	nodeAddrs []netip.Addr // the node's own addresses
	state     *core.PolicyState
	stateErr  error // the record could not be read: the kernel alone speaks
}

// readNode reads the attachment records with their ports and the installed policy state, in
// the node's network namespace (--node-netns), and the agent's record of its last pass.
func readNode(o *options) (nodeView, error) {
	var v nodeView
	read := func() error {
		in, err := core.InspectPolicies(o.dataDir, o.network, o.bridge)
		v.locals, v.nodeAddrs, v.installed = in.Locals, in.NodeAddrs, in.Installed
		return err
	}
	if o.nodeNetns == "" {
		if err := read(); err != nil {
			return v, err
		}
	} else {
		n, err := ns.GetNS(o.nodeNetns)
		if err != nil {
			return v, fmt.Errorf("--node-netns: %w", err)
		}
		defer n.Close()
		if err := n.Do(func(ns.NetNS) error { return read() }); err != nil {
			return v, err
		}
	}
	v.state, v.stateErr = core.ReadPolicyState(o.dataDir, o.network)
	return v, nil
}

// parsePodName reads NAMESPACE/POD.
func parsePodName(what, s string) (string, error) {
	ns, name, ok := strings.Cut(s, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return "", usagef("%s %q: want NAMESPACE/POD", what, s)
	}
	return s, nil
}

// pod finds the attachment of a pod ("namespace/name") on this node.
func (v nodeView) pod(name string) (core.PolicyLocal, error) {
	for _, l := range v.locals {
		if l.Pod == name {
			return l, nil
		}
	}
	return core.PolicyLocal{}, fmt.Errorf("pod %q has no attachment on this node (%d attachments recorded)", name, len(v.locals))
}

// addrs are a local's addresses as the policies see them: its record's and its link-local one.
func addrs(l core.PolicyLocal) []netip.Addr {
	var out []netip.Addr
	for _, p := range l.IPs {
		out = append(out, p.Addr().Unmap())
	}
	if l.LinkLocal.IsValid() {
		out = append(out, l.LinkLocal)
	}
	return out
}

// recorded is the agent's record of a port, when it has one.
func (v nodeView) recorded(port int) (core.PolicyStatePod, bool) {
	if v.state == nil {
		return core.PolicyStatePod{}, false
	}
	i := slices.IndexFunc(v.state.Pods, func(p core.PolicyStatePod) bool { return p.Port == port })
	if i < 0 {
		return core.PolicyStatePod{}, false
	}
	return v.state.Pods[i], true
}

// recordedPolicies are the policies the agent's record names for a direction of a pod's port,
// where the record is of that pod and the kernel's chain is the one it installed: a record of
// another pod on the port (a stale or planted file) or of another chain names nothing.
func (v nodeView) recordedPolicies(port int, pod string, ingress bool, chain string) []string {
	rec, ok := v.recorded(port)
	if !ok || rec.Pod != pod || chain == "" {
		return nil
	}
	d := rec.Egress
	if ingress {
		d = rec.Ingress
	}
	if d.Chain != chain {
		return nil
	}
	return d.Policies
}

// explanation is explain's answer (its JSON form too).
type explanation struct {
	Pod       string       `json:"pod"`
	Port      int          `json:"port"`
	Addresses []netip.Addr `json:"addresses"`
	// Sources are the addresses the kernel lets the pod's port send from.
	Sources []netip.Addr         `json:"sources"`
	Tables  bool                 `json:"tables"`
	Damage  []string             `json:"damage,omitempty"`
	Ingress directionExplanation `json:"ingress"`
	Egress  directionExplanation `json:"egress"`
	// Agent says what the agent's record of its last pass adds, or why it adds nothing.
	Agent agentRecord `json:"agent"`
	// API says whether the kernel holds what the API's objects mean now (with --kubeconfig).
	API apiComparison `json:"api"`
}

type directionExplanation struct {
	// State is "held", "not isolated" or "isolated".
	State string `json:"state"`
	Chain string `json:"chain,omitempty"`
	// Policies isolate the pod in the direction (from the agent's record, when it agrees with
	// the kernel).
	Policies []string `json:"policies,omitempty"`
	// Audit: only staged policies isolate the pod here; nothing is enforced, what Allows does
	// not hold passes (counted as what they would drop).
	Audit bool `json:"audit,omitempty"`
	// Allows are the group's entries as the kernel holds them.
	Allows []allowed `json:"allows,omitempty"`
	Damage []string  `json:"damage,omitempty"`
	// Refused is why the agent's last pass did not install this direction's allow list.
	Refused string `json:"refused,omitempty"`
}

type allowed struct {
	Peer  string `json:"peer"`
	Ports string `json:"ports"` // "any": every protocol and port
}

type agentRecord struct {
	Generation uint64    `json:"generation,omitempty"`
	Written    time.Time `json:"written,omitzero"`
	// Agrees says the kernel holds the chains the agent's last pass installed for the pod.
	Agrees bool   `json:"agrees"`
	Note   string `json:"note"`
}

func runPolicyExplain(in *invocation) error {
	name, err := parsePodName("NAMESPACE/POD", in.args[0])
	if err != nil {
		return err
	}
	var kube *rest.Config
	if in.o.kubeconfig != "" {
		if kube, err = loadKubeconfig(in.o.kubeconfig); err != nil {
			return err
		}
	}
	v, err := readNode(in.o)
	if err != nil {
		return err
	}
	l, err := v.pod(name)
	if err != nil {
		return err
	}
	e := v.explain(l)
	e.API = notCompared
	if kube != nil {
		apiIn, err := fetchAPIInput(kube)
		if err != nil {
			return err
		}
		cidrs, err := nodePodCIDRs(in.o)
		if err != nil {
			return err
		}
		e.API = v.compareWithAPI(apiIn, cidrs, l)
	}
	if in.o.asJSON() {
		return json.NewEncoder(in.stdout).Encode(e)
	}
	return e.print(in.stdout)
}

// explain reads one pod's state out of the view.
func (v nodeView) explain(l core.PolicyLocal) explanation {
	e := explanation{Pod: l.Pod, Port: l.Port, Addresses: addrs(l), Tables: v.installed.Tables, Damage: v.installed.Damage}
	ip := v.installed.Ports[l.Port]
	e.Sources = ip.Sources
	rec, hasRec := v.recorded(l.Port)
	switch {
	case v.stateErr != nil:
		e.Agent.Note = "the agent's record is unreadable, the kernel alone speaks: " + v.stateErr.Error()
	case v.state == nil:
		e.Agent.Note = "the agent has recorded no pass: the kernel alone speaks (policy names unknown)"
	case !hasRec || rec.Pod != l.Pod:
		e.Agent.Note = "the agent's last pass did not know this pod's port: pending (policy names unknown)"
	default:
		e.Agent.Generation, e.Agent.Written = v.state.Generation, v.state.Written
		e.Agent.Agrees = rec.Ingress.Chain == ip.Ingress && rec.Egress.Chain == ip.Egress
		if e.Agent.Agrees {
			e.Agent.Note = "the kernel holds what the agent's last pass installed"
		} else {
			e.Agent.Note = fmt.Sprintf("pending/changed since the agent's last pass: it installed ingress %s, egress %s; the kernel has ingress %s, egress %s",
				chainName(rec.Ingress.Chain), chainName(rec.Egress.Chain), chainName(ip.Ingress), chainName(ip.Egress))
		}
	}
	e.Ingress = v.direction(l.Port, ip.Ingress, policyrules.AllowIngress, rec.Ingress, e.Agent.Agrees)
	e.Egress = v.direction(l.Port, ip.Egress, policyrules.AllowEgress, rec.Egress, e.Agent.Agrees)
	return e
}

func chainName(c string) string {
	if c == "" {
		return "none (held)"
	}
	return c
}

func (v nodeView) direction(port int, chain, open string, rec core.PolicyStateDirection, trusted bool) directionExplanation {
	d := directionExplanation{Chain: chain}
	if trusted {
		d.Refused = rec.Refused
	}
	switch {
	case port <= 0:
		d.State = "held: its veth is not a port of the bridge (being set up or torn down)"
	case chain == "":
		d.State = "held: no element in the dispatch map, denied everything"
	case chain == open:
		d.State = "not isolated"
	default:
		d.State = "isolated"
		if trusted {
			d.Policies = rec.Policies
		}
		g, ok := v.installed.Groups[chain]
		if !ok {
			d.Damage = []string{"its group is not in the kernel"}
			break
		}
		d.Damage, d.Audit = g.Damage, g.Audit
		for _, e := range g.Entries {
			d.Allows = append(d.Allows, allowedOf(e))
		}
	}
	return d
}

func (e explanation) print(w io.Writer) error {
	fmt.Fprintf(w, "pod %s, port %d, addresses %s\n", e.Pod, e.Port, joinAddrs(e.Addresses))
	if !e.Tables {
		fmt.Fprintln(w, "no policy tables on this node: every guarded pod is denied everything (NetworkPolicy off, or the agent never ran)")
	}
	for _, d := range e.Damage {
		fmt.Fprintln(w, "damaged (the agent's next pass repairs it):", d)
	}
	fmt.Fprintf(w, "may send from: %s\n", joinAddrs(e.Sources))
	for _, dir := range []struct {
		name string
		d    directionExplanation
	}{{"ingress", e.Ingress}, {"egress", e.Egress}} {
		fmt.Fprintf(w, "%s: %s", dir.name, dir.d.State)
		if dir.d.State == "isolated" {
			policies := "policies unknown (no agreeing record of the agent)"
			if len(dir.d.Policies) > 0 {
				policies = strings.Join(dir.d.Policies, ", ")
			}
			fmt.Fprintf(w, " by %s (group %s)", policies, dir.d.Chain)
			if dir.d.Audit {
				fmt.Fprint(w, ", audit only: staged policies, nothing enforced; what they would drop passes")
			}
		}
		fmt.Fprintln(w)
		if dir.d.Refused != "" {
			fmt.Fprintln(w, "  not installed by the agent's last pass (kept what it had, or denied):", dir.d.Refused)
		}
		for _, d := range dir.d.Damage {
			fmt.Fprintln(w, "  damaged:", d)
		}
		if dir.d.State == "isolated" {
			peer := "from"
			if dir.name == "egress" {
				peer = "to"
			}
			if len(dir.d.Allows) == 0 {
				fmt.Fprintf(w, "  allows nothing\n")
			}
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			for _, a := range dir.d.Allows {
				ports := a.Ports
				if ports == "any" {
					ports = "every protocol and port"
				}
				fmt.Fprintf(tw, "  allows %s\t%s\t%s\n", peer, a.Peer, ports)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
		}
	}
	agent := e.Agent.Note
	if e.Agent.Generation > 0 {
		agent = fmt.Sprintf("%s (pass %d at %s)", agent, e.Agent.Generation, e.Agent.Written.Format(time.RFC3339))
	}
	fmt.Fprintln(w, "agent:", agent)
	e.API.print(w)
	return nil
}

func joinAddrs(as []netip.Addr) string {
	if len(as) == 0 {
		return "none"
	}
	s := make([]string, len(as))
	for i, a := range as {
		s[i] = a.String()
	}
	return strings.Join(s, ", ")
}

// endpoint is one end of a traced connection: a pod of this node, or an address.
type endpoint struct {
	arg  string
	pod  *core.PolicyLocal
	addr netip.Addr
}

// parseEndpoint reads SRC or DST: NAMESPACE/POD or an address.
func parseEndpoint(what, s string) (endpoint, error) {
	if a, err := netip.ParseAddr(s); err == nil {
		if a.Zone() != "" {
			return endpoint{}, usagef("%s %q: an address without a zone", what, s)
		}
		return endpoint{arg: s, addr: a.Unmap()}, nil
	}
	if !strings.Contains(s, "/") {
		return endpoint{}, usagef("%s %q: want NAMESPACE/POD or an IP address", what, s)
	}
	if _, err := netip.ParsePrefix(s); err == nil {
		return endpoint{}, usagef("%s %q: a prefix, want one address or NAMESPACE/POD", what, s)
	}
	if _, err := parsePodName(what, s); err != nil {
		return endpoint{}, err
	}
	return endpoint{arg: s}, nil
}

// parsePortProto reads PORT/PROTO (8080/tcp, 53/udp) or a protocol without ports (icmp).
func parsePortProto(s string) (uint8, uint16, error) {
	portStr, protoStr, hasPort := strings.Cut(s, "/")
	if !hasPort {
		if _, err := strconv.Atoi(s); err == nil {
			return 0, 0, usagef("PORT/PROTO %q: want the protocol too (%s/tcp)", s, s)
		}
		protoStr = s
	}
	proto, err := policyrules.ParseProtocol(protoStr)
	if err != nil {
		return 0, 0, usagef("PORT/PROTO %q: %v", s, err)
	}
	withPorts := proto == policyrules.TCP || proto == policyrules.UDP || proto == policyrules.SCTP
	if !withPorts {
		if hasPort {
			return 0, 0, usagef("PORT/PROTO %q: %s has no ports, give it alone (%s)", s, protoStr, protoStr)
		}
		return proto, 0, nil
	}
	if !hasPort {
		return 0, 0, usagef("PORT/PROTO %q: %s needs a port (8080/%s)", s, protoStr, protoStr)
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil || port == 0 {
		return 0, 0, usagef("PORT/PROTO %q: port %q is not a number from 1 to 65535", s, portStr)
	}
	return proto, uint16(port), nil
}

// traceAnswer is trace's answer (its JSON form too).
type traceAnswer struct {
	From     string      `json:"from"`
	To       string      `json:"to"`
	Src      netip.Addr  `json:"src"`
	Dst      netip.Addr  `json:"dst"`
	Protocol string      `json:"protocol"`
	Allowed  bool        `json:"allowed"`
	Steps    []traceStep `json:"steps"`
	Note     string      `json:"note"`
}

type traceStep struct {
	Direction string   `json:"direction"`
	Pod       string   `json:"pod"`
	Port      int      `json:"port"`
	Allowed   bool     `json:"allowed"`
	Chain     string   `json:"chain,omitempty"`
	Element   string   `json:"element,omitempty"`
	Reason    string   `json:"reason"`
	Policies  []string `json:"policies,omitempty"`
	Damage    []string `json:"damage,omitempty"`
}

const establishedNote = "this judges a connection's first packet; its replies pass on conntrack's state (each group's first rule), " +
	"and a connection conntrack already knows keeps passing after a policy change"

func runPolicyTrace(in *invocation) error {
	src, err := parseEndpoint("SRC", in.args[0])
	if err != nil {
		return err
	}
	dst, err := parseEndpoint("DST", in.args[1])
	if err != nil {
		return err
	}
	proto, port, err := parsePortProto(in.args[2])
	if err != nil {
		return err
	}
	v, err := readNode(in.o)
	if err != nil {
		return err
	}
	for _, e := range []*endpoint{&src, &dst} {
		if err := v.resolve(e); err != nil {
			return err
		}
	}
	if err := pickAddrs(&src, &dst); err != nil {
		return err
	}
	if src.pod == nil && dst.pod == nil {
		return fmt.Errorf("neither %s nor %s is a pod of this node: its policies judge neither", src.arg, dst.arg)
	}
	portOf := func(e endpoint) int {
		if e.pod == nil {
			return 0
		}
		return max(e.pod.Port, 0)
	}
	if (src.pod != nil && src.pod.Port <= 0) || (dst.pod != nil && dst.pod.Port <= 0) {
		return fmt.Errorf("%s: its veth is not a port of the bridge (being set up or torn down): held, denied", firstUnplugged(src, dst))
	}
	fromNode := src.pod == nil && slices.Contains(v.nodeAddrs, src.addr)
	verdict, err := v.installed.Trace(policyrules.Packet{Src: src.addr, Dst: dst.addr, Protocol: proto, Port: port, FromNode: fromNode}, portOf(src), portOf(dst))
	if err != nil {
		return err
	}
	ans := traceAnswer{From: src.arg, To: dst.arg, Src: src.addr, Dst: dst.addr, Protocol: protoString(proto, port), Allowed: verdict.Allowed, Note: establishedNote}
	for _, s := range verdict.Steps {
		e := src
		if s.Ingress {
			e = dst
		}
		st := traceStep{Direction: "egress", Pod: e.pod.Pod, Port: s.Port, Allowed: s.Allowed, Chain: s.Chain, Reason: s.Reason, Damage: s.Damage}
		if s.Ingress {
			st.Direction = "ingress"
		}
		if s.Match != nil {
			st.Element = s.Match.Peer.String()
			if s.Match.Ports != nil {
				st.Element += " " + s.Match.Ports.String()
			}
		}
		st.Policies = v.recordedPolicies(s.Port, e.pod.Pod, s.Ingress, s.Chain)
		ans.Steps = append(ans.Steps, st)
	}
	if in.o.asJSON() {
		return json.NewEncoder(in.stdout).Encode(ans)
	}
	return ans.print(in.stdout)
}

func firstUnplugged(src, dst endpoint) string {
	if src.pod != nil && src.pod.Port <= 0 {
		return src.arg
	}
	return dst.arg
}

func protoString(proto uint8, port uint16) string {
	if port == 0 {
		return policyrules.ProtocolName(proto)
	}
	return fmt.Sprintf("%d/%s", port, policyrules.ProtocolName(proto))
}

// resolve finds a pod's attachment, or the local pod an address belongs to.
func (v nodeView) resolve(e *endpoint) error {
	if !e.addr.IsValid() {
		l, err := v.pod(e.arg)
		if err != nil {
			return err
		}
		e.pod = &l
		return nil
	}
	for i, l := range v.locals {
		if slices.Contains(addrs(l), e.addr) {
			e.pod = &v.locals[i]
			return nil
		}
	}
	return nil
}

// pickAddrs chooses the address of a pod end: of the other end's family when that is an
// address, else IPv4 when both pods have one, else IPv6.
func pickAddrs(src, dst *endpoint) error {
	families := []bool{false, true} // is6
	switch {
	case src.addr.IsValid():
		families = []bool{src.addr.Is6()}
	case dst.addr.IsValid():
		families = []bool{dst.addr.Is6()}
	}
	for _, is6 := range families {
		s, okS := familyAddr(*src, is6)
		d, okD := familyAddr(*dst, is6)
		if okS && okD {
			src.addr, dst.addr = s, d
			return nil
		}
	}
	return fmt.Errorf("%s and %s have no address of one family in common", src.arg, dst.arg)
}

func familyAddr(e endpoint, is6 bool) (netip.Addr, bool) {
	if e.addr.IsValid() {
		return e.addr, e.addr.Is6() == is6
	}
	for _, a := range addrs(*e.pod) {
		if a.Is6() == is6 && !a.IsLinkLocalUnicast() {
			return a, true
		}
	}
	return netip.Addr{}, false
}

func (a traceAnswer) print(w io.Writer) error {
	verdict := "denied"
	if a.Allowed {
		verdict = "allowed"
	}
	fmt.Fprintf(w, "%s from %s (%s) to %s (%s): %s\n", a.Protocol, a.From, a.Src, a.To, a.Dst, verdict)
	for _, s := range a.Steps {
		v := "denies"
		if s.Allowed {
			v = "allows"
		}
		fmt.Fprintf(w, "  %s of %s (port %d) %s: %s\n", s.Direction, s.Pod, s.Port, v, s.Reason)
		if len(s.Policies) > 0 {
			fmt.Fprintf(w, "    isolated for %s by %s\n", s.Direction, strings.Join(s.Policies, ", "))
		}
		for _, d := range s.Damage {
			fmt.Fprintln(w, "    damaged group, the kernel may judge otherwise:", d)
		}
	}
	_, err := fmt.Fprintln(w, "note:", a.Note)
	return err
}
