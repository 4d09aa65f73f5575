package hostport

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/kubenet-dev/kubenet/internal/ipt"
)

// The iptables backend keeps the same contract with rules instead of map elements. Per family,
// in the nat table (and, for IPv4, the mangle table):
//
//	PREROUTING, OUTPUT  -m addrtype --dst-type LOCAL -j KUBENET-HP-<net>   only traffic to the node
//	KUBENET-HP-<net>      fixed: (IPv6) ::1 is not translated; then the pods' mappings
//	KUBENET-HPDNAT-<net>  one DNAT rule per entry, commented with its owner
//	POSTROUTING         -j KUBENET-HPSNAT-<net>
//	KUBENET-HPSNAT-<net>  fixed: (IPv4) translated connections from 127.0.0.0/8 are masqueraded;
//	                      then the hairpin rules
//	KUBENET-HPHAIR-<net>  one rule per pod address with mappings: its connections to itself are
//	                      masqueraded (any other client keeps its address, as with nftables)
//	mangle PREROUTING   -j KUBENET-LOCALNET-<net>   (IPv4) 127.0.0.0/8 not from lo dropped
//
// A pod's ADD and DEL are one iptables-restore per family whatever the node holds; the rules
// checked on every ADD are the fixed ones (their number depends on the configuration only).

// IPTables is the iptables backend; st reads each table at most once per operation.
func IPTables(st *ipt.State) Backend { return iptablesBackend{st: st} }

type iptablesBackend struct{ st *ipt.State }

// Chain names of the network.
func chainHP(network string) string       { return "KUBENET-HP-" + ipt.ChainSuffix(network) }
func chainHPDNAT(network string) string   { return "KUBENET-HPDNAT-" + ipt.ChainSuffix(network) }
func chainHPSNAT(network string) string   { return "KUBENET-HPSNAT-" + ipt.ChainSuffix(network) }
func chainHPHAIR(network string) string   { return "KUBENET-HPHAIR-" + ipt.ChainSuffix(network) }
func chainLOCALNET(network string) string { return "KUBENET-LOCALNET-" + ipt.ChainSuffix(network) }

// IPTablesChains names the network's host-port chains, per table: what removing this backend
// from the node removes.
func IPTablesChains(network string) map[string][]string {
	return map[string][]string{
		"nat":    {chainHP(network), chainHPDNAT(network), chainHPSNAT(network), chainHPHAIR(network)},
		"mangle": {chainLOCALNET(network)},
	}
}

func comment(s string) string { return "-m comment --comment " + ipt.Quote(s) }

// iptPlan is the fixed part of one family in one table.
type iptPlan struct {
	f     ipt.Family
	table string
	plan  ipt.Plan
	// entries are chains that hold per-pod rules: declared, never compared.
	entries []string
}

// iptablesPlan returns the fixed chains and jumps of cfg's families. Pure.
func iptablesPlan(cfg Config) []iptPlan {
	var out []iptPlan
	for _, is6 := range cfg.families() {
		f := ipt.FamilyOf(is6)
		n := cfg.Network
		hp := ipt.Chain{Name: chainHP(n)}
		if is6 {
			hp.Rules = append(hp.Rules, "-s ::1/128 "+comment("hostPorts: ::1 is not translated (IPv6 cannot route it off lo)")+" -j RETURN")
		}
		hp.Rules = append(hp.Rules, comment("hostPorts: the mappings of the pods")+" -j "+chainHPDNAT(n))
		snat := ipt.Chain{Name: chainHPSNAT(n)}
		if !is6 {
			snat.Rules = append(snat.Rules, "-s 127.0.0.0/8 ! -o lo -m conntrack --ctstate DNAT "+comment("hostPort connections from localhost: masquerade")+" -j MASQUERADE")
		}
		snat.Rules = append(snat.Rules, comment("hostPort connections of a pod to itself")+" -j "+chainHPHAIR(n))
		toLocal := "-m addrtype --dst-type LOCAL " + comment("kubenet "+n+": hostPorts") + " -j " + chainHP(n)
		out = append(out, iptPlan{f: f, table: "nat", entries: []string{chainHPDNAT(n), chainHPHAIR(n)}, plan: ipt.Plan{
			Chains: []ipt.Chain{hp, snat},
			Jumps: []ipt.Jump{
				{From: "PREROUTING", Rule: toLocal},
				{From: "OUTPUT", Rule: toLocal},
				{From: "POSTROUTING", Rule: comment("kubenet "+n+": hostPort SNAT") + " -j " + chainHPSNAT(n)},
			},
		}})
		if !is6 {
			guard := "(route_localnet is on for localhost hostPorts)"
			out = append(out, iptPlan{f: f, table: "mangle", plan: ipt.Plan{
				Chains: []ipt.Chain{{Name: chainLOCALNET(n), Rules: []string{
					"-s 127.0.0.0/8 ! -i lo " + comment("drop packets from 127.0.0.0/8 that did not arrive on lo "+guard) + " -j DROP",
					"-d 127.0.0.0/8 ! -i lo " + comment("drop packets to 127.0.0.0/8 that did not arrive on lo "+guard) + " -j DROP",
				}}},
				Jumps: []ipt.Jump{{From: "PREROUTING", Rule: comment("kubenet "+n+": localnet guard") + " -j " + chainLOCALNET(n)}},
			}})
		}
	}
	return out
}

// compare returns the differences of one plan in t: the fixed chains and jumps, and the entry
// chains, which must exist.
func (p iptPlan) compare(t *ipt.Table) []*ipt.Difference {
	diffs := ipt.Compare(t, p.plan.Chains, p.plan.Jumps)
	for _, c := range p.entries {
		if !t.Has(c) {
			diffs = append(diffs, &ipt.Difference{Family: p.f, Table: p.table, Object: "chain " + c, Missing: true, Detail: "missing"})
		}
	}
	return diffs
}

func (b iptablesBackend) checkNode(cfg Config) error {
	var errs []error
	for _, p := range iptablesPlan(cfg) {
		t, err := b.st.Table(context.Background(), p.f, p.table)
		if err != nil {
			return fmt.Errorf("hostport rules of network %q: %w", cfg.Network, err)
		}
		for _, d := range p.compare(t) {
			errs = append(errs, d)
		}
	}
	return errors.Join(errs...)
}

// missingNode counts the rules of the fixed chains (ipt.State.RuleCounts), STATUS's only question
// being whether one is gone or emptied; the entry chains hold every pod's rules and are not read:
// the fixed chains jump to them, and iptables keeps no jump to a chain that does not exist.
func (b iptablesBackend) missingNode(cfg Config, _ map[string]int) ([]error, error) {
	plans := iptablesPlan(cfg)
	diffs := make([][]*ipt.Difference, len(plans))
	errs := make([]error, len(plans))
	read := make([]func(), len(plans))
	for i, p := range plans {
		read[i] = func() { diffs[i], errs[i] = p.plan.CountDifferences(context.Background(), b.st, p.f, p.table) }
	}
	// The tables are read at once (STATUS waits for the slowest read, not for the sum).
	if err := ipt.InCallerNS(read...); err != nil {
		return nil, fmt.Errorf("hostport rules of network %q: %w", cfg.Network, err)
	}
	var out []error
	for i := range plans {
		if errs[i] != nil {
			return nil, fmt.Errorf("hostport rules of network %q: %w", cfg.Network, errs[i])
		}
		for _, d := range ipt.Missing(diffs[i]) {
			out = append(out, d)
		}
	}
	return out, nil
}

func (b iptablesBackend) ensureNode(cfg Config) (Repair, bool, error) {
	var rep Repair
	missing := false
	ctx := context.Background()
	for _, p := range iptablesPlan(cfg) {
		t, err := b.st.Table(ctx, p.f, p.table)
		if err != nil {
			return rep, false, fmt.Errorf("hostport rules of network %q: %w", cfg.Network, err)
		}
		if len(p.compare(t)) == 0 {
			continue
		}
		// Shared chains and jumps are written under the netfilter lock, from a read taken
		// under it (see ipt.State.Serialize).
		var diffs []*ipt.Difference
		err = b.st.Exclusively(p.f, p.table, func() error {
			t, err := b.st.Table(ctx, p.f, p.table)
			if err != nil {
				return err
			}
			diffs = p.compare(t)
			lines, _ := ipt.SyncLines(t, p.plan.Chains, nil)
			// Entry chains are declared only when missing: declaring empties a chain.
			var declare []string
			for _, c := range p.entries {
				if !t.Has(c) {
					declare = append(declare, ipt.Declare(p.f, ipt.Chain{Name: c}))
				}
			}
			jumps, _ := ipt.SyncLines(t, nil, p.plan.Jumps)
			return b.st.Restore(ctx, p.f, p.table, slices.Concat(declare, lines, jumps))
		})
		if err != nil {
			return rep, false, fmt.Errorf("hostport rules of network %q: %w", cfg.Network, err)
		}
		for _, d := range diffs {
			rep.Chains = append(rep.Chains, d.Object)
			missing = missing || d.Missing
		}
	}
	return rep, missing, nil
}

// ownerComment spells owner for an iptables comment: as Owner.String when every byte is one the
// tools print as it is, else with the interface name (which may hold quotes, backslashes or any
// other byte but "/", ":" and spaces) in hex, so that no input reaches a restore payload raw.
func ownerComment(o Owner) string {
	plain := func(r rune) bool {
		return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("_.-", r)
	}
	if strings.IndexFunc(o.IfName, func(r rune) bool { return !plain(r) }) < 0 {
		return o.String()
	}
	return o.ContainerID + "/x:" + hex.EncodeToString([]byte(o.IfName))
}

// parseOwnerComment is the inverse of ownerComment; false for anything Owner.Valid refuses.
func parseOwnerComment(s string) (Owner, bool) {
	id, ifName, _ := strings.Cut(s, "/")
	if enc, ok := strings.CutPrefix(ifName, "x:"); ok {
		b, err := hex.DecodeString(enc)
		if err != nil {
			return Owner{}, false
		}
		ifName = string(b)
	}
	return parseOwner(id + "/" + ifName)
}

// dnatRule is the rule of an entry in the DNAT chain.
func dnatRule(r Reservation) string {
	var b strings.Builder
	if !r.Any() {
		fmt.Fprintf(&b, "-d %s ", netip.PrefixFrom(r.HostIP, r.HostIP.BitLen()))
	}
	fmt.Fprintf(&b, "-p %s -m %s --dport %d %s -j DNAT --to-destination %s",
		r.Protocol, r.Protocol, r.HostPort, comment(ownerComment(r.Owner)), netip.AddrPortFrom(r.PodIP, r.ContainerPort))
	return b.String()
}

// hairpinRule is the rule that masquerades a pod's connections to itself through its host ports.
func hairpinRule(podIP netip.Addr, owner Owner) string {
	p := netip.PrefixFrom(podIP, podIP.BitLen()).String()
	return "-s " + p + " -d " + p + " -m conntrack --ctstate DNAT " + comment(ownerComment(owner)) + " -j MASQUERADE"
}

// parseDNAT decodes a rule of the DNAT chain; ok is false for a rule kubenet could not have
// written.
func parseDNAT(is6 bool, rule string) (Reservation, bool) {
	tok := ipt.Tokens(rule)
	r := Reservation{Entry: Entry{Key: Key{HostIP: unspecified(is6)}}}
	var haveDst bool
	for i := 0; i+1 < len(tok); i++ {
		v := tok[i+1]
		switch tok[i] {
		case "-d":
			p, err := netip.ParsePrefix(v)
			if err != nil || p.Bits() != p.Addr().BitLen() {
				return r, false
			}
			r.HostIP = p.Addr()
		case "-p":
			r.Protocol = v
		case "--dport":
			n, err := strconv.ParseUint(v, 10, 16)
			if err != nil {
				return r, false
			}
			r.HostPort = uint16(n)
		case "--comment":
			if o, ok := parseOwnerComment(v); ok {
				r.Owner = o
			}
		case "--to-destination":
			ap, err := netip.ParseAddrPort(v)
			if err != nil {
				return r, false
			}
			r.PodIP, r.ContainerPort, haveDst = ap.Addr().Unmap(), ap.Port(), true
		}
	}
	_, known := protoNumber(r.Protocol)
	return r, known && haveDst && r.HostPort != 0 && r.HostIP.Is6() == is6
}

// read returns the family's nat table as it is now (not as st read it: entries change under the
// network lock, and what the caller decides must rest on the current state).
func (b iptablesBackend) read(ctx context.Context, f ipt.Family) (*ipt.Table, error) {
	b.st.Forget(f, "nat")
	return b.st.Table(ctx, f, "nat")
}

func (iptablesBackend) home(cfg Config, k Key) string {
	return fmt.Sprintf("no rule in %s chain %s of network %q", ipt.FamilyOf(k.Is6()), chainHPDNAT(cfg.Network), cfg.Network)
}

func (b iptablesBackend) list(cfg Config, keys []Key) ([]Reservation, error) {
	var out []Reservation
	for _, is6 := range cfg.families() {
		if keys != nil && !slices.ContainsFunc(keys, func(k Key) bool { return k.Is6() == is6 }) {
			continue
		}
		t, err := b.read(context.Background(), ipt.FamilyOf(is6))
		if err != nil {
			return nil, fmt.Errorf("hostport rules of network %q: %w", cfg.Network, err)
		}
		for _, rule := range t.Chains[chainHPDNAT(cfg.Network)] {
			if r, ok := parseDNAT(is6, rule); ok {
				out = append(out, r)
			}
		}
	}
	return out, nil
}

func (b iptablesBackend) install(cfg Config, rs []Reservation) error {
	ctx := context.Background()
	for _, is6 := range []bool{false, true} {
		part := slices.DeleteFunc(slices.Clone(rs), func(r Reservation) bool { return r.Is6() != is6 })
		if len(part) == 0 {
			continue
		}
		f := ipt.FamilyOf(is6)
		var lines []string
		for _, r := range part {
			lines = append(lines, "-A "+chainHPDNAT(cfg.Network)+" "+dnatRule(r))
		}
		t, err := b.st.Table(ctx, f, "nat")
		if err != nil {
			return err
		}
		for _, h := range hairpins(part) {
			if !slices.ContainsFunc(t.Chains[chainHPHAIR(cfg.Network)], func(have string) bool { return ipt.Same(have, h) }) {
				lines = append(lines, "-A "+chainHPHAIR(cfg.Network)+" "+h)
			}
		}
		if err := b.st.Restore(ctx, f, "nat", lines); err != nil {
			// An exec that failed may still have committed (killed after the commit): read back.
			if ok, rerr := allPresent(b, cfg, part); rerr == nil && ok {
				continue
			}
			return fmt.Errorf("hostport rules for network %q: %w", cfg.Network, err)
		}
	}
	return nil
}

// hairpins returns the hairpin rules of rs's pod addresses, one per address and owner.
func hairpins(rs []Reservation) []string {
	var out []string
	for _, r := range rs {
		if !r.PodIP.IsValid() {
			continue
		}
		if h := hairpinRule(r.PodIP, r.Owner); !slices.Contains(out, h) {
			out = append(out, h)
		}
	}
	return out
}

// uninstall reads the family's chains and deletes, in one restore, the DNAT rules that hold rs's
// keys for rs's owners (whatever their destination), and the hairpin rules of an owner that is
// left without DNAT rules. A concurrent writer can make the restore fail (a rule it deletes is
// gone): it is read and tried once more.
func (b iptablesBackend) uninstall(cfg Config, rs []Reservation) error {
	ctx := context.Background()
	for _, is6 := range []bool{false, true} {
		part := slices.DeleteFunc(slices.Clone(rs), func(r Reservation) bool { return r.Is6() != is6 })
		if len(part) == 0 {
			continue
		}
		var err error
		for try := 0; try < 2; try++ {
			if err = b.uninstallFamily(ctx, cfg, ipt.FamilyOf(is6), part); err == nil {
				break
			}
		}
		if err != nil {
			return fmt.Errorf("remove hostports of network %q: %w", cfg.Network, err)
		}
	}
	return nil
}

func (b iptablesBackend) uninstallFamily(ctx context.Context, cfg Config, f ipt.Family, rs []Reservation) error {
	t, err := b.read(ctx, f)
	if err != nil {
		return err
	}
	type keyOwner struct {
		Key
		Owner
	}
	gone := map[keyOwner]bool{}
	owners := map[Owner]bool{}
	for _, r := range rs {
		gone[keyOwner{r.Key, r.Owner}] = true
		owners[r.Owner] = true
	}
	dnat, hair := chainHPDNAT(cfg.Network), chainHPHAIR(cfg.Network)
	var lines []string
	left := map[Owner]bool{}
	for _, rule := range t.Chains[dnat] {
		r, ok := parseDNAT(f == ipt.IPv6, rule)
		switch {
		case !ok:
		case gone[keyOwner{r.Key, r.Owner}]:
			lines = append(lines, "-D "+dnat+" "+rule)
		default:
			left[r.Owner] = true
		}
	}
	for _, rule := range t.Chains[hair] {
		for o := range owners {
			if !left[o] && hairpinOf(rule, o) {
				lines = append(lines, "-D "+hair+" "+rule)
			}
		}
	}
	return b.st.Restore(ctx, f, "nat", lines)
}

// hairpinOf tells whether a hairpin rule is owner's.
func hairpinOf(rule string, owner Owner) bool {
	tok := ipt.Tokens(rule)
	return slices.Contains(tok, "MASQUERADE") && slices.Contains(tok, ownerComment(owner))
}
