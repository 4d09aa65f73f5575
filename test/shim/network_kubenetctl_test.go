package shim

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kubenet-dev/kubenet/test/testkit"

	"github.com/kubenet-dev/kubenet/core"
	"github.com/kubenet-dev/kubenet/internal/nettest"
)

// ctlRun is one kubenetctl invocation's outcome.
type ctlRun struct {
	stdout, stderr string
	code           int
}

// kubenetctl runs the binary inside the node's netns, as an operator on the node would.
func kubenetctl(t *testing.T, bin string, node *nettest.Node, args ...string) ctlRun {
	t.Helper()
	var r ctlRun
	nettest.Do(t, node.NS, func() error {
		cmd := exec.Command(bin, args...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		r.stdout, r.stderr = stdout.String(), stderr.String()
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			r.code = exit.ExitCode()
			return nil
		}
		return err
	})
	return r
}

// TestKubenetctl drives kubenetctl end to end with kubenet and with cni: ready before and after
// --pod-cidr (exit 1 with the reason on one line, then 0), setup (prints the pod's IPs, which are
// on its eth0; --port is applied and reachable from outside), status (plain and --json), bad
// usage (exit 2), teardown with the sandbox ID derived from --netns (leak audit), status after
// teardown (exit 1).
func TestKubenetctl(t *testing.T) {
	t.Parallel()
	bin, err := nettest.BuildCommand(t.TempDir(), "kubenetctl")
	if err != nil {
		t.Fatal(err)
	}
	for _, plugin := range []string{"kubenet", "cni"} {
		t.Run(plugin, func(t *testing.T) {
			t.Parallel()
			node := nettest.NewNode(t, binDir)
			confDir := t.TempDir()
			writeConf(t, confDir, "10-kubenet.conflist", map[string]any{
				"cniVersion": "1.1.0", "name": "kubenet",
				"plugins": []any{map[string]any{"type": "kubenet", "dataDir": node.DataDir(),
					"capabilities": map[string]bool{"portMappings": true, "ipRanges": true}}},
			})
			global := []string{"--network-plugin", plugin, "--kubenet-data-dir", node.DataDir(),
				"--cni-conf-dir", confDir, "--cni-bin-dir", binDir, "--cni-cache-dir", filepath.Join(node.Dir, "cache")}
			withCIDR := append(slices.Clone(global), "--pod-cidr", dualStackCIDRs)
			ctl := func(args ...string) ctlRun { return kubenetctl(t, bin, node, args...) }
			expect := func(r ctlRun, code int, what string) {
				t.Helper()
				if r.code != code {
					t.Fatalf("%s: exit %d, want %d\nstdout: %s\nstderr: %s", what, r.code, code, r.stdout, r.stderr)
				}
				if code != 0 && strings.Count(strings.TrimSpace(r.stderr), "\n") > 0 {
					t.Errorf("%s: error is not one clear line:\n%s", what, r.stderr)
				}
			}

			r := ctl(append(global, "ready")...)
			expect(r, 1, "ready without a pod CIDR")
			if !strings.Contains(r.stderr, "not ready") {
				t.Errorf("ready without a pod CIDR: %q does not give the reason", r.stderr)
			}
			expect(ctl(append(withCIDR, "ready")...), 0, "ready with --pod-cidr")

			pod := nettest.NewNS(t)
			expect(ctl(append(withCIDR, "setup", "default", "web")...), 2, "setup without --netns")
			expect(ctl(append(withCIDR, "setup", "default", "web", "--netns", pod.Path(), "--port", "http")...), 2, "setup with a bad --port")
			expect(ctl(append(withCIDR, "teardown", "default", "web", "--netns", pod.Path(), "--port", "80:80")...), 2, "teardown with --port")

			r = ctl(append(withCIDR, "setup", "default", "web", "--netns", pod.Path(), "--port", "30085:8085/tcp")...)
			expect(r, 0, "setup")
			var printed []netip.Addr
			for _, f := range strings.Fields(r.stdout) {
				printed = append(printed, netip.MustParseAddr(f))
			}
			var onEth0 []netip.Addr
			for _, p := range testkit.Addrs(t, pod, "eth0") {
				onEth0 = append(onEth0, p.Addr())
			}
			if len(printed) != 2 || !slices.Equal(testkit.SortedAddrs(printed), testkit.SortedAddrs(onEth0)) {
				t.Fatalf("setup printed %v, the pod's eth0 has %v", printed, onEth0)
			}
			srv := nettest.StartTCPEcho(t, pod, netip.AddrPortFrom(printed[0], 8085))
			reply, err := nettest.TCPRequest(node.External, netip.AddrPortFrom(nettest.NodeUplink4.Addr(), 30085), "hp", testkit.TrafficTimeout)
			if err := nettest.ExpectFrom(reply, err, nettest.External4.Addr()); err != nil {
				t.Errorf("--port 30085:8085 to %s: %v", srv.Addr, err)
			}

			r = ctl(append(withCIDR, "status", "default", "web", "--netns", pod.Path(), "--json")...)
			expect(r, 0, "status --json")
			var st struct {
				IP  string   `json:"ip"`
				IPs []string `json:"ips"`
			}
			if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
				t.Fatalf("status --json printed %q: %v", r.stdout, err)
			}
			if st.IP != printed[0].String() || len(st.IPs) != 2 || st.IPs[1] != printed[1].String() {
				t.Errorf("status --json %+v, want ip %s and ips %v", st, printed[0], printed)
			}
			r = ctl(append(global, "status", "default", "web", "--netns", pod.Path())...)
			expect(r, 0, "status (plain, no --pod-cidr needed)")
			if strings.Fields(r.stdout)[0] != printed[0].String() {
				t.Errorf("status printed %q, want %v", r.stdout, printed)
			}

			att := core.Attachment{ContainerID: derivedSandboxID(t, node), IfName: "eth0"}
			expect(ctl(append(withCIDR, "teardown", "default", "web", "--netns", pod.Path())...), 0, "teardown")
			testkit.AssertNoResidue(t, node, "kubenet", att, printed)
			testkit.AssertNoHostPortResidue(t, node, printed, 30085)
			expect(ctl(append(withCIDR, "teardown", "default", "web", "--netns", pod.Path())...), 0, "repeated teardown")
			// No record, and eth0 is gone from the netns.
			expect(ctl(append(withCIDR, "status", "default", "web", "--netns", pod.Path())...), 1, "status after teardown")
		})
	}
}

// derivedSandboxID reads the one attachment record kubenet wrote, whose container ID kubenetctl
// derived from --netns.
func derivedSandboxID(t *testing.T, node *nettest.Node) string {
	t.Helper()
	recs, err := core.NewRecords(filepath.Join(node.DataDir(), "kubenet")).List()
	if err != nil || len(recs) != 1 {
		t.Fatalf("attachment records: %v, %v; want exactly one", recs, err)
	}
	if !strings.HasPrefix(recs[0].ContainerID, "kubenetctl-") {
		t.Errorf("sandbox ID %q not derived from the netns path", recs[0].ContainerID)
	}
	if _, err := os.Stat(filepath.Join(node.DataDir(), "kubenet")); err != nil {
		t.Fatal(err)
	}
	return recs[0].ContainerID
}
