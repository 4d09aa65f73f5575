package e2e

import (
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
	"sync"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubenet-dev/kubenet/test/e2e/criclient"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

// Node returns the node called name.
func (c *KubeCluster) Node(name string) *KubeNode {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// PodNetworkPods lists the pods on node that are on the pod network (not hostNetwork) and have
// addresses: the pods kubenet holds an attachment for.
func (c *KubeCluster) PodNetworkPods(ctx context.Context, node string) ([]corev1.Pod, error) {
	list, err := c.cp.Admin.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		return nil, err
	}
	var pods []corev1.Pod
	for _, p := range list.Items {
		if !p.Spec.HostNetwork && len(p.Status.PodIPs) > 0 && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			pods = append(pods, p)
		}
	}
	return pods, nil
}

// Reservations lists the addresses kubenet has reserved on node (one file per address in its
// data dir, read from the node's disk).
func (n *KubeNode) Reservations() ([]netip.Addr, error) {
	entries, err := os.ReadDir(filepath.Join(n.HostPath(nodeDataDir), "kubenet"))
	if err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	var addrs []netip.Addr
	for _, e := range entries {
		if a, err := netip.ParseAddr(e.Name()); err == nil {
			addrs = append(addrs, a)
		}
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	return addrs, nil
}

// BridgePorts lists the links enslaved to a bridge in the node's namespace: one host veth per
// pod attachment.
func (n *KubeNode) BridgePorts() ([]string, error) {
	var ports []string
	err := n.NS.Do(func(ns.NetNS) error {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		bridges := map[int]bool{}
		for _, l := range links {
			if l.Type() == "bridge" {
				bridges[l.Attrs().Index] = true
			}
		}
		for _, l := range links {
			if bridges[l.Attrs().MasterIndex] {
				ports = append(ports, l.Attrs().Name)
			}
		}
		return nil
	})
	return ports, err
}

// Leaks compares what kubenet holds on node with the pods the API server says run there: every
// reservation must be the address of such a pod, and there must be one bridge port per pod
// and no more. It returns what does not match.
func (c *KubeCluster) Leaks(ctx context.Context, n *KubeNode) ([]string, error) {
	pods, err := c.PodNetworkPods(ctx, n.Name)
	if err != nil {
		return nil, err
	}
	want := map[netip.Addr]string{}
	for _, p := range pods {
		for _, ip := range p.Status.PodIPs {
			if a, err := netip.ParseAddr(ip.IP); err == nil {
				want[a] = p.Namespace + "/" + p.Name
			}
		}
	}
	reserved, err := n.Reservations()
	if err != nil {
		return nil, err
	}
	var leaks []string
	for _, a := range reserved {
		if _, ok := want[a]; !ok {
			leaks = append(leaks, fmt.Sprintf("%s: address %s is reserved but no pod has it", n.Name, a))
		}
	}
	for a, pod := range want {
		if !slices.Contains(reserved, a) {
			leaks = append(leaks, fmt.Sprintf("%s: pod %s has %s, which kubenet has not reserved", n.Name, pod, a))
		}
	}
	ports, err := n.BridgePorts()
	if err != nil {
		return nil, err
	}
	if len(ports) != len(pods) {
		leaks = append(leaks, fmt.Sprintf("%s: %d bridge ports %v for %d pods", n.Name, len(ports), ports, len(pods)))
	}
	return leaks, nil
}

// PodNetNS opens the network namespace of a running pod: the namespace of its first
// container's process, found through the node's containerd and reached through the jail's
// /proc.
func (c *KubeCluster) PodNetNS(pod *corev1.Pod) (ns.NetNS, error) {
	n := c.Node(pod.Spec.NodeName)
	if n == nil || len(pod.Status.ContainerStatuses) == 0 {
		return nil, fmt.Errorf("pod %s: no node or no container yet", pod.Name)
	}
	id := strings.TrimPrefix(pod.Status.ContainerStatuses[0].ContainerID, "containerd://")
	out, err := n.Ctr("--namespace", "k8s.io", "tasks", "list")
	if err != nil {
		return nil, err
	}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == id {
			if _, err := strconv.Atoi(f[1]); err != nil {
				break
			}
			return ns.GetNS(fmt.Sprintf("/proc/%d/root/proc/%s/ns/net", n.Jail.Pid(), f[1]))
		}
	}
	return nil, fmt.Errorf("pod %s: containerd on %s lists no task %s:\n%s", pod.Name, n.Name, id, out)
}

// RuntimeCNIVersion is the cniVersion the node's containerd loaded kubenet's network with: the
// version its libcni chose from the conflist's cniVersion and cniVersions, as its verbose CRI
// Status shows it. The CRI socket is reached through the jail's root.
func (n *KubeNode) RuntimeCNIVersion(ctx context.Context) (string, error) {
	cri, err := criclient.Dial(fmt.Sprintf("/proc/%d/root%s", n.Jail.Pid(), containerdSock))
	if err != nil {
		return "", err
	}
	defer cri.Close()
	versions, err := cri.CNIVersions(ctx)
	if err != nil {
		return "", err
	}
	v, ok := versions["kubenet"]
	if !ok {
		return "", fmt.Errorf("%s: containerd has no network kubenet, only %v", n.Name, versions)
	}
	return v, nil
}

// ResultVersions reads libcni's result cache on the node (/var/lib/cni/results, written by the
// runtime after each ADD) and returns, per pod ("namespace/name") on kubenet's network, the
// cniVersion of the result kubenet gave: kubenet answers in the version it was called with.
func (n *KubeNode) ResultVersions() (map[string]string, error) {
	dir := n.HostPath("/var/lib/cni/results")
	entries, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	out := map[string]string{}
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), "kubenet-") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		var cached struct {
			NetworkName string      `json:"networkName"`
			CNIArgs     [][2]string `json:"cniArgs"`
			Result      struct {
				CNIVersion string `json:"cniVersion"`
			} `json:"result"`
		}
		if err := json.Unmarshal(b, &cached); err != nil {
			return nil, fmt.Errorf("%s: %w", e.Name(), err)
		}
		if cached.NetworkName != "kubenet" {
			continue
		}
		args := map[string]string{}
		for _, a := range cached.CNIArgs {
			args[a[0]] = a[1]
		}
		out[args["K8S_POD_NAMESPACE"]+"/"+args["K8S_POD_NAME"]] = cached.Result.CNIVersion
	}
	return out, nil
}

// Prober sends HTTP requests, each on a new connection, from nodes' namespaces to targets
// until stopped, and counts those that fail: the traffic a restart must not interrupt.
type Prober struct {
	targets  int
	mu       sync.Mutex
	sent     int
	failures []string
	stop     chan struct{}
	done     sync.WaitGroup
}

// ProbeTarget is a URL requested from inside a node's namespace.
type ProbeTarget struct {
	From *KubeNode
	URL  string
}

// StartProber starts probing every target every interval.
func StartProber(targets []ProbeTarget, interval time.Duration) *Prober {
	p := &Prober{stop: make(chan struct{}), targets: len(targets)}
	for _, tg := range targets {
		client := &http.Client{
			Timeout: 2 * time.Second,
			Transport: &http.Transport{
				DialContext:       nettest.DialIn(tg.From.NS),
				DisableKeepAlives: true,
			},
		}
		p.done.Add(1)
		go func() {
			defer p.done.Done()
			tick := time.NewTicker(interval)
			defer tick.Stop()
			for {
				err := get(client, tg.URL)
				p.mu.Lock()
				p.sent++
				if err != nil {
					p.failures = append(p.failures, fmt.Sprintf("%s from %s at %s: %v", tg.URL, tg.From.Name, time.Now().Format("15:04:05.000"), err))
				}
				p.mu.Unlock()
				select {
				case <-p.stop:
					return
				case <-tick.C:
				}
			}
		}()
	}
	return p
}

func get(client *http.Client, url string) error {
	resp, err := client.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %s", resp.Status)
	}
	return nil
}

// Stop ends the probing and returns how many requests were sent and which failed.
func (p *Prober) Stop() (int, []string) {
	close(p.stop)
	p.done.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.sent, p.failures
}
