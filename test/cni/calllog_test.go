package cni

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kubenet-dev/kubenet/test/testkit"

	"github.com/kubenet-dev/kubenet/core"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

// callLine is one line of the call log as an operator's jq would read it.
type callLine struct {
	Verb       string   `json:"verb"`
	CNIVersion string   `json:"cniVersion"`
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
// verb, the CNI version of the call, container, interface, netns, pod, duration and the result or
// the CNI error; a successful STATUS is not logged. Without logFile nothing is written.
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
	bad := node.ConfList(t, nettest.NetConf{CNIVersion: "1.0.0", Name: "bad", PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.5/24")}, Extra: map[string]any{"logFile": logFile}})
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
	// Each line says the version of its call: the 1.0.0 conflist's ADD is not the others' 1.1.0.
	for i, l := range got {
		if want := map[bool]string{false: "1.1.0", true: "1.0.0"}[i == 6]; l.CNIVersion != want {
			t.Errorf("%s line %d: cniVersion %q, want %q (the configuration's)", l.Verb, i, l.CNIVersion, want)
		}
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

// pluginHung is how long a logged call may take before it counts as wedged: far more than
// verblog.LockWait, the longest the log may delay it, plus the call itself.
const pluginHung = 30 * time.Second

// pluginCall is one run of the binary started by startPlugin.
type pluginCall struct {
	cmd            *exec.Cmd
	exited         <-chan error
	stdout, stderr bytes.Buffer
}

// startPlugin starts the kubenet binary inside the node with the CNI variables of verb on pod
// and stdin, without waiting for it.
func startPlugin(t *testing.T, node *nettest.Node, verb string, pod *nettest.Pod, stdin []byte) *pluginCall {
	t.Helper()
	c := &pluginCall{cmd: exec.Command(filepath.Join(binDir, "kubenet"))}
	c.cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "CNI_PATH=" + binDir, "CNI_COMMAND=" + verb,
		"CNI_CONTAINERID=" + pod.RT.ContainerID, "CNI_IFNAME=eth0", "CNI_NETNS=" + pod.NS.Path(), "CNI_ARGS=K8S_POD_NAMESPACE=default;K8S_POD_NAME=" + pod.RT.ContainerID}
	c.cmd.Stdin = bytes.NewReader(stdin)
	c.cmd.Stdout, c.cmd.Stderr = &c.stdout, &c.stderr
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var err error
	if c.exited, err = nettest.StartOnOwnThread(node.NS, c.cmd); err != nil {
		t.Fatalf("start %s: %v", verb, err)
	}
	return c
}

// wait waits for the run to end (killing it and failing the test after pluginHung) and returns
// its exit code.
func (c *pluginCall) wait(t *testing.T) int {
	t.Helper()
	select {
	case err := <-c.exited:
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode()
		}
		if err != nil {
			t.Fatal(err)
		}
		return 0
	case <-time.After(pluginHung):
		_ = c.cmd.Process.Kill()
		<-c.exited
		t.Fatalf("%s still running after %s; stderr: %s", c.cmd.Env, pluginHung, c.stderr.String())
		return -1
	}
}

// logConf is a network configuration for stdin with the call log at logFile.
func logConf(node *nettest.Node, logFile string) []byte {
	b, _ := json.Marshal(map[string]any{
		"cniVersion": "1.1.0", "name": "kubenet", "type": "kubenet", "dataDir": node.DataDir(),
		"podCIDRs": []string{nettest.PodCIDR4.String(), nettest.PodCIDR6.String()},
		"logFile":  logFile,
	})
	return b
}

// callLogLines counts the lines of stderr about the call log.
func callLogLines(stderr string) []string {
	var out []string
	for _, l := range strings.Split(stderr, "\n") {
		if strings.Contains(l, "call log") {
			out = append(out, l)
		}
	}
	return out
}

// TestCallLogNeverFailsTheCall: whatever is wrong with the log (a symlink at its path, its lock
// held forever by another process, a fifo in its place, a directory others may write), ADD and
// DEL succeed and set up or tear down the pod, each within the lock's time limit of its start,
// with exactly one line on stderr saying why nothing was logged; nothing outside the log's
// directory is written.
func TestCallLogNeverFailsTheCall(t *testing.T) {
	cases := []struct {
		name    string
		setup   func(t *testing.T, logDir, logFile, outside string)
		wantErr string
	}{
		{"symlink at the log path", func(t *testing.T, _, logFile, outside string) { mustDo(t, os.Symlink(outside, logFile)) }, "not a regular file"},
		{"fifo at the log path", func(t *testing.T, _, logFile, _ string) { mustDo(t, syscall.Mkfifo(logFile, 0o600)) }, "not a regular file"},
		{"log directory writable by all", func(t *testing.T, logDir, _, _ string) { mustDo(t, os.Chmod(logDir, 0o777)) }, "writable by others"},
		{"lock held forever by another process", func(t *testing.T, _, logFile, _ string) {
			f, err := os.OpenFile(logFile+".lock", os.O_CREATE|os.O_RDONLY, 0o600)
			mustDo(t, err)
			t.Cleanup(func() { f.Close() })
			mustDo(t, unix.Flock(int(f.Fd()), unix.LOCK_EX))
		}, "lock held by another process: gave up after 1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			node := nettest.NewNode(t, binDir)
			logDir := filepath.Join(node.Dir, "log")
			mustDo(t, os.Mkdir(logDir, 0o755))
			mustDo(t, os.Chmod(logDir, 0o755))
			outside := filepath.Join(node.Dir, "precious")
			mustDo(t, os.WriteFile(outside, []byte("precious\n"), 0o644))
			logFile := filepath.Join(logDir, "kubenet.log")
			tc.setup(t, logDir, logFile, outside)
			pod := node.NewPod(t, "unlogged")
			stdin := logConf(node, logFile)
			for _, verb := range []string{"ADD", "DEL"} {
				start := time.Now()
				call := startPlugin(t, node, verb, pod, stdin)
				code := call.wait(t)
				took := time.Since(start)
				if code != 0 {
					t.Fatalf("%s failed (exit %d): %s %s", verb, code, call.stdout.String(), call.stderr.String())
				}
				if lines := callLogLines(call.stderr.String()); len(lines) != 1 || !strings.Contains(lines[0], tc.wantErr) {
					t.Errorf("%s: stderr lines about the log %q, want one saying %q", verb, lines, tc.wantErr)
				}
				t.Logf("%s took %s", verb, took)
				// The call did its work: after ADD the pod has its addresses, after DEL no eth0.
				if verb == "ADD" {
					if got := testkit.Addrs(t, pod.NS, "eth0"); len(got) != 2 {
						t.Errorf("after ADD the pod has addresses %v, want one of each family", got)
					}
				} else if testkit.LinkExists(t, pod.NS, "eth0") {
					t.Error("after DEL the pod still has eth0")
				}
			}
			if b, err := os.ReadFile(outside); err != nil || string(b) != "precious\n" {
				t.Errorf("the file outside the log's directory holds %q (%v)", b, err)
			}
			if st, err := os.Lstat(logFile); err == nil && st.Mode().IsRegular() && st.Size() > 0 {
				t.Errorf("%s holds %d bytes: something was logged", logFile, st.Size())
			}
		})
	}
}

// TestCallLogSIGTERMWhileWaitingForLock: a call waiting for a log lock that another process
// holds ends at once on SIGTERM, which the plugin catches to end its context: the wait must
// watch that context, or the call would be unkillable but by SIGKILL.
func TestCallLogSIGTERMWhileWaitingForLock(t *testing.T) {
	node := nettest.NewNode(t, binDir)
	logFile := filepath.Join(node.Dir, "kubenet.log")
	lock, err := os.OpenFile(logFile+".lock", os.O_CREATE|os.O_RDONLY, 0o600)
	mustDo(t, err)
	defer lock.Close()
	mustDo(t, unix.Flock(int(lock.Fd()), unix.LOCK_EX))
	pod := node.NewPod(t, "sigterm")
	call := startPlugin(t, node, "DEL", pod, logConf(node, logFile))
	// The call waits for the lock once it has the lock file open.
	err = nettest.Eventually(pluginHung, func() error {
		if !hasOpen(call.cmd.Process.Pid, logFile+".lock") {
			return fmt.Errorf("the plugin has not opened %s.lock", logFile)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	mustDo(t, call.cmd.Process.Signal(syscall.SIGTERM))
	code := call.wait(t)
	if code != 0 {
		t.Errorf("DEL exited %d: %s %s", code, call.stdout.String(), call.stderr.String())
	}
	if lines := callLogLines(call.stderr.String()); len(lines) != 1 || !strings.Contains(lines[0], "terminated signal received") {
		t.Errorf("stderr lines about the log %q, want one saying SIGTERM ended the wait", lines)
	}
}

// hasOpen reports whether process pid has path open.
func hasOpen(pid int, path string) bool {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	fds, _ := os.ReadDir(dir)
	for _, fd := range fds {
		if target, err := os.Readlink(filepath.Join(dir, fd.Name())); err == nil && target == path {
			return true
		}
	}
	return false
}

func mustDo(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
