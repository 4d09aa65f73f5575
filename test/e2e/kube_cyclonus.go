package e2e

import (
	"context"
	"encoding/xml"
	"fmt"
	"os"
	"time"
)

// CyclonusResult is what one `cyclonus generate` run reports: its test cases (numbered from 1
// in the order cyclonus runs them, as its log numbers them) by outcome.
type CyclonusResult struct {
	Passed, Failed int
	// FailedCases names each failed case: "#<number> <description>".
	FailedCases []string
	Duration    time.Duration
}

func (r CyclonusResult) String() string {
	return fmt.Sprintf("%d of %d cases passed, %d failed, in %s", r.Passed, r.Passed+r.Failed, r.Failed, r.Duration.Round(time.Second))
}

// RunCyclonus runs `cyclonus generate` (bin) with args against the cluster from the control
// plane's namespace as the admin, and returns the outcome of its cases from its JUnit report.
// Its output goes to log, the report to junit.
func (c *KubeCluster) RunCyclonus(ctx context.Context, bin string, args []string, log, junit string) (CyclonusResult, error) {
	var res CyclonusResult
	// A report of an earlier run in the same place must not stand for this one.
	if err := os.Remove(junit); err != nil && !os.IsNotExist(err) {
		return res, err
	}
	var runErr error
	res.Duration, runErr = c.runFromControlPlane(ctx, log, []string{"KUBECONFIG=" + c.cp.AdminKubeconfig},
		bin, append([]string{"generate", "--junit-results-file=" + junit}, args...)...)
	b, err := os.ReadFile(junit)
	if err != nil {
		// cyclonus ends without its summary when a case cannot be set up (its DoOrDie).
		return res, fmt.Errorf("cyclonus wrote no report (%v): %w", runErr, err)
	}
	if err := res.parseJUnit(b); err != nil {
		return res, fmt.Errorf("cyclonus's report %s: %w", junit, err)
	}
	if runErr != nil {
		return res, fmt.Errorf("cyclonus: %w", runErr)
	}
	return res, nil
}

// parseJUnit counts the cases of cyclonus's JUnit report: one testcase per case, in the order
// it ran them, with a failure element when the cluster's connectivity differed from the
// expected truth table in any step (after the retries).
func (r *CyclonusResult) parseJUnit(report []byte) error {
	var suite struct {
		XMLName   xml.Name `xml:"testsuite"`
		Failures  int      `xml:"failures,attr"`
		TestCases []struct {
			Name    string    `xml:"name,attr"`
			Failure *struct{} `xml:"failure"`
		} `xml:"testcase"`
	}
	if err := xml.Unmarshal(report, &suite); err != nil {
		return err
	}
	if len(suite.TestCases) == 0 {
		return fmt.Errorf("no test case")
	}
	for i, tc := range suite.TestCases {
		if tc.Failure != nil {
			r.Failed++
			r.FailedCases = append(r.FailedCases, fmt.Sprintf("#%d %s", i+1, tc.Name))
		} else {
			r.Passed++
		}
	}
	if r.Failed != suite.Failures {
		return fmt.Errorf("%d test cases with a failure, the suite says %d", r.Failed, suite.Failures)
	}
	return nil
}
