//go:build kubenet_e2e_agent

package agent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/kubenet-dev/kubenet/agent/routes"
	"github.com/kubenet-dev/kubenet/test/controlplane"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

// The simulated cluster's addresses; they exist only inside the test's namespaces.
var (
	controlPlaneAddr = netip.MustParsePrefix("192.168.77.10/24")
	clusterCIDRs     = []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:10:244::/48")}
	serviceCIDR      = netip.MustParsePrefix("10.96.0.0/16") // the API server's --service-cluster-ip-range
)

// nodeAddrs are node i's underlay addresses (i from 1).
func nodeAddrs(i int) []netip.Prefix {
	return []netip.Prefix{
		netip.MustParsePrefix(fmt.Sprintf("192.168.77.%d/24", 10+i)),
		netip.MustParsePrefix(fmt.Sprintf("fd00:77::%d/64", 10+i)),
	}
}

// podCIDRs is a dual-stack pod CIDR pair numbered k.
func podCIDRs(k int) []netip.Prefix {
	return []netip.Prefix{
		netip.MustParsePrefix(fmt.Sprintf("10.244.%d.0/24", k)),
		netip.MustParsePrefix(fmt.Sprintf("fd00:10:244:%d::/64", k)),
	}
}

// saveCPUProfile writes the agent's CPU profile over the next d (the agent runs with
// --profiling) to file.
func (n *simNode) saveCPUProfile(file string, d time.Duration) error {
	return n.saveProfile(file, fmt.Sprintf("profile?seconds=%d", int(d.Seconds())), d)
}

// saveProfile writes the agent's profile /debug/pprof/<which> (the agent runs with --profiling),
// which takes d to make, to file.
func (n *simNode) saveProfile(file, which string, d time.Duration) error {
	c := &http.Client{Timeout: d + 30*time.Second, Transport: &http.Transport{DialContext: nettest.DialIn(n.ns)}}
	defer c.CloseIdleConnections()
	resp, err := c.Get(fmt.Sprintf("http://%s/debug/pprof/%s", metricsAddr, which))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("/debug/pprof/%s: HTTP %d", which, resp.StatusCode)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	return os.WriteFile(file, body, 0o644)
}

// metricsAddr is where every agent serves /metrics inside its own node namespace.
const metricsAddr = "127.0.0.1:9309"

// simNode is a node namespace on the underlay with its CNI dirs and its agent.
type simNode struct {
	name       string
	addrs      []netip.Prefix
	ns         ns.NetNS
	dir        string
	cni        *nettest.Node // libcni over the bin dir the agent installs into
	kubeconfig string
	agent      *nettest.Process
	// admin is the test's own API client (pods a test attaches exist in the API first).
	admin kubernetes.Interface
}

func newSimNode(t testing.TB, u *nettest.Underlay, cp *controlplane.ControlPlane, name string, i int, user string) *simNode {
	t.Helper()
	return newSimNodeWith(t, u, cp, name, nodeAddrs(i), user)
}

// newSimNodeWith is newSimNode with the node's underlay addresses given.
func newSimNodeWith(t testing.TB, u *nettest.Underlay, cp *controlplane.ControlPlane, name string, addrs []netip.Prefix, user string) *simNode {
	t.Helper()
	n := &simNode{name: name, addrs: addrs, ns: nettest.NewNS(t), dir: t.TempDir(), admin: cp.Admin}
	u.Attach(t, n.ns, "eth0", n.addrs...)
	n.cni = &nettest.Node{NS: n.ns, Dir: n.dir, CNI: libcni.NewCNIConfigWithCacheDir([]string{n.binDir()}, filepath.Join(n.dir, "cache"), nil)}
	n.kubeconfig = filepath.Join(n.dir, "kubeconfig")
	if err := cp.WriteKubeconfig(n.kubeconfig, user); err != nil {
		t.Fatal(err)
	}
	return n
}

func (n *simNode) confFile() string { return filepath.Join(n.dir, "net.d", "10-kubenet.conflist") }
func (n *simNode) binDir() string   { return filepath.Join(n.dir, "bin") }
func (n *simNode) logFile() string  { return filepath.Join(n.dir, "agent.log") }

// runtimeSocket is where the node's container runtime would listen.
func (n *simNode) runtimeSocket() string { return filepath.Join(n.dir, "cri.sock") }

// addr returns the node's underlay address of like's family.
func (n *simNode) addr(like netip.Addr) netip.Addr {
	for _, p := range n.addrs {
		if p.Addr().Is4() == like.Is4() {
			return p.Addr()
		}
	}
	return netip.Addr{}
}

// agentArgs are the flags of every agent in the test.
func (n *simNode) agentArgs() []string {
	var cidrs []string
	for _, p := range clusterCIDRs {
		cidrs = append(cidrs, p.String())
	}
	return []string{
		"--kubeconfig=" + n.kubeconfig,
		"--node-name=" + n.name,
		"--cluster-cidr=" + strings.Join(cidrs, ","),
		"--service-cidr=" + serviceCIDR.String(),
		"--mtu=1450",
		"--hairpin-mode=hairpin-veth",
		"--cni-conf-dir=" + filepath.Dir(n.confFile()),
		"--cni-bin-dir=" + n.binDir(),
		"--cni-bin-source=" + filepath.Join(testBins.pluginDir, "kubenet"),
		"--data-dir=" + n.cni.DataDir(),
		"--metrics-bind-address=" + metricsAddr,
		"--log-level=debug",
		// No runtime listens there: the stale-attachment collection must collect nothing (the
		// pods here are attached through libcni, no runtime lists them).
		"--container-runtime-endpoint=unix://" + n.runtimeSocket(),
		"--stale-gc-grace=1s",
		"--stale-gc-interval=500ms",
	}
}

// startAgent starts the node's agent with agentArgs and then extra (a flag given twice takes
// the later value).
func (n *simNode) startAgent(t testing.TB, extra ...string) {
	t.Helper()
	n.agent = nettest.StartProcess(t, n.ns, n.logFile(), testBins.agent, append(n.agentArgs(), extra...)...)
}

// get fetches path from the agent's HTTP server inside the node's namespace.
func (n *simNode) get(path string) (int, string, error) {
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: nettest.DialIn(n.ns)}}
	defer c.CloseIdleConnections()
	resp, err := c.Get("http://" + metricsAddr + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// metrics scrapes the agent: series (name plus labels, as exposed) -> value.
func (n *simNode) metrics() (map[string]float64, error) {
	code, body, err := n.get("/metrics")
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("/metrics: HTTP %d: %s", code, body)
	}
	out := map[string]float64{}
	for _, line := range strings.Split(body, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			return nil, fmt.Errorf("metric line %q: %w", line, err)
		}
		out[line[:i]] = v
	}
	return out, nil
}

// waitSynced waits until the running agent has finished a sync.
func (n *simNode) waitSynced(t testing.TB) map[string]float64 {
	t.Helper()
	var m map[string]float64
	err := nettest.Eventually(30*time.Second, func() error {
		var err error
		if m, err = n.metrics(); err != nil {
			return err
		}
		if m["kubenet_agent_last_sync_timestamp_seconds"] == 0 {
			return fmt.Errorf("no sync finished yet")
		}
		return nil
	})
	if err != nil {
		t.Fatalf("agent on %s: %v", n.name, err)
	}
	return m
}

// agentRoutes lists the routes carrying the agent's protocol mark as "dst via gw", sorted.
func agentRoutes(n ns.NetNS) ([]string, error) {
	var out []string
	err := n.Do(func(ns.NetNS) error {
		rs, err := netlink.RouteListFiltered(netlink.FAMILY_ALL,
			&netlink.Route{Protocol: routes.DefaultProtocol, Table: unix.RT_TABLE_MAIN},
			netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_TABLE)
		for _, r := range rs {
			out = append(out, fmt.Sprintf("%s via %s", r.Dst, r.Gw))
		}
		return err
	})
	slices.Sort(out)
	return out, err
}

// expectNotReady waits until the agent's /readyz answers 503 with a body containing why.
func expectNotReady(t *testing.T, n *simNode, why string) {
	t.Helper()
	err := nettest.Eventually(converge, func() error {
		code, body, err := n.get("/readyz")
		if err != nil || code != 503 || !strings.Contains(body, why) {
			return fmt.Errorf("/readyz of %s: %d %q %v, want 503 saying %q", n.name, code, body, err, why)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// expectReady waits until the agent's /readyz answers 200.
func expectReady(t *testing.T, n *simNode) {
	t.Helper()
	err := nettest.Eventually(converge, func() error {
		code, body, err := n.get("/readyz")
		if err != nil || code != 200 {
			return fmt.Errorf("/readyz of %s: %d %q %v", n.name, code, body, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// expectRoutes waits until the routes carrying the agent's mark on n are exactly want ("dst via
// gw", any order).
func expectRoutes(t *testing.T, n *simNode, want []string) {
	t.Helper()
	want = slices.Sorted(slices.Values(want))
	err := nettest.Eventually(converge, func() error {
		got, err := agentRoutes(n.ns)
		if err != nil {
			return err
		}
		if !slices.Equal(got, want) {
			return fmt.Errorf("routes of %s:\n got %q\nwant %q", n.name, got, want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// wantRoutes is what the agent on self should have: every other node's pod CIDRs via its
// underlay address of the same family.
func wantRoutes(self *simNode, nodes []*simNode, cidrs map[string][]netip.Prefix) []string {
	var out []string
	for _, n := range nodes {
		if n == self {
			continue
		}
		for _, c := range cidrs[n.name] {
			out = append(out, fmt.Sprintf("%s via %s", c, n.addr(c.Addr())))
		}
	}
	slices.Sort(out)
	return out
}

// nodeObject is a Node as a kubelet would register it, with pod CIDRs as a controller-manager
// with --allocate-node-cidrs would assign them (none: not assigned yet).
func nodeObject(name string, addrs []netip.Prefix, cidrs []netip.Prefix) *corev1.Node {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	for _, c := range cidrs {
		node.Spec.PodCIDRs = append(node.Spec.PodCIDRs, c.String())
	}
	if len(cidrs) > 0 {
		node.Spec.PodCIDR = node.Spec.PodCIDRs[0]
	}
	for _, a := range addrs {
		node.Status.Addresses = append(node.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: a.Addr().String()})
	}
	node.Status.Addresses = append(node.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeHostName, Address: name})
	return node
}

// createNode creates the Node and, since status is not taken from a create, writes its
// addresses through the status subresource as a kubelet does.
func createNode(t testing.TB, c kubernetes.Interface, node *corev1.Node) {
	t.Helper()
	if err := registerNode(c, node); err != nil {
		t.Fatal(err)
	}
}

// registerNode is createNode for any goroutine: it returns the error.
func registerNode(c kubernetes.Interface, node *corev1.Node) error {
	ctx := context.Background()
	created, err := c.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create node %s: %w", node.Name, err)
	}
	if len(created.Status.Addresses) == 0 {
		created.Status = node.Status
		if _, err := c.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("node %s status: %w", node.Name, err)
		}
	}
	return nil
}

func deleteNode(t testing.TB, c kubernetes.Interface, name string) {
	t.Helper()
	if err := c.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete node %s: %v", name, err)
	}
}

// networkCondition returns the Node's NetworkUnavailable condition (nil if it has none).
func networkCondition(c kubernetes.Interface, name string) (*corev1.NodeCondition, error) {
	node, err := c.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	for i := range node.Status.Conditions {
		if node.Status.Conditions[i].Type == corev1.NodeNetworkUnavailable {
			return &node.Status.Conditions[i], nil
		}
	}
	return nil, nil
}

// manifestObjects decodes deploy/kubenet.yaml.
func manifestObjects(t testing.TB) []runtime.Object {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "..", "deploy", "kubenet.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	r := yaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(raw)))
	var objs []runtime.Object
	for {
		doc, err := r.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
		if err != nil {
			t.Fatalf("deploy/kubenet.yaml: %v", err)
		}
		objs = append(objs, obj)
	}
	return objs
}

// applyManifest creates every object of deploy/kubenet.yaml through the API, so the server
// validates all of them (the DaemonSet too, which nothing here runs).
func applyManifest(t testing.TB, c kubernetes.Interface, objs []runtime.Object) {
	t.Helper()
	ctx := context.Background()
	for _, obj := range objs {
		var err error
		switch o := obj.(type) {
		case *corev1.ServiceAccount:
			_, err = c.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRole:
			_, err = c.RbacV1().ClusterRoles().Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRoleBinding:
			_, err = c.RbacV1().ClusterRoleBindings().Create(ctx, o, metav1.CreateOptions{})
		case *appsv1.DaemonSet:
			_, err = c.AppsV1().DaemonSets(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		default:
			t.Fatalf("deploy/kubenet.yaml: unexpected %T", obj)
		}
		if err != nil {
			t.Fatalf("create %T from deploy/kubenet.yaml: %v", obj, err)
		}
	}
}

// serviceAccountUser is the user the manifest's ServiceAccount authenticates as; the agents get
// a static token for it, so they run with exactly the manifest's RBAC.
func serviceAccountUser(t testing.TB, objs []runtime.Object) controlplane.User {
	t.Helper()
	for _, obj := range objs {
		if sa, ok := obj.(*corev1.ServiceAccount); ok {
			return controlplane.User{
				Name:   fmt.Sprintf("system:serviceaccount:%s:%s", sa.Namespace, sa.Name),
				Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + sa.Namespace},
			}
		}
	}
	t.Fatal("deploy/kubenet.yaml has no ServiceAccount")
	return controlplane.User{}
}

// logRecord finds a JSON log line of the agent with msg whose attributes include attrs.
func logRecord(file, msg string, attrs map[string]string) (map[string]any, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) != nil || rec["msg"] != msg {
			continue
		}
		match := true
		for k, v := range attrs {
			if fmt.Sprint(rec[k]) != v {
				match = false
			}
		}
		if match {
			return rec, nil
		}
	}
	return nil, fmt.Errorf("no log record %q with %v in %s", msg, attrs, file)
}
