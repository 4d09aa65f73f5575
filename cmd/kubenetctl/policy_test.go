package main

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"github.com/kubenet-dev/kubenet/core"
)

// TestPolicyArgumentErrors: a bad NAMESPACE/POD, SRC, DST or PORT/PROTO is bad usage (exit 2)
// naming the value, found before anything is read.
func TestPolicyArgumentErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"policy"}, `unknown command "policy"`},
		{[]string{"policy", "explain"}, "policy explain needs NAMESPACE/POD, got 0"},
		{[]string{"policy", "explain", "web"}, `NAMESPACE/POD "web": want NAMESPACE/POD`},
		{[]string{"policy", "explain", "ns/a/b"}, `NAMESPACE/POD "ns/a/b"`},
		{[]string{"policy", "explain", "ns/a", "-o", "yaml"}, `-o "yaml": want text or json`},
		{[]string{"policy", "explain", "ns/a", "--all"}, "policy explain does not take --all"},
		{[]string{"policy", "explain", "ns/a", "--kubeconfig", "/nonexistent/kubeconfig"}, `--kubeconfig "/nonexistent/kubeconfig"`},
		{[]string{"policy", "trace", "ns/a", "ns/b", "80/tcp", "--kubeconfig", "/x"}, "policy trace does not take --kubeconfig"},
		{[]string{"policy", "trace", "ns/a", "ns/b"}, "policy trace needs SRC DST PORT/PROTO, got 2"},
		{[]string{"policy", "trace", "ns/a", "ns/b", "80"}, `PORT/PROTO "80": want the protocol too (80/tcp)`},
		{[]string{"policy", "trace", "ns/a", "ns/b", "80/tcpx"}, `protocol "tcpx"`},
		{[]string{"policy", "trace", "ns/a", "ns/b", "0/tcp"}, `PORT/PROTO "0/tcp": port "0" is not a number from 1 to 65535`},
		{[]string{"policy", "trace", "ns/a", "ns/b", "70000/udp"}, `port "70000"`},
		{[]string{"policy", "trace", "ns/a", "ns/b", "tcp"}, `PORT/PROTO "tcp": tcp needs a port`},
		{[]string{"policy", "trace", "ns/a", "ns/b", "8/icmp"}, `PORT/PROTO "8/icmp": icmp has no ports`},
		{[]string{"policy", "trace", "10.0.0.0/8", "ns/b", "80/tcp"}, `SRC "10.0.0.0/8": a prefix`},
		{[]string{"policy", "trace", "ns/a", "fe80::1%eth0", "80/tcp"}, `DST "fe80::1%eth0": an address without a zone`},
		{[]string{"policy", "trace", "ns/a", "10.0.0.300", "80/tcp"}, `DST "10.0.0.300": want NAMESPACE/POD or an IP address`},
		{[]string{"policy", "trace", "/a", "ns/b", "80/tcp"}, `SRC "/a": want NAMESPACE/POD`},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(c.args, &stdout, &stderr); code != exitUsage {
			t.Errorf("%q: exit %d, want 2 (stderr %q)", c.args, code, stderr.String())
		}
		if lines := strings.Count(stderr.String(), "\n"); lines != 1 || !strings.Contains(stderr.String(), c.want) {
			t.Errorf("%q: stderr %q, want one line saying %q", c.args, stderr.String(), c.want)
		}
	}

}

// TestRecordedPolicies: trace names a step's policies from the agent's record only where the
// record is of the same pod on the port, in the same chain, as explain does: a port whose
// record names another pod (a stale or planted kubenet-policy.json; groups are shared across
// namespaces, so the chain alone proves nothing) names no policies.
func TestRecordedPolicies(t *testing.T) {
	v := nodeView{state: &core.PolicyState{Pods: []core.PolicyStatePod{
		{Port: 7, Pod: "other/old", Ingress: core.PolicyStateDirection{Isolated: true, Chain: "in-00", Policies: []string{"other/deny"}}},
		{Port: 8, Pod: "shop/web", Egress: core.PolicyStateDirection{Isolated: true, Chain: "out-01", Policies: []string{"shop/egress"}}},
	}}}
	for _, tt := range []struct {
		name    string
		port    int
		pod     string
		ingress bool
		chain   string
		want    []string
	}{
		{"the record's pod and chain", 8, "shop/web", false, "out-01", []string{"shop/egress"}},
		{"another chain in the kernel", 8, "shop/web", false, "out-02", nil},
		{"the other direction", 8, "shop/web", true, "out-01", nil},
		{"another pod on the port, same chain", 7, "shop/new", true, "in-00", nil},
		{"no record of the port", 9, "shop/web", true, "in-00", nil},
		{"held", 8, "shop/web", false, "", nil},
	} {
		if got := v.recordedPolicies(tt.port, tt.pod, tt.ingress, tt.chain); !slices.Equal(got, tt.want) {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
}
