package shim

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kubenet-dev/kubenet/test/testkit"

	"github.com/kubenet-dev/kubenet/test/nettest"
)

// TestOperatorFindsAndClearsLeaks is the README's operations recipe: kubenetctl allocations shows
// who holds which address (pod names from the attachment records, reservations without a
// record), and kubenetctl gc with the runtime's list of sandboxes removes everything else.
func TestOperatorFindsAndClearsLeaks(t *testing.T) {
	bin, err := nettest.BuildCommand(t.TempDir(), "kubenetctl")
	if err != nil {
		t.Fatal(err)
	}
	node := nettest.NewNode(t, binDir)
	list := node.ConfList(t, nettest.NetConf{PodCIDRs: testkit.DualStack()})
	keep, leaked := node.NewPod(t, "keep"), node.NewPod(t, "leaked")
	node.MustAdd(t, list, keep)
	node.MustAdd(t, list, leaked)
	orphan := filepath.Join(node.DataDir(), "kubenet", "10.244.1.250")
	if err := os.WriteFile(orphan, []byte("gone-long-ago\r\neth0"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctl := func(args ...string) ctlRun {
		return kubenetctl(t, bin, node, append([]string{"--kubenet-data-dir", node.DataDir()}, args...)...)
	}

	r := ctl("allocations", "--json")
	if r.code != 0 {
		t.Fatalf("allocations: exit %d: %s", r.code, r.stderr)
	}
	var allocs []allocationView
	if err := json.Unmarshal([]byte(r.stdout), &allocs); err != nil {
		t.Fatalf("allocations --json: %v: %s", err, r.stdout)
	}
	byID := map[string][]allocationView{}
	for _, a := range allocs {
		byID[a.ContainerID] = append(byID[a.ContainerID], a)
	}
	if len(byID["keep"]) != 2 || len(byID["leaked"]) != 2 || len(byID["gone-long-ago"]) != 1 {
		t.Fatalf("allocations = %+v; want two per pod and the orphan", allocs)
	}
	if a := byID["leaked"][0]; a.Pod != "default/leaked" || !a.Record {
		t.Errorf("leaked pod's allocation %+v; want pod default/leaked with a record", a)
	}
	if a := byID["gone-long-ago"][0]; a.Record {
		t.Errorf("orphan reservation %+v claims a record", a)
	}
	if table := ctl("allocations"); table.code != 0 || !strings.Contains(table.stdout, "ADDRESS") || !strings.Contains(table.stdout, "10.244.1.250") {
		t.Errorf("allocations table: exit %d\n%s%s", table.code, table.stdout, table.stderr)
	}

	if r := ctl("gc"); r.code != 2 {
		t.Errorf("gc without --valid or --all: exit %d, want 2 (usage): %s", r.code, r.stderr)
	}
	// The runtime lost track of "leaked" (its cache is gone too): only kubenet's state is left.
	if err := os.Remove(filepath.Join(node.Dir, "cache", "results", "kubenet-leaked-eth0")); err != nil {
		t.Fatal(err)
	}
	r = ctl("gc", "--valid", "keep")
	if r.code != 0 {
		t.Fatalf("gc: exit %d: %s", r.code, r.stderr)
	}
	for _, ip := range append(leaked.IPs(), testkit.MustAddr("10.244.1.250")) {
		if !strings.Contains(r.stdout, "released "+ip.String()) {
			t.Errorf("gc output does not report releasing %s:\n%s", ip, r.stdout)
		}
	}
	testkit.AssertNoResidue(t, node, "kubenet", testkit.AttachmentOf(leaked), leaked.IPs())
	if _, err := os.Stat(orphan); err == nil {
		t.Error("gc kept the orphan reservation")
	}
	if err := node.Check(list, keep); err != nil {
		t.Errorf("the kept pod fails CHECK after gc: %v", err)
	}
}

// allocationView is kubenetctl allocations --json's element.
type allocationView struct {
	Address     string `json:"address"`
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifname"`
	Pod         string `json:"pod"`
	Record      bool   `json:"record"`
}
