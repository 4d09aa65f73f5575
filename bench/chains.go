package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/google/nftables"
	"github.com/vishvananda/netlink"

	"github.com/kubenet-dev/kubenet/test/nettest"
)

// Node configuration both chains get: a kubenet node's defaults, with a pod CIDR large enough for
// the 500-pod workload.
const (
	networkName = "kubenet"
	bridgeName  = "cbr0"
	nodeMTU     = 1500
)

var podCIDR = netip.MustParsePrefix("10.244.0.0/22")

// chain is one way of attaching pods: a conflist, a libcni client that runs the plugins from
// their bin dir and records every process, and a second client (probe) that runs them through
// rssshim to learn their peak RSS. Both share the libcni cache.
type chain struct {
	name     string
	list     *libcni.NetworkConfigList
	exec     *recordingExec
	cni      *libcni.CNIConfig
	probe    *libcni.CNIConfig
	rssLog   string
	cacheDir string
}

func newChain(name string, list *libcni.NetworkConfigList, binDir, shimDir, workDir string) *chain {
	e := &recordingExec{}
	c := &chain{name: name, list: list, exec: e, cacheDir: filepath.Join(workDir, "cache-"+name), rssLog: filepath.Join(workDir, "rss-"+name+".log")}
	c.cni = libcni.NewCNIConfigWithCacheDir([]string{binDir}, c.cacheDir, e)
	c.probe = libcni.NewCNIConfigWithCacheDir([]string{shimDir}, c.cacheDir,
		&recordingExec{env: []string{shimTargetEnv + "=" + binDir, shimLogEnv + "=" + c.rssLog}})
	return c
}

// kubenetConfList is kubenet as a kubenet-on-containerd node would run it: one plugin that does
// bridge, IPAM, hairpin, masquerade, host ports and shaping.
func kubenetConfList(t testing.TB, node *nettest.Node, backend string) *libcni.NetworkConfigList {
	return kubenetConfListWith(t, node, backend, nil)
}

// kubenetConfListWith is kubenetConfList with more plugin keys.
func kubenetConfListWith(t testing.TB, node *nettest.Node, backend string, extra map[string]any) *libcni.NetworkConfigList {
	return node.ConfList(t, nettest.NetConf{
		Name:               networkName,
		Bridge:             bridgeName,
		PodCIDRs:           []netip.Prefix{podCIDR},
		NonMasqueradeCIDRs: []netip.Prefix{nettest.NonMasquerade4},
		MTU:                nodeMTU,
		HairpinMode:        "hairpin-veth",
		NetfilterBackend:   backend,
		Extra:              extra,
	})
}

// referenceConfList is the reference chain as a kubenet-on-containerd node runs it (containerd's
// conf_template for kubenet, plus the bandwidth plugin that replaced kubelet's shaper): bridge
// cbr0 as the gateway with hairpin, masquerade and MTU, host-local over the pod CIDR, portmap and
// bandwidth. backend picks the netfilter backend of bridge's ipMasq and of portmap.
func referenceConfList(node *nettest.Node, backend string) (*libcni.NetworkConfigList, error) {
	conf := map[string]any{
		"cniVersion": "1.1.0", "name": networkName,
		"plugins": []any{
			map[string]any{
				"type": "bridge", "bridge": bridgeName, "isGateway": true, "hairpinMode": true,
				"ipMasq": true, "ipMasqBackend": backend, "mtu": nodeMTU,
				"ipam": map[string]any{
					"type": "host-local", "dataDir": node.DataDir(),
					"ranges": [][]map[string]string{{{"subnet": podCIDR.String()}}},
					"routes": []map[string]string{{"dst": "0.0.0.0/0"}},
				},
			},
			map[string]any{"type": "portmap", "backend": backend, "capabilities": map[string]bool{"portMappings": true}},
			map[string]any{"type": "bandwidth", "capabilities": map[string]bool{"bandwidth": true}},
		},
	}
	raw, err := json.Marshal(conf)
	if err != nil {
		return nil, err
	}
	return libcni.NetworkConfFromBytes(raw)
}

// floorPlugin is the floor plugin's binary (bench/floorplugin).
const floorPlugin = "floorplugin"

// floorConfList runs the floor plugin alone on the node's bridge and pod CIDR.
func floorConfList() (*libcni.NetworkConfigList, error) {
	raw, err := json.Marshal(map[string]any{
		"cniVersion": "1.1.0", "name": networkName,
		"plugins": []any{map[string]any{"type": floorPlugin, "bridge": bridgeName, "subnet": podCIDR.String(), "mtu": nodeMTU}},
	})
	if err != nil {
		return nil, err
	}
	return libcni.NetworkConfFromBytes(raw)
}

// withoutFloor splits the floor plugin's chain (nil when not run) from the others.
func withoutFloor(chains []*chain) ([]*chain, *chain) {
	var floor *chain
	out := slices.DeleteFunc(slices.Clone(chains), func(c *chain) bool {
		if c.name == floorChain {
			floor = c
			return true
		}
		return false
	})
	return out, floor
}

// pod is one sandbox: its netns (reused across chains after a full DEL) and runtime config.
type pod struct {
	ns ns.NetNS
	rt *libcni.RuntimeConf
}

// podSpec says what a pod asks of the network.
type podSpec struct {
	hostPorts []portMapping
	bandwidth *bandwidth
}

// portMapping and bandwidth are the capability arguments as containerd sends them: go-cni's
// structs carry no json tags, so the keys arrive capitalised.
type portMapping struct {
	HostPort      int32
	ContainerPort int32
	Protocol      string
	HostIP        string
}

type bandwidth struct {
	IngressRate, IngressBurst, EgressRate, EgressBurst uint64
}

// containerdMaxBurst is the burst containerd sends with every bandwidth annotation (MaxUint32 bits).
const containerdMaxBurst = 1<<32 - 1

// shaped is a 10 Mbit/s limit each way, as the kubernetes.io/{ingress,egress}-bandwidth: 10M
// annotations make containerd send it.
func shaped() *bandwidth {
	return &bandwidth{IngressRate: 10_000_000, IngressBurst: containerdMaxBurst, EgressRate: 10_000_000, EgressBurst: containerdMaxBurst}
}

// runtimeConf is what containerd passes for a sandbox with ID id in netns n.
func runtimeConf(n ns.NetNS, id string, spec podSpec) *libcni.RuntimeConf {
	caps := map[string]any{"portMappings": append([]portMapping{}, spec.hostPorts...)}
	if spec.bandwidth != nil {
		caps["bandwidth"] = spec.bandwidth
	}
	return &libcni.RuntimeConf{
		ContainerID:    id,
		NetNS:          n.Path(),
		IfName:         "eth0",
		Args:           [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", "bench"}, {"K8S_POD_NAME", id}, {"K8S_POD_INFRA_CONTAINER_ID", id}},
		CapabilityArgs: caps,
	}
}

// benchNode is the node netns both chains take turns in.
type benchNode struct {
	*nettest.Node
}

// timed runs f inside the node (the plugin processes inherit the netns of the locked thread that
// starts them) and returns its wall time.
func (n benchNode) timed(f func(ctx context.Context) error) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var d time.Duration
	err := n.NS.Do(func(ns.NetNS) error {
		start := time.Now()
		err := f(ctx)
		d = time.Since(start)
		return err
	})
	return d, err
}

func (n benchNode) add(c *chain, p *pod) (time.Duration, error) {
	return n.addWith(c, c.cni, p)
}

func (n benchNode) del(c *chain, p *pod) (time.Duration, error) {
	return n.delWith(c, c.cni, p)
}

func (n benchNode) addWith(c *chain, cni *libcni.CNIConfig, p *pod) (time.Duration, error) {
	d, err := n.timed(func(ctx context.Context) error {
		_, err := cni.AddNetworkList(ctx, c.list, p.rt)
		return err
	})
	if err != nil {
		return d, fmt.Errorf("%s ADD %s: %w", c.name, p.rt.ContainerID, err)
	}
	return d, nil
}

func (n benchNode) delWith(c *chain, cni *libcni.CNIConfig, p *pod) (time.Duration, error) {
	d, err := n.timed(func(ctx context.Context) error { return cni.DelNetworkList(ctx, c.list, p.rt) })
	if err != nil {
		return d, fmt.Errorf("%s DEL %s: %w", c.name, p.rt.ContainerID, err)
	}
	return d, nil
}

func (n benchNode) status(c *chain) (time.Duration, error) {
	d, err := n.timed(func(ctx context.Context) error { return c.cni.GetStatusNetworkList(ctx, c.list) })
	if err != nil {
		return d, fmt.Errorf("%s STATUS: %w", c.name, err)
	}
	return d, nil
}

// nodeLinks are the links the node netns has before any chain runs.
var nodeLinks = []string{"lo", "eth0", "eth1"}

// snapshot is the node state a chain leaves behind with no pods attached: links, netfilter
// ruleset and the file names in the data dir. Comparing it before and after a round proves that
// DEL removed everything ADD made.
type snapshot struct {
	links   []string
	ruleset string
	files   []string
}

func (n benchNode) snapshot() (snapshot, error) {
	var s snapshot
	err := n.NS.Do(func(ns.NetNS) error {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		for _, l := range links {
			s.links = append(s.links, l.Attrs().Name)
		}
		slices.Sort(s.links)
		return nil
	})
	if err != nil {
		return s, fmt.Errorf("list links: %w", err)
	}
	// Stateless: iptables-nft rules carry counters, which traffic changes, and elements their
	// expiry. Settled: the last DEL's ended elements leave the listing at the kernel's next tick.
	if s.ruleset, err = nettest.SettledRuleset(n.NS, "-s"); err != nil {
		return s, err
	}
	err = filepath.WalkDir(n.DataDir(), func(path string, d os.DirEntry, err error) error {
		if err != nil {
			if os.IsNotExist(err) {
				return nil
			}
			return err
		}
		rel, _ := filepath.Rel(n.DataDir(), path)
		s.files = append(s.files, rel)
		return nil
	})
	return s, err
}

func (s snapshot) diff(after snapshot) error {
	var out []string
	if !slices.Equal(s.links, after.links) {
		out = append(out, fmt.Sprintf("links %v became %v", s.links, after.links))
	}
	if s.ruleset != after.ruleset {
		out = append(out, fmt.Sprintf("ruleset changed:\n--- before\n%s--- after\n%s", s.ruleset, after.ruleset))
	}
	if !slices.Equal(s.files, after.files) {
		out = append(out, fmt.Sprintf("data dir %v became %v", s.files, after.files))
	}
	if len(out) == 0 {
		return nil
	}
	return fmt.Errorf("state left behind after DEL of every pod: %s", strings.Join(out, "; "))
}

// kubeadmBridgeNetfilter are the bridge-netfilter settings of a kubeadm node (its preflight
// requires br_netfilter and bridge-nf-call-iptables=1): every chain runs with them, so bridged
// pod traffic passes the IP hooks (conntrack, kube-proxy's rules) for all alike. kubenet's ADD
// turns them on too; the reference chain does not touch them.
var kubeadmBridgeNetfilter = []string{"net/bridge/bridge-nf-call-iptables", "net/bridge/bridge-nf-call-ip6tables"}

// reset removes everything either chain may have left on the node, so the next chain starts
// from the same empty node and sees none of the other's links, rules or files: every link the
// node did not start with (the bridge), every nftables table (iptables-nft rules included), the
// data dir and the chain's libcni cache. The node's bridge-netfilter settings are a kubeadm
// node's (kubeadmBridgeNetfilter).
func (n benchNode) reset(c *chain) error {
	err := n.NS.Do(func(ns.NetNS) error {
		for _, s := range kubeadmBridgeNetfilter {
			if err := os.WriteFile("/proc/sys/"+s, []byte("1"), 0o644); err != nil {
				return fmt.Errorf("%s (is br_netfilter loaded?): %w", s, err)
			}
		}
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		for _, l := range links {
			if !slices.Contains(nodeLinks, l.Attrs().Name) {
				if err := netlink.LinkDel(l); err != nil {
					return fmt.Errorf("delete %s: %w", l.Attrs().Name, err)
				}
			}
		}
		conn, err := nftables.New()
		if err != nil {
			return err
		}
		tables, err := conn.ListTables()
		if err != nil {
			return err
		}
		for _, t := range tables {
			conn.DelTable(t)
		}
		return conn.Flush()
	})
	if err != nil {
		return fmt.Errorf("reset node: %w", err)
	}
	for _, dir := range []string{n.DataDir(), c.cacheDir, c.rssLog} {
		if err := os.RemoveAll(dir); err != nil {
			return err
		}
	}
	return nil
}
