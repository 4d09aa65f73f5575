package policy

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kubenet-dev/kubenet/core"
)

// TestWatchRecordsWakes: every way a record changes wakes the controller, a record damaged in
// place too (its pod must be held at once, not at the resync).
func TestWatchRecordsWakes(t *testing.T) {
	networkDir := t.TempDir()
	kicks := make(chan struct{}, 100)
	w, err := watchRecords(networkDir, func() { kicks <- struct{}{} })
	if err != nil {
		t.Fatal(err)
	}
	defer w.close()
	records := filepath.Join(networkDir, core.RecordDirName)
	record := filepath.Join(records, "c1@eth0.json")
	for _, tc := range []struct {
		name   string
		change func() error
	}{
		{"records directory made", func() error { return os.Mkdir(records, 0o755) }},
		{"record written", func() error { return os.WriteFile(record, []byte(`{"containerID":"c1","ifName":"eth0"}`), 0o644) }},
		{"record cut in half", func() error { return os.Truncate(record, 10) }},
		{"record truncated to nothing", func() error { return os.Truncate(record, 0) }},
		{"record removed", func() error { return os.Remove(record) }},
	} {
		for len(kicks) > 0 {
			<-kicks
		}
		if err := tc.change(); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		select {
		case <-kicks:
		case <-time.After(5 * time.Second):
			t.Errorf("%s: no wake-up", tc.name)
		}
	}
}
