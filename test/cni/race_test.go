package cni

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/kubenet-dev/kubenet/core"
	"github.com/kubenet-dev/kubenet/hostport"
	"github.com/kubenet-dev/kubenet/test/nettest"
	"github.com/kubenet-dev/kubenet/test/testkit"
)

// raceRounds is how many times TestAddDelRaceSameAttachment races the two verbs;
// KUBENET_RACE_ROUNDS overrides it.
func raceRounds(t *testing.T) int { return envInt(t, "KUBENET_RACE_ROUNDS", 40) }

// TestAddDelRaceSameAttachment starts an ADD and a DEL of one attachment as two plugin
// processes at (nearly) the same time, with one's start shifted by a different delay each round
// (the DEL's in even rounds, the ADD's in odd ones) so that each lands in every phase of the
// other, and checks the outcome: either the pod is
// fully set up with its record (CHECK passes, its address is reserved for it, it has its host
// port) or nothing of it is left. Then it cleans up with a DEL and races again.
func TestAddDelRaceSameAttachment(t *testing.T) {
	node := nettest.NewNode(t, binDir)
	pod := node.NewPod(t, "race")
	base := map[string]any{
		"cniVersion": "1.1.0", "name": "kubenet", "type": "kubenet", "dataDir": node.DataDir(),
		"podCIDRs": []string{nettest.PodCIDR4.String(), nettest.PodCIDR6.String()},
		"runtimeConfig": map[string]any{
			"portMappings": []map[string]any{{"hostPort": 31080, "containerPort": 80, "protocol": "udp"}},
			"bandwidth":    map[string]any{"ingressRate": 10_000_000, "egressRate": 10_000_000},
		},
	}
	stdin, _ := json.Marshal(base)
	env := func(cmd string) map[string]string {
		return map[string]string{"CNI_COMMAND": cmd, "CNI_CONTAINERID": "race", "CNI_IFNAME": "eth0",
			"CNI_NETNS": pod.NS.Path(), "CNI_PATH": binDir, "CNI_ARGS": "IgnoreUnknown=1"}
	}
	// An ADD alone takes tens of milliseconds; spread the DEL's start over that.
	solo := time.Now()
	if run, err := node.ExecPlugin(binDir, env("ADD"), stdin); err != nil || run.ExitCode != 0 {
		t.Fatalf("ADD alone: %v %+v", err, run)
	}
	span := time.Since(solo)
	if run, err := node.ExecPlugin(binDir, env("DEL"), stdin); err != nil || run.ExitCode != 0 {
		t.Fatalf("DEL alone: %v %+v", err, run)
	}
	rounds := raceRounds(t)
	outcomes := map[string]int{}
	for i := range rounds {
		shift := time.Duration(i/2*2) * span / time.Duration(rounds)
		addDelay, delDelay := time.Duration(0), shift
		if i%2 == 1 {
			addDelay, delDelay = shift/4, 0 // a DEL alone is quicker than an ADD
		}
		var wg sync.WaitGroup
		var add, del nettest.PluginRun
		var addErr, delErr error
		wg.Add(2)
		// The delays stagger the two starts; they wait for nothing.
		go func() {
			defer wg.Done()
			time.Sleep(addDelay)
			add, addErr = node.ExecPlugin(binDir, env("ADD"), stdin)
		}()
		go func() {
			defer wg.Done()
			time.Sleep(delDelay)
			del, delErr = node.ExecPlugin(binDir, env("DEL"), stdin)
		}()
		wg.Wait()
		if addErr != nil || delErr != nil {
			t.Fatalf("round %d: %v %v", i, addErr, delErr)
		}
		if del.ExitCode != 0 {
			t.Fatalf("round %d: DEL failed: %s", i, del.Stdout)
		}
		state := raceOutcome(t, node, pod, add, stdin)
		outcomes[state]++
		if t.Failed() {
			t.Fatalf("round %d (ADD started after %v, DEL after %v): ADD exit %d %s", i, addDelay, delDelay, add.ExitCode, add.Stdout)
		}
		if run, err := node.ExecPlugin(binDir, env("DEL"), stdin); err != nil || run.ExitCode != 0 {
			t.Fatalf("round %d: cleanup DEL: %v %s", i, err, run.Stdout)
		}
		testkit.AssertNoResidue(t, node, "kubenet", testkit.AttachmentOf(pod), nil)
	}
	t.Logf("%d rounds (starts shifted over %v): %v", rounds, span, outcomes)
}

// raceOutcome classifies the node after a racing ADD and DEL: "set up" (everything there, CHECK
// passes) or "nothing" (no trace); anything in between fails the test.
func raceOutcome(t *testing.T, node *nettest.Node, pod *nettest.Pod, add nettest.PluginRun, stdin []byte) string {
	t.Helper()
	att := testkit.AttachmentOf(pod)
	names := core.NamesFor("kubenet", att)
	netDir := filepath.Join(node.DataDir(), "kubenet")
	_, recErr := os.Stat(core.RecordPath(netDir, att))
	pieces := map[string]bool{
		"record":           recErr == nil,
		"host veth":        testkit.LinkExists(t, node.NS, names.HostVeth),
		"ifb":              testkit.LinkExists(t, node.NS, names.IFB),
		"pod eth0":         testkit.LinkExists(t, pod.NS, "eth0"),
		"reservation":      false,
		"hostPort file":    len(testkit.HostPortIndexFiles(t, node)) > 0,
		"hostPort element": len(testkit.HostPortElements(t, node)) > 0,
	}
	// The pod's isolation elements are part of it: all of them when it is set up, none when not.
	owner := att.ContainerID + "/" + att.IfName
	elements := isolationOfPort(testkit.IsolationElements(t, node), names.HostVeth, owner)
	pieces["an isolation element"] = len(elements) > 0
	if add.ExitCode == 0 {
		mac, ips, err := addResult(add.Stdout)
		if err != nil {
			t.Fatal(err)
		}
		pieces["every isolation element"] = slices.Equal(elements, isolationWant(testkit.IsolationMark(testkit.NodeBackend(node), names.HostVeth, owner), names.HostVeth, mac, ips, true))
	} else {
		pieces["every isolation element"] = false // which ones the pod would have, only ADD's result says
	}
	entries, _ := os.ReadDir(netDir)
	for _, e := range entries {
		if b, err := os.ReadFile(filepath.Join(netDir, e.Name())); err == nil && strings.HasPrefix(string(b), "race\r\n") {
			pieces["reservation"] = true
		}
	}
	var have, missing []string
	for k, v := range pieces {
		if v {
			have = append(have, k)
		} else {
			missing = append(missing, k)
		}
	}
	switch {
	case len(missing) == 0:
		// Set up: the ADD must have succeeded, and CHECK must pass with its result.
		if add.ExitCode != 0 {
			t.Errorf("the pod is set up but ADD failed: %s", add.Stdout)
			return "broken"
		}
		var conf map[string]any
		_ = json.Unmarshal(stdin, &conf)
		conf["prevResult"] = json.RawMessage(add.Stdout)
		check, _ := json.Marshal(conf)
		run, err := node.ExecPlugin(binDir, map[string]string{"CNI_COMMAND": "CHECK", "CNI_CONTAINERID": "race", "CNI_IFNAME": "eth0",
			"CNI_NETNS": pod.NS.Path(), "CNI_PATH": binDir}, check)
		if err != nil || run.ExitCode != 0 {
			t.Errorf("the pod is set up but CHECK fails: %v %s", err, run.Stdout)
		}
		return "set up"
	case len(have) == 0:
		return "nothing"
	}
	t.Errorf("half an attachment after ADD and DEL raced: has %v, lacks %v", have, missing)
	return fmt.Sprintf("half: %v", have)
}

// TestDelRacesBackendSwitch: DELs of host-port pods run while the ADD of another pod switches
// the node's netfilter backend (iptables to nftables, and the other way). Whichever runs first,
// no host port of a deleted pod may stay in the new backend's maps: it would lead the port to an
// address the next pod is given; and the backend left behind holds nothing of the network.
func TestDelRacesBackendSwitch(t *testing.T) {
	for _, from := range []string{"iptables", "nftables"} {
		t.Run("from "+from, func(t *testing.T) { delRacesBackendSwitch(t, from) })
	}
}

// delRacesBackendSwitch is TestDelRacesBackendSwitch from backend from to the other one.
func delRacesBackendSwitch(t *testing.T, from string) {
	node := nettest.NewNode(t, binDir)
	ipt := node.ConfList(t, nettest.NetConf{PodCIDRs: testkit.DualStack(), NetfilterBackend: "iptables"})
	nft := node.ConfList(t, nettest.NetConf{PodCIDRs: testkit.DualStack(), NetfilterBackend: "nftables"})
	if from == "nftables" {
		ipt, nft = nft, ipt // ipt is the configuration the round starts on, nft the switch's
	}
	const pods = 4
	for round := range raceRounds(t) / 4 {
		var deleted []*nettest.Pod
		for i := range pods {
			p := node.NewPod(t, fmt.Sprintf("sw-%d-%d", round, i))
			p.RT.CapabilityArgs = hpArgs(true, hpMapping{host: 32000 + i, container: 80, proto: "tcp"})
			if err := node.Add(ipt, p); err != nil {
				t.Fatalf("round %d: ADD %s: %v", round, p.RT.ContainerID, err)
			}
			deleted = append(deleted, p)
		}
		switcher := node.NewPod(t, fmt.Sprintf("sw-%d-new", round))
		errs, switchErr := raceSwitch(node, deleted, func(p *nettest.Pod) error { return node.Del(ipt, p) }, nft, switcher)
		for i, err := range errs {
			if err != nil {
				t.Errorf("round %d: DEL %s: %v", round, deleted[i].RT.ContainerID, err)
			}
		}
		if switchErr != nil {
			t.Errorf("round %d: ADD %s: %v", round, switcher.RT.ContainerID, switchErr)
		}
		if left := testkit.HostPortElements(t, node); len(left) > 0 {
			t.Fatalf("round %d: host ports of deleted pods left in the maps: %v", round, left)
		}
		// A DEL that opened on the old backend removes its pod's rules there after the move
		// emptied it: that must not put chains back.
		if left := otherBackendRules(t, node); len(left) > 0 {
			t.Fatalf("round %d: the node's backend is %s, and the other one still holds rules of the network: %v", round, testkit.NodeBackend(node), left)
		}
		if err := node.Del(nft, switcher); err != nil {
			t.Fatal(err)
		}
	}
}

// raceSwitch runs verb on every pod at once with the ADD of switcher through the switching
// configuration list, and returns each pod's error (in pods' order) and the switching ADD's.
func raceSwitch(node *nettest.Node, pods []*nettest.Pod, verb func(*nettest.Pod) error, switching *libcni.NetworkConfigList, switcher *nettest.Pod) (errs []error, switchErr error) {
	errs = make([]error, len(pods))
	var wg sync.WaitGroup
	for i, p := range pods {
		wg.Go(func() { errs[i] = verb(p) })
	}
	wg.Go(func() { switchErr = node.Add(switching, switcher) })
	wg.Wait()
	return errs, switchErr
}

// TestAddRacesBackendSwitch: ADDs of host-port pods that open with one backend (iptables, then
// nftables) run while the ADD of another pod switches the node to the other one. Whichever runs first, once every pod is
// deleted (with the configuration of the backend in use) no host-port DNAT may stay in either
// backend: an ADD that reserved its ports after the switch and wrote them into the old backend
// would leave rules there that no DEL removes, leading the port to an address the next pod is
// given.
func TestAddRacesBackendSwitch(t *testing.T) {
	for _, from := range []string{"iptables", "nftables"} {
		t.Run("from "+from, func(t *testing.T) { addRacesBackendSwitch(t, from) })
	}
}

// addRacesBackendSwitch is TestAddRacesBackendSwitch from backend from to the other one.
func addRacesBackendSwitch(t *testing.T, from string) {
	node := nettest.NewNode(t, binDir)
	ipt := node.ConfList(t, nettest.NetConf{PodCIDRs: testkit.DualStack(), NetfilterBackend: "iptables"})
	nft := node.ConfList(t, nettest.NetConf{PodCIDRs: testkit.DualStack(), NetfilterBackend: "nftables"})
	if from == "nftables" {
		ipt, nft = nft, ipt // ipt is the configuration the round starts on, nft the switch's
	}
	const pods = 4
	for round := range raceRounds(t) / 4 {
		// The node starts each round on backend from.
		first := node.NewPod(t, fmt.Sprintf("asw-%d-first", round))
		if err := node.Add(ipt, first); err != nil {
			t.Fatalf("round %d: ADD %s: %v", round, first.RT.ContainerID, err)
		}
		var added []*nettest.Pod
		for i := range pods {
			p := node.NewPod(t, fmt.Sprintf("asw-%d-%d", round, i))
			p.RT.CapabilityArgs = hpArgs(true, hpMapping{host: 32100 + i, container: 80, proto: "tcp"})
			added = append(added, p)
		}
		switcher := node.NewPod(t, fmt.Sprintf("asw-%d-new", round))
		errs, switchErr := raceSwitch(node, added, func(p *nettest.Pod) error { return node.Add(ipt, p) }, nft, switcher)
		// An ADD may fail here (the runtime DELs it and tries again): the switch refused by
		// ebtables while another ADD's guard chain is in use, or an ADD whose iptables chains
		// the switch removed. What must not happen is a host port left behind.
		for i, err := range append(errs, switchErr) {
			if err != nil {
				t.Errorf("round %d: ADD %s: %v", round, append(added, switcher)[i].RT.ContainerID, err)
			}
		}
		// DEL every pod with the configuration of the backend the switch asked for.
		for _, p := range append(append(added, first), switcher) {
			if err := node.Del(nft, p); err != nil {
				t.Fatalf("round %d: DEL %s: %v", round, p.RT.ContainerID, err)
			}
		}
		// Both backends are read, whichever the node's record names.
		for _, m := range []string{hostport.MapIPv4, hostport.MapIPv4Addr, hostport.MapIPv6, hostport.MapIPv6Addr} {
			if left := testkit.NFTElements(t, node, "inet", "map", m); len(left) > 0 {
				t.Fatalf("round %d: host ports of deleted pods left in nftables map %s: %s", round, m, left)
			}
		}
		for _, tool := range []string{"iptables-save", "ip6tables-save"} {
			var dnat []string
			for _, line := range strings.Split(nettest.Run(t, node.NS, tool, "-t", "nat"), "\n") {
				if strings.Contains(line, "DNAT") && strings.Contains(line, "--dport 321") {
					dnat = append(dnat, line)
				}
			}
			if len(dnat) > 0 {
				t.Fatalf("round %d: host-port DNAT of deleted pods left in %s: %v", round, tool, dnat)
			}
		}
	}
}

// TestAddRacesBackendSwitchIsolation: ADDs on iptables racing an ADD that switches the node to
// nftables (and ADDs after the switch that switch back). The switch puts back the isolation
// elements of every recorded pod whose attachment it can lock, and skips those an ADD holds;
// every ADD must succeed and leave its pod isolated in the backend in use (CHECK), or its port
// would be left alone by the guard and the anti-spoofing chains: a pod that may spoof addresses
// and answer as a router. The backend the node left holds nothing of the network.
//
// It failed before the backend lock (round 0 or 1: the racing ADDs' ports missing from
// pod-ports): an ADD wrote its elements into the backend it opened with, and the switch's
// rebuild skipped the attachments ADDs held.
func TestAddRacesBackendSwitchIsolation(t *testing.T) {
	node := nettest.NewNode(t, binDir)
	ipt := node.ConfList(t, nettest.NetConf{PodCIDRs: testkit.DualStack(), NetfilterBackend: "iptables"})
	nft := node.ConfList(t, nettest.NetConf{PodCIDRs: testkit.DualStack(), NetfilterBackend: "nftables"})
	const pods = 4
	for round := range raceRounds(t) / 4 {
		first := node.NewPod(t, fmt.Sprintf("isw-%d-first", round))
		if err := node.Add(ipt, first); err != nil {
			t.Fatalf("round %d: ADD %s: %v", round, first.RT.ContainerID, err)
		}
		added := make([]*nettest.Pod, pods)
		for i := range added {
			added[i] = node.NewPod(t, fmt.Sprintf("isw-%d-%d", round, i))
		}
		switcher := node.NewPod(t, fmt.Sprintf("isw-%d-new", round))
		errs, switchErr := raceSwitch(node, added, func(p *nettest.Pod) error { return node.Add(ipt, p) }, nft, switcher)
		for i, err := range append(errs, switchErr) {
			if err != nil {
				t.Errorf("round %d: ADD %s: %v", round, append(added, switcher)[i].RT.ContainerID, err)
			}
		}
		for _, p := range append(added, switcher) {
			if err := node.Check(nft, p); err != nil {
				t.Errorf("round %d: CHECK %s after the switch: %v", round, p.RT.ContainerID, err)
			}
		}
		if left := otherBackendRules(t, node); len(left) > 0 {
			t.Errorf("round %d: the node's backend is %s, and the other one still holds rules of the network: %v", round, testkit.NodeBackend(node), left)
		}
		for _, p := range append(append(added, first), switcher) {
			if err := node.Del(nft, p); err != nil {
				t.Fatalf("round %d: DEL %s: %v", round, p.RT.ContainerID, err)
			}
		}
		if t.Failed() {
			return
		}
	}
}

// otherBackendRules lists what the backend the node's record does not name holds of the tests'
// network: its nftables tables, or its iptables, ip6tables and ebtables chains and rules (every
// name kubenet gives them has "kubenet" in it), read with the tools.
func otherBackendRules(t *testing.T, node *nettest.Node) []string {
	t.Helper()
	var out []string
	switch b := testkit.NodeBackend(node); b {
	case core.NetfilterIPTables:
		for _, line := range strings.Split(nettest.Run(t, node.NS, "nft", "list", "tables"), "\n") {
			if strings.Contains(line, "kubenet") {
				out = append(out, line)
			}
		}
	case core.NetfilterNFTables:
		for _, tool := range []string{"iptables-save", "ip6tables-save", "ebtables-save"} {
			for _, line := range strings.Split(nettest.Run(t, node.NS, tool), "\n") {
				if !strings.HasPrefix(line, "#") && strings.Contains(strings.ToLower(line), "kubenet") {
					out = append(out, tool+": "+line)
				}
			}
		}
	default:
		t.Fatalf("the node records no backend (%q)", b)
	}
	return out
}

// TestCheckRacesBackendSwitch: CHECKs of running pods (on iptables) run over and over while the
// ADD of another pod switches the node to nftables. A CHECK holds its attachment's lock, and the
// switch's rebuild of the new backend's isolation elements passes over an attachment whose lock
// is held: a CHECK writes nothing, so a pod it held would be left out of the new backend's
// isolation sets altogether, no longer guarded against spoofing. Once the switch is over every
// pod must be isolated in the backend in use (CHECK with its configuration passes).
func TestCheckRacesBackendSwitch(t *testing.T) {
	node := nettest.NewNode(t, binDir)
	ipt := node.ConfList(t, nettest.NetConf{PodCIDRs: testkit.DualStack(), NetfilterBackend: "iptables"})
	nft := node.ConfList(t, nettest.NetConf{PodCIDRs: testkit.DualStack(), NetfilterBackend: "nftables"})
	const pods = 4
	for round := range raceRounds(t) / 4 {
		running := make([]*nettest.Pod, pods)
		for i := range running {
			running[i] = node.NewPod(t, fmt.Sprintf("csw-%d-%d", round, i))
			if err := node.Add(ipt, running[i]); err != nil {
				t.Fatalf("round %d: ADD %s: %v", round, running[i].RT.ContainerID, err)
			}
		}
		switcher := node.NewPod(t, fmt.Sprintf("csw-%d-new", round))
		// The racing CHECKs may fail (the switch removed the rules they read); they run until
		// the switch is over, so that one of them holds its lock whenever the rebuild comes.
		done := make(chan struct{})
		var wg sync.WaitGroup
		for _, p := range running {
			wg.Go(func() {
				for {
					select {
					case <-done:
						return
					default:
					}
					_ = node.Check(ipt, p)
				}
			})
		}
		switchErr := node.Add(nft, switcher)
		close(done)
		wg.Wait()
		if switchErr != nil {
			t.Errorf("round %d: ADD %s: %v", round, switcher.RT.ContainerID, switchErr)
		}
		for _, p := range append(running, switcher) {
			if err := node.Check(nft, p); err != nil {
				t.Errorf("round %d: CHECK %s after the switch: %v", round, p.RT.ContainerID, err)
			}
		}
		for _, p := range append(running, switcher) {
			if err := node.Del(nft, p); err != nil {
				t.Fatalf("round %d: DEL %s: %v", round, p.RT.ContainerID, err)
			}
		}
		if t.Failed() {
			return
		}
	}
}

// TestGCRacesBackendSwitch: a GC (run as the plugin, not through libcni, whose GC would DEL
// every cached attachment first) that collects every pod but one runs while the ADD of another
// pod switches the node from iptables to nftables. The switch puts back the isolation elements
// of every recorded pod in the new backend; a pod GC collects after that must leave nothing
// there (its elements would name a veth and addresses that are no longer its), nor a host port.
// The pod GC keeps and the switching pod stay isolated (CHECK), and the backend left behind
// holds nothing of the network.
func TestGCRacesBackendSwitch(t *testing.T) {
	node := nettest.NewNode(t, binDir)
	ipt := node.ConfList(t, nettest.NetConf{PodCIDRs: testkit.DualStack(), NetfilterBackend: "iptables"})
	nft := node.ConfList(t, nettest.NetConf{PodCIDRs: testkit.DualStack(), NetfilterBackend: "nftables"})
	const pods = 6
	var gcSpan time.Duration // the longest GC so far
	for round := range raceRounds(t) / 2 {
		kept := node.NewPod(t, fmt.Sprintf("gsw-%d-kept", round))
		if err := node.Add(ipt, kept); err != nil {
			t.Fatalf("round %d: ADD %s: %v", round, kept.RT.ContainerID, err)
		}
		collected := make([]*nettest.Pod, pods)
		for i := range collected {
			collected[i] = node.NewPod(t, fmt.Sprintf("gsw-%d-%d", round, i))
			collected[i].RT.CapabilityArgs = hpArgs(true, hpMapping{host: 32200 + i, container: 80, proto: "tcp"})
			if err := node.Add(ipt, collected[i]); err != nil {
				t.Fatalf("round %d: ADD %s: %v", round, collected[i].RT.ContainerID, err)
			}
		}
		switcher := node.NewPod(t, fmt.Sprintf("gsw-%d-new", round))
		valid := []types.GCAttachment{{ContainerID: kept.RT.ContainerID, IfName: kept.RT.IfName},
			{ContainerID: switcher.RT.ContainerID, IfName: switcher.RT.IfName}}
		var gcErr, switchErr error
		var gcTook time.Duration
		var wg sync.WaitGroup
		wg.Go(func() {
			start := time.Now()
			gcErr = execGC(node, ipt, valid)
			gcTook = time.Since(start)
		})
		// The switch starts later in each round, so that it lands in every phase of the GC; the
		// delay waits for nothing.
		wg.Go(func() {
			time.Sleep(time.Duration(round%8) * gcSpan / 8)
			switchErr = node.Add(nft, switcher)
		})
		wg.Wait()
		gcSpan = max(gcSpan, gcTook)
		if gcErr != nil {
			t.Errorf("round %d: GC: %v", round, gcErr)
		}
		if switchErr != nil {
			t.Errorf("round %d: ADD %s: %v", round, switcher.RT.ContainerID, switchErr)
		}
		els := testkit.IsolationElements(t, node)
		for _, p := range collected {
			port := core.NamesFor("kubenet", testkit.AttachmentOf(p)).HostVeth
			if left := isolationOfPort(els, port, p.RT.ContainerID+"/"+p.RT.IfName); len(left) > 0 {
				t.Errorf("round %d: GC collected %s, and the %s backend still isolates it: %v", round, p.RT.ContainerID, testkit.NodeBackend(node), left)
			}
		}
		if left := testkit.HostPortElements(t, node); len(left) > 0 {
			t.Errorf("round %d: host ports of collected pods left in the maps: %v", round, left)
		}
		for _, p := range []*nettest.Pod{kept, switcher} {
			if err := node.Check(nft, p); err != nil {
				t.Errorf("round %d: CHECK %s after the switch: %v", round, p.RT.ContainerID, err)
			}
		}
		if left := otherBackendRules(t, node); len(left) > 0 {
			t.Errorf("round %d: the node's backend is %s, and the other one still holds rules of the network: %v", round, testkit.NodeBackend(node), left)
		}
		for _, p := range []*nettest.Pod{kept, switcher} {
			if err := node.Del(nft, p); err != nil {
				t.Fatalf("round %d: DEL %s: %v", round, p.RT.ContainerID, err)
			}
		}
		if t.Failed() {
			return
		}
	}
}

// execGC runs the plugin's GC with list's configuration and the valid attachments, as a runtime
// does after it has deleted what it knows of itself: the plugin collects what is left.
func execGC(node *nettest.Node, list *libcni.NetworkConfigList, valid []types.GCAttachment) error {
	var conf map[string]any
	if err := json.Unmarshal(list.Plugins[0].Bytes, &conf); err != nil {
		return err
	}
	conf["cniVersion"], conf["name"], conf["cni.dev/valid-attachments"] = list.CNIVersion, list.Name, valid
	stdin, err := json.Marshal(conf)
	if err != nil {
		return err
	}
	run, err := node.ExecPlugin(binDir, map[string]string{"CNI_COMMAND": "GC", "CNI_PATH": binDir}, stdin)
	if err != nil {
		return err
	}
	if run.ExitCode != 0 {
		return fmt.Errorf("GC exit %d: %s", run.ExitCode, run.Stdout)
	}
	return nil
}

// TestSwitchesRaceBothWays: the node is switched both ways at once, round after round: ADDs of
// host-port pods through the iptables configuration, ADDs through the nftables one, the agent's
// periodic heal (in process, with the nftables configuration, as an agent that has read the new
// one) over and over, and CHECKs of the pods already up, all together. Every ADD and heal must
// succeed; once they are done the node's record names one backend, every pod is isolated there
// with its host port (CHECK with that backend's configuration), and the other backend holds
// nothing of the network.
func TestSwitchesRaceBothWays(t *testing.T) {
	node := nettest.NewNode(t, binDir)
	lists := map[core.NetfilterBackend]*libcni.NetworkConfigList{
		core.NetfilterIPTables: node.ConfList(t, nettest.NetConf{PodCIDRs: testkit.DualStack(), NetfilterBackend: "iptables"}),
		core.NetfilterNFTables: node.ConfList(t, nettest.NetConf{PodCIDRs: testkit.DualStack(), NetfilterBackend: "nftables"}),
	}
	healCfg := testkit.PluginConfig(t, lists[core.NetfilterNFTables])
	const perSide = 3
	var up []*nettest.Pod
	for round := range raceRounds(t) / 8 {
		var mu sync.Mutex
		var errs []error
		fail := func(err error) {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
		}
		var adds, others sync.WaitGroup
		var added []*nettest.Pod
		for side, list := range lists {
			for i := range perSide {
				p := node.NewPod(t, fmt.Sprintf("both-%d-%s-%d", round, side, i))
				p.RT.CapabilityArgs = hpArgs(true, hpMapping{host: 33000 + len(up) + len(added), container: 80, proto: "tcp"})
				added = append(added, p)
				adds.Go(func() {
					if err := node.Add(list, p); err != nil {
						fail(fmt.Errorf("ADD %s through %s: %w", p.RT.ContainerID, side, err))
					}
				})
			}
		}
		// The heal and the CHECKs go on until every ADD is over.
		done := make(chan struct{})
		others.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				err := node.NS.Do(func(ns.NetNS) error {
					_, err := core.HealNode(context.Background(), healCfg, true)
					return err
				})
				if err != nil {
					fail(fmt.Errorf("heal: %w", err))
				}
			}
		})
		for _, p := range up {
			others.Go(func() {
				for {
					select {
					case <-done:
						return
					default:
					}
					_ = node.Check(lists[core.NetfilterIPTables], p) // may fail while the node moves
				}
			})
		}
		adds.Wait()
		close(done)
		others.Wait()
		for _, err := range errs {
			t.Errorf("round %d: %v", round, err)
		}
		up = append(up, added...)
		b := testkit.NodeBackend(node)
		for _, p := range up {
			if err := node.Check(lists[b], p); err != nil {
				t.Errorf("round %d: CHECK %s on %s: %v", round, p.RT.ContainerID, b, err)
			}
		}
		if left := otherBackendRules(t, node); len(left) > 0 {
			t.Errorf("round %d: the node's backend is %s, and the other one still holds rules of the network: %v", round, b, left)
		}
		if t.Failed() {
			return
		}
	}
}
