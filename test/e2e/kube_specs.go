package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// SpecSet is a named selection of the upstream e2e specs: ginkgo's focus is the alternation of
// Focus. `make e2e-kubernetes E2E_SPECS=<name>` runs one; E2E_FOCUS runs any regular expression
// instead. Add a set here (and its line in docs/e2e.md) to run more specs in CI.
type SpecSet struct {
	Name  string
	Focus []string
}

// SpecSets are the named selections.
var SpecSets = []SpecSet{{
	// What a pod network must do: pod-to-pod, node-to-pod and Service traffic on one node and
	// across nodes, host ports, kube-proxy's Services through kubenet's bridge (hairpin, session
	// affinity, NodePorts, traffic policies), conntrack, and no SNAT between pods.
	Name: "network",
	Focus: []string{
		`\[sig-network\] Networking Granular Checks`,
		`\[sig-network\] HostPort`,
		`\[sig-network\] NoSNAT`,
		`\[sig-network\] Conntrack`,
		`\[sig-network\] Services should serve a basic endpoint from pods`,
		`\[sig-network\] Services should serve multiport endpoints from pods`,
		`\[sig-network\] Services should serve endpoints on same port and different protocols`,
		`\[sig-network\] Services should be able to create a functioning NodePort service`,
		`\[sig-network\] Services should have session affinity work`,
		`\[sig-network\] Services should be able to switch session affinity`,
		`\[sig-network\] Services should allow pods to hairpin back to themselves through services`,
		`\[sig-network\] Services should preserve source pod IP for traffic thru service cluster IP`,
		`\[sig-network\] Services should be able to change the type from`,
		`\[sig-network\] Services should respect internalTrafficPolicy=Local`,
		`\[sig-network\] Services should support externalTrafficPolicy=Local for type=NodePort`,
		`\[sig-network\] Services should implement NodePort and HealthCheckNodePort correctly when ExternalTrafficPolicy changes`,
		`\[sig-network\] Services should fallback to`,
	},
}, {
	// Every [sig-network] spec; the skips below still apply.
	Name:  "sig-network",
	Focus: []string{`\[sig-network\]`},
}, {
	// The network policy suite: kubenet-agent enforces NetworkPolicy (docs/networkpolicy.md).
	Name:  "netpol",
	Focus: []string{`\[sig-network\] Netpol`},
}, {
	// The dual-stack specs, for a DualStack cluster.
	Name:  "dual-stack",
	Focus: []string{`\[sig-network\] \[Feature:IPv6DualStack\]`},
}}

// SpecSetByName returns the set called name, or the union of several comma-separated sets.
func SpecSetByName(name string) (SpecSet, error) {
	union := SpecSet{Name: name}
	for _, one := range strings.Split(name, ",") {
		var names []string
		found := false
		for _, s := range SpecSets {
			if s.Name == one {
				union.Focus = append(union.Focus, s.Focus...)
				found = true
			}
			names = append(names, s.Name)
		}
		if !found {
			return SpecSet{}, fmt.Errorf("no spec set %q (known: %s)", one, strings.Join(names, ", "))
		}
	}
	return union, nil
}

// FocusRegexp is the set's ginkgo focus.
func (s SpecSet) FocusRegexp() string { return "(" + strings.Join(s.Focus, "|") + ")" }

// Skip is a spec (or group) the cluster cannot run, and why. The list is short on purpose: a
// spec belongs here only when something outside kubenet makes it impossible here.
type Skip struct{ Pattern, Reason string }

// Skips apply to every run, whatever the focus.
var Skips = []Skip{
	{`\[Disruptive\]`, "restarts components or nodes through the cloud provider or SSH, which this cluster has not; TestKubernetes's lifecycle checks restart them itself"},
	{`\[Feature:LoadBalancer\]|LoadBalancer`, "needs a cloud load balancer"},
	{`\[Feature:SCTPConnectivity\]|an SCTP HostPort|a basic SCTP service`, "the kernel of the machines these tests run on has no SCTP (socket(..., IPPROTO_SCTP) fails with EPROTONOSUPPORT); the Netpol specs with SCTP in a policy but TCP traffic run"},
	{`should not be vulnerable to the invalid conntrack state bug`, "needs the image regression-issue-74839, which is not built here"},
	{`CLOSE_WAIT`, "needs the image distroless-iptables, which is not built here"},
	{`\[sig-network\] DNS`, "needs the image jessie-dnsutils, which is not built here"},
	{`should be rejected for evicted pods`, "needs kubelet to evict a pod for its ephemeral storage; the jail's kubelet cannot measure the disk (localStorageCapacityIsolation off)"},
}

// SkipRegexp is the alternation of every skip.
func SkipRegexp() string {
	var p []string
	for _, s := range Skips {
		p = append(p, s.Pattern)
	}
	return "(" + strings.Join(p, "|") + ")"
}

// E2EResult counts the specs of a ginkgo run by their end state.
type E2EResult struct {
	Passed, Failed int
	// Skipped counts the specs that matched the focus but skipped themselves at run time (a
	// missing capability of the cluster); SkippedSpecs says which and why. Specs the focus or
	// the skip list left out are not counted.
	Skipped      int
	SkippedSpecs []string
	// FailedSpecs names each spec that did not pass, with its state.
	FailedSpecs []string
	// PassedSpecs names each spec that passed.
	PassedSpecs []string
	Duration    time.Duration
}

func (r E2EResult) String() string {
	return fmt.Sprintf("%d specs passed, %d did not, %d skipped, in %s", r.Passed, r.Failed, r.Skipped, r.Duration.Round(time.Second))
}

// RunE2E runs the e2e binary's specs matching focus (minus skip) with ginkgo against the
// cluster, from the control plane's namespace, procs specs at a time, and returns the counts of
// ginkgo's JSON report. Its output goes to log.
func (c *KubeCluster) RunE2E(ctx context.Context, focus, skip string, procs int, log string) (E2EResult, error) {
	var res E2EResult
	if _, err := regexp.Compile(focus); err != nil {
		return res, fmt.Errorf("focus %q: %w", focus, err)
	}
	report := filepath.Join(c.Dir, fmt.Sprintf("ginkgo-%d.json", time.Now().UnixNano()))
	var runErr error
	res.Duration, runErr = c.runFromControlPlane(ctx, log, nil, c.cfg.Bins.Path("ginkgo"),
		fmt.Sprintf("--procs=%d", procs),
		"--focus="+focus,
		"--skip="+skip,
		"--no-color",
		"--timeout=2h",
		"--json-report="+report,
		c.cfg.Bins.Path("e2e-network.test"), "--",
		"--provider=skeleton",
		"--kubeconfig="+c.cp.AdminKubeconfig,
		"--kubectl-path="+c.cfg.Bins.Path("kubectl"),
		fmt.Sprintf("--num-nodes=%d", len(c.Nodes)),
		"--disable-log-dump",
		"--report-dir="+filepath.Join(c.Dir, "e2e-report"),
	)
	b, err := os.ReadFile(report)
	if err != nil {
		return res, fmt.Errorf("ginkgo wrote no report (%v): %w", runErr, err)
	}
	var reports []struct {
		SpecReports []struct {
			ContainerHierarchyTexts []string
			LeafNodeText            string
			LeafNodeType            string
			State                   string
			Failure                 struct{ Message string }
		}
	}
	if err := json.Unmarshal(b, &reports); err != nil {
		return res, fmt.Errorf("ginkgo report %s: %w", report, err)
	}
	for _, r := range reports {
		for _, s := range r.SpecReports {
			if s.LeafNodeType != "It" {
				if s.State != "passed" && s.State != "skipped" {
					res.FailedSpecs = append(res.FailedSpecs, fmt.Sprintf("%s %s: %s", s.LeafNodeType, s.LeafNodeText, s.State))
				}
				continue
			}
			name := strings.Join(append(s.ContainerHierarchyTexts, s.LeafNodeText), " ")
			switch s.State {
			case "passed":
				res.Passed++
				res.PassedSpecs = append(res.PassedSpecs, name)
			case "skipped", "pending":
				if s.Failure.Message != "" {
					res.Skipped++
					res.SkippedSpecs = append(res.SkippedSpecs, name+": "+strings.TrimSpace(s.Failure.Message))
				}
			default:
				res.Failed++
				res.FailedSpecs = append(res.FailedSpecs, name+": "+s.State)
			}
		}
	}
	if runErr != nil && len(res.FailedSpecs) == 0 {
		return res, fmt.Errorf("ginkgo failed without a failed spec: %w", runErr)
	}
	return res, nil
}
