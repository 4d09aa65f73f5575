//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/kubenet-dev/kubenet/core"
	"github.com/kubenet-dev/kubenet/internal/nettest"
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
	archive string
}

// newRuntimeWorld prepares a node. plugins are extra CNI binaries for the bin dir (containerd
// 1.6 runs the reference loopback plugin as a network of its own). The conflist says
// cniVersion 1.0.0: containerd 1.6 and podman 4.3 reject 1.1.0 results.
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
	list := node.ConfList(t, nettest.NetConf{
		CNIVersion:         "1.0.0",
		Name:               network,
		PodCIDRs:           []netip.Prefix{nettest.PodCIDR4, nettest.PodCIDR6},
		NonMasqueradeCIDRs: []netip.Prefix{nettest.NonMasquerade4, nettest.NonMasquerade6},
	})
	if err := os.WriteFile(filepath.Join(w.cni.Conf, "10-kubenet.conflist"), list.Bytes, 0o644); err != nil {
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

// TestRuntimeContainerd runs a pod with a hostPort and an ingress-bandwidth annotation through
// containerd's CRI API, the calls kubelet makes, with kubenet as the pod network.
func TestRuntimeContainerd(t *testing.T) {
	requireTools(t, "containerd", "ctr", "runc", "containerd-shim-runc-v2", "nsenter")
	refDir, err := nettest.InstallRefPlugins()
	Require(t, err, "reference loopback plugin %s available (containerd 1.6 runs it for the pod's lo)", nettest.RefPluginsVersion)
	w := newRuntimeWorld(t, filepath.Join(refDir, "loopback"))
	jail := NewJail(t, w.node.NS)
	cd := StartContainerd(t, jail, w.dir, w.cni, w.archive)
	Check(t, nil, "%s running in the node netns (private root, state, sockets; pid %s), CRI reports RuntimeReady and NetworkReady; images imported", cd.Version, pidString(cd.Daemon))
	// Registered after the daemon, so it runs first at cleanup: pods go away through CNI DEL
	// even when the test fails midway.
	t.Cleanup(func() { cd.RemoveAllPods(t) })

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
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

	Require(t, cd.CRI.StopAndRemovePod(ctx, podID), "StopPodSandbox + RemovePodSandbox %s", short(podID))
	left, err := cd.CRI.PodIDs(ctx)
	if err == nil && len(left) > 0 {
		err = fmt.Errorf("pods %v remain", left)
	}
	Check(t, err, "containerd lists no pod sandbox")
	checkNoResidue(t, w, jail, filepath.Join(cd.StateDir, "io.containerd.grpc.v1.cri", "netns"))
	Check(t, cd.Daemon.Stop(), "containerd stopped by its pid (SIGTERM)")
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
