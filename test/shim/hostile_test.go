package shim

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/kubenet-dev/kubenet/core"
	"github.com/kubenet-dev/kubenet/network"
	"github.com/kubenet-dev/kubenet/test/nettest"
	"github.com/kubenet-dev/kubenet/test/testkit"
)

// TestShimHostileSandboxIDs: on the in-process path no skel checks the identifiers, so the core
// does. A sandbox ID that would reach a path outside the data dir, or be ambiguous in a file
// name or an nftables comment, makes SetUpPod, GetPodNetworkStatus and TearDownPod fail with an
// error naming it, and nothing is created anywhere: no link, no file in the data dir or beside it.
func TestShimHostileSandboxIDs(t *testing.T) {
	node := nettest.NewNode(t, binDir)
	host := newShimHost()
	_, _, plugins := allPlugins(t, node, t.TempDir())
	pm := managerFor(t, plugins, "kubenet", host)
	pm.Event(network.PodCIDRChangeEvent, podCIDREvent(dualStackCIDRs))
	// A canary beside the data dir: an ID with ".." would aim there.
	canary := filepath.Join(filepath.Dir(node.DataDir()), "canary")
	if err := os.Mkdir(canary, 0o755); err != nil {
		t.Fatal(err)
	}
	ids := []string{
		"../../canary/x", "../canary", "a/b", "..", ".", "", "-leading-dash", "a b", "a\x00b", "a\nb",
		"a@b", "a_b%2f", strings.Repeat("x", 129), "sandbox/../../etc",
	}
	linksBefore := linkNames(t, node)
	for _, id := range ids {
		t.Run(strings.ToValidUTF8(id, "?"), func(t *testing.T) {
			pod := &shimPod{namespace: "default", name: "hostile", id: network.ContainerID{Type: "test", ID: id}, NS: nettest.NewNS(t)}
			host.add(id, pod.NS, &network.PortMapping{HostPort: 30500, ContainerPort: 80, Protocol: "tcp"})
			if err := pm.SetUpPod(pod.namespace, pod.name, pod.id, nil, nil); err == nil {
				t.Error("SetUpPod accepted the ID")
			}
			if _, err := pm.GetPodNetworkStatus(pod.namespace, pod.name, pod.id); err == nil {
				t.Error("GetPodNetworkStatus accepted the ID")
			}
			if err := pm.TearDownPod(pod.namespace, pod.name, pod.id); err == nil {
				t.Error("TearDownPod accepted the ID")
			}
			if testkit.LinkExists(t, pod.NS, "eth0") {
				t.Error("the pod got an interface")
			}
		})
	}
	if after := linkNames(t, node); strings.Join(after, ",") != strings.Join(linksBefore, ",") {
		t.Errorf("links changed: %v -> %v", linksBefore, after)
	}
	if entries, _ := os.ReadDir(canary); len(entries) != 0 {
		t.Errorf("files appeared beside the data dir: %v", entries)
	}
	for _, f := range testkit.DataDirFiles(t, node) {
		// The network's lock and its node-wide settings, from the pod CIDR event; nothing of a pod.
		if base := filepath.Base(f); base != "lock" && !core.IsNodeFile(base) {
			t.Errorf("the data dir holds %s", f)
		}
	}
	if els := testkit.HostPortElements(t, node); len(els) != 0 {
		t.Errorf("hostPort elements: %v", els)
	}
}

func linkNames(t *testing.T, node *nettest.Node) []string {
	t.Helper()
	var out []string
	nettest.Do(t, node.NS, func() error {
		ls, err := netlink.LinkList()
		for _, l := range ls {
			out = append(out, l.Attrs().Name)
		}
		return err
	})
	return out
}

// TestShimGCListIsHostile: a GC list with a malformed entry (no interface name, an empty or
// malformed ID) is refused as a whole, through the plugin and through kubenetctl, and deletes
// nothing: an entry without its interface would otherwise protect nothing.
func TestShimGCListIsHostile(t *testing.T) {
	bin, err := nettest.BuildCommand(t.TempDir(), "kubenetctl")
	if err != nil {
		t.Fatal(err)
	}
	node := nettest.NewNode(t, binDir)
	host := newShimHost()
	kn, _, plugins := allPlugins(t, node, t.TempDir())
	pm := managerFor(t, plugins, "kubenet", host)
	pm.Event(network.PodCIDRChangeEvent, podCIDREvent(dualStackCIDRs))
	pod := newShimPod(t, host, "kept")
	ips := setUp(t, pm, pod, nil)
	lists := [][]core.ValidAttachment{
		{{ContainerID: pod.id.ID}},
		{{ContainerID: pod.id.ID, IfName: "eth0"}, {ContainerID: "", IfName: "eth0"}},
		{{ContainerID: "../x", IfName: "eth0"}},
		{{ContainerID: pod.id.ID, IfName: "eth0/x"}},
	}
	for _, valid := range lists {
		if err := kn.GC(valid); err == nil {
			t.Errorf("GC accepted %+v", valid)
		}
	}
	for _, arg := range []string{"../x", "a b", "x/eth0/y", "/eth0"} {
		if r := kubenetctl(t, bin, node, "--kubenet-data-dir", node.DataDir(), "gc", "--valid", arg); r.code == 0 {
			t.Errorf("kubenetctl gc --valid %q succeeded: %s", arg, r.stdout)
		}
	}
	st, err := pm.GetPodNetworkStatus(pod.namespace, pod.name, pod.id)
	if err != nil {
		t.Fatalf("the kept pod lost its status: %v", err)
	}
	if got := statusAddrs(t, st); len(got) != len(ips) {
		t.Errorf("the kept pod's addresses %v, want %v", got, ips)
	}
	if _, err := os.Stat(core.RecordPath(filepath.Join(node.DataDir(), "kubenet"), pod.att())); err != nil {
		t.Errorf("a refused GC removed the kept pod's record: %v", err)
	}
}

// TestShimTearDownWithBrokenRecord: the shim's TearDownPod finishes when the pod's record is
// unreadable, also on a plugin object that has seen no pod CIDR event yet (it derives its
// configuration from the record), and leaves nothing of the pod.
func TestShimTearDownWithBrokenRecord(t *testing.T) {
	node := nettest.NewNode(t, binDir)
	host := newShimHost()
	_, _, plugins := allPlugins(t, node, t.TempDir())
	pm := managerFor(t, plugins, "kubenet", host)
	pm.Event(network.PodCIDRChangeEvent, podCIDREvent(dualStackCIDRs))
	pod := newShimPod(t, host, "broken", &network.PortMapping{HostPort: 30501, ContainerPort: 80, Protocol: "udp"})
	ips := setUp(t, pm, pod, map[string]string{"kubernetes.io/ingress-bandwidth": "10M"})
	record := core.RecordPath(filepath.Join(node.DataDir(), "kubenet"), pod.att())
	b, err := os.ReadFile(record)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(record, b[:len(b)/3], 0o600); err != nil {
		t.Fatal(err)
	}
	// The status still comes, from the pod's interface.
	st, err := pm.GetPodNetworkStatus(pod.namespace, pod.name, pod.id)
	if err != nil {
		t.Fatalf("GetPodNetworkStatus with a truncated record: %v", err)
	}
	if got := statusAddrs(t, st); !slices.Equal(testkit.SortedAddrs(got), testkit.SortedAddrs(ips)) {
		t.Errorf("status addresses %v, want %v", got, ips)
	}
	// A new plugin object, as after a shim restart, before any pod CIDR event.
	_, _, fresh := allPlugins(t, node, t.TempDir())
	pm2 := managerFor(t, fresh, "kubenet", host)
	if err := pm2.TearDownPod(pod.namespace, pod.name, pod.id); err != nil {
		t.Fatalf("TearDownPod with a truncated record: %v", err)
	}
	testkit.AssertNoResidue(t, node, "kubenet", pod.att(), ips)
	testkit.AssertNoHostPortResidue(t, node, ips, 30501)
}
