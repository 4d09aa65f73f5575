//go:build e2e

package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/kubenet-dev/kubenet/agent/cnidir"
	"github.com/kubenet-dev/kubenet/agent/cri"
	"github.com/kubenet-dev/kubenet/agent/stale"
	"github.com/kubenet-dev/kubenet/core"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

// staleGrace is the collector's grace period in this test: long enough that the passes made
// while an ADD is held open fall inside it on a loaded machine, short enough to wait for.
const staleGrace = 10 * time.Second

// TestRuntimeContainerdStaleAttachments runs kubenet-agent's stale-attachment collector (the
// code the agent runs, in-process, against the node's netns) with Debian's containerd, which
// never sends CNI GC. Pods: "web" keeps running; "lost" dies without a CNI DEL and containerd
// forgets it (its task killed, its metadata deleted, containerd restarted, its netns mount gone
// as after a reboot); "halted" dies without a DEL but containerd remembers it (NOTREADY after
// the restart); "creating" is held inside its CNI ADD, before containerd lists it. The collector
// must take only lost's attachment, including its hostPort, and leave the others working.
func TestRuntimeContainerdStaleAttachments(t *testing.T) {
	requireTools(t, "containerd", "ctr", "runc", "containerd-shim-runc-v2", "nsenter")
	refDir, err := nettest.InstallRefPlugins()
	Require(t, err, "reference loopback plugin %s available (containerd 1.6 runs it for the pod's lo)", nettest.RefPluginsVersion)
	w := newRuntimeWorld(t, filepath.Join(refDir, "loopback"))
	gate := holdableKubenet(t, w)
	jail := NewJail(t, w.node.NS)
	cd := StartContainerd(t, debianContainerd, jail, w.dir, w.cni, w.archive)
	Check(t, nil, "%s running in the node netns", cd.Version)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	run := func(name string, hostPort int32) string {
		t.Helper()
		cfg := podConfig(jail, name, hostPort)
		id, err := cd.CRI.RunPod(ctx, cfg)
		Require(t, err, "RunPodSandbox %s: sandbox %s", name, short(id))
		return id
	}
	web, lost, halted := run("web", 30090), run("lost", 30091), run("halted", 0)
	webCfg := podConfig(jail, "web", 30090)
	_, err = cd.CRI.StartContainer(ctx, web, webCfg, &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: "server"}, Image: &runtimeapi.ImageSpec{Image: BusyboxImage}, Command: ServerCommand,
	})
	Require(t, err, "busybox httpd running in web")
	webIPs, err := cd.CRI.PodIPs(ctx, web)
	Require(t, err, "web has addresses %v", webIPs)
	lostRec := record(t, w, lost)

	for _, id := range []string{lost, halted} {
		_, err := cd.CtrOutput("tasks", "kill", "--signal", "SIGKILL", id)
		Require(t, err, "sandbox %s killed behind CRI's back (ctr tasks kill), no CNI DEL", short(id))
	}
	Require(t, waitNotReady(ctx, cd, lost, halted), "containerd saw both sandboxes die: NOTREADY")
	_, err = cd.CtrOutput("containers", "delete", lost)
	Require(t, err, "lost's container metadata deleted behind CRI's back (ctr containers delete)")
	Require(t, cd.Daemon.Stop(), "containerd stopped")
	cd = StartContainerd(t, debianContainerd, jail, w.dir, w.cni, w.archive)
	t.Cleanup(func() { cd.RemoveAllPods(t) })
	states, err := sandboxStates(ctx, cd)
	want := map[string]runtimeapi.PodSandboxState{web: runtimeapi.PodSandboxState_SANDBOX_READY, halted: runtimeapi.PodSandboxState_SANDBOX_NOTREADY}
	if err == nil && !mapsEqual(states, want) {
		err = fmt.Errorf("containerd lists %v, want %v", states, want)
	}
	Require(t, err, "containerd restarted: lists web READY and halted NOTREADY, and no longer knows lost")
	// As after a reboot: lost's netns mount is gone, and with it its veth pair.
	_, err = jail.Output("umount", lostRec.NetNS)
	if err == nil {
		err = os.Remove(lostRec.NetNS)
	}
	Require(t, err, "lost's netns mount %s removed", lostRec.NetNS)
	_, err = os.Stat(core.RecordPath(filepath.Join(w.node.DataDir(), network), core.Attachment{ContainerID: lost, IfName: "eth0"}))
	Require(t, err, "lost's attachment (addresses %v, hostPort 30091) is still on the node: the leak", lostRec.IPs)

	collector := newStaleCollector(t, w, cd)
	netConf := networkOf(t, w)
	pass := func() stale.Result {
		t.Helper()
		res, err := collector.Pass(ctx, netConf)
		Require(t, err, "a collection pass (%d sandboxes listed, %d attachments without one)", res.Sandboxes, res.Unlisted)
		return res
	}
	passes := 0
	err = nettest.Eventually(2*time.Minute, func() error {
		res, err := collector.Pass(ctx, netConf)
		if err != nil {
			return err
		}
		passes++
		if !slices.ContainsFunc(res.Report.Attachments, func(r core.Record) bool { return r.ContainerID == lost }) {
			return fmt.Errorf("lost not collected yet (pass: %d sandboxes, %d unlisted)", res.Sandboxes, res.Unlisted)
		}
		if len(res.Report.Attachments) != 1 {
			return fmt.Errorf("collected %+v, want only lost", res.Report.Attachments)
		}
		return nil
	})
	Require(t, err, "lost's attachment collected once it was without a sandbox for %s (pass %d)", staleGrace, passes)
	Check(t, attachmentGone(t, w, lost, lostRec), "nothing of lost remains: record, reservations %v, hostPort 30091 elements", lostRec.IPs)
	for _, id := range []string{web, halted} {
		_, err := os.Stat(core.RecordPath(filepath.Join(w.node.DataDir(), network), core.Attachment{ContainerID: id, IfName: "eth0"}))
		Check(t, err, "%s's attachment kept (READY or NOTREADY, containerd lists it)", short(id))
	}
	for _, ip := range webIPs {
		Check(t, ExpectHTTPFrom(w.node.Peer, netip.AddrPortFrom(ip, ServerPort), peer[ip.Is6()]), "web still serves on %s", ip)
	}

	// An ADD in flight: kubenet has written the record and made the veth, containerd has not
	// listed the sandbox yet. Passes now must not take it.
	gate.hold(t)
	created := make(chan error, 1)
	var creating string
	go func() {
		var err error
		creating, err = cd.CRI.RunPod(ctx, podConfig(jail, "creating", 0))
		created <- err
	}()
	Require(t, gate.waitHeld(ctx), "creating's CNI ADD done by kubenet, held before it returns to containerd")
	inFlight := recordOfPod(t, w, "default/creating")
	ids, err := cd.CRI.PodIDs(ctx)
	if err == nil && slices.Contains(ids, inFlight.ContainerID) {
		err = fmt.Errorf("containerd lists %s already", short(inFlight.ContainerID))
	}
	Require(t, err, "containerd does not list the sandbox %s while its ADD runs: a collector going by the list alone would take it", short(inFlight.ContainerID))
	for range 3 {
		pass()
	}
	_, err = os.Stat(core.RecordPath(filepath.Join(w.node.DataDir(), network), core.Attachment{ContainerID: inFlight.ContainerID, IfName: "eth0"}))
	Check(t, err, "three passes during the ADD left creating's attachment alone")
	gate.release(t)
	Require(t, <-created, "RunPodSandbox creating returned")
	ips, err := cd.CRI.PodIPs(ctx, creating)
	if err == nil && !sameAddrsOK(ips, inFlight.IPs) {
		err = fmt.Errorf("containerd reports %v, the record %v", ips, inFlight.IPs)
	}
	Check(t, err, "creating (%s) is up with the addresses its ADD reserved", short(creating))
	res := pass()
	Check(t, noneCollected(res), "a pass after creating is listed collects nothing")

	Require(t, cd.CRI.StopAndRemovePod(ctx, halted), "halted stopped and removed: containerd sends its CNI DEL")
	cd.RemoveAllPods(t)
	// libcni's result cache of lost is the runtime's, which lost the sandbox: nothing of
	// kubenet's can remove it (after a reboot it stays on disk the same way).
	_, err = jail.Output("sh", "-c", "rm -f /var/lib/cni/results/*-"+lost+"-*")
	Require(t, err, "libcni's cached results of lost removed by hand")
	checkNoResidue(t, w, jail, filepath.Join(cd.StateDir, "io.containerd.grpc.v1.cri", "netns"))
	Check(t, cd.Daemon.Stop(), "containerd stopped")
}

func podConfig(jail *Jail, name string, hostPort int32) *runtimeapi.PodSandboxConfig {
	cfg := &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: name, Uid: "e2e-" + name + "-uid", Namespace: "default"},
		Hostname: name,
		Linux:    &runtimeapi.LinuxPodSandboxConfig{CgroupParent: jail.CgroupParent},
	}
	if hostPort != 0 {
		cfg.PortMappings = []*runtimeapi.PortMapping{{Protocol: runtimeapi.Protocol_TCP, ContainerPort: ServerPort, HostPort: hostPort}}
	}
	return cfg
}

// newStaleCollector is kubenet-agent's collector over containerd's CRI socket, whose GC runs in
// the node's network namespace (the agent runs in the node's own).
func newStaleCollector(t *testing.T, w runtimeWorld, cd *Containerd) *stale.Collector {
	t.Helper()
	client, err := cri.Dial("unix://" + cd.socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	inNode := func(ctx context.Context, cfg *core.Config, k core.Keeper) (core.GCReport, error) {
		var r core.GCReport
		err := w.node.NS.Do(func(ns.NetNS) error {
			var err error
			r, err = core.Collect(ctx, cfg, k)
			return err
		})
		return r, err
	}
	c, err := stale.New(client, staleGrace, inNode)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// networkOf is the plugin configuration the agent derives for the world's conflist.
func networkOf(t *testing.T, w runtimeWorld) *core.Config {
	t.Helper()
	cfg, err := cnidir.NetworkConfig(cnidir.Options{
		CNIVersion:         "1.0.0",
		Name:               network,
		PodCIDRs:           []netip.Prefix{nettest.PodCIDR4, nettest.PodCIDR6},
		NonMasqueradeCIDRs: []netip.Prefix{nettest.NonMasquerade4, nettest.NonMasquerade6},
		DataDir:            w.node.DataDir(),
	})
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func record(t *testing.T, w runtimeWorld, id string) *core.Record {
	t.Helper()
	rec, err := core.NewRecords(filepath.Join(w.node.DataDir(), network)).Load(core.Attachment{ContainerID: id, IfName: "eth0"})
	if err == nil && rec == nil {
		err = errors.New("no record")
	}
	Require(t, err, "kubenet's record of %s", short(id))
	return rec
}

func recordOfPod(t *testing.T, w runtimeWorld, pod string) core.Record {
	t.Helper()
	recs, err := core.NewRecords(filepath.Join(w.node.DataDir(), network)).List()
	i := slices.IndexFunc(recs, func(r core.Record) bool { return r.Pod == pod })
	if err == nil && i < 0 {
		err = fmt.Errorf("no record names pod %s", pod)
	}
	Require(t, err, "kubenet's record of pod %s", pod)
	return recs[i]
}

// attachmentGone checks that nothing of the attachment remains: record, reservations, and the
// hostPort index entries and map elements its owner name marks.
func attachmentGone(t *testing.T, w runtimeWorld, id string, rec *core.Record) error {
	t.Helper()
	netDir := filepath.Join(w.node.DataDir(), network)
	var left []string
	if _, err := os.Stat(core.RecordPath(netDir, core.Attachment{ContainerID: id, IfName: "eth0"})); err == nil {
		left = append(left, "record")
	}
	for _, p := range rec.IPs {
		if _, err := os.Stat(filepath.Join(netDir, p.Addr().String())); err == nil {
			left = append(left, "reservation "+p.Addr().String())
		}
	}
	ruleset, err := nettest.SettledRuleset(w.node.NS)
	if err != nil {
		return err
	}
	if strings.Contains(ruleset, id) {
		left = append(left, "nftables elements of "+short(id))
	}
	if len(left) > 0 {
		return fmt.Errorf("left: %s", strings.Join(left, ", "))
	}
	return nil
}

func sandboxStates(ctx context.Context, cd *Containerd) (map[string]runtimeapi.PodSandboxState, error) {
	r, err := cd.CRI.Runtime.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return nil, err
	}
	out := map[string]runtimeapi.PodSandboxState{}
	for _, s := range r.Items {
		out[s.Id] = s.State
	}
	return out, nil
}

// waitNotReady polls until containerd reports every one of ids NOTREADY.
func waitNotReady(ctx context.Context, cd *Containerd, ids ...string) error {
	return nettest.Eventually(time.Minute, func() error {
		states, err := sandboxStates(ctx, cd)
		if err != nil {
			return err
		}
		for _, id := range ids {
			if states[id] != runtimeapi.PodSandboxState_SANDBOX_NOTREADY {
				return fmt.Errorf("%s is %s", short(id), states[id])
			}
		}
		return nil
	})
}

func mapsEqual[K comparable, V comparable](a, b map[K]V) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func sameAddrsOK(ips []netip.Addr, rec []netip.Prefix) bool {
	var recIPs []netip.Addr
	for _, p := range rec {
		recIPs = append(recIPs, p.Addr())
	}
	return sameAddrs(ips, recIPs) == nil
}

func noneCollected(res stale.Result) error {
	if len(res.Report.Attachments)+len(res.Report.Addresses) > 0 {
		return fmt.Errorf("collected %+v", res.Report)
	}
	return nil
}

// addGate holds kubenet's ADD open after the plugin has finished, before the result goes back
// to containerd: the binary the runtime runs is a wrapper that waits while a file exists.
type addGate struct{ dir string }

// holdableKubenet replaces kubenet in the world's CNI bin dir with the gated wrapper.
func holdableKubenet(t *testing.T, w runtimeWorld) addGate {
	t.Helper()
	g := addGate{dir: filepath.Join(w.dir, "gate")}
	if err := os.MkdirAll(g.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	script := fmt.Sprintf(`#!/bin/sh
# kubenet, with ADD held open while %[1]s/hold exists (at most 2 minutes).
out=$(%[2]s "$@")
rc=$?
if [ "$CNI_COMMAND" = ADD ] && [ -e %[1]s/hold ]; then
  : > %[1]s/held
  i=0
  while [ -e %[1]s/hold ] && [ $i -lt 2400 ]; do sleep 0.05; i=$((i+1)); done
fi
printf '%%s\n' "$out"
exit $rc
`, g.dir, filepath.Join(binDir, "kubenet"))
	wrapper := filepath.Join(w.cni.Bin, "kubenet")
	if err := os.Remove(wrapper); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(filepath.Join(g.dir, "hold")) })
	return g
}

func (g addGate) hold(t *testing.T) {
	t.Helper()
	_ = os.Remove(filepath.Join(g.dir, "held"))
	if err := os.WriteFile(filepath.Join(g.dir, "hold"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

func (g addGate) waitHeld(ctx context.Context) error {
	return nettest.Eventually(time.Minute, func() error {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		_, err := os.Stat(filepath.Join(g.dir, "held"))
		return err
	})
}

func (g addGate) release(t *testing.T) {
	t.Helper()
	if err := os.Remove(filepath.Join(g.dir, "hold")); err != nil {
		t.Fatal(err)
	}
}
