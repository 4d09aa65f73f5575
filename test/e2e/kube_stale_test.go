//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubenet-dev/kubenet/core"
	"github.com/kubenet-dev/kubenet/hostport"
	"github.com/kubenet-dev/kubenet/internal/nft"
	"github.com/kubenet-dev/kubenet/netpol"
)

// The deployed agent's stale-attachment collection (docs/agent.md, "Stale attachments") in the
// test's clusters: the manifest's 5 min grace and 1 min interval would make the check wait six
// minutes, so TestKubernetes gives the agent these when it runs its own checks. The grace still
// covers every RunPodSandbox of the specs (containerd lists a sandbox once its ADD is over and
// its pause container started, seconds later even under load): a shorter one that collected a
// pod being created would fail its spec.
const (
	kubeStaleGrace    = 30 * time.Second
	kubeStaleInterval = 5 * time.Second
)

// kubeStaleArgs are the agent flags that set them.
func kubeStaleArgs() []string {
	return []string{"--stale-gc-grace=" + kubeStaleGrace.String(), "--stale-gc-interval=" + kubeStaleInterval.String()}
}

// The leaked attachment: a made-up sandbox with a host port and both bandwidth limits, so that
// it owns every kind of per-pod state (reservations, record, veth, ifb, hostPort index and map
// elements, isolation elements, the NetworkPolicy port guard).
const (
	leakNetNS     = "kubenet-e2e-leak" // in the jail's /run/netns
	leakNamespace = "kubenet-stale"
	leakPod       = "leaked"
	leakHostPort  = 28793 // outside the NodePort range and the specs' host ports
)

// staleCheck is the collector check of TestKubernetes, in two halves around CoreDNS and the
// bandwidth check, so that the grace period passes while they run instead of adding to the
// run: startStaleCheck runs a pod ("survivor") on node1 with traffic to it from both nodes and
// then leaks an attachment there the way a runtime that lost a sandbox does (a CNI ADD of a
// sandbox containerd never had, and no DEL); finish waits until the deployed agent has removed
// every trace of it and checks that it waited the grace period and that the survivor kept its
// attachment and its traffic.
type staleCheck struct {
	c        *KubeCluster
	node     *KubeNode
	att      core.Attachment
	ips      []netip.Addr
	port     int       // the leaked veth's index, once seen: the policy maps' key
	written  time.Time // the record's mtime: the age the collector judges
	survivor *corev1.Pod
	prober   *Prober
	stop     func() (int, []string)
}

func startStaleCheck(t *testing.T, c *KubeCluster) *staleCheck {
	t.Helper()
	node := c.Nodes[0]
	c.createNamespace(t, leakNamespace)
	s := &staleCheck{c: c, node: node}
	s.survivor = c.createRunning(t, leakNamespace, agnhostPod("survivor", node.Name, nil))
	var targets []ProbeTarget
	for _, from := range c.Nodes {
		for _, ip := range s.survivor.Status.PodIPs {
			targets = append(targets, ProbeTarget{From: from, URL: hostPortURL(ip.IP, 8080, "/hostname")})
		}
	}
	// Running is not listening yet: netexec binds its port a moment after it starts.
	err := c.untilAnswering(func() []ProbeTarget { return targets })
	Require(t, err, "pod %s on %s answers from both nodes at %v", s.survivor.Name, node.Name, s.survivor.Status.PodIPs)
	s.prober = StartProber(targets, 250*time.Millisecond)
	s.stop = sync.OnceValues(s.prober.Stop)
	t.Cleanup(func() { s.stop() })

	id := make([]byte, 32)
	if _, err := rand.Read(id); err != nil {
		t.Fatal(err)
	}
	s.att = core.Attachment{ContainerID: hex.EncodeToString(id), IfName: "eth0", NetNS: "/run/netns/" + leakNetNS}
	_, err = node.Jail.Output("ip", "netns", "add", leakNetNS)
	Require(t, err, "%s: network namespace %s made for a sandbox containerd does not know", node.Name, leakNetNS)
	t.Cleanup(s.tidy)
	out, err := s.cni("ADD")
	Require(t, err, "%s: CNI ADD of sandbox %s with the node's conflist and its kubenet binary, no DEL to follow", node.Name, short(s.att.ContainerID))
	var result struct {
		IPs []struct {
			Address string `json:"address"`
		} `json:"ips"`
	}
	if err := json.Unmarshal(out, &result); err != nil {
		t.Fatalf("the ADD's result %s: %v", out, err)
	}
	for _, ip := range result.IPs {
		p, err := netip.ParsePrefix(ip.Address)
		if err != nil {
			t.Fatalf("the ADD's result %s: %v", out, err)
		}
		s.ips = append(s.ips, p.Addr())
	}
	st, err := os.Stat(s.recordPath())
	Require(t, err, "the leaked attachment has its record")
	s.written = st.ModTime()
	traces, err := s.traces()
	if err == nil {
		err = s.complete(traces)
	}
	Require(t, err, "%s holds the leaked attachment %v: %s", node.Name, s.ips, strings.Join(traces, "; "))
	return s
}

// tidy removes the leak when the agent did not (a failed check: the later checks then do not
// trip over it again) and its network namespace.
func (s *staleCheck) tidy() {
	if _, err := os.Stat(s.recordPath()); err == nil {
		_, _ = s.cni("DEL")
	}
	_, _ = s.node.Jail.Output("ip", "netns", "del", leakNetNS)
}

// cni runs the installed plugin inside the node's jail for the leaked attachment, as a runtime
// would with the conflist the agent wrote: pod arguments as containerd sends them, a host port
// and bandwidth limits.
func (s *staleCheck) cni(command string) ([]byte, error) {
	raw, err := os.ReadFile(s.node.HostPath(filepath.Join(nodeCNIConfDir, "10-kubenet.conflist")))
	if err != nil {
		return nil, err
	}
	var conflist struct {
		Name       string                   `json:"name"`
		CNIVersion string                   `json:"cniVersion"`
		Plugins    []map[string]interface{} `json:"plugins"`
	}
	if err := json.Unmarshal(raw, &conflist); err != nil || len(conflist.Plugins) != 1 {
		return nil, fmt.Errorf("the agent's conflist %s: %v, want one plugin", raw, err)
	}
	conf := conflist.Plugins[0]
	conf["name"], conf["cniVersion"] = conflist.Name, conflist.CNIVersion
	conf["runtimeConfig"] = map[string]any{
		"portMappings": []map[string]any{{"hostPort": leakHostPort, "containerPort": 8080, "protocol": "tcp"}},
		"bandwidth":    map[string]any{"ingressRate": 10_000_000, "egressRate": 10_000_000},
	}
	stdin, err := json.Marshal(conf)
	if err != nil {
		return nil, err
	}
	cmd := s.node.Jail.Command(filepath.Join(nodeCNIBinDir, "kubenet"))
	cmd.Env = append(os.Environ(),
		"CNI_COMMAND="+command,
		"CNI_CONTAINERID="+s.att.ContainerID,
		"CNI_NETNS="+s.att.NetNS,
		"CNI_IFNAME="+s.att.IfName,
		"CNI_PATH="+nodeCNIBinDir,
		"CNI_ARGS=IgnoreUnknown=1;K8S_POD_NAMESPACE="+leakNamespace+";K8S_POD_NAME="+leakPod+";K8S_POD_INFRA_CONTAINER_ID="+s.att.ContainerID)
	cmd.Stdin = bytes.NewReader(stdin)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("kubenet %s: %w: %s%s", command, err, out, stderr.Bytes())
	}
	return out, nil
}

func (s *staleCheck) netDir() string { return filepath.Join(s.node.HostPath(nodeDataDir), "kubenet") }

func (s *staleCheck) recordPath() string { return core.RecordPath(s.netDir(), s.att) }

// traces lists what the node holds of the leaked attachment, found without kubenet's code:
// files naming its container (reservations, the hostPort index) and its record, its veth and
// ifb, and the nftables elements of its host port, its bridge port (by name, and by index in the
// policy maps) or its addresses (unless another attachment holds the address by now: the
// collector released it).
func (s *staleCheck) traces() ([]string, error) {
	var out []string
	entries, err := os.ReadDir(s.netDir())
	if err != nil {
		return nil, err
	}
	reservedByOthers := map[netip.Addr]bool{}
	for _, e := range entries {
		a, err := netip.ParseAddr(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(s.netDir(), e.Name()))
		if err != nil && !os.IsNotExist(err) {
			return nil, err
		}
		if strings.HasPrefix(string(b), s.att.ContainerID) {
			out = append(out, "reservation "+e.Name())
		} else if err == nil {
			reservedByOthers[a] = true
		}
	}
	if _, err := os.Stat(s.recordPath()); err == nil {
		out = append(out, "record "+filepath.Base(s.recordPath()))
	}
	err = filepath.WalkDir(filepath.Join(s.netDir(), hostport.IndexDirName), func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		if b, _ := os.ReadFile(p); bytes.Contains(b, []byte(s.att.ContainerID)) {
			out = append(out, "hostPort index "+filepath.Base(p))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	names := core.NamesFor("kubenet", s.att)
	veth := false
	err = s.node.NS.Do(func(ns.NetNS) error {
		for _, l := range []string{names.HostVeth, names.IFB} {
			if link, err := netlink.LinkByName(l); err == nil {
				out = append(out, "link "+l)
				if l == names.HostVeth {
					s.port, veth = link.Attrs().Index, true
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if veth {
		// The NetworkPolicy port guard ADD puts on the veth (towards the pod): the policy's only
		// per-pod state before the agent's pass, which holds a pod the API does not have.
		filters, err := s.node.Jail.Output("tc", "filter", "show", "dev", names.HostVeth, "egress")
		if err != nil {
			return nil, err
		}
		if strings.Contains(filters, "kubenet-guard-") {
			out = append(out, "tc guard on link "+names.HostVeth)
		}
	}
	marks := []string{s.att.ContainerID, `"` + names.HostVeth + `"`, fmt.Sprint(leakHostPort), "-i " + names.HostVeth + " "}
	if s.port > 0 {
		marks = append(marks, fmt.Sprintf("[%d,", s.port))
	}
	for _, a := range s.ips {
		if !reservedByOthers[a] {
			marks = append(marks, `"`+a.String()+`"`)
		}
	}
	for _, tb := range []struct{ family, name string }{
		{"inet", nft.TableName("kubenet")}, {"bridge", nft.TableName("kubenet")}, {"bridge", netpol.TableName("kubenet")},
	} {
		dump, err := nftListTable(s.node.NS, tb.family, tb.name)
		if err != nil {
			return nil, err
		}
		elements, err := nftResidue(dump)
		if err != nil {
			return nil, err
		}
		for _, e := range elements {
			if slices.ContainsFunc(marks, func(m string) bool { return strings.Contains(e, m) }) {
				out = append(out, e)
			}
		}
	}
	// The iptables backend's: its host port's DNAT rule (commented with its container) and its
	// dispatch rule on the bridge (matching its veth).
	rules, err := iptResidue(NodeState{NS: s.node.NS, Network: "kubenet"})
	if err != nil {
		return nil, err
	}
	for _, r := range rules {
		if slices.ContainsFunc(marks, func(m string) bool { return strings.Contains(r, m) }) {
			out = append(out, r)
		}
	}
	return out, nil
}

// complete checks that traces hold every kind of state the leaked attachment was made with, so
// that their absence later means the collector removed them.
func (s *staleCheck) complete(traces []string) error {
	names := core.NamesFor("kubenet", s.att)
	want := []string{"record ", "hostPort index ", "link " + names.HostVeth, "link " + names.IFB}
	if s.c.cfg.Netfilter == "iptables" {
		want = append(want, "iptables rule of chain KUBENET-HPDNAT-", "ebtables rule of chain KUBENET-PODS-")
	} else {
		want = append(want, "nftables inet "+nft.TableName("kubenet"), "nftables bridge "+nft.TableName("kubenet"))
		if s.c.networkPolicy() {
			want = append(want, "tc guard on link "+names.HostVeth)
		}
	}
	for _, a := range s.ips {
		want = append(want, "reservation "+a.String())
	}
	var missing []string
	for _, w := range want {
		if !slices.ContainsFunc(traces, func(tr string) bool { return strings.HasPrefix(tr, w) }) {
			missing = append(missing, strings.TrimSpace(w))
		}
	}
	if len(missing) > 0 || len(s.ips) == 0 {
		return fmt.Errorf("addresses %v; missing: %s", s.ips, strings.Join(missing, ", "))
	}
	return nil
}

// finish waits for the deployed agent to collect the leak, then checks when it did and that the
// survivor was left alone.
func (s *staleCheck) finish(t *testing.T) {
	c, node := s.c, s.node
	defer s.tidy()
	// The earliest a pass can collect is a grace period after the ADD (the record's age, and as
	// long unlisted in the passes' view); a pass comes every interval. The rest is slack for a
	// loaded machine; without a working collector the wait ends in failure here.
	deadline := s.written.Add(kubeStaleGrace + 2*kubeStaleInterval + time.Minute)
	var left []string
	err := c.eventually(time.Until(deadline), func(context.Context) error {
		var err error
		if left, err = s.traces(); err != nil {
			return err
		}
		if len(left) > 0 {
			return fmt.Errorf("%s still holds %s", node.Name, strings.Join(left, "; "))
		}
		return nil
	})
	Require(t, err, "the agent on %s collected the leaked attachment of sandbox %s: reservations %v, record, hostPort index entry, veth, ifb and its netfilter elements and rules gone, by %s after its ADD",
		node.Name, short(s.att.ContainerID), s.ips, time.Since(s.written).Round(time.Second))

	at, line, err := s.collectedLogLine()
	if err == nil && at.Sub(s.written) < kubeStaleGrace {
		err = fmt.Errorf("collected %s after the ADD, before the grace period: %s", at.Sub(s.written).Round(time.Millisecond), line)
	}
	Check(t, err, "the agent's log says it collected sandbox %s (pod %s/%s) %s after its ADD, no earlier than the grace period %s",
		short(s.att.ContainerID), leakNamespace, leakPod, at.Sub(s.written).Round(100*time.Millisecond), kubeStaleGrace)

	sent, failed := s.stop()
	var probeErr error
	if len(failed) > 0 || sent == 0 {
		probeErr = fmt.Errorf("%d of %d requests failed: %s", len(failed), sent, strings.Join(first(failed, 5), "; "))
	}
	Check(t, probeErr, "all %d requests to pod %s on %s (from both nodes, every 250 ms since before the leak) succeeded throughout", sent, s.survivor.Name, node.Name)
	now, err := c.cp.Admin.CoreV1().Pods(leakNamespace).Get(context.Background(), s.survivor.Name, metav1.GetOptions{})
	if err == nil && (!slices.Equal(now.Status.PodIPs, s.survivor.Status.PodIPs) || now.Status.Phase != corev1.PodRunning) {
		err = fmt.Errorf("%s with addresses %v, before %v", now.Status.Phase, now.Status.PodIPs, s.survivor.Status.PodIPs)
	}
	Check(t, err, "pod %s keeps its addresses %v", s.survivor.Name, s.survivor.Status.PodIPs)
	var leaks []string
	err = c.eventually(time.Minute, func(ctx context.Context) error {
		var err error
		if leaks, err = c.Leaks(ctx, node); err != nil {
			return err
		}
		if len(leaks) > 0 {
			return fmt.Errorf("%s", strings.Join(leaks, "; "))
		}
		return nil
	})
	Check(t, err, "every running pod on %s still holds its reservations and its bridge port", node.Name)
}

// collectedLogLine finds, in the log of node's agent, the line that reports the leak's
// collection, and returns its time.
func (s *staleCheck) collectedLogLine() (time.Time, string, error) {
	pods, err := s.c.cp.Admin.CoreV1().Pods("kube-system").List(context.Background(), metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/name=kubenet-agent", FieldSelector: "spec.nodeName=" + s.node.Name,
	})
	if err != nil {
		return time.Time{}, "", err
	}
	if len(pods.Items) != 1 {
		return time.Time{}, "", fmt.Errorf("%d agent pods on %s", len(pods.Items), s.node.Name)
	}
	logs, err := s.c.Kubectl("-n", "kube-system", "logs", pods.Items[0].Name)
	if err != nil {
		return time.Time{}, "", err
	}
	sc := bufio.NewScanner(strings.NewReader(logs))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var l struct {
			Time      time.Time `json:"time"`
			Msg       string    `json:"msg"`
			Container string    `json:"container"`
			Pod       string    `json:"pod"`
		}
		if json.Unmarshal(sc.Bytes(), &l) != nil || l.Container != s.att.ContainerID {
			continue
		}
		if l.Msg != "collected the attachment of a sandbox the runtime no longer lists" || l.Pod != leakNamespace+"/"+leakPod {
			return time.Time{}, sc.Text(), fmt.Errorf("unexpected line: %s", sc.Text())
		}
		return l.Time, sc.Text(), nil
	}
	return time.Time{}, "", fmt.Errorf("no line about container %s in the log of %s", s.att.ContainerID, pods.Items[0].Name)
}

// networkPolicy says whether the agents enforce NetworkPolicy (policyEnforced of its AgentArgs).
func (c *KubeCluster) networkPolicy() bool { return policyEnforced(c.cfg.AgentArgs) }
