//go:build kubenet_e2e_agent

package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/kubenet-dev/kubenet/agent/routes"
	"github.com/kubenet-dev/kubenet/internal/ipnet"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

// Scale of the measurement: Nodes in the API server besides the agent's own, kubelet-style
// status updates per second while latency is measured, and latency samples per kind.
const (
	scaleNodes      = 999
	scaleHeartbeats = 100 // every Node every 10 s: kubelet's status updates before node leases
	scaleSamples    = 20
)

// scaleCIDRs is the dual-stack pod CIDR pair of node i: a /26 and a /64 inside the test's
// cluster CIDRs (10.244.0.0/16 holds 1024 /26s).
func scaleCIDRs(i int) []netip.Prefix {
	return []netip.Prefix{
		netip.MustParsePrefix(fmt.Sprintf("10.244.%d.%d/26", i/4, i%4*64)),
		netip.MustParsePrefix(fmt.Sprintf("fd00:10:244:%x::/64", i)),
	}
}

// scaleAddrs are node i's InternalIPs: on the agent's segment, so every route can be made.
func scaleAddrs(i int) []netip.Prefix {
	return []netip.Prefix{
		netip.MustParsePrefix(fmt.Sprintf("172.20.%d.%d/16", i/250, i%250+1)),
		netip.MustParsePrefix(fmt.Sprintf("fd00:77::1:%x/64", i)),
	}
}

// startScaleNode starts the cluster and the agent's node, node-0000, with an address on the
// segment of scaleAddrs besides its own (the agent is not started).
func startScaleNode(b *testing.B) (kubernetes.Interface, *simNode) {
	u, cp, agentUser := startCluster(b)
	self := newSimNode(b, u, cp, "node-0000", 1, agentUser)
	nettest.Do(b, self.ns, func() error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		return netlink.AddrAdd(l, &netlink.Addr{IPNet: ipnet.FromPrefix(netip.MustParsePrefix("172.20.255.254/16"))})
	})
	return cp.Admin, self
}

// BenchmarkAgentScale measures one agent in a cluster of 1000 Nodes (objects only, with the
// status a kubelet writes): memory (RSS), CPU, and the time from a Node change to the route in
// the kernel. It runs once whatever b.N is (`make bench-agent`); the numbers are reported as
// metrics and logged. Goals (docs/agent.md): under 2 s from change to route, under 100 MiB.
func BenchmarkAgentScale(b *testing.B) {
	api, self := startScaleNode(b)
	start := time.Now()
	createNode(b, api, kubeletNode(self.name, self.addrs, scaleCIDRs(0)))
	createMany(b, api, scaleNodes, func(i int) *corev1.Node {
		return kubeletNode(fmt.Sprintf("node-%04d", i+1), scaleAddrs(i+1), scaleCIDRs(i+1))
	})
	b.Logf("%d Nodes created in %s; one, as the API server returns it in JSON, is %d bytes",
		scaleNodes+1, time.Since(start).Round(time.Millisecond), nodeSize(b, api, "node-0500"))

	// The deployment's settings, not the harness's test timings.
	self.startAgent(b, "--log-level=info", "--stale-gc-interval=1m", "--stale-gc-grace=5m")
	pid := self.agent.Pid()
	mem := sampleRSS(pid)
	cpu0 := cpuTime(b, pid)
	start = time.Now()
	err := nettest.Eventually(5*time.Minute, func() error {
		m, err := self.metrics()
		if err != nil {
			return err
		}
		if got := m["kubenet_agent_routes_programmed"]; got != 2*scaleNodes {
			return fmt.Errorf("%v routes programmed, want %d", got, 2*scaleNodes)
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	initial := time.Since(start)
	if got, err := agentRoutes(self.ns); err != nil || len(got) != 2*scaleNodes {
		b.Fatalf("the kernel holds %d routes of the agent (%v), want %d", len(got), err, 2*scaleNodes)
	}
	initialCPU := cpuTime(b, pid) - cpu0
	synced := procStatus(b, pid, "VmRSS")
	b.Logf("initial sync: %d routes in %s from the agent's start, CPU %s, RSS %.1f MiB (anonymous %.1f MiB, the binary's pages %.1f MiB)",
		2*scaleNodes, initial.Round(time.Millisecond), initialCPU.Round(time.Millisecond), mib(synced),
		mib(procStatus(b, pid, "RssAnon")), mib(procStatus(b, pid, "RssFile")))

	idle := measureCPU(b, pid, 20*time.Second)
	steady := procStatus(b, pid, "VmRSS")
	b.Logf("idle: CPU %.2f%% of one core over 20 s, RSS %.1f MiB", idle, mib(steady))
	events := subscribeRoutes(b, self.ns)
	syncs0, cpuSync0 := syncCount(b, self), cpuTime(b, pid)
	idleLat := measureLatency(b, api, events, "idle")
	perSync := (cpuTime(b, pid) - cpuSync0) / time.Duration(syncCount(b, self)-syncs0)
	b.Logf("idle latency runs: CPU per sync %s (%v syncs)", perSync.Round(100*time.Microsecond), syncCount(b, self)-syncs0)

	// kubelet-style status updates of every Node (heartbeats: nothing the agent acts on), while
	// CPU and latency are measured again.
	stopHB := heartbeats(b, api, scaleHeartbeats)
	busy := measureCPU(b, pid, 20*time.Second)
	busyLat := measureLatency(b, api, events, "heartbeats")
	sent := stopHB()
	b.Logf("heartbeats: %d status updates at %d/s; agent CPU %.2f%% of one core over 20 s", sent, scaleHeartbeats, busy)

	m, err := self.metrics()
	if err != nil {
		b.Fatal(err)
	}
	syncs, syncSum := m["kubenet_agent_sync_duration_seconds_count"], m["kubenet_agent_sync_duration_seconds_sum"]
	b.Logf("syncs: %v, %.1f ms on average", syncs, 1000*syncSum/syncs)
	peak := mem.stop()
	hwm := procStatus(b, pid, "VmHWM")
	b.Logf("RSS: %.1f MiB after the initial sync, at most %.1f MiB sampled every 100 ms, VmHWM (peak) %.1f MiB", mib(synced), mib(peak), mib(hwm))
	for _, l := range []latencies{idleLat, busyLat} {
		b.Logf("%s: Node change to route in the kernel, %d samples each: pod CIDR assigned p50 %s p95 %s max %s; Node deleted p50 %s p95 %s max %s",
			l.name, len(l.add), pct(l.add, 50), pct(l.add, 95), pct(l.add, 100), pct(l.del, 50), pct(l.del, 95), pct(l.del, 100))
	}
	b.ReportMetric(1000*syncSum/syncs, "sync-ms")
	b.ReportMetric(float64(perSync.Microseconds())/1000, "sync-CPU-ms")
	b.ReportMetric(mib(steady), "idle-RSS-MiB")
	b.ReportMetric(mib(hwm), "peak-RSS-MiB")
	b.ReportMetric(mib(synced), "synced-RSS-MiB")
	b.ReportMetric(initial.Seconds(), "initial-sync-s")
	b.ReportMetric(idle, "idle-CPU-%")
	b.ReportMetric(busy, "heartbeat-CPU-%")
	b.ReportMetric(float64(pct(slices.Concat(idleLat.add, busyLat.add), 50).Milliseconds()), "add-p50-ms")
	b.ReportMetric(float64(pct(slices.Concat(idleLat.add, busyLat.add), 100).Milliseconds()), "add-max-ms")
	b.ReportMetric(float64(pct(slices.Concat(idleLat.del, busyLat.del), 100).Milliseconds()), "del-max-ms")
}

func syncCount(b *testing.B, n *simNode) float64 {
	m, err := n.metrics()
	if err != nil {
		b.Fatal(err)
	}
	return m["kubenet_agent_sync_duration_seconds_count"]
}

// kubeletNode is a Node as kubelet registers and reports it, with pod CIDRs as the
// controller-manager assigns them: labels, annotations, capacity, conditions, node info and the
// 50 images kubelet lists by default (--node-status-max-images), so that the objects weigh what
// real ones do.
func kubeletNode(name string, addrs, cidrs []netip.Prefix) *corev1.Node {
	n := nodeObject(name, addrs, cidrs)
	n.Labels = map[string]string{
		"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
		"beta.kubernetes.io/os": "linux", "beta.kubernetes.io/arch": "amd64",
		"node.kubernetes.io/instance-type": "m5.xlarge", "topology.kubernetes.io/region": "region-1",
		"topology.kubernetes.io/zone": "region-1" + string(rune('a'+len(name)%3)),
	}
	n.Annotations = map[string]string{
		"node.alpha.kubernetes.io/ttl":                           "0",
		"volumes.kubernetes.io/controller-managed-attach-detach": "true",
		"kubeadm.alpha.kubernetes.io/cri-socket":                 "unix:///run/containerd/containerd.sock",
	}
	res := corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("16Gi"),
		corev1.ResourcePods: resource.MustParse("110"), corev1.ResourceEphemeralStorage: resource.MustParse("100Gi"),
		"hugepages-1Gi": resource.MustParse("0"), "hugepages-2Mi": resource.MustParse("0"),
	}
	n.Status.Capacity, n.Status.Allocatable = res, res
	now := metav1.Now()
	for _, c := range []struct {
		typ             corev1.NodeConditionType
		status          corev1.ConditionStatus
		reason, message string
	}{
		{corev1.NodeMemoryPressure, corev1.ConditionFalse, "KubeletHasSufficientMemory", "kubelet has sufficient memory available"},
		{corev1.NodeDiskPressure, corev1.ConditionFalse, "KubeletHasNoDiskPressure", "kubelet has no disk pressure"},
		{corev1.NodePIDPressure, corev1.ConditionFalse, "KubeletHasSufficientPID", "kubelet has sufficient PID available"},
		{corev1.NodeReady, corev1.ConditionTrue, "KubeletReady", "kubelet is posting ready status"},
	} {
		n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: c.typ, Status: c.status, Reason: c.reason, Message: c.message, LastHeartbeatTime: now, LastTransitionTime: now})
	}
	n.Status.DaemonEndpoints.KubeletEndpoint.Port = 10250
	id := fmt.Sprintf("%032x", len(name)*7919+int(name[len(name)-1]))
	n.Status.NodeInfo = corev1.NodeSystemInfo{
		MachineID: id, SystemUUID: id, BootID: id, KernelVersion: "6.1.0-28-amd64", OSImage: "Debian GNU/Linux 12 (bookworm)",
		ContainerRuntimeVersion: "containerd://1.7.24", KubeletVersion: "v1.34.1",
		OperatingSystem: "linux", Architecture: "amd64",
	}
	for i := range 50 {
		repo := fmt.Sprintf("registry.example.com/team-%d/service-%d", i%7, i)
		n.Status.Images = append(n.Status.Images, corev1.ContainerImage{
			Names:     []string{fmt.Sprintf("%s@sha256:%064x", repo, i*104729+1), repo + ":v1." + strconv.Itoa(i)},
			SizeBytes: int64(20_000_000 + i*1_000_000),
		})
	}
	return n
}

// createMany creates count Nodes made by gen, eight at a time.
func createMany(b *testing.B, api kubernetes.Interface, count int, gen func(i int) *corev1.Node) {
	work := make(chan int)
	errs := make(chan error, count)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				if err := registerNode(api, gen(i)); err != nil {
					errs <- err
				}
			}
		}()
	}
	for i := range count {
		work <- i
	}
	close(work)
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
}

func nodeSize(b *testing.B, api kubernetes.Interface, name string) int {
	n, err := api.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		b.Fatal(err)
	}
	raw, err := json.Marshal(n)
	if err != nil {
		b.Fatal(err)
	}
	return len(raw)
}

// latencies are the times from a Node change, as the API call that makes it starts, to its
// route change arriving from the kernel.
type latencies struct {
	name     string
	add, del []time.Duration
}

// measureLatency registers scaleSamples Nodes as kubelet does (addresses, no pod CIDR), then,
// for each, assigns its pod CIDRs as the controller-manager does and waits for both routes;
// deletes it and waits for both to go.
func measureLatency(b *testing.B, api kubernetes.Interface, events *routeEvents, name string) latencies {
	l := latencies{name: name}
	ctx := context.Background()
	for k := range scaleSamples {
		i := scaleNodes + 1 + k // pod CIDRs free again once the sample's Node is deleted
		node := fmt.Sprintf("late-%s-%02d", name, k)
		createNode(b, api, kubeletNode(node, scaleAddrs(i), nil))
		cidrs := scaleCIDRs(i)
		patch := fmt.Sprintf(`{"spec":{"podCIDR":%q,"podCIDRs":[%q,%q]}}`, cidrs[0], cidrs[0], cidrs[1])
		t0 := time.Now()
		if _, err := api.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			b.Fatal(err)
		}
		l.add = append(l.add, events.waitFor(b, unix.RTM_NEWROUTE, cidrs).Sub(t0))
		t0 = time.Now()
		if err := api.CoreV1().Nodes().Delete(ctx, node, metav1.DeleteOptions{}); err != nil {
			b.Fatal(err)
		}
		l.del = append(l.del, events.waitFor(b, unix.RTM_DELROUTE, cidrs).Sub(t0))
	}
	return l
}

// waitFor reads route notifications until one of kind (RTM_NEWROUTE, RTM_DELROUTE) with the
// agent's mark has arrived for every one of dsts, and returns when the last arrived.
func (e *routeEvents) waitFor(b *testing.B, kind uint16, dsts []netip.Prefix) time.Time {
	left := slices.Clone(dsts)
	deadline := time.After(time.Minute)
	for len(left) > 0 {
		select {
		case u := <-e.ch:
			if u.Type != kind || u.Protocol != routes.DefaultProtocol {
				continue
			}
			if p, ok := ipnet.ToPrefix(u.Dst); ok {
				left = slices.DeleteFunc(left, func(d netip.Prefix) bool { return d == p })
			}
		case <-deadline:
			b.Fatalf("no route notification %d for %v within a minute", kind, left)
		}
	}
	return time.Now()
}

func pct(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(ds))
	i := (len(s)*p + 99) / 100
	return s[max(i-1, 0)].Round(time.Millisecond)
}

// heartbeats patches the Ready condition of node-0001..node-0999 in turn, rate times a second,
// as kubelets posting their status do; the returned func stops it and says how many went out.
func heartbeats(b *testing.B, api kubernetes.Interface, rate int) func() int {
	stop := make(chan struct{})
	work := make(chan string)
	var wg sync.WaitGroup
	var mu sync.Mutex
	sent := 0
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for name := range work {
				now := time.Now().UTC().Format(time.RFC3339)
				patch := fmt.Sprintf(`{"status":{"conditions":[{"type":"Ready","status":"True","reason":"KubeletReady","message":"kubelet is posting ready status","lastHeartbeatTime":%q}]}}`, now)
				if _, err := api.CoreV1().Nodes().PatchStatus(context.Background(), name, []byte(patch)); err != nil {
					b.Error(err)
					continue
				}
				mu.Lock()
				sent++
				mu.Unlock()
			}
		}()
	}
	go func() {
		defer close(work)
		tick := time.NewTicker(time.Second / time.Duration(rate))
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-tick.C:
				work <- fmt.Sprintf("node-%04d", i%scaleNodes+1)
			}
		}
	}()
	return func() int {
		close(stop)
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		return sent
	}
}

// rssSampler reads a process's resident set every 100 ms and keeps the largest.
type rssSampler struct {
	done chan struct{}
	max  chan int64
}

func sampleRSS(pid int) *rssSampler {
	s := &rssSampler{done: make(chan struct{}), max: make(chan int64, 1)}
	go func() {
		var peak int64
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			if v, err := readStatus(pid, "VmRSS"); err == nil {
				peak = max(peak, v)
			}
			select {
			case <-s.done:
				s.max <- peak
				return
			case <-tick.C:
			}
		}
	}()
	return s
}

func (s *rssSampler) stop() int64 {
	close(s.done)
	return <-s.max
}

// readStatus returns a "kB" field of /proc/<pid>/status in bytes.
func readStatus(pid int, field string) (int64, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb * 1024, err
		}
	}
	return 0, fmt.Errorf("no %s in /proc/%d/status", field, pid)
}

func procStatus(b *testing.B, pid int, field string) int64 {
	v, err := readStatus(pid, field)
	if err != nil {
		b.Fatal(err)
	}
	return v
}

// cpuTime is the user and system time the process has used (/proc/<pid>/stat, in clock ticks
// of 10 ms: USER_HZ is 100 on Linux).
func cpuTime(b *testing.B, pid int) time.Duration {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// The command name may hold spaces: fields count from after its closing parenthesis.
	fields := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+1:]))
	utime, err1 := strconv.ParseInt(fields[11], 10, 64)
	stime, err2 := strconv.ParseInt(fields[12], 10, 64)
	if err1 != nil || err2 != nil {
		b.Fatalf("/proc/%d/stat: %q", pid, raw)
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// measureCPU returns the process's CPU use over the next d, in percent of one core.
func measureCPU(b *testing.B, pid int, d time.Duration) float64 {
	c0, t0 := cpuTime(b, pid), time.Now()
	<-time.After(d)
	return 100 * float64(cpuTime(b, pid)-c0) / float64(time.Since(t0))
}

func mib(bytes int64) float64 { return float64(bytes) / (1 << 20) }
