package cni

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/kubenet-dev/kubenet/test/testkit"

	"github.com/vishvananda/netlink"

	"github.com/kubenet-dev/kubenet/core"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

// TestFailedAddLeavesNothing makes ADD fail at different steps and audits that nothing of the
// attachment remains and that what existed before is untouched.
func TestFailedAddLeavesNothing(t *testing.T) {
	cases := []struct {
		name     string
		cidrs    []netip.Prefix
		prepare  func(t *testing.T, node *nettest.Node, pod *nettest.Pod)
		wantCode uint
		wantMsg  string
	}{
		{
			name:  "pod already has the interface",
			cidrs: testkit.DualStack(),
			prepare: func(t *testing.T, node *nettest.Node, pod *nettest.Pod) {
				nettest.Do(t, pod.NS, func() error {
					return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "eth0peer"})
				})
			},
			wantCode: core.ErrAttachmentExists,
			wantMsg:  `"eth0"`,
		},
		{
			name:  "bridge name taken by a non-bridge link",
			cidrs: testkit.DualStack(),
			prepare: func(t *testing.T, node *nettest.Node, pod *nettest.Pod) {
				nettest.Do(t, node.NS, func() error {
					return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "cbr0"}, PeerName: "cbr0peer"})
				})
			},
			wantMsg: "not a bridge",
		},
		{
			name:  "address pool exhausted",
			cidrs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/30")},
			prepare: func(t *testing.T, node *nettest.Node, pod *nettest.Pod) {
				// A /30 has one pod address; a first pod takes it.
				list := node.ConfList(t, nettest.NetConf{PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/30")}})
				node.MustAdd(t, list, node.NewPod(t, "first"))
			},
			wantCode: core.ErrNoAddresses,
			wantMsg:  "10.244.1.0/30",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			node := nettest.NewNode(t, binDir)
			list := node.ConfList(t, nettest.NetConf{PodCIDRs: tc.cidrs})
			pod := node.NewPod(t, "failing")
			tc.prepare(t, node, pod)
			before := stateFiles(t, node)
			err := node.Add(list, pod)
			if err == nil {
				t.Fatal("ADD succeeded, want a failure")
			}
			if tc.wantCode != 0 && testkit.CNICode(err) != tc.wantCode {
				t.Errorf("error code %d, want %d: %v", testkit.CNICode(err), tc.wantCode, err)
			}
			if !strings.Contains(err.Error(), tc.wantMsg) {
				t.Errorf("error %q does not name %q", err, tc.wantMsg)
			}
			testkit.AssertNoResidue(t, node, "kubenet", testkit.AttachmentOf(pod), nil)
			if after := stateFiles(t, node); !slices.Equal(before, after) {
				t.Errorf("data dir changed by the failed ADD:\nbefore %v\nafter  %v", before, after)
			}
			// The runtime must DEL after a failed ADD; that DEL succeeds and finds nothing to do.
			if err := node.Del(list, pod); err != nil {
				t.Errorf("DEL after failed ADD: %v", err)
			}
		})
	}
}

// stateFiles lists the data dir's reservations and records, leaving out the lock and the
// round-robin cursors, which any allocation attempt may create or move (as with host-local), and
// the node-wide files (settings, backend record), which belong to the node (like its bridge).
func stateFiles(t testing.TB, node *nettest.Node) []string {
	t.Helper()
	var out []string
	for _, f := range testkit.DataDirFiles(t, node) {
		base := filepath.Base(f)
		if base != "lock" && !strings.HasPrefix(base, "last_reserved_ip.") && !core.IsNodeFile(base) {
			out = append(out, f)
		}
	}
	return out
}

// TestAddTwice: a second ADD of the same (container, interface) fails and leaves the first
// attachment working.
func TestAddTwice(t *testing.T) {
	node := nettest.NewNode(t, binDir)
	list := node.ConfList(t, nettest.NetConf{PodCIDRs: testkit.DualStack()})
	a, b := node.NewPod(t, "twice"), node.NewPod(t, "peer")
	node.MustAdd(t, list, a)
	node.MustAdd(t, list, b)
	files := testkit.DataDirFiles(t, node)
	again := &nettest.Pod{NS: a.NS, RT: a.RT}
	err := node.Add(list, again)
	if testkit.CNICode(err) != core.ErrAttachmentExists {
		t.Fatalf("second ADD: got %v, want code %d", err, core.ErrAttachmentExists)
	}
	if after := testkit.DataDirFiles(t, node); !slices.Equal(files, after) {
		t.Errorf("second ADD changed the data dir:\nbefore %v\nafter  %v", files, after)
	}
	for _, ip := range a.IPs() {
		srv := nettest.StartTCPEcho(t, a.NS, netip.AddrPortFrom(ip, 8080))
		testkit.ExpectReachable(t, b.NS, srv, b.IP(ip))
	}
}

// TestDelVariants: DEL succeeds and leaves nothing when the netns is gone, CNI_NETNS is empty,
// prevResult is missing, or DEL is repeated.
func TestDelVariants(t *testing.T) {
	cases := []struct {
		name   string
		before func(t *testing.T, node *nettest.Node, pod *nettest.Pod)
	}{
		{"plain", func(*testing.T, *nettest.Node, *nettest.Pod) {}},
		{"netns deleted", func(t *testing.T, _ *nettest.Node, pod *nettest.Pod) { nettest.DeleteNS(t, pod.NS) }},
		{"empty CNI_NETNS", func(_ *testing.T, _ *nettest.Node, pod *nettest.Pod) { pod.RT.NetNS = "" }},
		{"no prevResult", func(t *testing.T, node *nettest.Node, pod *nettest.Pod) {
			cache := filepath.Join(node.Dir, "cache", "results", "kubenet-"+pod.RT.ContainerID+"-eth0")
			if err := os.Remove(cache); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			node := nettest.NewNode(t, binDir)
			list := node.ConfList(t, nettest.NetConf{PodCIDRs: testkit.DualStack()})
			pod := node.NewPod(t, "deleted")
			if err := node.Add(list, pod); err != nil {
				t.Fatal(err)
			}
			att := testkit.AttachmentOf(pod)
			// Put a flow of the pod into conntrack, so the audit can see DEL remove it.
			peer := nettest.StartTCPEcho(t, node.Peer, netip.AddrPortFrom(nettest.Peer4.Addr(), 9001))
			testkit.ExpectReachable(t, pod.NS, peer, nettest.NodePeerLink4.Addr()) // no non-masquerade CIDRs: SNATed
			tc.before(t, node, pod)
			for i := range 2 {
				if err := node.Del(list, pod); err != nil {
					t.Fatalf("DEL #%d: %v", i+1, err)
				}
			}
			testkit.AssertNoResidue(t, node, "kubenet", att, pod.IPs())
		})
	}
}

// TestParallelAdds: 200 ADDs from 16 parallel plugin processes get 200 unique addresses, and 200
// DELs leave the data dir with only the lock and cursor files.
func TestParallelAdds(t *testing.T) {
	const pods, workers = 200, 16
	node := nettest.NewNode(t, binDir)
	list := node.ConfList(t, nettest.NetConf{PodCIDRs: testkit.DualStack()})
	all := make([]*nettest.Pod, pods)
	for i := range all {
		all[i] = node.NewPod(t, fmt.Sprintf("par-%03d", i))
	}
	runParallel(t, workers, all, func(p *nettest.Pod) error { return node.Add(list, p) })
	seen := map[netip.Addr]string{}
	for _, p := range all {
		if len(p.IPs()) != 2 {
			t.Fatalf("%s got %v, want one address per family", p.RT.ContainerID, p.IPs())
		}
		for _, ip := range p.IPs() {
			if other, dup := seen[ip]; dup {
				t.Errorf("address %s handed to both %s and %s", ip, other, p.RT.ContainerID)
			}
			seen[ip] = p.RT.ContainerID
		}
	}
	runParallel(t, workers, all, func(p *nettest.Pod) error { return node.Del(list, p) })
	if left := stateFiles(t, node); len(left) > 0 {
		t.Errorf("data dir holds more than lock and cursors after all DELs: %v", left)
	}
}

func runParallel(t *testing.T, workers int, pods []*nettest.Pod, op func(*nettest.Pod) error) {
	t.Helper()
	work := make(chan *nettest.Pod)
	errs := make(chan error, len(pods))
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for p := range work {
				if err := op(p); err != nil {
					errs <- fmt.Errorf("%s: %w", p.RT.ContainerID, err)
				}
			}
		}()
	}
	for _, p := range pods {
		work <- p
	}
	close(work)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestVersionCommand: VERSION lists exactly the supported versions, and a bare run names the
// plugin and its versions.
func TestVersionCommand(t *testing.T) {
	node := nettest.NewNode(t, binDir)
	run, err := node.ExecPlugin(binDir, map[string]string{"CNI_COMMAND": "VERSION"}, []byte(`{"cniVersion":"1.1.0"}`))
	if err != nil || run.ExitCode != 0 {
		t.Fatalf("VERSION: %v %+v", err, run)
	}
	var info struct {
		SupportedVersions []string `json:"supportedVersions"`
	}
	if err := json.Unmarshal([]byte(run.Stdout), &info); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(info.SupportedVersions, core.SupportedVersions()) {
		t.Errorf("VERSION lists %v, want %v", info.SupportedVersions, core.SupportedVersions())
	}
	bare, err := node.ExecPlugin(binDir, nil, nil)
	if err != nil || bare.ExitCode != 0 {
		t.Fatalf("bare run: %v %+v", err, bare)
	}
	if !strings.Contains(bare.Stderr, "kubenet") || !strings.Contains(bare.Stderr, strings.Join(core.SupportedVersions(), ", ")) {
		t.Errorf("bare run says %q; want the name and the versions", bare.Stderr)
	}
}
