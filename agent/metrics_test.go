package agent

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestMetricsDocumented: every metric the agent registers has exactly one row in the metrics
// table of docs/agent.md (section "Health and metrics"), and that table has no row of a metric
// the agent does not register. A row elsewhere in the document (a merge that pasted rows into
// another section) counts as a second row.
func TestMetricsDocumented(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := newMetrics(reg); err != nil {
		t.Fatal(err)
	}
	// Described, not gathered: a vector without series is not gathered.
	registered := map[string]bool{}
	descs := make(chan *prometheus.Desc, 100)
	reg.Describe(descs)
	close(descs)
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`)
	for d := range descs {
		if m := fqName.FindStringSubmatch(d.String()); m != nil {
			registered[m[1]] = true
		}
	}

	doc, err := os.ReadFile("../docs/agent.md")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("(?m)^\\| `(kubenet_agent_[a-z_]+)[^`]*` \\|")
	rows := map[string]int{}
	_, metricsSection, ok := strings.Cut(string(doc), "\n## Health and metrics\n")
	if !ok {
		t.Fatal(`docs/agent.md has no section "Health and metrics"`)
	}
	metricsSection, _, _ = strings.Cut(metricsSection, "\n## ")
	inSection := map[string]bool{}
	for _, m := range row.FindAllStringSubmatch(metricsSection, -1) {
		inSection[m[1]] = true
	}
	for _, m := range row.FindAllStringSubmatch(string(doc), -1) {
		rows[m[1]]++
	}
	for name := range registered {
		switch {
		case !inSection[name]:
			t.Errorf("metric %s has no row in the metrics table of docs/agent.md", name)
		case rows[name] > 1:
			t.Errorf("metric %s has %d rows in docs/agent.md, want one", name, rows[name])
		}
	}
	for name := range rows {
		if !registered[name] {
			t.Errorf("docs/agent.md has a row of metric %s, which the agent does not register", name)
		}
	}
	if len(registered) < 10 {
		t.Fatalf("only %d metrics found: %v", len(registered), registered)
	}
}
