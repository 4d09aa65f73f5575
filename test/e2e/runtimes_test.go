//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/kubenet-dev/kubenet/agent/cnidir"
	"github.com/kubenet-dev/kubenet/core"
	"github.com/kubenet-dev/kubenet/internal/nft"
	"github.com/kubenet-dev/kubenet/internal/verblog"
	"github.com/kubenet-dev/kubenet/test/nettest"
	"github.com/kubenet-dev/kubenet/test/testkit"
)

// network is the CNI network name of the runtime tests' conflist.
const network = "kubenet"

// runtimeWorld is one node for one runtime: a nettest node (node netns with an "external" host
// outside the non-masquerade CIDRs and a "peer" inside them that routes the pod CIDRs to the
// node), a private CNI conf dir holding kubenet's conflist, a private CNI bin dir, and the
// image archive.
type runtimeWorld struct {
	node    *nettest.Node
	dir     string
	cni     CNIDirs
	list    *libcni.NetworkConfigList
	archive string
	// callLog is kubenet's call log (the conflist's logFile): one line per call, with the CNI
	// version the runtime called with.
	callLog string
}

// agentCNIVersions is the cniVersions list of the conflist kubenet-agent writes.
var agentCNIVersions = []string{"1.0.0", "1.1.0"}

// newRuntimeWorld prepares a node. plugins are extra CNI binaries for the bin dir (containerd
// 1.6 runs the reference loopback plugin as a network of its own). The conflist's versions are
// the agent's: cniVersion 1.0.0, which containerd 1.6 and podman 4.3 read (they reject 1.1.0
// results), and cniVersions 1.0.0 and 1.1.0, from which containerd 2 picks 1.1.0.
func newRuntimeWorld(t *testing.T, plugins ...string) runtimeWorld {
	t.Helper()
	node := nettest.NewNode(t, binDir)
	w := runtimeWorld{node: node, dir: t.TempDir()}
	w.cni = CNIDirs{Conf: filepath.Join(w.dir, "cni-conf"), Bin: filepath.Join(w.dir, "cni-bin")}
	for _, d := range []string{w.cni.Conf, w.cni.Bin} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range append([]string{filepath.Join(binDir, "kubenet")}, plugins...) {
		if err := os.Symlink(p, filepath.Join(w.cni.Bin, filepath.Base(p))); err != nil {
			t.Fatal(err)
		}
	}
	w.callLog = filepath.Join(w.dir, "log", "calls.log")
	w.list = node.ConfList(t, nettest.NetConf{
		CNIVersion:         cnidir.DefaultCNIVersion,
		CNIVersions:        agentCNIVersions,
		Name:               network,
		PodCIDRs:           []netip.Prefix{nettest.PodCIDR4, nettest.PodCIDR6},
		NonMasqueradeCIDRs: []netip.Prefix{nettest.NonMasquerade4, nettest.NonMasquerade6},
		Extra:              map[string]any{"logFile": w.callLog},
	})
	if err := os.WriteFile(filepath.Join(w.cni.Conf, "10-kubenet.conflist"), w.list.Bytes, 0o644); err != nil {
		t.Fatal(err)
	}
	w.archive = filepath.Join(w.dir, "images.tar")
	err := WriteBusyboxArchive(w.archive, "/bin/busybox",
		Image{Ref: BusyboxImage, Cmd: ServerCommand},
		// The sandbox's only job is to hold the namespaces; the runtime SIGKILLs it.
		Image{Ref: PauseImage, Cmd: []string{"/bin/sleep", "inf"}})
	Require(t, err, "built images %s and %s from Debian's busybox-static", BusyboxImage, PauseImage)
	return w
}

// requireTools fails (not skips: a silent skip would hide that nothing was tested) when a
// runtime is not installed.
func requireTools(t *testing.T, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is not installed: run `make e2e-runtimes`, which installs it with apt-get", tool)
		}
	}
}

// Addresses of the world around the node, per family.
var (
	uplink   = map[bool]netip.Addr{false: nettest.NodeUplink4.Addr(), true: nettest.NodeUplink6.Addr()}
	external = map[bool]netip.Addr{false: nettest.External4.Addr(), true: nettest.External6.Addr()}
	peer     = map[bool]netip.Addr{false: nettest.Peer4.Addr(), true: nettest.Peer6.Addr()}
)

// checkPodServes checks that the server in the pod answers on each pod address from the peer
// (no NAT: the server sees the peer's own address) and on the node's hostPort from the
// external host (DNAT to the pod; the server sees the external host's address).
func checkPodServes(t *testing.T, w runtimeWorld, ips []netip.Addr, hostPort uint16) {
	t.Helper()
	for _, ip := range ips {
		dst := netip.AddrPortFrom(ip, ServerPort)
		Check(t, ExpectHTTPFrom(w.node.Peer, dst, peer[ip.Is6()]), "pod address %s reached from the peer netns; the pod saw the peer's address %s", dst, peer[ip.Is6()])
	}
	for _, is6 := range []bool{false, true} {
		dst := netip.AddrPortFrom(uplink[is6], hostPort)
		Check(t, ExpectHTTPFrom(w.node.External, dst, external[is6]), "hostPort %s reached from the external netns; the pod saw the client's address %s", dst, external[is6])
	}
}

// checkRecord checks kubenet's attachment record of the pod: the addresses the runtime
// reports, and the capability arguments the runtime passed (proof that they reached the plugin
// in the runtime's own JSON shape).
func checkRecord(t *testing.T, w runtimeWorld, id string, ips []netip.Addr, hostPort int, bandwidth *core.Bandwidth) {
	t.Helper()
	rec, err := core.NewRecords(filepath.Join(w.node.DataDir(), network)).Load(core.Attachment{ContainerID: id, IfName: "eth0"})
	Require(t, err, "kubenet's attachment record of %s/eth0 exists", short(id))
	var recIPs []netip.Addr
	for _, p := range rec.IPs {
		recIPs = append(recIPs, p.Addr())
	}
	Check(t, sameAddrs(recIPs, ips), "the runtime reports the addresses kubenet assigned: %v", ips)
	var ports []int
	for _, m := range rec.PortMappings {
		ports = append(ports, int(m.HostPort))
	}
	var portErr error
	if !slices.Contains(ports, hostPort) {
		portErr = fmt.Errorf("record has host ports %v", ports)
	}
	Check(t, portErr, "the runtime passed hostPort %d to kubenet (portMappings capability)", hostPort)
	if bandwidth != nil {
		var bwErr error
		if rec.Bandwidth == nil || rec.Bandwidth.IngressRate != bandwidth.IngressRate {
			bwErr = fmt.Errorf("record has bandwidth %+v", rec.Bandwidth)
		}
		Check(t, bwErr, "the runtime passed ingress rate %d bit/s to kubenet (bandwidth capability)", bandwidth.IngressRate)
	}
}

// checkIngressShaping checks that the pod's host veth carries a tbf qdisc with the rate.
func checkIngressShaping(t *testing.T, w runtimeWorld, id string, rateBits uint64) {
	t.Helper()
	veth := core.NamesFor(network, core.Attachment{ContainerID: id, IfName: "eth0"}).HostVeth
	var found []string
	err := w.node.NS.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(veth)
		if err != nil {
			return err
		}
		qdiscs, err := netlink.QdiscList(l)
		if err != nil {
			return err
		}
		for _, q := range qdiscs {
			if tbf, ok := q.(*netlink.Tbf); ok {
				found = append(found, fmt.Sprintf("tbf rate %d bit/s", tbf.Rate*8))
			}
		}
		return nil
	})
	if err == nil && !slices.Contains(found, fmt.Sprintf("tbf rate %d bit/s", rateBits)) {
		err = fmt.Errorf("qdiscs on %s: %v", veth, found)
	}
	Check(t, err, "ingress shaping: tbf qdisc with rate %d bit/s on the pod's host veth %s", rateBits, veth)
}

// checkNoResidue runs the residue audit on the node and checks the runtime-side leftovers in
// the jail: libcni's result cache and the netns mounts.
func checkNoResidue(t *testing.T, w runtimeWorld, jail *Jail, netnsDirs ...string) {
	t.Helper()
	left, err := Residue(NodeState{NS: w.node.NS, DataDir: w.node.DataDir(), Network: network,
		PodCIDRs: []netip.Prefix{nettest.PodCIDR4, nettest.PodCIDR6}})
	if err == nil && len(left) > 0 {
		err = fmt.Errorf("left behind:\n  %s", strings.Join(left, "\n  "))
	}
	Check(t, err, "zero residue on the node: no veth on the bridge, ifb, tbf/ingress qdisc, reservation, record, hostPort index file, nftables element (hostPort maps, isolation sets, policy table), or conntrack entry of a pod address")
	for _, dir := range append([]string{"/var/lib/cni/results"}, netnsDirs...) {
		out, err := jail.Output("find", dir, "-mindepth", "1")
		if err == nil && strings.TrimSpace(out) != "" {
			err = fmt.Errorf("left behind:\n%s", out)
		}
		Check(t, err, "zero residue in the runtime's %s (inside its jail)", dir)
	}
}

// containerdBins is the directory of hack/containerd/build.sh's binaries; `make e2e-runtimes`
// and `make e2e-kubernetes` pass it.
var containerdBins = flag.String("containerd.bins", "", "directory of hack/containerd/build.sh's containerd 2 binaries (default: run build.sh when a test needs them)")

var builtContainerd = sync.OnceValues(func() (ContainerdRelease, error) {
	dir := *containerdBins
	if dir == "" {
		cmd := exec.Command("../../hack/containerd/build.sh")
		cmd.Stderr = os.Stderr
		out, err := cmd.Output()
		if err != nil {
			return ContainerdRelease{}, fmt.Errorf("hack/containerd/build.sh: %w", err)
		}
		dir = strings.TrimSpace(string(out))
	}
	r := ContainerdRelease{Name: "2.2", Dir: dir}
	for _, b := range []string{"containerd", "containerd-shim-runc-v2", "ctr"} {
		if _, err := os.Stat(r.Bin(b)); err != nil {
			return r, err
		}
	}
	return r, nil
})

// debianContainerd is Debian's containerd, the one install-runtimes.sh and the Makefile install.
var debianContainerd = ContainerdRelease{Name: "1.6"}

// containerdRelease is the release called name: Debian's 1.6 (installed by `make e2e-runtimes`)
// or 2.2 (hack/containerd/build.sh's).
func containerdRelease(t testing.TB, name string) ContainerdRelease {
	t.Helper()
	switch name {
	case debianContainerd.Name:
		return debianContainerd
	case "2.2":
		r, err := builtContainerd()
		Require(t, err, "containerd 2.2 built by hack/containerd/build.sh in %s", r.Dir)
		return r
	}
	t.Fatalf("no containerd %q: 1.6 (Debian's) or 2.2 (hack/containerd/build.sh)", name)
	return ContainerdRelease{}
}

// TestRuntimeContainerd runs a pod with a hostPort and an ingress-bandwidth annotation through
// containerd's CRI API, the calls kubelet makes, with kubenet as the pod network: on Debian's
// containerd 1.6 and on containerd 2.2, which also calls STATUS, with cniVersion 1.1.0.
func TestRuntimeContainerd(t *testing.T) {
	requireTools(t, "containerd", "ctr", "runc", "containerd-shim-runc-v2", "nsenter")
	for _, name := range []string{"1.6", "2.2"} {
		// One after the other: each prints its checks, and interleaved they would not say whose.
		t.Run(name, func(t *testing.T) { testContainerd(t, containerdRelease(t, name)) })
	}
}

func testContainerd(t *testing.T, r ContainerdRelease) {
	var plugins []string
	if r.NeedsLoopback() {
		refDir, err := nettest.InstallRefPlugins()
		Require(t, err, "reference loopback plugin %s available (containerd 1.6 runs it for the pod's lo)", nettest.RefPluginsVersion)
		plugins = append(plugins, filepath.Join(refDir, "loopback"))
	}
	w := newRuntimeWorld(t, plugins...)
	jail := NewJail(t, w.node.NS)
	cd := StartContainerd(t, r, jail, w.dir, w.cni, w.archive)
	Check(t, nil, "%s running in the node netns (private root, state, sockets; pid %s), CRI reports RuntimeReady and NetworkReady; images imported", cd.Version, pidString(cd.Daemon))
	// Registered after the daemon, so it runs first at cleanup: pods go away through CNI DEL
	// even when the test fails midway.
	t.Cleanup(func() { cd.RemoveAllPods(t) })

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	versions, err := cd.CRI.CNIVersions(ctx)
	if err == nil && versions[network] != r.CNIVersion() {
		err = fmt.Errorf("networks and versions: %v", versions)
	}
	Check(t, err, "containerd %s loaded network %s with cniVersion %s (verbose Status's cniconfig) from the conflist's cniVersion %s and cniVersions %v",
		r.Name, network, r.CNIVersion(), cnidir.DefaultCNIVersion, agentCNIVersions)
	const hostPort, rate = 30080, 10_000_000
	podCfg := &runtimeapi.PodSandboxConfig{
		Metadata:     &runtimeapi.PodSandboxMetadata{Name: "web", Uid: "e2e-web-uid", Namespace: "default"},
		Hostname:     "web",
		PortMappings: []*runtimeapi.PortMapping{{Protocol: runtimeapi.Protocol_TCP, ContainerPort: ServerPort, HostPort: hostPort}},
		Annotations:  map[string]string{"kubernetes.io/ingress-bandwidth": "10M"},
		Linux:        &runtimeapi.LinuxPodSandboxConfig{CgroupParent: jail.CgroupParent},
	}
	podID, err := cd.CRI.RunPod(ctx, podCfg)
	Require(t, err, "RunPodSandbox web (hostPort %d->%d, kubernetes.io/ingress-bandwidth=10M): sandbox %s", hostPort, ServerPort, short(podID))
	ctrID, err := cd.CRI.StartContainer(ctx, podID, podCfg, &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: "server"},
		Image:    &runtimeapi.ImageSpec{Image: BusyboxImage},
		Command:  ServerCommand,
	})
	Require(t, err, "CreateContainer + StartContainer: busybox httpd in the pod (container %s)", short(ctrID))
	state, err := cd.CRI.ContainerState(ctx, ctrID)
	if err == nil && state != runtimeapi.ContainerState_CONTAINER_RUNNING {
		err = fmt.Errorf("state %s", state)
	}
	Check(t, err, "ContainerStatus reports the server running")
	ips, err := cd.CRI.PodIPs(ctx, podID)
	if err == nil && len(ips) != 2 {
		err = fmt.Errorf("pod has addresses %v, want one per family", ips)
	}
	Require(t, err, "PodSandboxStatus reports one address per family: %v", ips)
	checkRecord(t, w, podID, ips, hostPort, &core.Bandwidth{IngressRate: rate})
	checkPodServes(t, w, ips, hostPort)
	checkIngressShaping(t, w, podID, rate)
	checkStatusDrivesNetworkReady(t, w, cd, ips, hostPort)

	Require(t, cd.CRI.StopAndRemovePod(ctx, podID), "StopPodSandbox + RemovePodSandbox %s", short(podID))
	left, err := cd.CRI.PodIDs(ctx)
	if err == nil && len(left) > 0 {
		err = fmt.Errorf("pods %v remain", left)
	}
	Check(t, err, "containerd lists no pod sandbox")
	checkCallVersions(t, w, podID, r.CNIVersion(), "ADD", "DEL")
	checkNoResidue(t, w, jail, filepath.Join(cd.StateDir, "io.containerd.grpc.v1.cri", "netns"))
	Check(t, cd.Daemon.Stop(), "containerd stopped by its pid (SIGTERM)")
}

// checkStatusDrivesNetworkReady takes the network's node-wide rules away (the table a firewall
// reload flushes) under the running pod. containerd 2 calls kubenet's STATUS on every CRI
// Status: NetworkReady turns false with kubenet's answer (code 50, naming the missing rules) as
// the message, which kubelet would make the Node's NotReady reason; once the agent's repair
// (core.HealNode, in-process in the node netns) has put the rules back, NetworkReady is true
// again and the pod serves its hostPort again. containerd 1.6 never calls STATUS: it reports
// NetworkReady all along, which shows what the check tells apart.
func checkStatusDrivesNetworkReady(t *testing.T, w runtimeWorld, cd *Containerd, ips []netip.Addr, hostPort uint16) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	table := nft.TableName(network)
	nettest.Run(t, w.node.NS, "nft", "delete", "table", "inet", table)
	broken := time.Now()
	if !cd.Release.V2() {
		cond, err := cd.CRI.NetworkCondition(ctx)
		if err == nil && !cond.Status {
			err = fmt.Errorf("NetworkReady=false: %s %s", cond.Reason, cond.Message)
		}
		Check(t, err, "containerd 1.6 reports NetworkReady=true with table inet %s deleted: it never calls STATUS", table)
	} else {
		var cond *runtimeapi.RuntimeCondition
		err := nettest.Eventually(time.Minute, func() error {
			var err error
			if cond, err = cd.CRI.NetworkCondition(ctx); err == nil && cond.Status {
				err = errors.New("NetworkReady=true")
			}
			return err
		})
		if err == nil && (cond.Reason != "NetworkPluginNotReady" || !strings.Contains(cond.Message, "node-wide rules of network \""+network+"\"") ||
			!strings.Contains(cond.Message, "missing")) {
			err = fmt.Errorf("NetworkReady=false, reason %q, message %q", cond.Reason, cond.Message)
		}
		Check(t, err, "with table inet %s deleted, CRI Status reports NetworkReady=false within %s, reason %s, message %q",
			table, time.Since(broken).Round(time.Millisecond), cond.GetReason(), cond.GetMessage())
		err = logHas(w, func(l verblog.Entry) error {
			if l.Verb != "STATUS" || l.Time.Before(broken.Add(-time.Second)) {
				return errSkip
			}
			if l.Error == nil || l.Error.Code != core.ErrPluginNotAvailable || l.CNIVersion != "1.1.0" {
				return fmt.Errorf("STATUS line %+v", l)
			}
			return nil
		})
		Check(t, err, "kubenet's call log has the failed STATUS: code %d, cniVersion 1.1.0", core.ErrPluginNotAvailable)
	}

	cfg := testkit.PluginConfig(t, w.list)
	var rep core.NodeRepair
	nettest.Do(t, w.node.NS, func() error {
		var err error
		rep, err = core.HealNode(ctx, cfg, true)
		return err
	})
	var repErr error
	if rep.Found == nil || rep.Restored != len(ips) {
		repErr = fmt.Errorf("repair %+v", rep)
	}
	Check(t, repErr, "the agent's repair (core.HealNode) found the node-wide rules missing and put them back, with the pod's %d hostPort map elements", len(ips))
	repaired := time.Now()
	err := nettest.Eventually(time.Minute, func() error {
		cond, err := cd.CRI.NetworkCondition(ctx)
		if err == nil && !cond.Status {
			err = fmt.Errorf("NetworkReady=false: %s %s", cond.Reason, cond.Message)
		}
		return err
	})
	Check(t, err, "CRI Status reports NetworkReady=true again %s after the repair", time.Since(repaired).Round(time.Millisecond))
	checkPodServes(t, w, ips, hostPort)
}

// errSkip tells logHas that a line is not the one looked for.
var errSkip = errors.New("not this line")

// logHas reads kubenet's call log and returns nil once match accepts a line (returns nil), the
// first error other than errSkip that match returns, or an error when no line matched.
func logHas(w runtimeWorld, match func(verblog.Entry) error) error {
	lines, err := readCallLog(w.callLog)
	if err != nil {
		return err
	}
	for _, l := range lines {
		if err := match(l); !errors.Is(err, errSkip) {
			return err
		}
	}
	return fmt.Errorf("no such line among %d in %s", len(lines), w.callLog)
}

// checkCallVersions checks kubenet's call log for the calls the runtime made for the sandbox id:
// verbs, in this order (a verb repeated in a row counts once: containerd 1.6 sends DEL on
// StopPodSandbox and again on RemovePodSandbox), each with the CNI version want.
func checkCallVersions(t *testing.T, w runtimeWorld, id, want string, verbs ...string) {
	t.Helper()
	lines, err := readCallLog(w.callLog)
	var got []string
	if err == nil {
		for _, l := range lines {
			if l.Container != id {
				continue
			}
			got = append(got, l.Verb+" "+l.CNIVersion)
			got = slices.Compact(got)
			if l.CNIVersion != want && err == nil {
				err = fmt.Errorf("%s called with cniVersion %q", l.Verb, l.CNIVersion)
			}
		}
	}
	var wantCalls []string
	for _, v := range verbs {
		wantCalls = append(wantCalls, v+" "+want)
	}
	if err == nil && !slices.Equal(got, wantCalls) {
		err = fmt.Errorf("calls %v, want %v", got, wantCalls)
	}
	Check(t, err, "kubenet's call log: the runtime called %v for sandbox %s, each with cniVersion %s", verbs, short(id), want)
}

// readCallLog parses kubenet's call log.
func readCallLog(path string) ([]verblog.Entry, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []verblog.Entry
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var e verblog.Entry
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			return nil, fmt.Errorf("%s: %q: %w", path, line, err)
		}
		out = append(out, e)
	}
	return out, nil
}

// TestRuntimePodman runs a container with a published port through podman 4's CNI backend
// with kubenet's conflist.
func TestRuntimePodman(t *testing.T) {
	requireTools(t, "podman", "conmon", "runc", "nsenter")
	w := newRuntimeWorld(t)
	jail := NewJail(t, w.node.NS, PodmanEtc(t, w.dir, w.cni)...)
	pm := NewPodman(t, jail, w.archive)
	version := pm.Run(t, "version", "--format", "{{.Client.Version}}")
	backend := pm.Run(t, "info", "--format", "{{.Host.NetworkBackend}}")
	var backendErr error
	if backend != "cni" {
		backendErr = fmt.Errorf("network backend is %q", backend)
	}
	Require(t, backendErr, "podman %s in the node netns with the CNI backend (private storage, /etc/containers and CNI dirs); images loaded", version)
	t.Cleanup(func() { _, _ = pm.Output("rm", "--all", "--force", "--time", "0") })

	const hostPort = 30081
	id, err := pm.Output("run", "--detach", "--name", "web", "--network", network, "--cgroup-parent", jail.CgroupParent,
		"--publish", fmt.Sprintf("%d:%d", hostPort, ServerPort), BusyboxImage)
	Require(t, err, "podman run --network %s --publish %d:%d: busybox httpd (container %s)", network, hostPort, ServerPort, short(id))
	ips := pm.IPs(t, "web", network)
	var ipsErr error
	if len(ips) != 2 {
		ipsErr = fmt.Errorf("container has addresses %v, want one per family", ips)
	}
	Require(t, ipsErr, "podman inspect reports one address per family: %v", ips)
	checkRecord(t, w, id, ips, hostPort, nil)
	checkPodServes(t, w, ips, hostPort)

	_, err = pm.Output("rm", "--force", "--time", "0", "web")
	Require(t, err, "podman rm web")
	out, err := pm.Output("ps", "--all", "--quiet")
	if err == nil && out != "" {
		err = fmt.Errorf("containers %s remain", out)
	}
	Check(t, err, "podman lists no container")
	checkNoResidue(t, w, jail, "/run/netns")
}

func pidString(d *Daemon) string {
	pid, err := d.Pid()
	if err != nil {
		return "?"
	}
	return fmt.Sprint(pid)
}

// short abbreviates a container ID for the log, as runtimes' CLIs do.
func short(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// sameAddrs tells whether a and b hold the same addresses, in any order.
func sameAddrs(a, b []netip.Addr) error {
	x, y := slices.Clone(a), slices.Clone(b)
	slices.SortFunc(x, netip.Addr.Compare)
	slices.SortFunc(y, netip.Addr.Compare)
	if !slices.Equal(x, y) {
		return fmt.Errorf("kubenet assigned %v, the runtime reports %v", a, b)
	}
	return nil
}
