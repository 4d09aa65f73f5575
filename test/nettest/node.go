package nettest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
)

// Addresses of the simulated node's surroundings. They exist only inside the test's namespaces.
var (
	// The node's uplink to an "external" host, outside every non-masquerade CIDR.
	NodeUplink4 = netip.MustParsePrefix("198.18.0.1/24")
	NodeUplink6 = netip.MustParsePrefix("2001:db8:e::1/64")
	External4   = netip.MustParsePrefix("198.18.0.2/24")
	External6   = netip.MustParsePrefix("2001:db8:e::2/64")
	// The node's link to a "cluster peer" host inside the non-masquerade CIDRs, which routes the
	// node's pod CIDRs back to the node (as a cloud route would).
	NodePeerLink4 = netip.MustParsePrefix("10.200.0.1/24")
	NodePeerLink6 = netip.MustParsePrefix("fd00:200::1/64")
	Peer4         = netip.MustParsePrefix("10.200.0.2/24")
	Peer6         = netip.MustParsePrefix("fd00:200::2/64")
	// Default pod CIDRs and non-masquerade CIDRs of a test node.
	PodCIDR4       = netip.MustParsePrefix("10.244.1.0/24")
	PodCIDR6       = netip.MustParsePrefix("fd00:10:244:1::/64")
	NonMasquerade4 = netip.MustParsePrefix("10.0.0.0/8")
	NonMasquerade6 = netip.MustParsePrefix("fd00::/8")
)

// BuildPlugin compiles ./cmd/kubenet with the given build tags into dir and returns dir, for use
// as the CNI bin dir. TestMain functions call it once.
func BuildPlugin(dir string, tags ...string) (string, error) {
	if _, err := BuildCommand(dir, "kubenet", tags...); err != nil {
		return "", err
	}
	return dir, nil
}

func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("go.mod not found above the test directory")
		}
		dir = parent
	}
}

// Node is a simulated Kubernetes node: its own netns with an uplink to an external host and a
// link to a cluster peer, a private CNI data and cache dir, and a libcni client that runs the
// plugin inside the node's namespace.
type Node struct {
	NS       ns.NetNS
	External ns.NetNS
	Peer     ns.NetNS
	Dir      string // dataDir, cache dir and conflists live below it
	CNI      *libcni.CNIConfig
	// NetfilterBackend is the netfilterBackend of the node's conflist ("": auto): ConfList sets
	// it, a test that writes its configuration by hand sets it. Readers of the kernel's rules
	// (test/testkit) go by it until kubenet has recorded the backend it chose.
	NetfilterBackend string
}

// NewNode builds a node whose plugins are found in binDir.
func NewNode(t testing.TB, binDir string) *Node {
	t.Helper()
	n := &Node{NS: NewNS(t), External: NewNS(t), Peer: NewNS(t), Dir: t.TempDir()}
	Link(t, Endpoint{NS: n.NS, IfName: "eth0", Addrs: []netip.Prefix{NodeUplink4, NodeUplink6}},
		Endpoint{NS: n.External, IfName: "eth0", Addrs: []netip.Prefix{External4, External6}})
	Link(t, Endpoint{NS: n.NS, IfName: "eth1", Addrs: []netip.Prefix{NodePeerLink4, NodePeerLink6}},
		Endpoint{NS: n.Peer, IfName: "eth0", Addrs: []netip.Prefix{Peer4, Peer6}})
	AddRoute(t, n.NS, netip.MustParsePrefix("0.0.0.0/0"), External4.Addr())
	AddRoute(t, n.NS, netip.MustParsePrefix("::/0"), External6.Addr())
	for _, p := range []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:10:244::/48")} {
		gw := NodePeerLink4.Addr()
		if p.Addr().Is6() {
			gw = NodePeerLink6.Addr()
		}
		AddRoute(t, n.Peer, p, gw)
	}
	n.CNI = libcni.NewCNIConfigWithCacheDir([]string{binDir}, filepath.Join(n.Dir, "cache"), nil)
	return n
}

// DataDir is the kubenet dataDir of this node.
func (n *Node) DataDir() string { return filepath.Join(n.Dir, "networks") }

// NetConf is the kubenet plugin configuration a test wants; zero fields take test defaults.
type NetConf struct {
	CNIVersion         string
	Name               string
	Bridge             string
	PodCIDRs           []netip.Prefix
	NonMasqueradeCIDRs []netip.Prefix
	MTU                int
	HairpinMode        string
	NetfilterBackend   string         // "" leaves the key out (auto)
	Extra              map[string]any // more plugin keys, verbatim
	// CNIVersions is the conflist's cniVersions (nil leaves it out): libcni 1.2 and later call
	// with the highest of them they support, older ones with CNIVersion.
	CNIVersions []string
}

// ConfList renders c as a conflist for this node (dataDir inside the node's temp dir).
func (n *Node) ConfList(t testing.TB, c NetConf) *libcni.NetworkConfigList {
	t.Helper()
	if c.CNIVersion == "" {
		c.CNIVersion = "1.1.0"
	}
	if c.Name == "" {
		c.Name = "kubenet"
	}
	plugin := map[string]any{
		"type":    "kubenet",
		"dataDir": n.DataDir(),
		"capabilities": map[string]bool{
			"portMappings": true, "bandwidth": true, "ipRanges": true, "io.kubernetes.cri.pod-annotations": true,
		},
	}
	if c.Bridge != "" {
		plugin["bridge"] = c.Bridge
	}
	if c.PodCIDRs != nil {
		plugin["podCIDRs"] = c.PodCIDRs
	}
	if c.NonMasqueradeCIDRs != nil {
		plugin["nonMasqueradeCIDRs"] = c.NonMasqueradeCIDRs
	}
	if c.MTU != 0 {
		plugin["mtu"] = c.MTU
	}
	if c.HairpinMode != "" {
		plugin["hairpinMode"] = c.HairpinMode
	}
	if c.NetfilterBackend != "" {
		plugin["netfilterBackend"] = c.NetfilterBackend
	}
	n.NetfilterBackend = c.NetfilterBackend
	for k, v := range c.Extra {
		plugin[k] = v
	}
	conf := map[string]any{"cniVersion": c.CNIVersion, "name": c.Name, "plugins": []any{plugin}}
	if c.CNIVersions != nil {
		conf["cniVersions"] = c.CNIVersions
	}
	raw, err := json.Marshal(conf)
	if err != nil {
		t.Fatal(err)
	}
	list, err := libcni.NetworkConfFromBytes(raw)
	if err != nil {
		t.Fatalf("conflist %s: %v", raw, err)
	}
	return list
}

// Pod is a pod sandbox on a node: a netns and the runtime's view of its attachment.
type Pod struct {
	NS     ns.NetNS
	RT     *libcni.RuntimeConf
	Result *current.Result
	// ResultVersion is the cniVersion of the result as the plugin printed it.
	ResultVersion string
}

// NewPod makes a pod netns (not yet attached) with container ID id.
func (n *Node) NewPod(t testing.TB, id string) *Pod {
	t.Helper()
	podNS := NewNS(t)
	return &Pod{NS: podNS, RT: &libcni.RuntimeConf{
		ContainerID: id,
		NetNS:       podNS.Path(),
		IfName:      "eth0",
		Args:        [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", "default"}, {"K8S_POD_NAME", id}},
	}}
}

// runInNode runs f inside the node's netns, where the plugin binary must run: the child process
// inherits the network namespace of the locked thread that starts it.
func (n *Node) runInNode(f func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	return n.NS.Do(func(ns.NetNS) error { return f(ctx) })
}

// Add runs ADD for pod through libcni and stores the result (converted to the current version).
func (n *Node) Add(list *libcni.NetworkConfigList, pod *Pod) error {
	var res types.Result
	err := n.runInNode(func(ctx context.Context) error {
		var err error
		res, err = n.CNI.AddNetworkList(ctx, list, pod.RT)
		return err
	})
	if err != nil {
		return err
	}
	pod.ResultVersion = res.Version()
	pod.Result, err = current.NewResultFromResult(res)
	return err
}

// MustAdd is Add that fails the test, and registers a DEL at cleanup.
func (n *Node) MustAdd(t testing.TB, list *libcni.NetworkConfigList, pod *Pod) {
	t.Helper()
	if err := n.Add(list, pod); err != nil {
		t.Fatalf("ADD %s: %v", pod.RT.ContainerID, err)
	}
	t.Cleanup(func() { _ = n.Del(list, pod) })
}

// Del runs DEL for pod through libcni.
func (n *Node) Del(list *libcni.NetworkConfigList, pod *Pod) error {
	return n.runInNode(func(ctx context.Context) error { return n.CNI.DelNetworkList(ctx, list, pod.RT) })
}

// Check runs CHECK for pod through libcni.
func (n *Node) Check(list *libcni.NetworkConfigList, pod *Pod) error {
	return n.runInNode(func(ctx context.Context) error { return n.CNI.CheckNetworkList(ctx, list, pod.RT) })
}

// GC runs GC through libcni with the given valid attachments.
func (n *Node) GC(list *libcni.NetworkConfigList, valid []types.GCAttachment) error {
	return n.runInNode(func(ctx context.Context) error {
		return n.CNI.GCNetworkList(ctx, list, &libcni.GCArgs{ValidAttachments: valid})
	})
}

// Status runs STATUS through libcni.
func (n *Node) Status(list *libcni.NetworkConfigList) error {
	return n.runInNode(func(ctx context.Context) error { return n.CNI.GetStatusNetworkList(ctx, list) })
}

// IPs returns the pod's addresses from its result, IPv4 first.
func (p *Pod) IPs() []netip.Addr {
	var out []netip.Addr
	for _, ip := range p.Result.IPs {
		a, _ := netip.AddrFromSlice(ip.Address.IP)
		out = append(out, a.Unmap())
	}
	return out
}

// IP returns the pod's address of the family of like.
func (p *Pod) IP(like netip.Addr) netip.Addr {
	for _, a := range p.IPs() {
		if a.Is4() == like.Is4() {
			return a
		}
	}
	return netip.Addr{}
}
