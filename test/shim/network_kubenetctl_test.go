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
	"github.com/kubenet-dev/kubenet/test/nettest"
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

// TestKubenetctlOnConflistNode is the trap of a node set up from a dual-stack conflist: kubenetctl
// with its default --non-masquerade-cidr (IPv4 only) used to rewrite the node, removing the IPv6
// SNAT rule. Now it is refused with every difference named and the node keeps its IPv6 gateway
// and SNAT rules and its pod passes CHECK; `node` shows the owner; with the conflist's values
// kubenetctl works and the owner stays; --take-over-node applies kubenetctl's settings and makes
// it the owner, after which the conflist's ADDs are the ones refused (code 104).
func TestKubenetctlOnConflistNode(t *testing.T) {
	t.Parallel()
	bin, err := nettest.BuildCommand(t.TempDir(), "kubenetctl")
	if err != nil {
		t.Fatal(err)
	}
	node := nettest.NewNode(t, binDir)
	dual := []netip.Prefix{nettest.PodCIDR4, nettest.PodCIDR6}
	list := node.ConfList(t, nettest.NetConf{PodCIDRs: dual, NonMasqueradeCIDRs: []netip.Prefix{nettest.NonMasquerade4, nettest.NonMasquerade6}})
	cniPod := node.NewPod(t, "from-conflist")
	node.MustAdd(t, list, cniPod)
	t.Cleanup(func() { _ = node.Del(list, cniPod) })
	gateways := []netip.Prefix{netip.MustParsePrefix("10.244.1.1/24"), netip.MustParsePrefix("fd00:10:244:1::1/64")}

	global := []string{"--kubenet-data-dir", node.DataDir(), "--pod-cidr", dualStackCIDRs}
	ctl := func(args ...string) ctlRun { return kubenetctl(t, bin, node, append(slices.Clone(global), args...)...) }
	nodeOwner := func() string {
		t.Helper()
		r := ctl("node", "--json")
		var s core.NodeSettings
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &s) != nil {
			t.Fatalf("node --json: exit %d: %s%s", r.code, r.stdout, r.stderr)
		}
		return s.Owner
	}
	pod := nettest.NewNS(t)

	r := ctl("setup", "default", "web", "--netns", pod.Path())
	if r.code != 1 || !testkit.ContainsAll(r.stderr, "belong to the CNI configuration (cni)", "nonMasqueradeCIDRs [10.0.0.0/8 fd00::/8] on the node, [10.0.0.0/8] here", "--take-over-node") {
		t.Fatalf("setup with differing defaults: exit %d, stderr %q; want exit 1 naming the owner and the difference", r.code, r.stderr)
	}
	if got := testkit.Addrs(t, node.NS, "cbr0"); !testkit.SamePrefixes(got, gateways) {
		t.Errorf("the refused kubenetctl changed the bridge: %v, want %v", got, gateways)
	}
	testkit.CheckMasqRules(t, node.NS, dual)
	if err := node.Check(list, cniPod); err != nil {
		t.Errorf("the conflist's pod fails CHECK after the refused kubenetctl: %v", err)
	}
	if testkit.LinkExists(t, pod, "eth0") {
		t.Error("the refused setup left an interface in the pod")
	}
	// A refused caller that also names another netfilter backend must be refused before the
	// node's rules move: nothing in iptables, the nftables rules and the backend record as they were.
	record := func() string {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(node.DataDir(), "kubenet", core.NetfilterFile))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	before := record()
	if r := ctl("--netfilter-backend", "iptables", "setup", "default", "web", "--netns", pod.Path()); r.code != 1 || !strings.Contains(r.stderr, "netfilterBackend") {
		t.Errorf("setup on another backend: exit %d, stderr %q; want exit 1 naming netfilterBackend", r.code, r.stderr)
	}
	if after := record(); after != before {
		t.Errorf("the refused setup rewrote the backend record: %s, was %s", after, before)
	}
	if saved := nettest.Run(t, node.NS, "iptables-save"); strings.Contains(saved, "KUBENET-") {
		t.Errorf("the refused setup wrote iptables rules:\n%s", saved)
	}
	testkit.CheckMasqRules(t, node.NS, dual)
	if err := node.Check(list, cniPod); err != nil {
		t.Errorf("the conflist's pod fails CHECK after the refused setup on another backend: %v", err)
	}
	if r := ctl("ready"); r.code != 1 || !strings.Contains(r.stderr, "belong to the CNI configuration") {
		t.Errorf("ready with differing settings: exit %d, %q", r.code, r.stderr)
	}
	if owner := nodeOwner(); owner != core.OwnerCNI {
		t.Errorf("owner %q, want cni", owner)
	}

	// With the conflist's values kubenetctl works alongside, and changes nothing.
	same := []string{"--non-masquerade-cidr", "10.0.0.0/8,fd00::/8"}
	if r := ctl(append(same, "setup", "default", "web", "--netns", pod.Path())...); r.code != 0 {
		t.Fatalf("setup with the node's settings: exit %d: %s", r.code, r.stderr)
	}
	if r := ctl(append(same, "teardown", "default", "web", "--netns", pod.Path())...); r.code != 0 {
		t.Fatalf("teardown: exit %d: %s", r.code, r.stderr)
	}
	if owner := nodeOwner(); owner != core.OwnerCNI {
		t.Errorf("owner %q after kubenetctl with the same settings, want cni", owner)
	}
	testkit.CheckMasqRules(t, node.NS, dual)

	// An explicit take-over: kubenetctl's single-family settings win and it owns the node.
	r = kubenetctl(t, bin, node, "--kubenet-data-dir", node.DataDir(), "--pod-cidr", nettest.PodCIDR4.String(), "--take-over-node", "ready")
	if r.code != 0 {
		t.Fatalf("ready --take-over-node: exit %d: %s", r.code, r.stderr)
	}
	if got := testkit.Addrs(t, node.NS, "cbr0"); !testkit.SamePrefixes(got, gateways[:1]) {
		t.Errorf("bridge after the take-over: %v, want %v", got, gateways[:1])
	}
	if owner := nodeOwner(); owner != "kubenetctl" {
		t.Errorf("owner %q after --take-over-node, want kubenetctl", owner)
	}
	late := node.NewPod(t, "late")
	if err := node.Add(list, late); testkit.CNICode(err) != core.ErrNodeOwned {
		t.Errorf("conflist ADD after the take-over: %v, want code %d", err, core.ErrNodeOwned)
	}
	testkit.AssertNoResidue(t, node, "kubenet", testkit.AttachmentOf(late), nil)
}
