package policy

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/client-go/tools/record"

	"github.com/kubenet-dev/kubenet/internal/policyrules"
)

// TestReportRefused: a refused allow list becomes one Event on each policy that selects its pods
// in its direction (not on the others), recorded once while it stays refused and again when it
// comes back; only the kernel's refusals ask for a retry.
func TestReportRefused(t *testing.T) {
	in := testInput()
	in.Policies = []*networkingv1.NetworkPolicy{
		np("a", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "server")}), // ingress of a/server
		np("a", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "server"), PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}}),
		np("a", networkingv1.NetworkPolicySpec{PodSelector: *sel("app", "client")}), // another pod
		np("b", networkingv1.NetworkPolicySpec{}),                                   // another namespace
	}
	for i, p := range in.Policies {
		p.Name = fmt.Sprint("p", i)
	}
	tooBig := policyrules.Refusal{Ingress: true, Pods: []string{"a/server"}, Group: "in-x", Cost: 300000, Err: fmt.Errorf("%w: its sets would cost too much", policyrules.ErrTooBig)}
	byKernel := policyrules.Refusal{Ingress: false, Pods: []string{"a/server"}, Group: "out-y", Err: errors.New("netlink receive: cannot allocate memory")}

	events := record.NewFakeRecorder(10)
	c := &Controller{cfg: Config{NodeName: "n1"}, log: slog.New(slog.DiscardHandler), events: events, reported: map[string]bool{}}
	recorded := func() []string {
		var out []string
		for {
			select {
			case e := <-events.Events:
				out = append(out, e)
			default:
				return out
			}
		}
	}
	c.reportRefused(in, []policyrules.Refusal{tooBig})
	got := recorded()
	if len(got) != 1 || !strings.Contains(got[0], EventPolicyRefused) || !strings.Contains(got[0], "ingress allow list of pod a/server") || !strings.Contains(got[0], "n1") {
		t.Fatalf("events %q, want one on p0 for a/server's ingress", got)
	}
	c.reportRefused(in, []policyrules.Refusal{tooBig})
	if got := recorded(); len(got) != 0 {
		t.Errorf("the same refusal again: events %q, want none", got)
	}
	c.reportRefused(in, []policyrules.Refusal{tooBig, byKernel})
	if got := recorded(); len(got) != 1 || !strings.Contains(got[0], "egress allow list") || !strings.Contains(got[0], "cannot allocate memory") {
		t.Errorf("the kernel's refusal of the egress list: events %q, want one (on p1)", got)
	}
	c.reportRefused(in, nil)
	c.reportRefused(in, []policyrules.Refusal{tooBig})
	if got := recorded(); len(got) != 1 {
		t.Errorf("a refusal that came back: events %q, want one", got)
	}
	if kernelRefused([]policyrules.Refusal{tooBig}) || !kernelRefused([]policyrules.Refusal{tooBig, byKernel}) {
		t.Error("kernelRefused: only the kernel's refusals ask for a retry")
	}
	if got := selecting(in.Policies, map[string]*corev1.Pod{}, []string{"a/server"}, true); len(got) != 0 {
		t.Errorf("policies selecting a pod the API does not have: %v", got)
	}
}
