package isolation

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/kubenet-dev/kubenet/internal/ipt"
	"github.com/kubenet-dev/kubenet/internal/nft"
)

// The iptables backend guards the bridge with ebtables, in the nat table's PREROUTING (priority
// -300: before the bridge learns a frame's source MAC, forwards it, or hands it to br_netfilter):
//
//	PREROUTING -j KUBENET-PODS-<net>   one jump
//	KUBENET-PODS-<net>                 one rule per pod: -i <host veth> -j KNP-<net>-<port>
//	KUBENET-GUARD-<net>                the guard, fixed: no routers, DHCP servers, loopback, VLANs
//	KNP-<net>-<port>                   the pod's chain: the guard, then (anti-spoofing) its own MAC
//	                                   and addresses pass and everything else is dropped
//
// ebtables has no sets, so a pod's part is a chain of a few rules and one dispatch rule instead of
// set elements: still constant work per ADD and DEL (one ebtables-restore each). What ebtables
// cannot express: the target address of a neighbour advertisement and the link-layer address
// option of neighbour solicitations and advertisements (its ip6 match stops at the ICMPv6 type),
// so there a pod can claim another IPv6 address in neighbour discovery, from its own address and
// MAC. ARP, every source address and MAC, and the guard are checked as with nftables.

// ebtablesTable is the ebtables table of the isolation chains.
const ebtablesTable = "nat"

func ebtablesPods(network string) string  { return "KUBENET-PODS-" + ipt.ChainSuffix(network) }
func ebtablesGuard(network string) string { return "KUBENET-GUARD-" + ipt.ChainSuffix(network) }

// ebtablesPodPrefix starts the name of every pod chain of the network.
func ebtablesPodPrefix(network string) string { return "KNP-" + ipt.ChainSuffix(network) + "-" }

// ebtablesPod is the chain of the pod behind port.
func ebtablesPod(network, port string) string {
	sum := sha256.Sum256([]byte(port))
	return ebtablesPodPrefix(network) + hex.EncodeToString(sum[:5])
}

// dispatch is the rule of the pods chain that sends port's frames to the pod's chain.
func dispatch(network, port string) string { return "-i " + port + " -j " + ebtablesPod(network, port) }

// EbtablesNodePlan returns the network's fixed ebtables objects: the guard chain and the jump to
// the dispatch chain (which holds only the pods' rules, so it is not compared, only declared).
// Pure.
func EbtablesNodePlan(cfg Config) ipt.Plan {
	guard := ipt.Chain{Name: ebtablesGuard(cfg.Network), Policy: "RETURN", Rules: []string{
		"-p 802_1Q -j DROP",
		"-p S-TAG -j DROP",
		"-p IPv4 --ip-src 127.0.0.0/8 -j DROP",
		"-p IPv4 --ip-dst 127.0.0.0/8 -j DROP",
		"-p IPv4 --ip-proto icmp --ip-icmp-type redirect -j DROP",
		"-p IPv4 --ip-proto icmp --ip-icmp-type router-advertisement -j DROP",
		"-p IPv4 --ip-proto udp --ip-sport 67 --ip-dport 68 -j DROP",
		"-p IPv6 --ip6-src ::1 -j DROP",
		"-p IPv6 --ip6-dst ::1 -j DROP",
		"-p IPv6 --ip6-proto udp --ip6-sport 547 --ip6-dport 546 -j DROP",
		"-p IPv6 --ip6-proto ipv6-icmp --ip6-icmp-type router-solicitation -j DROP",
		"-p IPv6 --ip6-proto ipv6-icmp --ip6-icmp-type router-advertisement -j DROP",
		"-p IPv6 --ip6-proto ipv6-icmp --ip6-icmp-type redirect -j DROP",
		"-p IPv6 --ip6-proto ipv6-icmp --ip6-icmp-type 138/0:255 -j DROP",
	}}
	return ipt.Plan{
		Chains: []ipt.Chain{guard},
		Jumps:  []ipt.Jump{{From: "PREROUTING", Rule: "-j " + ebtablesPods(cfg.Network)}},
	}
}

// ebtablesPodChain is the chain of port p: the guard, then with anti-spoofing its MAC and its
// addresses pass (its IPv6 link-local address too; :: only for duplicate address detection and
// MLD reports, 0.0.0.0 only in ARP probes) and everything else is dropped. Pure.
func ebtablesPodChain(cfg Config, p Port) ipt.Chain {
	c := ipt.Chain{Name: ebtablesPod(cfg.Network, p.Name), Policy: "RETURN", Rules: []string{"-j " + ebtablesGuard(cfg.Network)}}
	if !cfg.AntiSpoofing {
		return c
	}
	mac := strings.ToLower(p.MAC.String())
	add := func(rule string) { c.Rules = append(c.Rules, rule) }
	add("-s ! " + mac + " -j DROP")
	v6 := []netip.Addr{}
	for _, a := range p.Addrs {
		if a.Is6() {
			v6 = append(v6, a)
			continue
		}
		add("-p IPv4 --ip-src " + a.String() + " -j RETURN")
		add("-p ARP --arp-htype 1 --arp-ptype 0x800 --arp-ip-src " + a.String() + " --arp-mac-src " + mac + " -j RETURN")
	}
	add("-p ARP --arp-op Request --arp-htype 1 --arp-ptype 0x800 --arp-ip-src 0.0.0.0 --arp-mac-src " + mac + " -j RETURN")
	for _, a := range append(v6, LinkLocal(p.MAC)) {
		add("-p IPv6 --ip6-src " + a.String() + " -j RETURN")
	}
	for _, t := range []string{"neighbour-solicitation", "143/0:255", "131/0:255"} {
		add("-p IPv6 --ip6-src :: --ip6-proto ipv6-icmp --ip6-icmp-type " + t + " -j RETURN")
	}
	add("-j DROP")
	return c
}

// EnsureEbtables brings the network's fixed chains to EbtablesNodePlan(cfg) and adds the chains
// and dispatch rules of ports, in one ebtables-restore. For a pod's ADD it reads three chains by
// name, the jump's, the dispatch chain and the guard (what the bridge's table holds per pod is
// never read), and writes the guard in the same transaction when it differs (a rule of it
// changed in place is put right by the next ADD). With many ports (the node's healing) it reads
// the whole table once and writes only what differs. rebuilt says that
// the jump, the dispatch chain or the guard was missing (a new node, a flushed ruleset, a guard
// deleted after the pods' chains were flushed): every running pod's chain went with them, and
// the caller puts them back.
func EnsureEbtables(ctx context.Context, st *ipt.State, cfg Config, ports ...Port) (rebuilt bool, err error) {
	pods := ebtablesPods(cfg.Network)
	whole := len(ports) > portsByName
	read := func() (*ipt.Table, error) {
		if whole {
			return st.Table(ctx, ipt.Bridge, ebtablesTable)
		}
		return st.Chains(ctx, ipt.Bridge, ebtablesTable, "PREROUTING", pods, ebtablesGuard(cfg.Network))
	}
	t, err := read()
	if err != nil {
		return false, fmt.Errorf("isolation rules of network %q: %w", cfg.Network, err)
	}
	plan := EbtablesNodePlan(cfg)
	_, jumpDiffs := ipt.SyncLines(t, nil, plan.Jumps)
	// A guard that is gone was deleted after every pod's chain lost its jump to it (the kernel
	// keeps a chain something jumps to): those chains were flushed, and are put back like after
	// a flushed ruleset.
	rebuilt = !t.Has(pods) || len(ipt.Missing(jumpDiffs)) > 0 || !t.Has(ebtablesGuard(cfg.Network))
	if !t.Has(pods) || len(jumpDiffs) > 0 {
		// The shared objects are made under the netfilter lock, from a read taken under it: two
		// first ADDs would each declare the dispatch chain (emptying the other's rule) and
		// insert the jump twice.
		err := st.Exclusively(ipt.Bridge, ebtablesTable, func() error {
			if t, err = read(); err != nil {
				return err
			}
			// The guard is left to the restore below, which compares it with this read.
			lines, _ := ipt.SyncLines(t, nil, plan.Jumps)
			if !t.Has(pods) {
				lines = append([]string{ipt.Declare(ipt.Bridge, ipt.Chain{Name: pods, Policy: "RETURN"})}, lines...)
			}
			return st.Restore(ctx, ipt.Bridge, ebtablesTable, lines)
		})
		if err != nil {
			return rebuilt, fmt.Errorf("isolation rules of network %q: %w", cfg.Network, err)
		}
		if !t.Has(pods) {
			t.Chains[pods] = nil // made just now, empty
		}
	}
	// The guard is written only when it differs from its plan. Writing it whole with every
	// pod's rules instead (declaring a chain empties it) saved a listing but cost more than it
	// saved: a transaction that deletes rules makes the tool's closing of its netlink socket
	// wait for the kernel to release them, about 12 ms per ADD against 2 ms for the listing,
	// which runs beside the other two.
	lines, _ := ipt.SyncLines(t, plan.Chains, nil)
	if len(lines) == 0 && !guardListedFaithfully(cfg.Network) {
		lines = writeChain(nil, plan.Chains[0])
	}
	for _, p := range ports {
		// A pod's chain is written whole whether or not it exists: listing it first would cost
		// a read per port. With many ports the whole table was read, and only chains that
		// differ are written.
		chain := ebtablesPodChain(cfg, p)
		if whole {
			chainLines, _ := ipt.SyncLines(t, []ipt.Chain{chain}, nil)
			lines = append(lines, chainLines...)
		} else {
			lines = writeChain(lines, chain)
		}
		if !slices.ContainsFunc(t.Chains[pods], func(r string) bool { return ipt.Same(r, dispatch(cfg.Network, p.Name)) }) {
			lines = append(lines, "-A "+pods+" "+dispatch(cfg.Network, p.Name))
		}
	}
	if len(lines) == 0 {
		return rebuilt, nil
	}
	if err := st.Restore(ctx, ipt.Bridge, ebtablesTable, lines); err != nil {
		return rebuilt, fmt.Errorf("isolation rules of network %q: %w", cfg.Network, err)
	}
	return rebuilt, nil
}

// writeChain appends the restore lines that make chain c exactly its plan.
func writeChain(lines []string, c ipt.Chain) []string {
	lines = append(lines, ipt.Declare(ipt.Bridge, c))
	for _, r := range c.Rules {
		lines = append(lines, "-A "+c.Name+" "+r)
	}
	return lines
}

// RemoveEbtables removes the dispatch rules and chains of ports, those that exist, in one
// ebtables-restore.
func RemoveEbtables(ctx context.Context, st *ipt.State, network string, ports ...Port) error {
	names := []string{ebtablesPods(network)}
	for _, p := range ports {
		names = append(names, ebtablesPod(network, p.Name))
	}
	portNames := make([]string, len(ports))
	for i, p := range ports {
		portNames[i] = p.Name
	}
	// Under the netfilter lock, from a read taken under it: a switch of backend removes every
	// chain of the network under that lock, and a restore that names a chain it removed
	// after our read fails whole (and the switch's, that names one we removed, fails too).
	return st.Exclusively(ipt.Bridge, ebtablesTable, func() error {
		t, err := st.Chains(ctx, ipt.Bridge, ebtablesTable, names...)
		if err != nil {
			return fmt.Errorf("isolation rules of network %q: %w", network, err)
		}
		return removePorts(ctx, st, t, network, portNames)
	})
}

// removePorts removes the dispatch rules and chains of the named ports from t.
func removePorts(ctx context.Context, st *ipt.State, t *ipt.Table, network string, ports []string) error {
	pods := ebtablesPods(network)
	var lines []string
	for _, port := range ports {
		for _, r := range t.Chains[pods] {
			if ipt.Same(r, dispatch(network, port)) {
				lines = append(lines, "-D "+pods+" "+r)
			}
		}
	}
	for _, port := range ports {
		if chain := ebtablesPod(network, port); t.Has(chain) {
			lines = append(lines, "-F "+chain, "-X "+chain)
		}
	}
	if len(lines) == 0 {
		return nil
	}
	if err := st.Restore(ctx, ipt.Bridge, ebtablesTable, lines); err != nil {
		return fmt.Errorf("remove isolation rules of network %q: %w", network, err)
	}
	return nil
}

// GCEbtables removes the chain and dispatch rule of every port keep rejects (ebtables rules
// carry no comment: keep gets the port and no owner), and every pod chain no dispatch rule
// leads to; it returns the ports it removed.
func GCEbtables(ctx context.Context, st *ipt.State, network string, keep func(port, owner string) bool) ([]string, error) {
	t, err := st.Table(ctx, ipt.Bridge, ebtablesTable)
	if err != nil {
		return nil, fmt.Errorf("isolation rules of network %q: %w", network, err)
	}
	var stale []string
	reached := map[string]bool{}
	for _, r := range t.Chains[ebtablesPods(network)] {
		port := inputPort(r)
		reached[ebtablesPod(network, port)] = true
		if port == "" || !keep(port, "") {
			stale = append(stale, port)
		}
	}
	var lines []string
	for chain := range t.Chains {
		if strings.HasPrefix(chain, ebtablesPodPrefix(network)) && !reached[chain] {
			lines = append(lines, "-F "+chain, "-X "+chain)
		}
	}
	if err := removePorts(ctx, st, t, network, stale); err != nil {
		return stale, err
	}
	if len(lines) > 0 {
		slices.Sort(lines)
		if err := st.Restore(ctx, ipt.Bridge, ebtablesTable, lines); err != nil {
			return stale, fmt.Errorf("remove isolation rules of network %q: %w", network, err)
		}
	}
	slices.Sort(stale)
	return stale, nil
}

// inputPort returns the interface a dispatch rule matches ("-i <port> ..."), or "".
func inputPort(rule string) string {
	tok := ipt.Tokens(rule)
	for i := 0; i+1 < len(tok); i++ {
		if tok[i] == "-i" {
			return tok[i+1]
		}
	}
	return ""
}

// CheckNodeEbtables reports how the network's fixed ebtables objects differ from the plan.
func CheckNodeEbtables(ctx context.Context, st *ipt.State, cfg Config) error {
	t, err := fixedChains(ctx, st, cfg.Network)
	if err != nil {
		return err
	}
	plan := EbtablesNodePlan(cfg)
	diffs := ipt.Compare(t, plan.Chains, plan.Jumps)
	if len(diffs) == 0 && !guardListedFaithfully(cfg.Network) {
		diffs = append(diffs, &ipt.Difference{Family: ipt.Bridge, Table: ebtablesTable, Object: "chain " + ebtablesGuard(cfg.Network),
			Detail: "changed in place: in nftables it is not what ebtables lists (a policy, or a match ebtables cannot print)"})
	}
	if pods := ebtablesPods(cfg.Network); !t.Has(pods) {
		diffs = append(diffs, &ipt.Difference{Family: ipt.Bridge, Table: ebtablesTable, Object: "chain " + pods, Missing: true, Detail: "missing"})
	}
	return joinDiffs(diffs)
}

// CheckEbtables verifies the fixed objects and p's chain and dispatch rule.
func CheckEbtables(ctx context.Context, st *ipt.State, cfg Config, p Port) error {
	if err := CheckNodeEbtables(ctx, st, cfg); err != nil {
		return err
	}
	t, err := st.Chains(ctx, ipt.Bridge, ebtablesTable, ebtablesPods(cfg.Network), ebtablesPod(cfg.Network, p.Name))
	if err != nil {
		return err
	}
	if d := ipt.Compare(t, []ipt.Chain{ebtablesPodChain(cfg, p)}, nil); len(d) > 0 {
		return fmt.Errorf("isolation of port %s: %w", p.Name, d[0])
	}
	n := 0
	for _, r := range t.Chains[ebtablesPods(cfg.Network)] {
		if ipt.Same(r, dispatch(cfg.Network, p.Name)) {
			n++
		}
	}
	if n != 1 {
		return fmt.Errorf("isolation of port %s: %d dispatch rules in %s, want 1", p.Name, n, ebtablesPods(cfg.Network))
	}
	return nil
}

// portsByName is how many ports EnsureEbtables handles reading only the fixed chains by name;
// beyond, it reads the whole table once (the node's healing puts back every pod's chain).
const portsByName = 2

// fixedChains reads the network's fixed chains and the chain they hang from, by name (a read
// that costs the same on a full node).
func fixedChains(ctx context.Context, st *ipt.State, network string) (*ipt.Table, error) {
	return st.Chains(ctx, ipt.Bridge, ebtablesTable, "PREROUTING", ebtablesGuard(network), ebtablesPods(network))
}

// EbtablesChains returns, for removing the network's isolation from ebtables altogether, the
// chains of the table that are the network's.
func EbtablesChains(t *ipt.Table, network string) []string {
	var out []string
	for chain := range t.Chains {
		if chain == ebtablesPods(network) || chain == ebtablesGuard(network) || strings.HasPrefix(chain, ebtablesPodPrefix(network)) {
			out = append(out, chain)
		}
	}
	slices.Sort(out)
	return out
}

// EbtablesTable is the ebtables table that holds the isolation chains.
func EbtablesTable() string { return ebtablesTable }

func joinDiffs(diffs []*ipt.Difference) error {
	if len(diffs) == 0 {
		return nil
	}
	errs := make([]error, len(diffs))
	for i, d := range diffs {
		errs[i] = d
	}
	return errors.Join(errs...)
}

// guardListedFaithfully tells whether the kernel's guard is all that ebtables lists of it, which
// is what SyncLines and Compare see: ebtables-nft keeps the chain in nftables, and its listing
// leaves out what it cannot show. ebtables -L prints "policy: RETURN" for a user chain whatever
// its policy (kept as a last rule, which -L omits): a guard made to ACCEPT hands every pod's
// frames on before the pod's chain checks its MAC and addresses. And it prints "-p 802_1Q" for
// an ether type compared with < or >, under a zero mask, or compared twice, the last compare
// printed: rules that drop no VLAN frame. Before a pod's ADD trusted the listing, it wrote the
// guard whole every time, which put such edits right.
//
// So the guard's rules are read over netlink (one dump, no process) and each must have the form
// ebtables-nft gives every rule of the guard: one ether type compared for equality, at most one
// match extension (what it compares, ebtables prints), a counter, DROP; and there must be no
// more of them than the plan's rules (a policy other than RETURN is one more). No guard in
// nftables (ebtables-legacy keeps its own, which it lists as it is) passes. Whatever cannot be
// read fails: the guard is written, as before.
func guardListedFaithfully(network string) bool {
	chain := &nftables.Chain{Name: ebtablesGuard(network), Table: &nftables.Table{Name: ebtablesTable, Family: nftables.TableFamilyBridge}}
	d, err := nft.DumpChain(chain)
	if err != nil {
		return false
	}
	rules, err := d.Rules()
	if err != nil {
		return false
	}
	have := rules[chain.Name]
	if len(have) == 0 {
		return true // ebtables-legacy's guard, or an empty one, which the listing shows
	}
	if len(have) != len(EbtablesNodePlan(Config{Network: network}).Chains[0].Rules) {
		return false
	}
	for _, r := range have {
		if !ebtablesGuardRuleForm(r.Exprs) {
			return false
		}
	}
	return true
}

// ebtablesGuardRuleForm tells whether exprs are the form of an ebtables-nft rule
// "-p <ether type> [<ip or ip6 match>] -j DROP": the frame's ether type loaded and compared for
// equality, at most one match, at most one counter, the verdict drop. Pure.
func ebtablesGuardRuleForm(exprs []expr.Any) bool {
	if len(exprs) < 3 {
		return false
	}
	load, ok := exprs[0].(*expr.Payload)
	if !ok || load.OperationType != expr.PayloadLoad || load.Base != expr.PayloadBaseLLHeader || load.Offset != 12 || load.Len != 2 {
		return false
	}
	cmp, ok := exprs[1].(*expr.Cmp)
	if !ok || cmp.Op != expr.CmpOpEq || cmp.Register != load.DestRegister || len(cmp.Data) != 2 {
		return false
	}
	rest := exprs[2:]
	if _, ok := rest[0].(*expr.Match); ok {
		rest = rest[1:]
	}
	if len(rest) > 0 {
		if _, ok := rest[0].(*expr.Counter); ok {
			rest = rest[1:]
		}
	}
	if len(rest) != 1 {
		return false
	}
	v, ok := rest[0].(*expr.Verdict)
	return ok && v.Kind == expr.VerdictDrop
}
