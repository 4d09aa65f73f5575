package e2e

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubenet-dev/kubenet/test/controlplane"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

// KubeClusterConfig describes a cluster to start.
type KubeClusterConfig struct {
	Bins KubeBins
	// Repo is the checkout: deploy/kubenet.yaml is installed from it.
	Repo string
	// Images is the archive of WriteKubeImages, imported into every node's containerd.
	Images string
	// ProxyMode is kube-proxy's mode: iptables or nftables.
	ProxyMode string
	// DualStack adds IPv6 to the underlay, the Service and cluster CIDRs and the node IPs
	// (IPv4 stays the primary family).
	DualStack bool
	// Nodes is the number of worker nodes.
	Nodes int
	// Topology is how the hosts are wired (kube_topology.go); empty is one-link.
	Topology KubeTopology
	// AgentArgs are flags appended to the agent's in deploy/kubenet.yaml (a user's edit of the
	// manifest, like the image and --cluster-cidr); they override the manifest's own.
	AgentArgs []string
	// Netfilter is kubenet's netfilterBackend on the nodes (the agent's --netfilter-backend):
	// nftables or iptables.
	Netfilter string
	// Containerd is the nodes' container runtime: Debian's 1.6 or containerd 2.2.
	Containerd ContainerdRelease

	// Filled in by StartKubeCluster from DualStack.
	ClusterCIDRs, ServiceCIDRs []netip.Prefix
	ClusterDNS                 string
}

// The cluster's addresses; they exist only inside the test's namespaces.
var (
	kubeUnderlay4 = netip.MustParsePrefix("10.250.0.0/24")
	kubeUnderlay6 = netip.MustParsePrefix("fd00:250::/64")
)

// kubeUnderlayAddr is host i's address on the underlay in p (10 is the control plane, 11 and up
// the nodes, 254 the router).
func kubeUnderlayAddr(p netip.Prefix, i int) netip.Prefix {
	if p.Addr().Is4() {
		a := p.Addr().As4()
		a[3] = byte(i)
		return netip.PrefixFrom(netip.AddrFrom4(a), p.Bits())
	}
	a := p.Addr().As16()
	a[15] = byte(i)
	return netip.PrefixFrom(netip.AddrFrom16(a), p.Bits())
}

// KubeCluster is a running cluster: an underlay segment, a control plane and nodes, each in a
// network namespace named after the run (kubenet-k8s-<pid>-<n>-<role>) so that a later run can
// sweep what a dead one left (SweepKubeRuns).
type KubeCluster struct {
	t           testing.TB // the test the cluster lives as long as
	cfg         KubeClusterConfig
	Name        string // kubenet-k8s-<pid>-<n>
	Dir         string
	segments    []*kubeSegment // the underlay's subnets (buildUnderlay)
	router      ns.NetNS       // the router between them; nil on one link
	routerAddrs []netip.Prefix // the router's addresses on the control plane's subnet
	cp          *controlplane.ControlPlane
	Nodes       []*KubeNode
	refPlugins  string
}

// kubeClusterSeq numbers the clusters of one test binary.
var kubeClusterSeq atomic.Int32

// KubeRunPrefix starts the name of everything a cluster makes on the machine (network
// namespaces, cgroups, its directory): kubenet-k8s-<pid of the test binary>-.
const KubeRunPrefix = "kubenet-k8s-"

// StartKubeCluster starts a cluster as cfg says and waits until every node is registered with
// its pod CIDRs. kubenet is not installed yet: InstallKubenet does that. Everything is torn
// down at cleanup, also when the test fails half-way.
func StartKubeCluster(t *testing.T, cfg KubeClusterConfig) *KubeCluster {
	t.Helper()
	nettest.RequireRoot(t)
	cfg.ClusterCIDRs = []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}
	cfg.ServiceCIDRs = []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")}
	cfg.ClusterDNS = "10.96.0.10"
	if cfg.DualStack {
		cfg.ClusterCIDRs = append(cfg.ClusterCIDRs, netip.MustParsePrefix("fd00:10:244::/56"))
		cfg.ServiceCIDRs = append(cfg.ServiceCIDRs, netip.MustParsePrefix("fd00:10:96::/112"))
	}
	c := &KubeCluster{t: t, cfg: cfg, Name: fmt.Sprintf("%s%d-%d", KubeRunPrefix, os.Getpid(), kubeClusterSeq.Add(1))}
	c.Dir = filepath.Join(os.TempDir(), c.Name)
	if err := os.MkdirAll(c.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the cluster's logs and files are kept in %s (the next run's sweep removes them)", c.Dir)
			return
		}
		if err := os.RemoveAll(c.Dir); err != nil {
			t.Errorf("remove %s: %v", c.Dir, err)
		}
	})
	var err error
	if c.refPlugins, err = nettest.InstallRefPlugins(); err != nil {
		t.Fatal(err)
	}

	c.buildUnderlay(t)
	// The control plane's subnet is node1's.
	addrs := func(i int) []netip.Prefix { return kubeHostAddrs(0, i, cfg.DualStack) }

	var names []string
	for i := 1; i <= cfg.Nodes; i++ {
		names = append(names, fmt.Sprintf("node%d", i))
	}
	cpDir := filepath.Join(c.Dir, "control-plane")
	if err := os.MkdirAll(cpDir, 0o755); err != nil {
		t.Fatal(err)
	}
	cpNS := c.plugNode(t, c.Name+"-cp", addrs(10))
	c.cp = controlplane.Start(t, cpNS, controlplane.Config{
		Bins: cfg.Bins.Dir, Dir: cpDir, Addrs: addrs(10), ServiceCIDRs: cfg.ServiceCIDRs, ClusterCIDRs: cfg.ClusterCIDRs,
		Users: []controlplane.User{{Name: "system:kube-proxy"}}, Nodes: names,
	})

	for i, name := range names {
		n := &KubeNode{Name: name, Addrs: kubeHostAddrs(cfg.Topology.nodeSubnet(i+1), 11+i, cfg.DualStack), Dir: filepath.Join(c.Dir, name), cluster: c, nsName: c.Name + "-" + name}
		if err := os.MkdirAll(n.Dir, 0o755); err != nil {
			t.Fatal(err)
		}
		n.NS = c.plugNode(t, n.nsName, n.Addrs)
		n.prepareDisk(t)
		n.boot(t)
		c.Nodes = append(c.Nodes, n)
	}
	err = c.eventually(3*time.Minute, func(ctx context.Context) error {
		for _, n := range c.Nodes {
			node, err := c.cp.Admin.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if len(node.Spec.PodCIDRs) != len(cfg.ClusterCIDRs) {
				return fmt.Errorf("node %s has pod CIDRs %v", n.Name, node.Spec.PodCIDRs)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("nodes did not register with their pod CIDRs: %v", err)
	}
	return c
}

// clusterLifetime reports failures to the test it is used in but registers cleanups with the
// test the cluster belongs to: a daemon restarted, or a node rebooted, from a subtest must live
// on after that subtest, as long as the cluster.
type clusterLifetime struct {
	testing.TB
	owner testing.TB
}

func (l clusterLifetime) Cleanup(f func()) { l.owner.Cleanup(f) }

// lifetime is t with the cluster's cleanups.
func (c *KubeCluster) lifetime(t testing.TB) testing.TB { return clusterLifetime{TB: t, owner: c.t} }

// plugNode makes the named network namespace with addrs on the subnet that holds them and a
// default route via that subnet's router (which reaches no address outside the test: one
// link's forwards nothing, two subnets' only between them).
func (c *KubeCluster) plugNode(t testing.TB, name string, addrs []netip.Prefix) ns.NetNS {
	t.Helper()
	seg, err := c.segment(addrs[0].Addr())
	if err != nil {
		t.Fatal(err)
	}
	n := nettest.NewNamedNS(t, name)
	seg.Attach(t, n, "eth0", addrs...)
	for i, a := range addrs {
		nettest.AddRoute(t, n, netip.PrefixFrom(a.Addr(), 0).Masked(), seg.router[i].Addr())
	}
	return n
}

// Admin is a client of system:masters.
func (c *KubeCluster) Admin() *controlplane.ControlPlane { return c.cp }

// eventually polls f with a fresh 10 s context until it succeeds or timeout passes, failing
// early when a control-plane process or a node daemon has exited.
func (c *KubeCluster) eventually(timeout time.Duration, f func(ctx context.Context) error) error {
	return nettest.Eventually(timeout, func() error {
		if err := c.dead(); err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return f(ctx)
	})
}

// dead names a process of the cluster that exited on its own.
func (c *KubeCluster) dead() error {
	for _, p := range c.cp.Processes() {
		select {
		case <-p.Done():
			return fmt.Errorf("%w: %s:\n%s", nettest.ErrExited, p.Name, nettest.Tail(p.Log, 20))
		default:
		}
	}
	for _, n := range c.Nodes {
		for _, d := range []*Daemon{n.Containerd, n.Kubelet, n.Proxy} {
			if d != nil && d.Exited() && !d.Stopped() {
				return fmt.Errorf("%w: %s on %s:\n%s", nettest.ErrExited, d.Name, n.Name, nettest.Tail(d.LogFile, 20))
			}
		}
	}
	return nil
}

// Kubectl runs kubectl as the admin inside the control plane's namespace.
func (c *KubeCluster) Kubectl(args ...string) (string, error) {
	cmd := exec.Command("nsenter", append([]string{"--net=" + c.cp.NS.Path(), "--", c.cfg.Bins.Path("kubectl"), "--kubeconfig=" + c.cp.AdminKubeconfig}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// runFromControlPlane runs name with args from the control plane's network namespace, with
// env added to the test's environment, output to log, in a PID namespace of its own (should the
// test die, the kernel ends every process it started), and returns how long it ran.
func (c *KubeCluster) runFromControlPlane(ctx context.Context, log string, env []string, name string, args ...string) (time.Duration, error) {
	out, err := os.Create(log)
	if err != nil {
		return 0, err
	}
	defer out.Close()
	cmd := exec.CommandContext(ctx, "nsenter", append([]string{
		"--net=" + c.cp.NS.Path(), "--", "unshare", "--pid", "--fork", "--kill-child", name}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Dir = c.Dir
	start := time.Now()
	err = cmd.Run()
	return time.Since(start), err
}

// NetworkNotReady checks that every node is NotReady because the runtime has no network
// configuration yet: what a node without a network plugin reports, and must report until the
// agent has written the conflist.
func (c *KubeCluster) NetworkNotReady(ctx context.Context) error {
	for _, n := range c.Nodes {
		node, err := c.cp.Admin.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		ready := nodeCondition(node, corev1.NodeReady)
		if ready == nil || ready.Status == corev1.ConditionTrue || !strings.Contains(ready.Message, "cni") {
			return fmt.Errorf("node %s: Ready condition %+v, want False for want of a CNI configuration", n.Name, ready)
		}
		if _, err := os.Stat(n.HostPath(filepath.Join(nodeCNIConfDir, "10-kubenet.conflist"))); !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("node %s has a conflist before kubenet is installed (%v)", n.Name, err)
		}
	}
	return nil
}

func nodeCondition(node *corev1.Node, typ corev1.NodeConditionType) *corev1.NodeCondition {
	for i := range node.Status.Conditions {
		if node.Status.Conditions[i].Type == typ {
			return &node.Status.Conditions[i]
		}
	}
	return nil
}

// InstallKubenet installs kubenet the way users do (docs/agent.md): deploy/kubenet.yaml with
// its image set to AgentImage, --cluster-cidr set to the cluster's CIDRs and cfg.AgentArgs
// added, applied with kubectl. It waits for the DaemonSet's rollout and every node Ready.
func (c *KubeCluster) InstallKubenet(t testing.TB) {
	t.Helper()
	manifest, err := os.ReadFile(filepath.Join(c.cfg.Repo, "deploy/kubenet.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	edited, err := editManifest(string(manifest), AgentImage, nettest.JoinPrefixes(c.cfg.ClusterCIDRs), c.cfg.AgentArgs)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(c.Dir, "kubenet.yaml")
	if err := os.WriteFile(file, []byte(edited), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := c.Kubectl("apply", "-f", file); err != nil {
		t.Fatal(err)
	} else {
		t.Logf("kubectl apply -f deploy/kubenet.yaml:\n%s", strings.TrimSpace(out))
	}
	if _, err := c.Kubectl("-n", "kube-system", "rollout", "status", "ds/kubenet-agent", "--timeout=3m"); err != nil {
		t.Fatalf("%v\n%s", err, c.describeAgents())
	}
	if err := c.WaitNodesReady(3 * time.Minute); err != nil {
		t.Fatal(err)
	}
}

// policyEnforced says whether an agent of deploy/kubenet.yaml given agentArgs after the
// manifest's own flags enforces NetworkPolicy: the manifest turns it on, the last
// --network-policy flag among agentArgs decides, as the agent's flag parsing does.
func policyEnforced(agentArgs []string) bool {
	on := true
	for _, a := range agentArgs {
		name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if name != "network-policy" {
			continue
		}
		on = true
		if hasValue {
			on, _ = strconv.ParseBool(value) // a bad value stops the agent; false is as good here
		}
	}
	return on
}

// describeAgents is kubectl's view of the agents' pods, for a failure message.
func (c *KubeCluster) describeAgents() string {
	out, _ := c.Kubectl("-n", "kube-system", "describe", "pods", "-l", "app.kubernetes.io/name=kubenet-agent")
	return out
}

// WaitNodesReady waits until every node is Ready.
func (c *KubeCluster) WaitNodesReady(timeout time.Duration) error {
	return c.eventually(timeout, func(ctx context.Context) error {
		for _, n := range c.Nodes {
			node, err := c.cp.Admin.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if r := nodeCondition(node, corev1.NodeReady); r == nil || r.Status != corev1.ConditionTrue {
				return fmt.Errorf("node %s not Ready: %+v", n.Name, r)
			}
		}
		return nil
	})
}

// editManifest makes the edits docs/agent.md tells users to make to deploy/kubenet.yaml: the
// image, --cluster-cidr, and extra agent flags appended to the agent's args, after the
// manifest's own (the agent's flag parsing takes the last value of a flag, so they override the
// manifest's). Each edited line must occur exactly once, so a changed manifest fails here
// instead of being installed unedited.
func editManifest(manifest, image, clusterCIDR string, extraArgs []string) (string, error) {
	imageLine := regexp.MustCompile(`(?m)^(\s*image: )\S+(.*)$`)
	cidrLine := regexp.MustCompile(`(?m)^(\s*- --cluster-cidr=)\S+(.*)$`)
	for _, re := range []*regexp.Regexp{imageLine, cidrLine} {
		if n := len(re.FindAllString(manifest, -1)); n != 1 {
			return "", fmt.Errorf("deploy/kubenet.yaml: %d lines match %s, want 1", n, re)
		}
	}
	manifest = imageLine.ReplaceAllString(manifest, "${1}"+image)
	manifest = cidrLine.ReplaceAllString(manifest, "${1}"+clusterCIDR)
	if len(extraArgs) == 0 {
		return manifest, nil
	}
	// The args list: the --cluster-cidr item and the items and comments at its indentation after
	// it; the extra flags go after its last item.
	lines := strings.SplitAfter(manifest, "\n")
	at := slices.IndexFunc(lines, func(l string) bool { return cidrLine.MatchString(strings.TrimSuffix(l, "\n")) })
	indent := lines[at][:len(lines[at])-len(strings.TrimLeft(lines[at], " "))]
	last := at
	for i := at + 1; i < len(lines); i++ {
		rest, ok := strings.CutPrefix(lines[i], indent)
		if !ok || strings.HasPrefix(rest, " ") {
			break
		}
		if strings.HasPrefix(rest, "- ") {
			last = i
		} else if !strings.HasPrefix(rest, "#") {
			break
		}
	}
	var extra []string
	for _, a := range extraArgs {
		extra = append(extra, indent+"- "+a+"\n")
	}
	return strings.Join(slices.Concat(lines[:last+1], extra, lines[last+1:]), ""), nil
}

//go:embed kube/coredns.yaml
var coreDNSManifest string

// InstallCoreDNS applies CoreDNS as the cluster's DNS (the kube-dns Service at ClusterDNS) and
// waits until it answers.
func (c *KubeCluster) InstallCoreDNS(t testing.TB) {
	t.Helper()
	file := filepath.Join(c.Dir, "coredns.yaml")
	body := strings.NewReplacer("@IMAGE@", coreDNSRepo+":"+c.cfg.Bins.Versions["COREDNS"], "@DNS_IP@", c.cfg.ClusterDNS).Replace(coreDNSManifest)
	if err := os.WriteFile(file, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Kubectl("apply", "-f", file); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Kubectl("-n", "kube-system", "rollout", "status", "deploy/coredns", "--timeout=3m"); err != nil {
		out, _ := c.Kubectl("-n", "kube-system", "describe", "pods", "-l", "k8s-app=kube-dns")
		t.Fatalf("%v\n%s", err, out)
	}
}
