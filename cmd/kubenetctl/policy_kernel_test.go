package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kubenet-dev/kubenet/agent/policy"
	"github.com/kubenet-dev/kubenet/core"
	"github.com/kubenet-dev/kubenet/internal/policyrules"
	"github.com/kubenet-dev/kubenet/netpol"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

// TestPolicyUnknownPod: a pod without an attachment on the node, or two addresses of none, is a
// failure (exit 1) naming it.
func TestPolicyUnknownPod(t *testing.T) {
	node := nettest.NewNS(t)
	dataDir := t.TempDir()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"policy", "explain", "ns/nope"}, `pod "ns/nope" has no attachment on this node`},
		{[]string{"policy", "trace", "ns/nope", "10.0.0.1", "80/tcp"}, `pod "ns/nope" has no attachment on this node`},
		{[]string{"policy", "trace", "10.0.0.2", "10.0.0.1", "80/tcp"}, "neither 10.0.0.2 nor 10.0.0.1 is a pod of this node"},
	} {
		var stdout, stderr bytes.Buffer
		args := append([]string{"--node-netns", node.Path(), "--kubenet-data-dir", dataDir}, c.args...)
		if code := run(args, &stdout, &stderr); code != exitFailed {
			t.Errorf("%q: exit %d, want 1 (stderr %q)", c.args, code, stderr.String())
		}
		if !strings.Contains(stderr.String(), c.want) {
			t.Errorf("%q: stderr %q, want it to say %q", c.args, stderr.String(), c.want)
		}
	}
}

// policyNode is a node namespace with a bridge and two pods' attachments (records and host
// veths), whose policies were installed by a policy pass as the agent makes it.
type policyNode struct {
	node    ns.NetNS
	dataDir string
	a, b    policyPod
}

type policyPod struct {
	name string
	addr netip.Addr
	port int
}

const policyNetwork, policyBridge = "kubenet", "cbr-pol"

func newPolicyNode(t *testing.T) *policyNode {
	t.Helper()
	n := &policyNode{node: nettest.NewNS(t), dataDir: t.TempDir(),
		a: policyPod{name: "ns/a", addr: netip.MustParseAddr("10.244.0.2")},
		b: policyPod{name: "ns/b", addr: netip.MustParseAddr("10.244.0.3")}}
	if err := os.Mkdir(filepath.Join(n.dataDir, policyNetwork), 0o755); err != nil {
		t.Fatal(err)
	}
	records := core.NewRecords(filepath.Join(n.dataDir, policyNetwork))
	nettest.Do(t, n.node, func() error {
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: policyBridge}}
		if err := netlink.LinkAdd(br); err != nil {
			return err
		}
		if err := netlink.AddrAdd(br, &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP("10.244.0.1"), Mask: net.CIDRMask(24, 32)}}); err != nil {
			return err
		}
		for i, p := range []*policyPod{&n.a, &n.b} {
			att := core.Attachment{ContainerID: fmt.Sprintf("%064d", i+1), IfName: "eth0", Pod: p.name}
			if err := records.Save(&core.Record{ContainerID: att.ContainerID, IfName: att.IfName, Pod: p.name, IPs: []netip.Prefix{netip.PrefixFrom(p.addr, 24)}}); err != nil {
				return err
			}
			host := core.NamesFor(policyNetwork, att).HostVeth
			if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: host, MasterIndex: br.Index}, PeerName: fmt.Sprintf("peer%d", i)}); err != nil {
				return err
			}
			l, err := netlink.LinkByName(host)
			if err != nil {
				return err
			}
			p.port = l.Attrs().Index
		}
		return nil
	})
	return n
}

// pass installs: b takes TCP 8080 from a (policy ns/allow-a); a sends nothing (ns/deny-out).
func (n *policyNode) pass(t *testing.T) {
	t.Helper()
	n.apply(t, func(locals []core.PolicyLocal) policyrules.Ruleset {
		var rs policyrules.Ruleset
		for _, l := range locals {
			p := policyrules.Pod{Port: l.Port, Name: l.Pod, IPs: []netip.Addr{l.IPs[0].Addr()}}
			switch l.Pod {
			case n.a.name:
				p.Egress = policyrules.Direction{Isolated: true, Policies: []string{"ns/deny-out"}}
			case n.b.name:
				p.Ingress = policyrules.Direction{Isolated: true, Policies: []string{"ns/allow-a"}, Allow: []policyrules.Entry{
					{Peer: policyrules.Single(n.a.addr), Ports: &policyrules.Ports{Protocol: policyrules.TCP, First: 8080, Last: 8080}}}}
			}
			rs.Pods = append(rs.Pods, p)
		}
		return rs
	})
}

// apply runs a policy pass as the agent does, with compile.
func (n *policyNode) apply(t *testing.T, compile func([]core.PolicyLocal) policyrules.Ruleset) {
	t.Helper()
	nettest.Do(t, n.node, func() error {
		_, err := core.ApplyPolicies(core.PolicyNetwork{DataDir: n.dataDir, Network: policyNetwork, Bridge: policyBridge}, compile)
		if err != nil && strings.Contains(err.Error(), "br_netfilter") {
			t.Skipf("this kernel: %v", err)
		}
		return err
	})
}

// TestPolicyExplainNamedPort: a policy whose port is a name, compiled by the agent's compiler
// and installed by a pass, reads back as the number the name resolved to, with the policy's
// name; --kubeconfig's comparison of the same objects finds it in sync.
func TestPolicyExplainNamedPort(t *testing.T) {
	n := newPolicyNode(t)
	in := allowFromA(intstr.FromString("http"))
	n.apply(t, func(locals []core.PolicyLocal) policyrules.Ruleset {
		in.Local = policy.LocalsOf(locals)
		return policy.Compile(in).Ruleset
	})
	expectLines(t, "explain ns/b", n.ctl(t, "policy", "explain", "ns/b"),
		"ingress: isolated by ns/allow-a (group in-", "allows from 10.244.0.2 tcp/8080", "egress: not isolated",
		"agent: the kernel holds what the agent's last pass installed")
	var v nodeView
	nettest.Do(t, n.node, func() (err error) {
		o := &options{dataDir: n.dataDir, network: policyNetwork, bridge: policyBridge}
		v, err = readNode(o)
		return err
	})
	l, err := v.pod("ns/b")
	if err != nil {
		t.Fatal(err)
	}
	if cmp := v.compareWithAPI(allowFromA(intstr.FromString("http")), nil, l); !cmp.InSync {
		t.Errorf("the objects the pass compiled, compared: %+v", cmp)
	}
	if cmp := v.compareWithAPI(allowFromA(intstr.FromInt32(8081)), nil, l); cmp.InSync || cmp.Ingress == nil ||
		len(cmp.Ingress.Missing) == 0 || cmp.Ingress.Missing[0] != (allowed{Peer: "10.244.0.2", Ports: "tcp/8081"}) {
		t.Errorf("the policy on another port, compared: %+v", cmp)
	}
}

func (n *policyNode) ctl(t *testing.T, args ...string) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	all := append([]string{"--node-netns", n.node.Path(), "--kubenet-data-dir", n.dataDir, "--kubenet-bridge", policyBridge}, args...)
	if code := run(all, &stdout, &stderr); code != exitOK {
		t.Fatalf("%q: exit %d: %s", args, code, stderr.String())
	}
	return stdout.String()
}

// words collapses runs of blanks (the tables' alignment) into one.
func words(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = strings.Join(strings.Fields(l), " ")
	}
	return strings.Join(lines, "\n")
}

func expectLines(t *testing.T, what, out string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(words(out), w) {
			t.Errorf("%s does not say %q:\n%s", what, w, out)
		}
	}
}

// TestPolicyExplainAndTrace: explain and trace read a pass back from the kernel with the
// agent's record of it: isolation, policies, allowed peers and ports, the deciding element or
// missing one; then say so when the kernel no longer holds what the pass installed (a pod
// held), and fall back to the kernel alone when the record is unreadable.
func TestPolicyExplainAndTrace(t *testing.T) {
	n := newPolicyNode(t)
	n.pass(t)
	out := n.ctl(t, "policy", "explain", "ns/b")
	expectLines(t, "explain ns/b", out,
		fmt.Sprintf("pod ns/b, port %d, addresses 10.244.0.3", n.b.port),
		"may send from: 10.244.0.3",
		"ingress: isolated by ns/allow-a (group in-",
		"allows from 10.244.0.2 tcp/8080",
		"egress: not isolated",
		"agent: the kernel holds what the agent's last pass installed (pass 1 at",
		"API: not compared")
	expectLines(t, "explain ns/a", n.ctl(t, "policy", "explain", "ns/a"),
		"egress: isolated by ns/deny-out (group out-", "allows nothing", "ingress: not isolated")

	out = n.ctl(t, "policy", "trace", "ns/a", "ns/b", "8080/tcp")
	expectLines(t, "trace a → b", out, "8080/tcp from ns/a (10.244.0.2) to ns/b (10.244.0.3): denied",
		"egress of ns/a (port", "denies: no element of group out-", "matches 10.244.0.3 tcp/8080: dropped by its last rule",
		"isolated for egress by ns/deny-out",
		"ingress of ns/b", "allows: group in-", "element 10.244.0.2 tcp/8080", "note: this judges a connection's first packet")
	expectLines(t, "trace b → a", n.ctl(t, "policy", "trace", "ns/b", "10.244.0.2", "9/udp"),
		"9/udp from ns/b (10.244.0.3) to 10.244.0.2 (10.244.0.2): allowed", "not isolated for egress", "not isolated for ingress")
	expectLines(t, "trace node → b", n.ctl(t, "policy", "trace", "10.244.0.1", "ns/b", "8080/tcp"),
		"8080/tcp from 10.244.0.1 (10.244.0.1) to ns/b (10.244.0.3): allowed", "the node's own packets reach every pod that is not held")
	expectLines(t, "trace outside → b", n.ctl(t, "policy", "trace", "192.0.2.1", "ns/b", "icmp"),
		"icmp from 192.0.2.1 (192.0.2.1) to ns/b (10.244.0.3): denied", "no element of group in-")

	var ans traceAnswer
	if err := json.Unmarshal([]byte(n.ctl(t, "policy", "trace", "10.244.0.2", "ns/b", "8080/tcp", "-o", "json")), &ans); err != nil {
		t.Fatal(err)
	}
	if ans.Allowed || len(ans.Steps) != 2 || ans.Steps[0].Pod != "ns/a" || ans.Steps[1].Element != "10.244.0.2 tcp/8080" {
		t.Errorf("trace -o json: %+v; want denied by a's egress, b's ingress element 10.244.0.2 tcp/8080", ans)
	}
	var e explanation
	if err := json.Unmarshal([]byte(n.ctl(t, "policy", "explain", "ns/b", "--json")), &e); err != nil {
		t.Fatal(err)
	}
	if e.Ingress.State != "isolated" || !slices.Equal(e.Ingress.Policies, []string{"ns/allow-a"}) || !e.Agent.Agrees ||
		len(e.Ingress.Allows) != 1 || e.Ingress.Allows[0] != (allowed{Peer: "10.244.0.2", Ports: "tcp/8080"}) {
		t.Errorf("explain --json: %+v", e)
	}

	// Behind the agent's back: b's ingress element goes. b is held; the record no longer speaks.
	nettest.Do(t, n.node, func() error {
		c, err := nftables.New()
		if err != nil {
			return err
		}
		m := &nftables.Set{Table: netpol.BridgeTable(policyNetwork), Name: netpol.MapIngress, IsMap: true, KeyType: nftables.TypeIFIndex, DataType: nftables.TypeVerdict}
		key := make([]byte, 4)
		binary.NativeEndian.PutUint32(key, uint32(n.b.port))
		if err := c.SetDeleteElements(m, []nftables.SetElement{{Key: key}}); err != nil {
			return err
		}
		return c.Flush()
	})
	expectLines(t, "explain ns/b held", n.ctl(t, "policy", "explain", "ns/b"),
		"ingress: held: no element in the dispatch map, denied everything",
		"agent: pending/changed since the agent's last pass: it installed ingress in-")
	expectLines(t, "trace a → b held", n.ctl(t, "policy", "trace", "ns/b", "ns/b", "8080/tcp"),
		fmt.Sprintf("port %d has no element in ingress-ports: held", n.b.port))

	// An unreadable record: the kernel alone speaks.
	file := filepath.Join(n.dataDir, policyNetwork, core.PolicyStateFile)
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/hostname", file); err != nil {
		t.Fatal(err)
	}
	expectLines(t, "explain ns/a, record a symlink", n.ctl(t, "policy", "explain", "ns/a"),
		"egress: isolated by policies unknown (no agreeing record of the agent)", "agent: the agent's record is unreadable, the kernel alone speaks", "not a regular file")
}
