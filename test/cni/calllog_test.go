package cni

import (
	"bufio"
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/kubenet-dev/kubenet/test/testkit"

	"github.com/kubenet-dev/kubenet/core"
	"github.com/kubenet-dev/kubenet/internal/nettest"
)

// callLine is one line of the call log as an operator's jq would read it.
type callLine struct {
	Verb       string   `json:"verb"`
	Network    string   `json:"network"`
	Container  string   `json:"container"`
	Interface  string   `json:"interface"`
	NetNS      string   `json:"netns"`
	Pod        string   `json:"pod"`
	DurationMs *float64 `json:"durationMs"`
	Result     *struct {
		IPs []string `json:"ips"`
	} `json:"result"`
	Error *struct {
		Code uint   `json:"code"`
		Msg  string `json:"msg"`
	} `json:"error"`
}

// TestCallLog: with logFile set, every call of the binary (ADD, a failing ADD, CHECK, DEL, GC, a
// failing STATUS, an ADD whose configuration is otherwise invalid) appends one JSON line with the
// verb, container, interface, netns, pod, duration and the result or the CNI error; a successful
// STATUS is not logged. Without logFile nothing is written.
func TestCallLog(t *testing.T) {
	node := nettest.NewNode(t, binDir)
	logFile := filepath.Join(node.Dir, "log", "kubenet.log")
	list := node.ConfList(t, nettest.NetConf{PodCIDRs: testkit.DualStack(), Extra: map[string]any{"logFile": logFile}})
	pod := node.NewPod(t, "logged")
	node.MustAdd(t, list, pod)
	if err := node.Add(list, pod); testkit.CNICode(err) != core.ErrAttachmentExists {
		t.Fatalf("second ADD: %v", err)
	}
	if err := node.Check(list, pod); err != nil {
		t.Fatal(err)
	}
	if err := node.Status(list); err != nil {
		t.Fatal(err)
	}
	if err := node.Del(list, pod); err != nil {
		t.Fatal(err)
	}
	if err := node.GC(list, nil); err != nil {
		t.Fatal(err)
	}
	noCIDR := node.ConfList(t, nettest.NetConf{Name: "nocidr", Extra: map[string]any{"logFile": logFile}})
	if err := node.Status(noCIDR); testkit.CNICode(err) != core.ErrPluginNotAvailable {
		t.Fatalf("STATUS without a pod CIDR: %v", err)
	}
	bad := node.ConfList(t, nettest.NetConf{Name: "bad", PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.5/24")}, Extra: map[string]any{"logFile": logFile}})
	broken := node.NewPod(t, "broken")
	if err := node.Add(bad, broken); testkit.CNICode(err) != 7 {
		t.Fatalf("ADD with host bits in podCIDRs: %v", err)
	}

	got := readCallLog(t, logFile)
	var verbs []string
	for _, l := range got {
		verbs = append(verbs, l.Verb)
		if l.DurationMs == nil || *l.DurationMs <= 0 {
			t.Errorf("%s line without a duration: %+v", l.Verb, l)
		}
		if (l.Result == nil) == (l.Error == nil) {
			t.Errorf("%s line must have a result or an error, not both or neither: %+v", l.Verb, l)
		}
	}
	if want := []string{"ADD", "ADD", "CHECK", "DEL", "GC", "STATUS", "ADD"}; !slices.Equal(verbs, want) {
		t.Fatalf("logged verbs %v, want %v (a successful STATUS is not logged)", verbs, want)
	}
	add := got[0]
	if add.Network != "kubenet" || add.Container != "logged" || add.Interface != "eth0" || add.NetNS != pod.NS.Path() || add.Pod != "default/logged" {
		t.Errorf("ADD line %+v: want network, container, interface, netns and pod of the call", add)
	}
	var want []string
	for _, ip := range pod.Result.IPs {
		want = append(want, ip.Address.String())
	}
	if add.Result == nil || !slices.Equal(add.Result.IPs, want) {
		t.Errorf("ADD line result %+v, want the pod's addresses %v", add.Result, want)
	}
	for i, code := range map[int]uint{1: core.ErrAttachmentExists, 5: core.ErrPluginNotAvailable, 6: 7} {
		if got[i].Error == nil || got[i].Error.Code != code || got[i].Error.Msg == "" {
			t.Errorf("%s line %d: error %+v, want code %d with its message", got[i].Verb, i, got[i].Error, code)
		}
	}
	if got[6].Container != "broken" || got[6].Network != "bad" {
		t.Errorf("invalid-configuration ADD logged as %+v", got[6])
	}

	// Default off: a conflist without logFile writes no log anywhere in the node's directory.
	quiet := nettest.NewNode(t, binDir)
	qlist := quiet.ConfList(t, nettest.NetConf{PodCIDRs: testkit.DualStack()})
	qpod := quiet.NewPod(t, "quiet")
	quiet.MustAdd(t, qlist, qpod)
	if err := quiet.Del(qlist, qpod); err != nil {
		t.Fatal(err)
	}
	_ = filepath.WalkDir(quiet.Dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && filepath.Ext(p) == ".log" {
			t.Errorf("a log file appeared without logFile: %s", p)
		}
		return nil
	})
}

func readCallLog(t *testing.T, path string) []callLine {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("call log: %v", err)
	}
	defer f.Close()
	var out []callLine
	s := bufio.NewScanner(f)
	for s.Scan() {
		var l callLine
		if err := json.Unmarshal(s.Bytes(), &l); err != nil {
			t.Fatalf("call log line %q: %v", s.Text(), err)
		}
		out = append(out, l)
	}
	return out
}
