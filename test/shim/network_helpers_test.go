package shim

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kubenet-dev/kubenet/test/testkit"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/kubenet-dev/kubenet/core"
	"github.com/kubenet-dev/kubenet/network"
	"github.com/kubenet-dev/kubenet/network/cni"
	knet "github.com/kubenet-dev/kubenet/network/kubenet"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

// dualStackCIDRs is the pod-cidr-change detail of a dual-stack test node (nettest.PodCIDR4 and
// PodCIDR6), as kubelet joins Node.spec.podCIDRs.
const dualStackCIDRs = "10.244.1.0/24,fd00:10:244:1::/64"

// shimHost is the runtime shim's side of the plugin contract: it knows each sandbox's netns
// and host ports.
type shimHost struct {
	mu    sync.Mutex
	pods  map[string]ns.NetNS
	ports map[string][]*network.PortMapping
}

func newShimHost() *shimHost {
	return &shimHost{pods: map[string]ns.NetNS{}, ports: map[string][]*network.PortMapping{}}
}

func (h *shimHost) add(id string, n ns.NetNS, ports ...*network.PortMapping) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.pods[id], h.ports[id] = n, ports
}

// GetNetNS fails, as a real shim does, once the sandbox's netns is gone.
func (h *shimHost) GetNetNS(id string) (string, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	n, ok := h.pods[id]
	if !ok {
		return "", fmt.Errorf("unknown sandbox %s", id)
	}
	if _, err := os.Stat(n.Path()); err != nil {
		return "", fmt.Errorf("cannot find network namespace for the terminated container %s", id)
	}
	return n.Path(), nil
}

func (h *shimHost) GetPodPortMappings(id string) ([]*network.PortMapping, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.ports[id], nil
}

// shimPod is a pod sandbox as a shim drives it.
type shimPod struct {
	namespace, name string
	id              network.ContainerID
	NS              ns.NetNS
}

func newShimPod(t testing.TB, host *shimHost, name string, ports ...*network.PortMapping) *shimPod {
	p := &shimPod{namespace: "default", name: name, id: network.ContainerID{Type: "test", ID: "sandbox-" + name}, NS: nettest.NewNS(t)}
	host.add(p.id.ID, p.NS, ports...)
	return p
}

func (p *shimPod) att() core.Attachment {
	return core.Attachment{ContainerID: p.id.ID, IfName: network.DefaultInterfaceName}
}

// allPlugins registers every plugin as a shim does, with kubenet's node-side work in the node's
// netns and the CNI wrapper's plugins executed there.
// Their logs go to the test's output.
func allPlugins(t testing.TB, node *nettest.Node, confDir string, binDirs ...string) (*knet.Plugin, *cni.Plugin, []network.NetworkPlugin) {
	log := testLogger(t)
	kn := knet.New(knet.Options{NodeNS: node.NS, DataDir: node.DataDir(), Logger: log})
	t.Cleanup(func() { _ = kn.Close() })
	cn := cni.New(cni.Options{ConfDir: confDir, BinDirs: binDirs, CacheDir: filepath.Join(node.Dir, "cache"), NodeNS: node.NS, Logger: log})
	return kn, cn, []network.NetworkPlugin{kn, cn}
}

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// managerFor selects pluginName like kubelet's --network-plugin and wraps it in a PluginManager.
func managerFor(t testing.TB, plugins []network.NetworkPlugin, pluginName string, host network.Host) *network.PluginManager {
	t.Helper()
	p, err := network.InitNetworkPlugin(plugins, pluginName, host, network.HairpinVeth, "10.0.0.0/8,fd00::/8", network.UseDefaultMTU)
	if err != nil {
		t.Fatal(err)
	}
	pm, err := network.NewPluginManager(p, nil)
	if err != nil {
		t.Fatal(err)
	}
	return pm
}

func podCIDREvent(cidrs string) map[string]interface{} {
	return map[string]interface{}{network.PodCIDRChangeDetailCIDR: cidrs}
}

// writeConf writes a CNI configuration file into dir.
func writeConf(t testing.TB, dir, file string, conf any) {
	t.Helper()
	b, err := json.Marshal(conf)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, file), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// listenIn tries to bind proto addr inside n the way a host process would (Go's listeners set
// SO_REUSEADDR) and returns the error; a successful socket is closed at once. proto is a Go
// network name: "tcp6" and "udp6" bind IPv6 only, "tcp" and "udp" on [::] both families.
func listenIn(t *testing.T, n ns.NetNS, proto, addr string) error {
	t.Helper()
	var lerr error
	nettest.Do(t, n, func() error {
		if strings.HasPrefix(proto, "udp") {
			c, err := net.ListenPacket(proto, addr)
			if err == nil {
				c.Close()
			}
			lerr = err
			return nil
		}
		l, err := net.Listen(proto, addr)
		if err == nil {
			l.Close()
		}
		lerr = err
		return nil
	})
	return lerr
}

func expectPortHeld(t *testing.T, n ns.NetNS, proto, addr string) {
	t.Helper()
	if err := listenIn(t, n, proto, addr); !errors.Is(err, syscall.EADDRINUSE) {
		t.Errorf("host process binding %s %s: %v, want EADDRINUSE (the plugin holds it)", proto, addr, err)
	}
}

// expectPortFree wants a host process to be able to bind proto addr in n. It polls for a
// second: a socket closed while a concurrent fork (any exec of the test process)
// has not yet reached its exec stays open in the child until then.
func expectPortFree(t *testing.T, n ns.NetNS, proto, addr string) {
	t.Helper()
	if err := nettest.Eventually(time.Second, func() error { return listenIn(t, n, proto, addr) }); err != nil {
		t.Errorf("host process binding %s %s: %v, want the port free", proto, addr, err)
	}
}

// setLoDown puts lo of n down, so a test can see who brings it up.
func setLoDown(t *testing.T, n ns.NetNS) {
	t.Helper()
	nettest.Do(t, n, func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.LinkSetDown(lo)
	})
}

func loIsUp(t *testing.T, n ns.NetNS) bool {
	t.Helper()
	return testkit.Link(t, n, "lo").Attrs().Flags&net.FlagUp != 0
}

// statusAddrs converts a PodNetworkStatus to addresses, checking IP == IPs[0].
func statusAddrs(t *testing.T, st *network.PodNetworkStatus) []netip.Addr {
	t.Helper()
	if st == nil || len(st.IPs) == 0 {
		t.Fatalf("pod network status %+v has no IPs", st)
	}
	if !st.IP.Equal(st.IPs[0]) {
		t.Errorf("status IP %s is not IPs[0] %s", st.IP, st.IPs[0])
	}
	var out []netip.Addr
	for _, ip := range st.IPs {
		a, _ := netip.AddrFromSlice(ip)
		out = append(out, a.Unmap())
	}
	return out
}

// setUp runs SetUpPod for p and returns the addresses GetPodNetworkStatus reports.
func setUp(t *testing.T, pm *network.PluginManager, p *shimPod, annotations map[string]string) []netip.Addr {
	t.Helper()
	if err := pm.SetUpPod(p.namespace, p.name, p.id, annotations, nil); err != nil {
		t.Fatal(err)
	}
	st, err := pm.GetPodNetworkStatus(p.namespace, p.name, p.id)
	if err != nil {
		t.Fatal(err)
	}
	return statusAddrs(t, st)
}
