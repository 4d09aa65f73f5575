package cni

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/vishvananda/netlink"

	"github.com/kubenet-dev/kubenet/core"
	"github.com/kubenet-dev/kubenet/hostport"
	"github.com/kubenet-dev/kubenet/isolation"
	"github.com/kubenet-dev/kubenet/test/nettest"
	"github.com/kubenet-dev/kubenet/test/testkit"
)

// The verb fuzzer: a randomized, stateful test that drives the built plugin (with its crash
// points) through sequences of ADD, DEL, CHECK, GC and STATUS with valid and hostile input,
// kills it with SIGKILL at crash points and at random moments, damages its state files, and
// checks the node against a model after every step.
//
//	KUBENET_FUZZ_SEED=<n>     replay one sequence (default: a new one per run; `make test` prints
//	                          it before the tests start, the test logs it: on failure, or with -v)
//	KUBENET_FUZZ_STEPS=<n>    steps per seed and backend (default 75: 150 per seed, about 15%
//	                          longer than 120 steps on one backend)
//	KUBENET_FUZZ_SEEDS=<n>    seeds to run one after the other (default 1)
//	KUBENET_FUZZ_BACKEND=<b>  the netfilter backend: nftables or iptables (default: each seed on
//	                          both, one subtest per backend, nftables first)
//
// The long run (README, Testing; both backends, about 80 minutes): KUBENET_FUZZ_STEPS=2000
// KUBENET_FUZZ_SEEDS=10 go test -count=1 -timeout 3h -run '^TestVerbFuzz$' -v ./test/cni/. A seed replays the sequence of
// operations and inputs exactly, on either backend; where a random SIGKILL lands depends on
// timing, so a replay kills at the same delay, not necessarily at the same instruction.

func TestVerbFuzz(t *testing.T) {
	bin, err := nettest.BuildPlugin(t.TempDir(), "kubenet_crashtest")
	if err != nil {
		t.Fatal(err)
	}
	steps := envInt(t, "KUBENET_FUZZ_STEPS", 75)
	seeds := envInt(t, "KUBENET_FUZZ_SEEDS", 1)
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("KUBENET_FUZZ_SEED"); s != "" {
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("KUBENET_FUZZ_SEED=%q: %v", s, err)
		}
	}
	backends := []core.NetfilterBackend{core.NetfilterNFTables, core.NetfilterIPTables}
	if b := core.NetfilterBackend(os.Getenv("KUBENET_FUZZ_BACKEND")); b != "" {
		if !slices.Contains(backends, b) {
			t.Fatalf("KUBENET_FUZZ_BACKEND=%q: want %q or %q", b, core.NetfilterNFTables, core.NetfilterIPTables)
		}
		backends = []core.NetfilterBackend{b}
	}
	total := 0
	for i := range seeds {
		s := seed + uint64(i)
		ok := t.Run(fmt.Sprintf("seed=%d", s), func(t *testing.T) {
			for _, b := range backends {
				replay := fmt.Sprintf("KUBENET_FUZZ_SEED=%d KUBENET_FUZZ_STEPS=%d KUBENET_FUZZ_BACKEND=%s go test -count=1 -run '^TestVerbFuzz$' -v ./test/cni/", s, steps, b)
				ok := t.Run("backend="+string(b), func(t *testing.T) {
					t.Logf("seed %d, %d steps on %s (replay: %s)", s, steps, b, replay)
					f := newFuzzer(t, bin, s, b)
					done := 0
					for f.step = 1; f.step <= steps && !t.Failed(); f.step++ {
						f.doStep()
						done++
					}
					total += done
					f.drain()
					t.Logf("seed %d on %s: %d steps, %d plugin runs (%d killed), %d hostPort and %d isolation elements checked; %s",
						s, b, done, f.runs, f.killed, f.seenHostPorts, f.seenIsolation, f.counts())
				})
				if !ok {
					t.Logf("replay the failure with %s", replay)
				}
			}
		})
		if !ok {
			break
		}
	}
	t.Logf("%d steps over %d seed(s) starting at %d on %v", total, seeds, seed, backends)
}

func envInt(t *testing.T, name string, def int) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive number", name, s)
	}
	return n
}

// attState is what the model knows of an attachment.
type attState int

const (
	attGone    attState = iota // DEL or GC succeeded, or ADD failed cleanly: nothing may remain
	attLive                    // ADD succeeded: CHECK must pass (unless damaged)
	attUnknown                 // an operation on it was killed: anything may remain until a DEL succeeds
)

// fuzzAtt is one attachment of the model.
type fuzzAtt struct {
	id      string
	slot    int // index of the pod netns it lives in
	state   attState
	result  []byte // ADD's stdout (live only)
	ips     []netip.Addr
	mac     net.HardwareAddr // its pod interface's, from ADD's result; kept once it is gone
	ports   []fuzzPort
	damaged bool // its state files were corrupted: CHECK may fail, DEL must still succeed
	// recordDamaged: its record was corrupted; delBlind: its last successful DEL ran without a
	// readable record (damaged, or never written by a killed ADD). Such a DEL cannot tell a
	// reservation torn inside the interface name ("id\r\net") from one of another interface of
	// the container, so that one stays for GC.
	recordDamaged, delBlind bool
}

type fuzzPort struct {
	HostPort      int    `json:"hostPort"`
	ContainerPort int    `json:"containerPort"`
	Protocol      string `json:"protocol"`
}

type fuzzer struct {
	t       *testing.T
	backend core.NetfilterBackend // the netfilterBackend of every configuration it sends
	rng     *rand.Rand
	bin     string
	node    *nettest.Node
	slots   []*nettest.Pod // pod netns; at most one attachment each
	atts    map[string]*fuzzAtt
	nextID  int
	step    int
	runs    int
	killed  int
	ops     map[string]int
	trace   []string // one line per plugin run, for the failure message
	// seen counts the hostPort and isolation elements the invariants checked, summed over the
	// steps: a reader that found nothing would let them pass vacuously.
	seenHostPorts, seenIsolation int
	canary                       string // a file outside the data dir that planted symlinks point to
}

// The node: a small IPv4 range so that address exhaustion happens, and an IPv6 one.
var (
	fuzzCIDR4 = netip.MustParsePrefix("10.244.9.0/29") // .2-.6 for pods
	fuzzCIDR6 = netip.MustParsePrefix("fd00:10:244:9::/64")
)

const fuzzSlots = 6

func newFuzzer(t *testing.T, bin string, seed uint64, backend core.NetfilterBackend) *fuzzer {
	f := &fuzzer{t: t, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), bin: bin,
		atts: map[string]*fuzzAtt{}, ops: map[string]int{}, backend: backend}
	f.node = nettest.NewNode(t, f.bin)
	// The readers of the kernel's rules go by it while the backend record is missing or damaged.
	f.node.NetfilterBackend = string(backend)
	f.canary = filepath.Join(t.TempDir(), "canary")
	if err := os.WriteFile(f.canary, []byte("canary"), 0o600); err != nil {
		t.Fatal(err)
	}
	for range fuzzSlots {
		f.slots = append(f.slots, f.node.NewPod(t, "slot"))
	}
	return f
}

func (f *fuzzer) counts() string {
	var keys []string
	for k := range f.ops {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%d", k, f.ops[k]))
	}
	return strings.Join(parts, " ")
}

// failf stops the sequence with the step and the seed's context.
func (f *fuzzer) failf(format string, args ...any) {
	f.t.Helper()
	start := max(0, len(f.trace)-40)
	f.t.Fatalf("step %d: %s\nlast plugin runs:\n%s\nstate:\n%s", f.step, fmt.Sprintf(format, args...), strings.Join(f.trace[start:], "\n"), f.dump())
}

// dump describes the model and the data dir, for failure messages.
func (f *fuzzer) dump() string {
	var b strings.Builder
	for _, id := range f.ids() {
		if a := f.atts[id]; a.state != attGone {
			fmt.Fprintf(&b, "  %s slot %d state %d damaged %v ips %v pod eth0 %v\n", a.id, a.slot, a.state, a.damaged, a.ips, f.podAddrs(f.slots[a.slot]))
		}
	}
	for addr, owner := range f.reservations() {
		fmt.Fprintf(&b, "  reservation %s: %q\n", addr, owner)
	}
	for _, rel := range testkit.DataDirFiles(f.t, f.node) {
		if strings.Contains(rel, core.RecordDirName) {
			data, _ := os.ReadFile(filepath.Join(f.node.DataDir(), rel))
			fmt.Fprintf(&b, "  %s: %.200s\n", rel, data)
		}
	}
	return b.String()
}

func (f *fuzzer) pick(weights map[string]int) string {
	var names []string
	sum := 0
	for k, w := range weights {
		names = append(names, k)
		sum += w
	}
	slices.Sort(names) // map order is random; the seed must decide alone
	n := f.rng.IntN(sum)
	for _, k := range names {
		if n < weights[k] {
			return k
		}
		n -= weights[k]
	}
	panic("unreachable")
}

func (f *fuzzer) doStep() {
	op := f.pick(map[string]int{
		"add": 30, "add-invalid": 8, "add-killed": 10, "del": 20, "del-hint": 6, "del-killed": 5,
		"del-unknown-id": 3, "check": 8, "check-hostile": 3, "gc": 4, "gc-hostile": 3, "gc-killed": 2,
		"status": 4, "corrupt": 6, "add-del-race": 4, "gc-hint": 2,
	})
	f.ops[op]++
	switch op {
	case "add":
		f.add(0, "")
	case "add-killed":
		if f.rng.IntN(2) == 0 {
			points := core.CrashPoints()
			f.add(0, points[f.rng.IntN(len(points))])
		} else {
			f.add(time.Duration(1+f.rng.IntN(60))*time.Millisecond, "")
		}
	case "add-invalid":
		f.addInvalid()
	case "del", "del-hint", "del-killed":
		a := f.anyAttachment()
		if a == nil {
			return
		}
		var kill time.Duration
		crashAt := ""
		if op == "del-killed" {
			if f.rng.IntN(2) == 0 {
				points := core.DelCrashPoints()
				crashAt = points[f.rng.IntN(len(points))]
			} else {
				kill = time.Duration(1+f.rng.IntN(40)) * time.Millisecond
			}
		}
		f.del(a, op == "del-hint", kill, crashAt)
	case "del-unknown-id":
		f.delNeverAdded()
	case "check":
		f.checkAll()
	case "check-hostile":
		f.checkHostile()
	case "gc":
		f.gc(nil, 0)
	case "gc-hostile":
		f.gcHostile()
	case "gc-killed":
		f.gc(nil, time.Duration(1+f.rng.IntN(40))*time.Millisecond)
	case "status":
		f.status()
	case "corrupt":
		f.corrupt()
	case "add-del-race":
		f.addDelRace()
	case "gc-hint":
		h := delHints()
		f.gcWith(f.validList(), map[string]any{"runtimeConfig": h[f.rng.IntN(len(h))]}, 0)
	}
	if !f.t.Failed() {
		f.checkInvariants()
	}
}

// run executes the plugin in the node with env and stdin. With kill > 0 it sends SIGKILL after
// that long (if the run has not ended); killed reports whether the run ended by a signal.
func (f *fuzzer) run(env map[string]string, stdin []byte, kill time.Duration) (run nettest.PluginRun, killed bool) {
	f.t.Helper()
	f.runs++
	cmd := exec.Command(filepath.Join(f.bin, "kubenet"))
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "CNI_PATH=" + f.bin}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Stdin = bytes.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	exited, err := nettest.StartOnOwnThread(f.node.NS, cmd)
	if err != nil {
		f.failf("start plugin: %v", err)
	}
	var timer *time.Timer
	if kill > 0 {
		timer = time.AfterFunc(kill, func() { _ = cmd.Process.Signal(syscall.SIGKILL) })
	}
	select {
	case err = <-exited:
	case <-time.After(2 * time.Minute):
		_ = cmd.Process.Kill()
		f.failf("plugin %s hung for 2 minutes", env["CNI_COMMAND"])
	}
	if timer != nil {
		timer.Stop()
	}
	run.Stdout, run.Stderr = stdout.String(), stderr.String()
	defer func() {
		outcome := fmt.Sprintf("exit %d", run.ExitCode)
		if killed {
			outcome = "killed"
		} else if run.Err != nil {
			outcome += fmt.Sprintf(" code %d %.160s", run.Err.Code, run.Err.Msg)
		}
		f.trace = append(f.trace, fmt.Sprintf("  step %d: %s %s crash=%q kill=%v -> %s", f.step, env["CNI_COMMAND"], env["CNI_CONTAINERID"], env["KUBENET_CRASH_AT"], kill, outcome))
	}()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			f.killed++
			return run, true
		}
		run.ExitCode = ee.ExitCode()
		var e struct {
			Code uint   `json:"code"`
			Msg  string `json:"msg"`
		}
		if json.Unmarshal(stdout.Bytes(), &e) == nil {
			run.Err = &types.Error{Code: e.Code, Msg: e.Msg}
		}
	} else if err != nil {
		f.failf("plugin: %v", err)
	}
	// No input may make a verb panic: Go prints the panic on stderr and exits 2.
	if strings.Contains(run.Stderr, "panic:") || strings.Contains(run.Stderr, "goroutine ") {
		f.failf("plugin %s panicked:\n%s", env["CNI_COMMAND"], run.Stderr)
	}
	if run.ExitCode != 0 && run.Err == nil {
		f.failf("plugin %s exited %d without a CNI error on stdout: %q %q", env["CNI_COMMAND"], run.ExitCode, run.Stdout, run.Stderr)
	}
	return run, false
}

func (f *fuzzer) conf(extra map[string]any) []byte {
	c := map[string]any{
		"cniVersion": "1.1.0", "name": "kubenet", "type": "kubenet",
		"podCIDRs": []string{fuzzCIDR4.String(), fuzzCIDR6.String()}, "nonMasqueradeCIDRs": []string{"10.0.0.0/8"},
		"dataDir": f.node.DataDir(), "netfilterBackend": f.backend,
	}
	for k, v := range extra {
		c[k] = v
	}
	b, err := json.Marshal(c)
	if err != nil {
		f.failf("%v", err)
	}
	return b
}

func (f *fuzzer) env(command string, a *fuzzAtt) map[string]string {
	return map[string]string{
		"CNI_COMMAND": command, "CNI_CONTAINERID": a.id, "CNI_IFNAME": "eth0",
		"CNI_NETNS": f.slots[a.slot].NS.Path(),
		"CNI_ARGS":  "IgnoreUnknown=1;K8S_POD_NAMESPACE=fuzz;K8S_POD_NAME=" + a.id,
	}
}

// freeSlot returns a pod netns that holds no attachment the model knows of, or -1.
func (f *fuzzer) freeSlot() int {
	used := map[int]bool{}
	for _, a := range f.atts {
		if a.state != attGone {
			used[a.slot] = true
		}
	}
	var free []int
	for i := range f.slots {
		if !used[i] {
			free = append(free, i)
		}
	}
	if len(free) == 0 {
		return -1
	}
	return free[f.rng.IntN(len(free))]
}

func (f *fuzzer) newAttachment() *fuzzAtt {
	slot := f.freeSlot()
	if slot < 0 {
		return nil
	}
	f.nextID++
	a := &fuzzAtt{id: fmt.Sprintf("fz%04d", f.nextID), slot: slot, state: attGone}
	f.atts[a.id] = a
	return a
}

func (f *fuzzer) randomPorts() []fuzzPort {
	var out []fuzzPort
	for range f.rng.IntN(3) {
		p := fuzzPort{HostPort: 30001 + f.rng.IntN(3), ContainerPort: 80 + f.rng.IntN(2), Protocol: []string{"tcp", "udp"}[f.rng.IntN(2)]}
		if !slices.ContainsFunc(out, func(o fuzzPort) bool { return o.HostPort == p.HostPort && o.Protocol == p.Protocol }) {
			out = append(out, p)
		}
	}
	return out
}

// portHolders returns the attachments (other than a) that may hold one of ports.
func (f *fuzzer) portHolders(a *fuzzAtt, ports []fuzzPort) (certain, maybe bool) {
	for _, o := range f.atts {
		if o == a || o.state == attGone {
			continue
		}
		for _, p := range ports {
			if slices.ContainsFunc(o.ports, func(q fuzzPort) bool { return q.HostPort == p.HostPort && q.Protocol == p.Protocol }) {
				if o.state == attLive {
					certain = true
				} else {
					maybe = true
				}
			}
		}
	}
	return certain, maybe
}

func (f *fuzzer) add(kill time.Duration, crashAt string) {
	a := f.newAttachment()
	if a == nil {
		return
	}
	a.ports = f.randomPorts()
	rc := map[string]any{}
	if len(a.ports) > 0 {
		rc["portMappings"] = a.ports
	}
	if f.rng.IntN(3) == 0 {
		rc["bandwidth"] = map[string]any{"ingressRate": 1_000_000 * (1 + f.rng.IntN(10)), "egressRate": 1_000_000 * (1 + f.rng.IntN(10))}
	}
	env := f.env("ADD", a)
	if crashAt != "" {
		env["KUBENET_CRASH_AT"] = crashAt
	}
	run, killed := f.run(env, f.conf(map[string]any{"runtimeConfig": rc}), kill)
	if killed {
		a.state = attUnknown
		return
	}
	if crashAt != "" && run.ExitCode == 0 {
		f.failf("ADD %s with KUBENET_CRASH_AT=%q was not killed: %s", a.id, crashAt, run.Stdout)
	}
	// (A crash point after a refusal, a port conflict say, is never reached.)
	if run.ExitCode == 0 {
		f.setLive(a, run.Stdout)
		if certain, _ := f.portHolders(a, a.ports); certain {
			f.failf("ADD %s got host ports %v that a live pod holds", a.id, a.ports)
		}
		return
	}
	// A failed ADD leaves nothing of the attachment; the reasons it may fail are these.
	a.state = attGone
	switch run.Err.Code {
	case core.ErrNoAddresses:
		// Damaged reservation files hold their address for nobody until GC.
		if taken := f.poolTaken(); taken < 5 {
			f.failf("ADD %s: no addresses while only %d reservation files exist: %s", a.id, taken, run.Err.Msg)
		}
	case core.ErrPortConflict:
		if certain, maybe := f.portHolders(a, a.ports); !certain && !maybe {
			f.failf("ADD %s: port conflict without a holder: %s", a.id, run.Err.Msg)
		}
	default:
		f.failf("ADD %s failed: code %d %s", a.id, run.Err.Code, run.Err.Msg)
	}
}

// hostileAdd is an ADD input a pod author or a broken runtime may send; ADD must refuse it with
// code (0: any error) and change nothing.
type hostileAdd struct {
	name string
	conf map[string]any
	env  map[string]string
	code uint
}

func hostileAdds() []hostileAdd {
	rc := func(v any) map[string]any { return map[string]any{"runtimeConfig": v} }
	return []hostileAdd{
		{"hostPort 0", rc(map[string]any{"portMappings": []any{map[string]any{"hostPort": 0, "containerPort": 80}}}), nil, 7},
		{"hostPort 70000", rc(map[string]any{"portMappings": []any{map[string]any{"hostPort": 70000, "containerPort": 80}}}), nil, 7},
		{"protocol icmp", rc(map[string]any{"portMappings": []any{map[string]any{"hostPort": 30009, "containerPort": 80, "protocol": "icmp"}}}), nil, 7},
		{"bad ingress annotation", rc(map[string]any{"io.kubernetes.cri.pod-annotations": map[string]string{"kubernetes.io/ingress-bandwidth": "lots"}}), nil, 7},
		{"negative bandwidth", rc(map[string]any{"bandwidth": map[string]any{"egressRate": -1}}), nil, 7},
		{"portMappings not a list", rc(map[string]any{"portMappings": "8080"}), nil, 7},
		{"container ID with slash", nil, map[string]string{"CNI_CONTAINERID": "../../x"}, 4},
		{"container ID with space", nil, map[string]string{"CNI_CONTAINERID": "a b"}, 4},
		{"ifname with slash", nil, map[string]string{"CNI_IFNAME": "a/b"}, 4},
		{"ifname too long", nil, map[string]string{"CNI_IFNAME": "abcdefghijklmnop"}, 4},
		{"netns not a netns", nil, map[string]string{"CNI_NETNS": "/proc/self/status"}, 4},
		{"netns of the plugin", nil, map[string]string{"CNI_NETNS": "/proc/self/ns/net"}, 0},
		{"CNI_ARGS garbage", nil, map[string]string{"CNI_ARGS": ";;=x"}, 4},
		{"podCIDR 127/8", map[string]any{"podCIDRs": []string{"127.0.0.0/8"}}, nil, 7},
		{"podCIDR link-local", map[string]any{"podCIDRs": []string{"169.254.0.0/16"}}, nil, 7},
		{"podCIDR of the uplink", map[string]any{"podCIDRs": []string{"198.18.0.0/24"}}, nil, 7},
		{"bridge lo", map[string]any{"bridge": "lo"}, nil, 7},
		{"bridge all", map[string]any{"bridge": "all"}, nil, 7},
		{"bridge eth0", map[string]any{"bridge": "eth0"}, nil, 7},
		{"network name with slash", map[string]any{"name": "a/b"}, nil, 7},
	}
}

func (f *fuzzer) addInvalid() {
	a := f.newAttachment()
	if a == nil {
		return
	}
	cases := hostileAdds()
	c := cases[f.rng.IntN(len(cases))]
	f.ops["add-invalid/"+c.name]++
	before := f.snapshot()
	env := f.env("ADD", a)
	for k, v := range c.env {
		env[k] = v
	}
	run, _ := f.run(env, f.conf(c.conf), 0)
	if run.ExitCode == 0 {
		f.failf("ADD with %s succeeded: %s", c.name, run.Stdout)
	}
	if c.code != 0 && run.Err.Code != c.code {
		f.failf("ADD with %s: code %d (%s), want %d", c.name, run.Err.Code, run.Err.Msg, c.code)
	}
	if after := f.snapshot(); after != before {
		f.failf("ADD with %s changed the node:\nbefore %s\nafter  %s", c.name, before, after)
	}
}

// snapshot is a summary of everything kubenet may have created on the node: data dir files,
// links and the rules of the node's netfilter backend.
func (f *fuzzer) snapshot() string {
	var links []string
	nettest.Do(f.t, f.node.NS, func() error {
		ls, err := netlink.LinkList()
		for _, l := range ls {
			links = append(links, l.Attrs().Name)
		}
		return err
	})
	slices.Sort(links)
	ruleset := testkit.NetfilterRuleset(f.t, f.node)
	return fmt.Sprintf("files %v links %v ruleset %d bytes %x", testkit.DataDirFiles(f.t, f.node), links, len(ruleset), ruleset)
}

// anyAttachment picks a live or unknown attachment, or nil.
func (f *fuzzer) anyAttachment() *fuzzAtt {
	var out []*fuzzAtt
	for _, id := range f.ids() {
		if a := f.atts[id]; a.state != attGone {
			out = append(out, a)
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out[f.rng.IntN(len(out))]
}

func (f *fuzzer) ids() []string {
	var ids []string
	for id := range f.atts {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// delHints are capability arguments a runtime passes on DEL, from the pod spec: at most hints.
func delHints() []map[string]any {
	return []map[string]any{
		{"portMappings": []any{map[string]any{"hostPort": 0, "containerPort": 80}}},
		{"portMappings": []any{map[string]any{"hostPort": 30001, "containerPort": 80, "protocol": "tcp"}}},
		{"portMappings": []any{map[string]any{"hostPort": 99999, "containerPort": -1, "protocol": "bogus"}}},
		{"io.kubernetes.cri.pod-annotations": map[string]string{"kubernetes.io/egress-bandwidth": "-5M"}},
		{"bandwidth": map[string]any{"ingressRate": 5}},
		{"portMappings": "garbage"},
		{"ipRanges": []any{[]any{map[string]any{"subnet": "banana"}}}},
	}
}

func (f *fuzzer) del(a *fuzzAtt, hint bool, kill time.Duration, crashAt string) {
	extra := map[string]any{}
	if hint {
		h := delHints()
		extra["runtimeConfig"] = h[f.rng.IntN(len(h))]
	}
	if a.result != nil && f.rng.IntN(2) == 0 {
		extra["prevResult"] = json.RawMessage(a.result)
	}
	env := f.env("DEL", a)
	if f.rng.IntN(4) == 0 {
		env["CNI_NETNS"] = "" // the runtime lost the netns
	}
	if crashAt != "" {
		env["KUBENET_CRASH_AT"] = crashAt
	}
	_, err := os.Lstat(f.recordPath(a))
	blind := a.recordDamaged || err != nil
	run, killed := f.run(env, f.conf(extra), kill)
	if killed {
		a.state = attUnknown
		return
	}
	if run.ExitCode != 0 {
		f.failf("DEL %s (state %d, damaged %v, runtimeConfig %v) failed: code %d %s", a.id, a.state, a.damaged, extra["runtimeConfig"], run.Err.Code, run.Err.Msg)
	}
	a.state, a.result, a.ips, a.delBlind = attGone, nil, nil, blind
}

// recordPath is the attachment record of a.
func (f *fuzzer) recordPath(a *fuzzAtt) string {
	return core.RecordPath(filepath.Join(f.node.DataDir(), "kubenet"), core.Attachment{ContainerID: a.id, IfName: "eth0"})
}

// tornInIfName tells whether a reservation holds a's owner cut short inside the interface name:
// "id\r\ne", "id\r\net", "id\r\neth".
func tornInIfName(a *fuzzAtt, content string) bool {
	full := a.id + "\r\neth0"
	return len(content) > len(a.id+"\r\n") && len(content) < len(full) && strings.HasPrefix(full, content)
}

func (f *fuzzer) delNeverAdded() {
	f.nextID++
	a := &fuzzAtt{id: fmt.Sprintf("fz%04d", f.nextID), slot: f.rng.IntN(fuzzSlots)}
	env := f.env("DEL", a)
	env["CNI_NETNS"] = ""
	if run, _ := f.run(env, f.conf(nil), 0); run.ExitCode != 0 {
		f.failf("DEL of never added %s: code %d %s", a.id, run.Err.Code, run.Err.Msg)
	}
}

func (f *fuzzer) checkAll() {
	for _, id := range f.ids() {
		a := f.atts[id]
		if a.state != attLive || a.damaged {
			continue
		}
		run, _ := f.run(f.env("CHECK", a), f.conf(map[string]any{"prevResult": json.RawMessage(a.result)}), 0)
		if run.ExitCode != 0 {
			f.failf("CHECK of live %s: code %d %s", a.id, run.Err.Code, run.Err.Msg)
		}
	}
}

// checkHostile sends CHECK a prevResult a broken runtime may cache: it must fail cleanly (no
// panic: run checks that) and change nothing.
func (f *fuzzer) checkHostile() {
	a := f.anyAttachment()
	if a == nil || a.state != attLive {
		return
	}
	prevs := []string{
		`{"cniVersion":"1.1.0","interfaces":[{"name":"eth0"}],"ips":[{"interface":-1,"address":"10.244.9.2/29"}]}`,
		`{"cniVersion":"1.1.0","interfaces":[],"ips":[{"interface":7,"address":"10.244.9.2/29"}]}`,
		`{"cniVersion":"1.1.0","ips":[{"address":"10.244.9.200/29"}]}`,
		`{"cniVersion":"1.1.0","ips":[{}]}`,
		`{"cniVersion":"0.3.1","ips":[{"version":"4","interface":-5,"address":"10.244.9.2/29"}]}`,
		`{"cniVersion":"1.1.0","interfaces":null,"ips":null}`,
	}
	prev := prevs[f.rng.IntN(len(prevs))]
	before := f.snapshot()
	run, _ := f.run(f.env("CHECK", a), f.conf(map[string]any{"prevResult": json.RawMessage(prev)}), 0)
	if run.ExitCode == 0 {
		f.failf("CHECK %s with prevResult %s passed", a.id, prev)
	}
	if after := f.snapshot(); after != before {
		f.failf("CHECK with prevResult %s changed the node", prev)
	}
}

func (f *fuzzer) validList() []map[string]string {
	var out []map[string]string
	for _, id := range f.ids() {
		if a := f.atts[id]; a.state == attLive {
			out = append(out, map[string]string{"containerID": a.id, "ifname": "eth0"})
		}
	}
	return out
}

func (f *fuzzer) gc(valid []map[string]string, kill time.Duration) {
	if valid == nil {
		valid = f.validList()
	}
	f.gcWith(valid, nil, kill)
}

// gcWith runs GC keeping valid, with extra configuration members (hints GC must ignore).
func (f *fuzzer) gcWith(valid []map[string]string, extra map[string]any, kill time.Duration) {
	members := map[string]any{"cni.dev/valid-attachments": valid}
	for k, v := range extra {
		members[k] = v
	}
	run, killed := f.run(map[string]string{"CNI_COMMAND": "GC"}, f.conf(members), kill)
	for _, a := range f.atts {
		if a.state == attUnknown && !killed {
			if run.ExitCode != 0 {
				continue
			}
			a.state, a.result, a.ips = attGone, nil, nil
		}
	}
	if killed {
		return
	}
	if run.ExitCode != 0 {
		f.failf("GC failed: code %d %s", run.Err.Code, run.Err.Msg)
	}
}

// gcHostile sends a GC list with a malformed entry: GC must refuse it and remove nothing.
func (f *fuzzer) gcHostile() {
	valid := f.validList()
	bad := []map[string]string{
		{"containerID": "", "ifname": "eth0"},
		{"ifname": "eth0"},
		{"containerID": "../x", "ifname": "eth0"},
	}
	// An entry that names a live pod without its interface would, read leniently, drop that pod.
	if len(valid) > 0 {
		bad = append(bad, map[string]string{"containerID": valid[0]["containerID"]})
	}
	b := bad[f.rng.IntN(len(bad))]
	valid = append(valid, b)
	before := f.snapshot()
	run, _ := f.run(map[string]string{"CNI_COMMAND": "GC"}, f.conf(map[string]any{"cni.dev/valid-attachments": valid}), 0)
	if run.ExitCode == 0 {
		f.failf("GC accepted the malformed entry %v", b)
	}
	if after := f.snapshot(); after != before {
		f.failf("GC with the malformed entry %v changed the node:\nbefore %s\nafter  %s", b, before, after)
	}
}

func (f *fuzzer) status() {
	run, _ := f.run(map[string]string{"CNI_COMMAND": "STATUS"}, f.conf(nil), 0)
	if run.ExitCode != 0 && !(run.Err.Code == core.ErrPluginNotAvailable && f.poolTaken() >= 5) {
		f.failf("STATUS: code %d %s", run.Err.Code, run.Err.Msg)
	}
}

// corrupt damages one state file of an attachment the way a full disk, a crash of another tool
// or an attacker with write access would, or drops junk into the data dir.
func (f *fuzzer) corrupt() {
	netDir := filepath.Join(f.node.DataDir(), "kubenet")
	files := testkit.DataDirFiles(f.t, f.node)
	var targets []string
	for _, rel := range files {
		base := filepath.Base(rel)
		if base == "lock" || strings.HasPrefix(base, "last_reserved_ip.") || strings.HasPrefix(base, ".") {
			continue
		}
		// Only regular files: the test must not write through a symlink it planted itself.
		if st, err := os.Lstat(filepath.Join(f.node.DataDir(), rel)); err != nil || !st.Mode().IsRegular() {
			continue
		}
		targets = append(targets, filepath.Join(f.node.DataDir(), rel))
	}
	kind := f.rng.IntN(5)
	if kind == 3 || len(targets) == 0 {
		junk := []string{"junk", "10.244.9.7", "kubenet-attachments/zz.json", "kubenet-hostports/tcp-1/0.0.0.0", "kubenet-hostports/bogus"}
		p := filepath.Join(netDir, junk[f.rng.IntN(len(junk))])
		if _, err := os.Lstat(p); err == nil {
			return
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			f.failf("%v", err)
		}
		if err := os.WriteFile(p, []byte("{garbage"), 0o600); err != nil {
			f.failf("%v", err)
		}
		f.trace = append(f.trace, fmt.Sprintf("  step %d: planted junk %s", f.step, p))
		f.ops["corrupt/junk"]++
		return
	}
	p := targets[f.rng.IntN(len(targets))]
	data, err := os.ReadFile(p)
	if err != nil {
		f.failf("%v", err)
	}
	original := string(data)
	// Whose file is it? Reservations and index files hold the ID, records are named after it.
	for _, a := range f.atts {
		if a.state != attGone && (strings.Contains(p, a.id) || strings.Contains(original, a.id)) {
			a.damaged = true
			a.recordDamaged = a.recordDamaged || p == f.recordPath(a)
		}
	}
	if kind == 4 { // a symlink planted in its place, to a file outside the data dir
		if err := os.Remove(p); err != nil {
			f.failf("%v", err)
		}
		if err := os.Symlink(f.canary, p); err != nil {
			f.failf("%v", err)
		}
		f.ops["corrupt/symlink"]++
		f.trace = append(f.trace, fmt.Sprintf("  step %d: replaced %s by a symlink out", f.step, p))
		return
	}
	switch kind {
	case 0: // truncated: a write cut short
		data = data[:f.rng.IntN(len(data)+1)]
	case 1: // garbage
		data = []byte("\x00\xffnot json{")
	case 2: // empty
		data = nil
	}
	if err := os.WriteFile(p, data, 0o600); err != nil {
		f.failf("%v", err)
	}
	f.ops[fmt.Sprintf("corrupt/%d", kind)]++
	f.trace = append(f.trace, fmt.Sprintf("  step %d: damaged (kind %d) %s -> %q", f.step, kind, p, data))
}

// addDelRace starts an ADD and a DEL of one new attachment at once: afterwards the attachment
// is either fully set up (its record exists, the ADD succeeded; checkInvariants and CHECK hold
// it to that) or gone without a trace.
func (f *fuzzer) addDelRace() {
	a := f.newAttachment()
	if a == nil {
		return
	}
	a.ports = f.randomPorts()
	conf := f.conf(map[string]any{"runtimeConfig": map[string]any{"portMappings": a.ports}})
	var add, del nettest.PluginRun
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		add, _ = f.runQuiet(f.env("ADD", a), conf)
	}()
	del, _ = f.runQuiet(f.env("DEL", a), conf)
	wg.Wait()
	f.trace = append(f.trace, fmt.Sprintf("  step %d: ADD+DEL race %s -> ADD exit %d %.120s, DEL exit %d %.120s", f.step, a.id, add.ExitCode, add.Stdout, del.ExitCode, del.Stdout))
	if del.ExitCode != 0 {
		f.failf("DEL racing ADD of %s failed: %s", a.id, del.Stdout)
	}
	_, err := os.Stat(core.RecordPath(filepath.Join(f.node.DataDir(), "kubenet"), core.Attachment{ContainerID: a.id, IfName: "eth0"}))
	if err != nil {
		a.state = attGone // checkInvariants: nothing of it may be left
		return
	}
	if add.ExitCode != 0 {
		f.failf("ADD of %s failed (%s) but its record exists", a.id, add.Stdout)
	}
	f.setLive(a, add.Stdout)
}

// setLive records a's successful ADD from its result: addresses and the pod interface's MAC.
func (f *fuzzer) setLive(a *fuzzAtt, stdout string) {
	mac, ips, err := addResult(stdout)
	if err != nil {
		f.failf("ADD %s: %v", a.id, err)
	}
	a.state, a.result, a.mac, a.ips = attLive, []byte(stdout), mac, ips
}

// runQuiet runs the plugin from a goroutine: no test failure from there, only the outcome.
func (f *fuzzer) runQuiet(env map[string]string, stdin []byte) (nettest.PluginRun, error) {
	full := map[string]string{"CNI_PATH": f.bin}
	for k, v := range env {
		full[k] = v
	}
	return f.node.ExecPlugin(f.bin, full, stdin)
}

// drain DELs every attachment that may exist and checks that the node is clean: after the DELs
// nothing of any attachment is left (checkInvariants); then a GC with an empty list collects what
// no attachment can be told from (a damaged reservation file whose attachment had no record yet),
// and the data dir holds only the lock, the cursors and planted junk.
func (f *fuzzer) drain() {
	if f.t.Failed() {
		return
	}
	f.step = -1
	for _, id := range f.ids() {
		if a := f.atts[id]; a.state != attGone {
			f.del(a, false, 0, "")
		}
	}
	f.checkInvariants()
	f.gc([]map[string]string{}, 0)
	if left := stateFiles(f.t, f.node); len(left) > 0 {
		var kept []string
		for _, l := range left {
			if !f.isJunk(l) {
				kept = append(kept, l)
			}
		}
		if len(kept) > 0 {
			f.failf("after DEL of every attachment the data dir holds %v", kept)
		}
	}
	if els := testkit.HostPortElements(f.t, f.node); len(els) > 0 {
		f.failf("after DEL of every attachment hostPort elements remain: %v", els)
	}
	if els := testkit.IsolationElements(f.t, f.node); len(els) > 0 {
		f.failf("after DEL of every attachment isolation elements remain: %v", els)
	}
}

// isJunk tells the files corrupt() planted (they belong to no attachment) from kubenet's state.
func (f *fuzzer) isJunk(rel string) bool {
	for _, j := range []string{"kubenet/junk", "kubenet/10.244.9.7", "kubenet/kubenet-attachments/zz.json", "kubenet/kubenet-hostports/tcp-1/0.0.0.0", "kubenet/kubenet-hostports/bogus"} {
		if rel == j {
			return true
		}
	}
	return false
}

// checkInvariants compares the node with the model:
//   - no address is reserved by two attachments, and no two pods carry one address;
//   - nothing of a gone attachment remains (links, reservations, records, elements, index files);
//   - every hostPort element belongs to an attachment that may exist and points at an address
//     reserved by that attachment;
//   - every pod interface that exists carries only addresses reserved by its attachment (an
//     address whose old veth still exists must never be free);
//   - the bridge's isolation elements are those of attachments that may exist (checkIsolation).
func (f *fuzzer) checkInvariants() {
	f.t.Helper()
	if b, err := os.ReadFile(f.canary); err != nil || string(b) != "canary" {
		f.failf("the file outside the data dir that planted symlinks point to was touched: %q %v", b, err)
	}
	reserved := f.reservations()
	for _, id := range f.ids() {
		a := f.atts[id]
		names := core.NamesFor("kubenet", core.Attachment{ContainerID: a.id, IfName: "eth0"})
		if a.state == attGone {
			for _, l := range []string{names.HostVeth, names.IFB} {
				if testkit.LinkExists(f.t, f.node.NS, l) {
					f.failf("gone attachment %s still has link %s", a.id, l)
				}
			}
			for addr, owner := range reserved {
				if (strings.HasPrefix(owner, a.id+"\r\n") || owner == a.id) && !(a.delBlind && tornInIfName(a, owner)) {
					f.failf("gone attachment %s still holds address %s", a.id, addr)
				}
			}
			for _, rel := range testkit.DataDirFiles(f.t, f.node) {
				if strings.Contains(rel, a.id) {
					f.failf("gone attachment %s still has file %s", a.id, rel)
				}
				// A damaged index file names nobody for sure: DEL removes it when the kernel's
				// element or rule of its key names the attachment, and an ADD killed between the
				// file and the rule leaves none; then GC removes it (drain checks that).
				if strings.Contains(rel, hostport.IndexDirName) && !f.isJunk(rel) {
					if b, _ := os.ReadFile(filepath.Join(f.node.DataDir(), rel)); bytes.Contains(b, []byte(`"`+a.id+`"`)) && !(a.damaged && !json.Valid(b)) {
						f.failf("gone attachment %s still holds hostPort index file %s", a.id, rel)
					}
				}
			}
			continue
		}
		if a.state == attLive && !a.damaged {
			for _, ip := range a.ips {
				if owner := reserved[ip]; owner != a.id+"\r\neth0" {
					f.failf("live attachment %s: its address %s is reserved by %q", a.id, ip, owner)
				}
			}
		}
		// Whatever state: a pod interface that exists carries only addresses its attachment holds.
		for _, ip := range f.podAddrs(f.slots[a.slot]) {
			if owner := reserved[ip]; owner != a.id+"\r\neth0" && !a.damaged {
				f.failf("attachment %s (state %d): pod eth0 carries %s, which is reserved by %q", a.id, a.state, ip, owner)
			}
		}
	}
	// No two pod netns carry one address.
	seen := map[netip.Addr]int{}
	for i, s := range f.slots {
		for _, ip := range f.podAddrs(s) {
			if j, dup := seen[ip]; dup {
				f.failf("address %s is on the pods of slot %d and slot %d", ip, j, i)
			}
			seen[ip] = i
		}
	}
	hostPorts := testkit.HostPortElements(f.t, f.node)
	f.seenHostPorts += len(hostPorts)
	for _, el := range hostPorts {
		id, _, _ := strings.Cut(el.Comment, "/")
		a := f.atts[id]
		if a == nil || a.state == attGone {
			f.failf("hostPort element %s belongs to no attachment that may exist", el)
		}
		ip, err := netip.ParseAddr(strings.Fields(el.Value)[0])
		if err != nil {
			f.failf("hostPort element %s: value %q", el, el.Value)
		}
		if owner := reserved[ip]; owner != id+"\r\neth0" && !a.damaged {
			f.failf("hostPort element %s points at %s, reserved by %q, not by its owner", el, ip, owner)
		}
	}
	f.checkIsolation(reserved)
}

// checkIsolation holds the elements of the bridge's isolation sets (pod-ports, anti-spoof-*) to
// the model. An element is a permission to send from a port, a MAC and an address, so:
//   - every element is keyed by the bridge port of an attachment that may exist: nothing keyed by
//     the host veth of a gone attachment (DEL, GC, a failed ADD) remains, and with it nothing
//     of its MAC or addresses;
//   - its comment names that attachment;
//   - it carries only that attachment's MAC, the link-local address derived from it, and
//     addresses reserved for that attachment (unless its files were damaged);
//   - no element carries the MAC of a gone attachment, under whatever port;
//   - a live attachment whose files are intact has exactly its elements (anti-spoofing is on).
func (f *fuzzer) checkIsolation(reserved map[netip.Addr]string) {
	f.t.Helper()
	els := testkit.IsolationElements(f.t, f.node)
	f.seenIsolation += len(els)
	backend := testkit.NodeBackend(f.node)
	byPort := map[string]*fuzzAtt{}
	for _, a := range f.atts {
		byPort[fuzzHostVeth(a)] = a
	}
	for _, el := range els {
		port, rest, _ := strings.Cut(el.Key, " . ")
		a := byPort[port]
		switch {
		case a == nil:
			f.failf("isolation element %s is keyed by a port no attachment has", el)
		case a.state == attGone:
			f.failf("gone attachment %s still has isolation element %s", a.id, el)
		case mark(el) != testkit.IsolationMark(backend, port, a.id+"/eth0"):
			f.failf("isolation element %s of attachment %s's port names another owner", el, a.id)
		}
		switch el.Set {
		case isolation.SetMAC:
			if a.mac != nil && rest != a.mac.String() {
				f.failf("isolation element %s: attachment %s's MAC is %s", el, a.id, a.mac)
			}
		case isolation.SetFastIPv4, isolation.SetFastIPv6:
			// port . MAC . address: the MAC checked here, the address as below.
			mac, addr, _ := strings.Cut(rest, " . ")
			if a.mac != nil && mac != a.mac.String() {
				f.failf("isolation element %s: attachment %s's MAC is %s", el, a.id, a.mac)
			}
			rest = addr
			fallthrough
		case isolation.SetIPv4, isolation.SetIPv6:
			ip, err := netip.ParseAddr(rest)
			switch {
			case err != nil:
				f.failf("isolation element %s: address %q: %v", el, rest, err)
			case ip.IsLinkLocalUnicast():
				if a.mac != nil && ip != testkit.LinkLocal(a.mac) {
					f.failf("isolation element %s: attachment %s's link-local address is %s", el, a.id, testkit.LinkLocal(a.mac))
				}
			default:
				if owner := reserved[ip]; owner != a.id+"\r\neth0" && !a.damaged {
					f.failf("isolation element %s lets attachment %s send from %s, reserved by %q", el, a.id, ip, owner)
				}
			}
		}
	}
	for _, id := range f.ids() {
		a := f.atts[id]
		switch {
		case a.state == attGone && a.mac != nil:
			for _, el := range els {
				if el.Set == isolation.SetMAC && strings.HasSuffix(el.Key, " . "+a.mac.String()) {
					f.failf("isolation element %s carries the MAC of gone attachment %s", el, a.id)
				}
			}
		case a.state == attLive && !a.damaged:
			port := fuzzHostVeth(a)
			owner := a.id + "/eth0"
			got, want := isolationOfPort(els, port, owner), isolationWant(testkit.IsolationMark(backend, port, owner), port, a.mac, a.ips, true)
			if !slices.Equal(got, want) {
				f.failf("live attachment %s: isolation elements\n got %q\nwant %q", a.id, got, want)
			}
		}
	}
}

// mark is what ties el to its attachment (testkit.IsolationMark): its comment or its chain.
func mark(el testkit.IsolationElement) testkit.IsolationElement {
	return testkit.IsolationElement{Comment: el.Comment, Chain: el.Chain}
}

// fuzzHostVeth is the bridge port of a model attachment.
func fuzzHostVeth(a *fuzzAtt) string {
	return core.NamesFor("kubenet", core.Attachment{ContainerID: a.id, IfName: "eth0"}).HostVeth
}

// poolTaken counts the names in the data dir that take one of the five IPv4 pod addresses.
func (f *fuzzer) poolTaken() int {
	n := 0
	for a := range f.reservations() {
		if fuzzCIDR4.Contains(a) && a != fuzzCIDR4.Addr() && a != netip.MustParseAddr("10.244.9.1") && a != netip.MustParseAddr("10.244.9.7") {
			n++
		}
	}
	return n
}

// reservations reads the address reservation files: address -> content.
func (f *fuzzer) reservations() map[netip.Addr]string {
	out := map[netip.Addr]string{}
	dir := filepath.Join(f.node.DataDir(), "kubenet")
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		a, err := netip.ParseAddr(e.Name())
		if err != nil {
			continue
		}
		b, _ := os.ReadFile(filepath.Join(dir, e.Name()))
		out[a] = string(b)
	}
	return out
}

// podAddrs lists the global addresses of eth0 in a pod netns (none when it has no eth0).
func (f *fuzzer) podAddrs(p *nettest.Pod) []netip.Addr {
	var out []netip.Addr
	nettest.Do(f.t, p.NS, func() error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return nil
		}
		as, err := netlink.AddrList(l, netlink.FAMILY_ALL)
		for _, a := range as {
			ip, _ := netip.AddrFromSlice(a.IP)
			if !ip.IsLinkLocalUnicast() {
				out = append(out, ip.Unmap())
			}
		}
		return err
	})
	return out
}
