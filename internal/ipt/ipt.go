// Package ipt is the iptables backend's plumbing: reading a table of iptables, ip6tables or
// ebtables in one exec of its -save tool, comparing kubenet's chains with their plan rule by
// rule, and writing every change of one operation in one exec of the -restore tool with
// --noflush (one transaction: other tools' chains stay untouched). github.com/coreos/go-iptables
// finds the commands and tells whether iptables is usable at all; it has no save or restore, and
// one exec per rule would make a pod's ADD cost what its rules count.
//
// Rules are kept as the text the -save tool prints after "-A <chain> ", and compared token by
// token (quoting aside), so a plan must be written in the tool's canonical order: the kernel
// tests of each mechanism write their plans and read them back to prove that they are.
package ipt

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/coreos/go-iptables/iptables"

	"github.com/kubenet-dev/kubenet/internal/procs"
)

// Family is one of the three rule sets: IPv4 (iptables), IPv6 (ip6tables), bridge (ebtables).
type Family int

const (
	IPv4 Family = iota + 1
	IPv6
	Bridge
)

// FamilyOf is the rule set of one address family (true: IPv6).
func FamilyOf(is6 bool) Family {
	if is6 {
		return IPv6
	}
	return IPv4
}

// Families returns the IP families of the given address families (true: IPv6), deduplicated.
func Families(is6 ...bool) []Family {
	var out []Family
	for _, v6 := range is6 {
		if f := FamilyOf(v6); !slices.Contains(out, f) {
			out = append(out, f)
		}
	}
	return out
}

func (f Family) String() string {
	switch f {
	case IPv4:
		return "iptables"
	case IPv6:
		return "ip6tables"
	case Bridge:
		return "ebtables"
	}
	return fmt.Sprintf("family %d", int(f))
}

// command is the family's tool; its save and restore tools carry the suffixes.
func (f Family) command() string { return f.String() }

// Timeout bounds one exec of a tool: a hung iptables lock must not hang a CNI verb forever.
const Timeout = 30 * time.Second

// ChainSuffix is what kubenet appends to the names of a network's chains: a hash of the network
// name, because chain names are short (iptables allows 28 characters, ebtables 31) and network
// names are not. The comments of iptables rules carry the network's name for a reader.
func ChainSuffix(network string) string {
	sum := sha256.Sum256([]byte("kubenet-chain\x00" + network))
	return hex.EncodeToString(sum[:4])
}

// Available tells whether the family's tool (and its save and restore tools) can be run, under
// root (see run). On the node itself, go-iptables finds iptables and ip6tables and asks their
// version; under another root the tools are looked for there and asked themselves.
func Available(f Family, root string) error {
	if root != "" && root != "/" {
		for _, suffix := range []string{"", "-save", "-restore"} {
			if _, err := toolPath(root, f.command()+suffix); err != nil {
				return fmt.Errorf("%s: %w", f, err)
			}
		}
		_, err := run(context.Background(), root, f, "", nil, "--version")
		return err
	}
	if f != Bridge {
		proto := iptables.ProtocolIPv4
		if f == IPv6 {
			proto = iptables.ProtocolIPv6
		}
		if _, err := iptables.New(iptables.IPFamily(proto), iptables.Timeout(int(Timeout.Seconds()))); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
	} else if _, err := exec.LookPath(f.command()); err != nil {
		return fmt.Errorf("%s: %w", f, err)
	}
	for _, tool := range []string{f.command() + "-save", f.command() + "-restore"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
	}
	return nil
}

// Table is one table of one family as its -save tool printed it.
type Table struct {
	Family Family
	Name   string
	// Chains maps each chain the table declares to its rules, in order, each the text after
	// "-A <chain> ".
	Chains map[string][]string
	// Policies maps each declared chain to its policy ("ACCEPT", "RETURN", "-" ...).
	Policies map[string]string
}

// Has tells whether the table declares chain.
func (t *Table) Has(chain string) bool {
	_, ok := t.Chains[chain]
	return ok
}

// toolDirs are where a node's root file system keeps the tools.
var toolDirs = [...]string{"/usr/sbin", "/sbin", "/usr/bin", "/bin", "/usr/local/sbin", "/usr/local/bin"}

// toolPath finds tool under root ("" or "/": the process's own PATH) and returns its path as
// seen inside root.
func toolPath(root, tool string) (string, error) {
	if root == "" || root == "/" {
		return exec.LookPath(tool)
	}
	for _, dir := range toolDirs {
		p := filepath.Join(dir, tool)
		// Lstat: a node's tools are symbolic links with absolute targets (/usr/sbin/iptables ->
		// /etc/alternatives/iptables), which mean the node's files only once the tool runs
		// chrooted; followed from here they would name this process's files.
		st, err := os.Lstat(filepath.Join(root, p))
		if err == nil && (st.Mode()&os.ModeSymlink != 0 || st.Mode().IsRegular() && st.Mode()&0o111 != 0) {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found in %s under %s", tool, strings.Join(toolDirs[:], ", "), root)
}

// run execs the family's tool with suffix ("-save", "-restore", "") and stdin, bounded by
// Timeout. With a root other than "/" the tool is the one of that file system, run chrooted into
// it: kubenet-agent runs the node's own tools (and their legacy or nft mode) from its container.
func run(ctx context.Context, root string, f Family, suffix string, stdin []byte, args ...string) ([]byte, error) {
	path, err := toolPath(root, f.command()+suffix)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, Timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, args...)
	// The tool dies with the plugin: a restore outliving a killed ADD could commit after the
	// DEL that cleans up, and leave its rules behind. (A restore commits in one transaction, so
	// one killed half-way writes nothing.)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if root != "" && root != "/" {
		cmd.Dir = "/"
		cmd.SysProcAttr.Chroot = root
	}
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if msg == "" {
			msg = err.Error()
		}
		return nil, fmt.Errorf("%s%s %s: %s", f.command(), suffix, strings.Join(args, " "), msg)
	}
	return stdout.Bytes(), nil
}

// Save reads one table of f with the tools under root. A table nobody created yet reads as
// empty.
func Save(ctx context.Context, root string, f Family, table string) (*Table, error) {
	out, err := run(ctx, root, f, "-save", nil, "-t", table)
	if err != nil {
		return nil, err
	}
	return Parse(f, table, out), nil
}

// Parse reads the output of a -save tool for one table (pure, so it is tested without a kernel).
func Parse(f Family, table string, out []byte) *Table {
	t := &Table{Family: f, Name: table, Chains: map[string][]string{}, Policies: map[string]string{}}
	in := ""
	for _, line := range strings.Split(string(out), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, "*"):
			in = strings.TrimPrefix(line, "*")
		case in != table:
		case strings.HasPrefix(line, ":"):
			fields := strings.Fields(line[1:])
			if len(fields) == 0 {
				continue
			}
			if _, ok := t.Chains[fields[0]]; !ok {
				t.Chains[fields[0]] = nil
			}
			if len(fields) > 1 {
				t.Policies[fields[0]] = fields[1]
			}
		case strings.HasPrefix(line, "-A "):
			chain, rule, _ := strings.Cut(line[3:], " ")
			t.Chains[chain] = append(t.Chains[chain], rule)
		}
	}
	return t
}

// Restore applies lines (restore syntax: ":CHAIN POLICY", "-A", "-D", "-I", "-F", "-X") to one
// table of f in one transaction, leaving everything else as it is. A chain declared with ":"
// is created, or emptied if it exists. iptables and ip6tables wait for the xtables lock of
// legacy kernels' tables (-w).
func restore(ctx context.Context, root string, f Family, table string, lines []string) error {
	if len(lines) == 0 {
		return nil
	}
	var b strings.Builder
	fmt.Fprintf(&b, "*%s\n", table)
	for _, l := range lines {
		b.WriteString(l)
		b.WriteByte('\n')
	}
	b.WriteString("COMMIT\n")
	args := []string{"--noflush"}
	if f != Bridge {
		args = append(args, "-w", fmt.Sprint(int(Timeout.Seconds())))
	}
	_, err := run(ctx, root, f, "-restore", []byte(b.String()), args...)
	return err
}

// Tokens splits a rule into its words, honouring double quotes the way the tools quote comments,
// so that two spellings of one rule compare equal.
func Tokens(rule string) []string {
	var out []string
	var cur strings.Builder
	quoted, have := false, false
	for _, r := range rule {
		switch {
		case r == '"':
			quoted, have = !quoted, true
		case r == ' ' && !quoted:
			if have {
				out = append(out, cur.String())
				cur.Reset()
				have = false
			}
		default:
			cur.WriteRune(r)
			have = true
		}
	}
	if have {
		out = append(out, cur.String())
	}
	return out
}

// Same tells whether two rules are the same rule.
func Same(a, b string) bool { return slices.Equal(Tokens(a), Tokens(b)) }

// Quote quotes a comment for a rule: kubenet's comments hold no quotes or backslashes.
func Quote(s string) string { return `"` + s + `"` }

// Chain is a planned chain: its name, the policy it is declared with ("-" for iptables, "RETURN"
// for an ebtables chain that hands back to its caller) and its rules in order.
type Chain struct {
	Name   string
	Policy string
	Rules  []string
}

// Jump is a planned rule in a chain kubenet does not own (a built-in chain such as POSTROUTING):
// it must be there exactly once; other rules of that chain are left alone.
type Jump struct {
	From string
	Rule string
}

// Difference is how a table differs from its plan in one object (a chain, a jump). Missing says
// that the object is absent altogether (what a flushed ruleset leaves), rather than changed.
type Difference struct {
	Family  Family
	Table   string
	Object  string
	Missing bool
	Detail  string
}

func (d *Difference) Error() string {
	return fmt.Sprintf("%s table %s %s: %s", d.Family, d.Table, d.Object, d.Detail)
}

// Compare returns the differences between the table and the plan: each planned chain must hold
// exactly its rules (and, for ebtables, its policy), each jump must be in its chain exactly once.
// Pure.
func Compare(t *Table, chains []Chain, jumps []Jump) []*Difference {
	var out []*Difference
	diff := func(object string, missing bool, format string, args ...any) {
		out = append(out, &Difference{Family: t.Family, Table: t.Name, Object: object, Missing: missing, Detail: fmt.Sprintf(format, args...)})
	}
	for _, c := range chains {
		have, ok := t.Chains[c.Name]
		object := "chain " + c.Name
		if d := countDifference(t.Family, t.Name, c, len(have), ok); d != nil {
			out = append(out, d)
			continue
		}
		switch {
		case t.Family == Bridge && c.Policy != "" && t.Policies[c.Name] != c.Policy:
			diff(object, false, "policy %s, want %s", t.Policies[c.Name], c.Policy)
		default:
			for i, r := range c.Rules {
				if !Same(have[i], r) {
					diff(object, false, "rule %d is %q, want %q: changed in place", i, have[i], r)
					break
				}
			}
		}
	}
	for _, j := range jumps {
		n := 0
		for _, r := range t.Chains[j.From] {
			if Same(r, j.Rule) {
				n++
			}
		}
		switch n {
		case 1:
		case 0:
			diff("jump from "+j.From, true, "missing: %s", j.Rule)
		default:
			diff("jump from "+j.From, false, "%d copies of %s, want one", n, j.Rule)
		}
	}
	return out
}

// CompareCounts is Compare of the chains alone, by their rule counts (State.RuleCounts): a chain
// missing, emptied, or holding another number of rules than planned. Pure.
func CompareCounts(f Family, table string, counts map[string]int, chains []Chain) []*Difference {
	var out []*Difference
	for _, c := range chains {
		n, ok := counts[c.Name]
		if d := countDifference(f, table, c, n, ok); d != nil {
			out = append(out, d)
		}
	}
	return out
}

// countDifference is how a chain that exists (or not) with n rules differs from c by its count,
// or nil.
func countDifference(f Family, table string, c Chain, n int, exists bool) *Difference {
	d := &Difference{Family: f, Table: table, Object: "chain " + c.Name}
	switch {
	case !exists:
		d.Missing, d.Detail = true, fmt.Sprintf("missing, want %d rules", len(c.Rules))
	case n == 0 && len(c.Rules) > 0:
		d.Missing, d.Detail = true, fmt.Sprintf("empty, want %d rules", len(c.Rules))
	case n != len(c.Rules):
		d.Detail = fmt.Sprintf("has %d rules, want %d", n, len(c.Rules))
	default:
		return nil
	}
	return d
}

// SyncLines returns the restore lines that make t hold chains and jumps as planned, writing only
// what differs: a chain that differs is declared again (which empties it) and refilled, a missing
// jump is inserted first in its chain, extra copies of a jump are deleted. It also returns what
// differed. Pure.
func SyncLines(t *Table, chains []Chain, jumps []Jump) ([]string, []*Difference) {
	diffs := Compare(t, chains, jumps)
	var lines []string
	for _, c := range chains {
		if !slices.ContainsFunc(diffs, func(d *Difference) bool { return d.Object == "chain "+c.Name }) {
			continue
		}
		lines = append(lines, declare(t.Family, c))
		for _, r := range c.Rules {
			lines = append(lines, "-A "+c.Name+" "+r)
		}
	}
	for _, j := range jumps {
		n := 0
		for _, r := range t.Chains[j.From] {
			if Same(r, j.Rule) {
				n++
			}
		}
		if n == 0 {
			lines = append(lines, insertFirst(j.From, j.Rule))
		}
		for ; n > 1; n-- {
			lines = append(lines, "-D "+j.From+" "+j.Rule)
		}
	}
	return lines, diffs
}

// declare is the restore line that creates (or empties) chain c.
func declare(f Family, c Chain) string {
	policy := c.Policy
	if policy == "" {
		policy = "-"
		if f == Bridge {
			policy = "ACCEPT"
		}
	}
	if f == Bridge {
		return ":" + c.Name + " " + policy
	}
	return ":" + c.Name + " " + policy + " [0:0]"
}

// Declare is the restore line that creates (or empties) chain c of family f.
func Declare(f Family, c Chain) string { return declare(f, c) }

// insertFirst is the restore line that puts rule first in chain.
func insertFirst(chain, rule string) string { return "-I " + chain + " 1 " + rule }

// RemoveLines returns the restore lines that remove every jump to one of chains from the
// table's other chains, then empty and delete chains (those the table has). Pure.
func RemoveLines(t *Table, chains []string) []string {
	var lines []string
	for from, rules := range t.Chains {
		if slices.Contains(chains, from) {
			continue
		}
		for _, r := range rules {
			if target := jumpTarget(r); target != "" && slices.Contains(chains, target) {
				lines = append(lines, "-D "+from+" "+r)
			}
		}
	}
	slices.Sort(lines) // deterministic order
	var present []string
	for _, c := range chains {
		if t.Has(c) {
			present = append(present, c)
		}
	}
	for _, c := range present {
		lines = append(lines, "-F "+c)
	}
	for _, c := range present {
		lines = append(lines, "-X "+c)
	}
	return lines
}

// jumpTarget returns the chain a rule jumps or goes to, or "".
func jumpTarget(rule string) string {
	tok := Tokens(rule)
	for i := 0; i+1 < len(tok); i++ {
		if tok[i] == "-j" || tok[i] == "-g" || tok[i] == "--jump" || tok[i] == "--goto" {
			return tok[i+1]
		}
	}
	return ""
}

// State reads each table of each family at most once per operation (one ADD, one STATUS), for
// mechanisms that each look at their own chains of a shared table. Safe for concurrent use. A
// mechanism that writes a table calls Forget, so a later reader of that table sees the write.
//
// Table reads a whole table (one -save); Chains lists only the named chains (one -L each, run
// at once): a -save costs what the table holds, and ebtables' nat table holds a chain per pod,
// so the verbs that must cost the same on a full node read the bridge's fixed chains by name.
type State struct {
	// Root is the file system whose tools are run, chrooted ("" or "/": the process's own).
	Root string
	// Sentinels makes Check count the rules of the plan's own chains (RuleCounts), not read and
	// compare them, nor the built-in chains their jumps hang from: what STATUS needs to tell a
	// node whose rules are gone (a reload takes kubenet's chains), at a cost that does not grow
	// with the node (a table's -save costs what it holds: every pod's host-port rules,
	// kube-proxy's). A jump deleted alone, or a rule changed in place, is a difference, which
	// CHECK reports and ADD and the agent repair.
	Sentinels bool
	// Serialize runs f while no other process writes node-wide rules of the network (chains
	// every pod shares, and the jumps to them): restores that declare a shared chain empty it,
	// and restores that insert a jump duplicate it, when they race. nil runs f as it is (one
	// process, as in a mechanism's own tests).
	Serialize func(f func() error) error

	mu     sync.Mutex
	tables map[stateKey]*readOnce
}

// Exclusively runs f under Serialize, after dropping what was read of table of f's family: what
// f decides from a read must rest on a read taken under the lock.
func (s *State) Exclusively(fam Family, table string, f func() error) error {
	run := func() error {
		s.Forget(fam, table)
		return f()
	}
	if s.Serialize == nil {
		return run()
	}
	return s.Serialize(run)
}

type stateKey struct {
	f     Family
	table string
	chain string // "" for the whole table
}

type readOnce struct {
	once sync.Once
	t    *Table
	err  error
}

func (s *State) once(k stateKey) *readOnce {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tables == nil {
		s.tables = map[stateKey]*readOnce{}
	}
	o, ok := s.tables[k]
	if !ok {
		o = &readOnce{}
		s.tables[k] = o
	}
	return o
}

// Table returns table of f, read once.
func (s *State) Table(ctx context.Context, f Family, table string) (*Table, error) {
	o := s.once(stateKey{f, table, ""})
	o.once.Do(func() { o.t, o.err = Save(ctx, s.Root, f, table) })
	return o.t, o.err
}

// Chains returns a Table that holds the named chains of table that exist (and no others), each
// listed once; when the whole table was read already, from that.
func (s *State) Chains(ctx context.Context, f Family, table string, names ...string) (*Table, error) {
	s.mu.Lock()
	_, ok := s.tables[stateKey{f, table, ""}]
	s.mu.Unlock()
	if ok {
		t, err := s.Table(ctx, f, table)
		if err != nil {
			return t, err
		}
		out := &Table{Family: f, Name: table, Chains: map[string][]string{}, Policies: map[string]string{}}
		for _, n := range names {
			if rules, ok := t.Chains[n]; ok {
				out.Chains[n], out.Policies[n] = rules, t.Policies[n]
			}
		}
		return out, nil
	}
	reads := make([]*readOnce, len(names))
	list := make([]func(), len(names))
	for i, n := range names {
		reads[i] = s.once(stateKey{f, table, n})
		list[i] = func() { reads[i].once.Do(func() { reads[i].t, reads[i].err = List(ctx, s.Root, f, table, n) }) }
	}
	if err := InCallerNS(list...); err != nil {
		for _, r := range reads {
			r.once.Do(func() { r.err = err }) // never entered: nothing read
		}
	}
	out := &Table{Family: f, Name: table, Chains: map[string][]string{}, Policies: map[string]string{}}
	for i, n := range names {
		if reads[i].err != nil {
			return nil, reads[i].err
		}
		if rules, ok := reads[i].t.Chains[n]; ok {
			out.Chains[n], out.Policies[n] = rules, reads[i].t.Policies[n]
		}
	}
	return out, nil
}

// InCallerNS runs every f at once, each on a goroutine that enters the caller's network
// namespace first, and returns when all have: a new goroutine runs on any thread, and an exec
// forks from its thread, so without that a tool would read the namespace the process started in,
// not the node's (the in-process plugin and tests call from a thread moved into the node). When
// the caller's namespace cannot be told, they run one after another on the caller's thread; the
// error is that of entering a namespace (the fs that could not enter have not run).
func InCallerNS(fs ...func()) error {
	here, err := ns.GetCurrentNS()
	if err != nil {
		for _, f := range fs {
			f()
		}
		return nil
	}
	defer here.Close()
	// Side by side, each parsing what its process prints: on the one processor STATUS starts
	// with they would take turns.
	procs.All()
	var wg sync.WaitGroup
	errs := make([]error, len(fs))
	for i, f := range fs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = here.Do(func(ns.NetNS) error { f(); return nil })
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Restore applies lines to one table of f (see restore) and forgets what was read of it.
func (s *State) Restore(ctx context.Context, f Family, table string, lines []string) error {
	if len(lines) == 0 {
		return nil
	}
	s.Forget(f, table)
	return restore(ctx, s.Root, f, table, lines)
}

// Available tells whether the tools of f can run under the State's root.
func (s *State) Available(f Family) error { return Available(f, s.Root) }

// Forget drops what was read of table of f, whole or by chain.
func (s *State) Forget(f Family, table string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k := range s.tables {
		if k.f == f && k.table == table {
			delete(s.tables, k)
		}
	}
}

// List reads one chain of table of f: ebtables -L, or iptables -S. A chain that does not exist
// reads as a Table without it (the tools fail then; a failure of the tool itself is told apart
// by running it once more on a built-in chain, which always exists).
func List(ctx context.Context, root string, f Family, table, chain string) (*Table, error) {
	args := []string{"-t", table, "-S", chain}
	if f == Bridge {
		args = []string{"-t", table, "-L", chain}
	} else {
		args = append([]string{"-w", fmt.Sprint(int(Timeout.Seconds()))}, args...)
	}
	out, err := run(ctx, root, f, "", nil, args...)
	t := &Table{Family: f, Name: table, Chains: map[string][]string{}, Policies: map[string]string{}}
	if err != nil {
		// Listing a built-in chain, which always exists, tells a missing chain from a tool that
		// fails: only a chain that is not the built-in one is listed so, once.
		builtin := map[string]string{"nat": "PREROUTING", "filter": "FORWARD", "mangle": "PREROUTING"}[table]
		if builtin == "" || builtin == chain {
			return nil, err
		}
		if _, berr := List(ctx, root, f, table, builtin); berr != nil {
			return nil, err
		}
		return t, nil // the tool works: the chain is missing
	}
	return parseList(f, t, chain, out), nil
}

// parseList reads the output of ebtables -L CHAIN or iptables -S CHAIN into t (pure).
func parseList(f Family, t *Table, chain string, out []byte) *Table {
	t.Chains[chain] = nil
	for _, line := range strings.Split(string(out), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case f == Bridge && strings.HasPrefix(line, "Bridge chain: "):
			if _, pol, ok := strings.Cut(line, "policy: "); ok {
				t.Policies[chain] = strings.TrimSpace(pol)
			}
		case f == Bridge && (line == "" || strings.HasPrefix(line, "Bridge table: ")):
		case f == Bridge:
			t.Chains[chain] = append(t.Chains[chain], line)
		case strings.HasPrefix(line, "-A "+chain+" "):
			t.Chains[chain] = append(t.Chains[chain], strings.TrimPrefix(line, "-A "+chain+" "))
		case strings.HasPrefix(line, "-P "+chain+" "):
			t.Policies[chain] = strings.TrimPrefix(line, "-P "+chain+" ")
		}
	}
	return t
}

// Plan is what one mechanism keeps in one table of one family: its chains and its jumps.
type Plan struct {
	Chains []Chain
	Jumps  []Jump
}

// Check reports how the table (read through st) differs from the plan, every difference
// joined, or nil.
func (p Plan) Check(ctx context.Context, st *State, f Family, table string) error {
	var diffs []*Difference
	if st.Sentinels {
		var err error
		if diffs, err = p.CountDifferences(ctx, st, f, table); err != nil {
			return err
		}
	} else {
		t, err := p.read(ctx, st, f, table)
		if err != nil {
			return err
		}
		diffs = Compare(t, p.Chains, p.Jumps)
	}
	var errs []error
	for _, d := range diffs {
		errs = append(errs, d)
	}
	return errors.Join(errs...)
}

// Ensure makes the table hold the plan, reading it through st and writing one restore only when
// it differs; it returns what differed (nil: nothing was written). It always reads what the
// jumps hang from, also through a State for STATUS (Sentinels): a read without them would take
// every jump for missing and insert it again.
func (p Plan) Ensure(ctx context.Context, st *State, f Family, table string) ([]*Difference, error) {
	t, err := p.read(ctx, st, f, table)
	if err != nil {
		return nil, err
	}
	if lines, _ := SyncLines(t, p.Chains, p.Jumps); len(lines) == 0 {
		return nil, nil // the healthy node's ADD: one read, no lock
	}
	var diffs []*Difference
	err = st.Exclusively(f, table, func() error {
		t, err := p.read(ctx, st, f, table)
		if err != nil {
			return err
		}
		var lines []string
		lines, diffs = SyncLines(t, p.Chains, p.Jumps)
		return st.Restore(ctx, f, table, lines)
	})
	return diffs, err
}

// CountDifferences counts the rules of the plan's own chains (State.RuleCounts) and returns how
// the counts differ from the plan (CompareCounts).
func (p Plan) CountDifferences(ctx context.Context, st *State, f Family, table string) ([]*Difference, error) {
	counts, err := st.RuleCounts(ctx, f, table, p.own()...)
	if err != nil {
		return nil, err
	}
	return CompareCounts(f, table, counts, p.Chains), nil
}

// read reads what the plan compares: for ebtables its chains and the chains its jumps hang
// from, by name (the bridge's tables hold a chain per pod), and for iptables and ip6tables the
// whole table, whose one -save costs less than a listing per chain.
func (p Plan) read(ctx context.Context, st *State, f Family, table string) (*Table, error) {
	if f != Bridge {
		return st.Table(ctx, f, table)
	}
	return st.Chains(ctx, f, table, p.Names()...)
}

// own names the plan's own chains.
func (p Plan) own() []string {
	var names []string
	for _, c := range p.Chains {
		names = append(names, c.Name)
	}
	return names
}

// Names are the chains the plan is compared in: its own and the chains its jumps hang from.
func (p Plan) Names() []string {
	names := p.own()
	for _, j := range p.Jumps {
		if !slices.Contains(names, j.From) {
			names = append(names, j.From)
		}
	}
	return names
}

// Missing returns the differences of diffs that are missing objects.
func Missing(diffs []*Difference) []*Difference {
	var out []*Difference
	for _, d := range diffs {
		if d.Missing {
			out = append(out, d)
		}
	}
	return out
}
