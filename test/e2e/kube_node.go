package e2e

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/kubenet-dev/kubenet/test/nettest"
)

// KubeNode is a node of the cluster: a network namespace on the underlay, and in it a jail (a
// private mount, PID and UTS namespace, host name = node name) running containerd (the
// cluster's release: Debian's 1.6 or 2.2), a kubelet and kube-proxy. The node's disk is a directory of the test: /var/lib, /var/log and
// the changes to /etc and /opt (where the agent writes the conflist and installs the plugin)
// live there and survive a Reboot; /run is a tmpfs of the jail and does not.
type KubeNode struct {
	Name  string
	Addrs []netip.Prefix // underlay addresses, one per family
	NS    ns.NetNS
	Dir   string

	Jail                       *Jail
	Containerd, Kubelet, Proxy *Daemon

	cluster *KubeCluster
	nsName  string
}

// Node paths inside the jail, which are the defaults of every component and of the manifest.
const (
	nodeCNIConfDir = "/etc/cni/net.d"
	nodeCNIBinDir  = "/opt/cni/bin"
	nodeDataDir    = "/var/lib/cni/networks" // kubenet's default dataDir
	containerdSock = "/run/containerd/containerd.sock"
)

// kernelTunables are the sysctls kubelet sets machine-wide when they differ from these values
// (vm.overcommit_memory, kernel.panic, ...). Inside the jail a file with exactly the value
// kubelet wants is bound over each, so kubelet reads what it wants and writes nothing.
var kernelTunables = map[string]string{
	"vm/overcommit_memory":      "1",
	"vm/panic_on_oom":           "0",
	"kernel/panic":              "10",
	"kernel/panic_on_oops":      "1",
	"kernel/keys/root_maxkeys":  "1000000",
	"kernel/keys/root_maxbytes": "25000000",
}

// disk is where a path of the node's file system lives on the machine.
func (n *KubeNode) disk(parts ...string) string {
	return filepath.Join(append([]string{n.Dir}, parts...)...)
}

// nodeDirs are the node's directories of its own, each bound over the path the node sees
// (its disk): the CNI dirs start empty whatever the machine has there (a machine's podman may
// have left a conflist in /etc/cni/net.d, which would make the node Ready without kubenet).
var nodeDirs = []struct{ disk, path string }{
	{"var-lib", "/var/lib"},
	{"var-log", "/var/log"},
	{"cni-conf", nodeCNIConfDir},
	{"cni-bin", nodeCNIBinDir},
}

// HostPath is the machine's path of a file the node sees at p under one of nodeDirs.
func (n *KubeNode) HostPath(p string) string {
	for _, d := range nodeDirs {
		if rest, ok := strings.CutPrefix(p, d.path+"/"); ok {
			return n.disk(d.disk, rest)
		}
	}
	panic("not on the node's disk: " + p)
}

// State is where kubenet keeps its per-pod state on this node, for the residue audit; podCIDRs
// are the node's (Node.spec.podCIDRs: the audit tells the bridge's own address from pods' by
// them).
func (n *KubeNode) State(podCIDRs []netip.Prefix) NodeState {
	return NodeState{NS: n.NS, DataDir: n.HostPath(nodeDataDir), Network: "kubenet", PodCIDRs: podCIDRs}
}

// prepareDisk makes the node's directories and configuration files (once: a reboot keeps them).
func (n *KubeNode) prepareDisk(t testing.TB) {
	t.Helper()
	for _, d := range []string{"var-lib", "var-log", "cni-conf", "cni-bin", "etc-upper", "etc-work", "opt-upper", "opt-work", "sysctl"} {
		if err := os.MkdirAll(n.disk(d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for name, v := range kernelTunables {
		if err := os.WriteFile(n.disk("sysctl", strings.ReplaceAll(name, "/", ".")), []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	c := n.cluster
	// containerd 1.6 runs the reference loopback plugin for the pod's lo: a node image ships it
	// (kubeadm's kubernetes-cni package); the agent installs only kubenet. containerd 2 brings
	// lo up itself here, so its nodes have no CNI binary but kubenet.
	if c.cfg.Containerd.NeedsLoopback() {
		if err := copyFile(filepath.Join(c.refPlugins, "loopback"), n.disk("cni-bin", "loopback"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	config := c.cfg.Containerd.Config(containerdPaths{Root: "/var/lib/containerd", State: "/run/containerd", Socket: containerdSock,
		SandboxImage: KubePauseImage, CNIConf: nodeCNIConfDir, CNIBin: nodeCNIBinDir, RuncRoot: "/run/containerd/runc"})
	write := func(name, body string) {
		if err := os.WriteFile(n.disk(name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("containerd.toml", config)
	// Pods with dnsPolicy Default get this; nothing answers on the underlay's router.
	write("resolv.conf", "nameserver "+c.routerAddrs[0].Addr().String()+"\n")
	write("kubelet.yaml", fmt.Sprintf(kubeletConfig, c.cp.Dir+"/ca.crt", n.disk("resolv.conf"), c.cfg.ClusterDNS))
	write("kube-proxy.yaml", fmt.Sprintf(kubeProxyConfig, c.cp.Kubeconfig(t, "system:kube-proxy"), n.Name, c.cfg.ProxyMode, nettest.JoinPrefixes(c.cfg.ClusterCIDRs)))
	n.cluster.cp.Kubeconfig(t, "system:node:"+n.Name)
}

// jailCgroup is the jail's cgroup, removed with it; it carries the run's name so a later run
// can sweep it.
func (n *KubeNode) jailCgroup() string { return "/" + n.nsName }

// containerCgroupParent is where containerd places the cgroup of every container when kubelet
// names no parent (cgroupsPerQOS off): /k8s.io/<container id> in each hierarchy.
const containerCgroupParent = "k8s.io"

// removeContainerCgroups removes the cgroup of every container the node's containerd ever
// made, found by the per-container directories containerd's CRI plugin keeps on the node's
// disk: runc removes a container's cgroups when the container is deleted, but not those of
// containers that died with their node. dir is the node's directory.
func removeContainerCgroups(dir string) error {
	var ids []string
	for _, kind := range []string{"sandboxes", "containers"} {
		entries, _ := os.ReadDir(filepath.Join(dir, "var-lib/containerd/io.containerd.grpc.v1.cri", kind))
		for _, e := range entries {
			ids = append(ids, e.Name())
		}
	}
	hierarchies, err := os.ReadDir(cgroupRoot)
	if err != nil {
		return err
	}
	var left []string
	err = nettest.Eventually(30*time.Second, func() error {
		left = nil
		for _, h := range hierarchies {
			for _, id := range ids {
				p := filepath.Join(cgroupRoot, h.Name(), containerCgroupParent, id)
				if err := syscall.Rmdir(p); err != nil && !errors.Is(err, syscall.ENOENT) {
					left = append(left, fmt.Sprintf("%s: %v", p, err))
				}
			}
		}
		if len(left) > 0 {
			return fmt.Errorf("container cgroups left: %s", strings.Join(left, "; "))
		}
		return nil
	})
	for _, h := range hierarchies {
		// Gone once no node uses it any more; another node's containers may still be there.
		_ = syscall.Rmdir(filepath.Join(cgroupRoot, h.Name(), containerCgroupParent))
	}
	return err
}

// boot starts the node: the jail, containerd (with the images imported), kubelet and
// kube-proxy. Each stops when the cluster's test ends; Reboot and Restart replace them.
func (n *KubeNode) boot(t testing.TB) {
	t.Helper()
	// Registered before the jail, so it runs once the jail has ended.
	t.Cleanup(func() {
		if err := removeContainerCgroups(n.Dir); err != nil {
			t.Errorf("%s: %v", n.Name, err)
		}
	})
	n.Jail = StartJail(t, n.NS, JailConfig{
		Hostname:     n.Name,
		NetnsSys:     true,
		CgroupParent: n.jailCgroup(),
		Overlays: []Overlay{
			{Target: "/etc", Upper: n.disk("etc-upper"), Work: n.disk("etc-work")},
			{Target: "/opt", Upper: n.disk("opt-upper"), Work: n.disk("opt-work")},
		},
		Binds: n.binds(),
	})
	n.startContainerd(t)
	if _, err := n.Ctr("--namespace", "k8s.io", "images", "import", n.cluster.cfg.Images); err != nil {
		t.Fatal(err)
	}
	n.startKubelet(t)
	n.startProxy(t)
}

func (n *KubeNode) binds() []Bind {
	var b []Bind
	for _, d := range nodeDirs {
		// /etc and /opt are overlays: making a missing CNI dir there touches only the node.
		b = append(b, Bind{Source: n.disk(d.disk), Target: d.path, Create: strings.HasPrefix(d.path, "/etc/") || strings.HasPrefix(d.path, "/opt/")})
	}
	for name := range kernelTunables {
		b = append(b, Bind{Source: n.disk("sysctl", strings.ReplaceAll(name, "/", ".")), Target: "/proc/sys/" + name})
	}
	return b
}

func (n *KubeNode) startContainerd(t testing.TB) {
	t.Helper()
	n.Containerd = n.Jail.StartDaemon(t, n.disk("containerd.log"), n.cluster.cfg.Containerd.Bin("containerd"), "--config", n.disk("containerd.toml"))
	err := n.whileUp(time.Minute, func() error {
		_, err := n.Ctr("version")
		return err
	}, n.Containerd)
	if err != nil {
		t.Fatalf("%s: containerd did not start: %v", n.Name, err)
	}
}

// Ctr runs the ctr of the node's containerd release inside the node (its default socket) and
// returns its output.
func (n *KubeNode) Ctr(args ...string) (string, error) {
	return n.Jail.Output(n.cluster.cfg.Containerd.Bin("ctr"), args...)
}

func (n *KubeNode) startKubelet(t testing.TB) {
	t.Helper()
	var ips []string
	for _, a := range n.Addrs {
		ips = append(ips, a.Addr().String())
	}
	c := n.cluster
	n.Kubelet = n.Jail.StartDaemon(t, n.disk("kubelet.log"), c.cfg.Bins.Path("kubelet"),
		"--config="+n.disk("kubelet.yaml"),
		"--kubeconfig="+c.cp.KubeconfigPath("system:node:"+n.Name),
		"--hostname-override="+n.Name,
		"--node-ip="+strings.Join(ips, ","),
		"--v=2",
	)
	// Up means past its start-up, which fails for good if the runtime is away at that moment.
	n.waitHealthy(t, "http://127.0.0.1:10248/healthz", n.Kubelet)
}

// waitHealthy polls url from inside the node's namespace until it answers 200 OK.
func (n *KubeNode) waitHealthy(t testing.TB, url string, d *Daemon) {
	t.Helper()
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DialContext: nettest.DialIn(n.NS), DisableKeepAlives: true}}
	err := n.whileUp(2*time.Minute, func() error { return get(client, url) }, d)
	if err != nil {
		t.Fatalf("%s: %s not healthy: %v", n.Name, d.Name, err)
	}
}

func (n *KubeNode) startProxy(t testing.TB) {
	t.Helper()
	n.Proxy = n.Jail.StartDaemon(t, n.disk("kube-proxy.log"), n.cluster.cfg.Bins.Path("kube-proxy"),
		"--config="+n.disk("kube-proxy.yaml"), "--v=2")
	// Healthy once it has written its rules.
	n.waitHealthy(t, "http://127.0.0.1:10256/healthz", n.Proxy)
}

// whileUp polls f until it succeeds, failing early when one of the daemons has exited.
func (n *KubeNode) whileUp(timeout time.Duration, f func() error, daemons ...*Daemon) error {
	return nettest.Eventually(timeout, func() error {
		for _, d := range daemons {
			if d.Exited() {
				return fmt.Errorf("%w: %s; its log:\n%s", nettest.ErrExited, d.Name, nettest.Tail(d.LogFile, 20))
			}
		}
		return f()
	})
}

// Restart stops one of the node's daemons (containerd, kubelet or kube-proxy) with SIGTERM and
// starts it again, as `systemctl restart` would.
func (n *KubeNode) Restart(t testing.TB, daemon string) {
	t.Helper()
	t = n.cluster.lifetime(t)
	stop := func(d *Daemon) {
		if err := d.Stop(); err != nil {
			t.Fatalf("%s: %v", n.Name, err)
		}
	}
	switch daemon {
	case "containerd":
		stop(n.Containerd)
		n.startContainerd(t)
	case "kubelet":
		stop(n.Kubelet)
		n.startKubelet(t)
	case "kube-proxy":
		stop(n.Proxy)
		n.startProxy(t)
	default:
		t.Fatalf("no daemon %s on a node", daemon)
	}
}

// Reboot is a power cycle of the node: every process of the jail is killed at once, the
// jail's /run (containerd's state, the pods' network namespace mounts) is gone with it, and
// the node's network namespace is replaced by a new one with the same underlay addresses, as
// the kernel's network state (links, routes, nftables) does not survive a reboot either. The
// node's disk stays. Then the node boots again.
func (n *KubeNode) Reboot(t testing.TB) {
	t.Helper()
	t = n.cluster.lifetime(t)
	if err := n.Jail.Kill(); err != nil {
		t.Fatalf("%s: power off: %v", n.Name, err)
	}
	// What the kernel would have dropped with the machine: nothing on the node's disk knows
	// these cgroups any more.
	if err := removeContainerCgroups(n.Dir); err != nil {
		t.Fatalf("%s: %v", n.Name, err)
	}
	old := n.NS
	_ = old.Close()
	if err := nettest.RemoveNS(filepath.Join("/run/netns", n.nsName)); err != nil {
		t.Fatalf("%s: %v", n.Name, err)
	}
	n.NS = n.cluster.plugNode(t, n.nsName, n.Addrs)
	n.boot(t)
}

// copyFile copies src to dst with mode.
func copyFile(src, dst string, mode os.FileMode) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, mode)
}

// kubeletConfig is the node's KubeletConfiguration: cgroupfs without per-QoS cgroups (no
// systemd here, and the machine is cgroup v1), every pod under the node's own cgroup root, no
// evictions and no image garbage collection (the jail cannot measure the machine's disk, and
// the images cannot be pulled again), a private resolv.conf, and the kubelet's API secured the
// way kubeadm does it (client certificates of the cluster CA, webhook authorization).
const kubeletConfig = `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
failCgroupV1: false
localStorageCapacityIsolation: false
evictionHard:
  memory.available: "1Mi"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
protectKernelDefaults: false
resolvConf: %[2]s
clusterDNS: [%[3]s]
clusterDomain: cluster.local
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
serializeImagePulls: false
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: %[1]s
authorization:
  mode: Webhook
`

// kubeProxyConfig is the node's KubeProxyConfiguration. The conntrack settings are all zero,
// which tells kube-proxy to leave nf_conntrack_max, the hash size and the timeouts alone: they
// are the machine's, not the node's.
const kubeProxyConfig = `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: %[1]s
hostnameOverride: %[2]s
mode: %[3]s
clusterCIDR: %[4]s
metricsBindAddress: 127.0.0.1:10249
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
`
