//go:build e2e

package e2e

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kubenet-dev/kubenet/test/nettest"
)

// Flags of TestCyclonus; `make e2e-cyclonus` sets them. The cluster's flags are TestKubernetes's
// (-kube.bins, -kube.proxy-modes, -kube.parallel, -kube.agent-args, -kube.netfilter,
// -kube.dual-stack).
var (
	cyclonusBin     = flag.String("cyclonus.bin", "", "the cyclonus binary (default: run hack/cyclonus/build.sh)")
	cyclonusArgs    = flag.String("cyclonus.args", "", "arguments of `cyclonus generate`, space-separated")
	cyclonusResults = flag.String("cyclonus.results", "", "directory for cyclonus's log and JUnit report per kube-proxy mode (default: a new one in $TMPDIR, kept)")
)

// TestCyclonus runs cyclonus (github.com/mattfenwick/cyclonus), the community's NetworkPolicy
// test-case generator, against kubenet in the cluster of TestKubernetes (docs/e2e.md, "make
// e2e-cyclonus"): per kube-proxy mode a cluster with kubenet enforcing NetworkPolicy and
// CoreDNS, then `cyclonus generate`, which creates namespaces x, y and z with pods a, b and c
// serving TCP and UDP on ports 80 and 81, and for each of its cases installs policies (and
// changes labels, namespaces, pods), probes every pod from every pod through its Service with
// `kubectl exec ... agnhost connect`, and compares what got through with the truth table of
// its own model of the API. Every failed case fails the test; the log holds its tables. Then
// kubenet's residue audit, once every pod is gone.
func TestCyclonus(t *testing.T) {
	run := prepareKubeRun(t)
	bin := *cyclonusBin
	if bin == "" {
		out, err := exec.Command(filepath.Join(run.repo, "hack/cyclonus/build.sh")).Output()
		Require(t, err, "hack/cyclonus/build.sh built cyclonus")
		bin = strings.TrimSpace(string(out))
	}
	results := *cyclonusResults
	if results == "" {
		var err error
		if results, err = os.MkdirTemp("", "kubenet-cyclonus-"); err != nil {
			t.Fatal(err)
		}
	} else if err := os.MkdirAll(results, 0o755); err != nil {
		t.Fatal(err)
	}
	args := strings.Fields(*cyclonusArgs)
	t.Logf("cyclonus %s generate %s; log and report in %s", bin, strings.Join(args, " "), results)

	for _, mode := range strings.Split(*kubeProxyModes, ",") {
		t.Run(mode, func(t *testing.T) {
			if *kubeParallel {
				t.Parallel()
			}
			cfg := run.config(t, mode, netfilterFor(mode, true), nil)
			if cfg.Netfilter != "nftables" {
				t.Fatalf("kubenet enforces NetworkPolicy only on nftables, not on %s (-kube.netfilter)", cfg.Netfilter)
			}
			start := time.Now()
			c := StartKubeCluster(t, cfg)
			c.InstallKubenet(t)
			c.InstallCoreDNS(t)
			t.Logf("cluster %s: kube-proxy %s, kubenet on %s, ready with CoreDNS in %s", c.Name, mode, cfg.Netfilter, time.Since(start).Round(time.Second))

			t.Run("Cyclonus", func(t *testing.T) {
				log := filepath.Join(results, fmt.Sprintf("cyclonus-%s.log", mode))
				junit := filepath.Join(results, fmt.Sprintf("cyclonus-%s.xml", mode))
				res, err := c.RunCyclonus(context.Background(), bin, args, log, junit)
				if err != nil {
					t.Fatalf("%v\n%s", err, cyclonusSummary(log))
				}
				t.Logf("cyclonus, kube-proxy %s, kubenet on %s: %s; log %s\n%s", mode, cfg.Netfilter, res, log, cyclonusSummary(log))
				for _, f := range res.FailedCases {
					t.Errorf("failed: %s (its truth tables are in %s)", f, log)
				}
			})
			t.Run("Residue", func(t *testing.T) { checkResidue(t, c) })
		})
	}
}

// cyclonusSummary is the part of cyclonus's log from its summary table on (the per-tag and
// per-protocol tables), or its last lines when there is none.
func cyclonusSummary(log string) string {
	b, err := os.ReadFile(log)
	if err != nil {
		return err.Error()
	}
	if i := strings.LastIndex(string(b), "SummaryTable:"); i >= 0 {
		return string(b[i:])
	}
	return fmt.Sprintf("(no summary) last lines of %s:\n%s", filepath.Base(log), nettest.Tail(log, 40))
}
