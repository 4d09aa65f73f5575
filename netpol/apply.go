package netpol

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"

	"github.com/kubenet-dev/kubenet/internal/nft"
)

// maxElementsPerMessage bounds one netlink message of set elements: the kernel takes a batch of
// messages of any total size, but a single message must fit its receive buffer.
const maxElementsPerMessage = 512

// Applied tells what an Apply changed, for logs and metrics.
type Applied struct {
	Groups        int // groups in use
	NewGroups     int // groups created by this Apply
	RemovedGroups int
	MapChanges    int // map elements added, changed or removed
	Released      int // pending addresses released
	BaseWritten   bool
}

// Apply makes the network's policy table hold rs: the base chains, a group (chain and sets) for
// every distinct allow list, map elements for every address of every pod in rs and none for any
// other address, and the pending elements of rs's pods removed. Everything but the removal of
// groups nobody uses any more happens in one transaction, so no packet ever sees half a change;
// the unused groups go in a second one. The caller holds the network lock, so no ADD or DEL
// changes the pending sets or maps between the read and the write.
func Apply(network string, rs Ruleset) (Applied, error) {
	var res Applied
	c, err := nftables.New()
	if err != nil {
		return res, fmt.Errorf("policy rules: netlink: %w", err)
	}
	t := Table(network)
	cur, err := readState(c, t)
	if err != nil {
		return res, err
	}
	want := plan(rs)
	res.Groups = len(want.groups)

	c.AddTable(t)
	sets, err := ensureFixed(c, t)
	if err != nil {
		return res, err
	}
	if !cur.baseOK {
		writeBase(c, t)
		res.BaseWritten = true
	}
	for name, g := range want.groups {
		if cur.chains[name] {
			continue
		}
		if err := addGroup(c, t, name, g.dir, g.group); err != nil {
			return res, err
		}
		res.NewGroups++
	}
	for _, m := range []string{MapIngress4, MapIngress6, MapEgress4, MapEgress6} {
		var del, add []nftables.SetElement
		for addr, chain := range cur.maps[m] {
			if want.maps[m][addr] != chain {
				del = append(del, nftables.SetElement{Key: addr.AsSlice()})
			}
		}
		for addr, chain := range want.maps[m] {
			if cur.maps[m][addr] != chain {
				add = append(add, nftables.SetElement{Key: addr.AsSlice(), VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: chain}})
			}
		}
		res.MapChanges += len(add) + len(del)
		if err := deleteElements(c, sets[m], del); err != nil {
			return res, err
		}
		if err := addElements(c, sets[m], add); err != nil {
			return res, err
		}
	}
	for _, set := range []string{SetPending4, SetPending6} {
		var release []nftables.SetElement
		for addr, owner := range cur.pending[set] {
			if want.owners[addr] == owner {
				release = append(release, nftables.SetElement{Key: addr.AsSlice()})
			}
		}
		res.Released += len(release)
		if err := deleteElements(c, sets[set], release); err != nil {
			return res, err
		}
	}
	if err := c.Flush(); err != nil {
		return res, fmt.Errorf("policy rules of network %q: %w", network, err)
	}

	// The groups nobody jumps to any more. The kernel refuses to delete a chain that a map
	// element still names, so this is a transaction of its own after the switch.
	var unused []string
	for name := range cur.chains {
		if _, ok := want.groups[name]; !ok {
			unused = append(unused, name)
		}
	}
	if len(unused) == 0 {
		return res, nil
	}
	for _, name := range unused {
		c.DelChain(&nftables.Chain{Table: t, Name: name})
		for _, s := range cur.sets {
			if strings.HasPrefix(s, name+"-") {
				c.DelSet(&nftables.Set{Table: t, Name: s})
			}
		}
	}
	if err := c.Flush(); err != nil {
		return res, fmt.Errorf("remove unused policy groups of network %q: %w", network, err)
	}
	res.RemovedGroups = len(unused)
	return res, nil
}

// desired is what Apply wants in the kernel.
type desired struct {
	groups map[string]plannedGroup
	maps   map[string]map[netip.Addr]string // map name → address → group chain
	owners map[netip.Addr]string            // address → owner whose pending element may go
}

type plannedGroup struct {
	dir   string
	group group
}

// plan computes the groups and map elements of rs. Pure.
func plan(rs Ruleset) desired {
	d := desired{groups: map[string]plannedGroup{}, maps: map[string]map[netip.Addr]string{}, owners: map[netip.Addr]string{}}
	for _, m := range []string{MapIngress4, MapIngress6, MapEgress4, MapEgress6} {
		d.maps[m] = map[netip.Addr]string{}
	}
	for _, p := range rs.Pods {
		for _, dir := range []struct {
			name string
			d    Direction
		}{{ingressDir, p.Ingress}, {egressDir, p.Egress}} {
			if !dir.d.Isolated {
				continue
			}
			g := canonical(dir.d.Allow)
			name := g.name(dir.name)
			d.groups[name] = plannedGroup{dir.name, g}
			for _, a := range p.IPs {
				d.maps[mapFor(dir.name, a.Is6())][a.Unmap()] = name
			}
		}
		for _, a := range p.IPs {
			d.owners[a.Unmap()] = p.Owner
		}
	}
	return d
}

func mapFor(dir string, is6 bool) string {
	switch {
	case dir == ingressDir && is6:
		return MapIngress6
	case dir == ingressDir:
		return MapIngress4
	case is6:
		return MapEgress6
	}
	return MapEgress4
}

// state is what the kernel holds of the table.
type state struct {
	baseOK  bool
	chains  map[string]bool // group chains
	sets    []string
	maps    map[string]map[netip.Addr]string
	pending map[string]map[netip.Addr]string // set → address → owner
}

// readState reads the table; a missing table reads as empty.
func readState(c *nftables.Conn, t *nftables.Table) (state, error) {
	st := state{chains: map[string]bool{}, maps: map[string]map[netip.Addr]string{}, pending: map[string]map[netip.Addr]string{}}
	for _, m := range []string{MapIngress4, MapIngress6, MapEgress4, MapEgress6} {
		st.maps[m] = map[netip.Addr]string{}
	}
	if ok, err := nft.TableExistsWith(c, t); err != nil || !ok {
		return st, err
	}
	chains, err := c.ListChainsOfTableFamily(t.Family)
	if err != nil && !nft.IsNotExist(err) {
		return st, fmt.Errorf("list chains: %w", err)
	}
	for _, ch := range chains {
		if ch.Table.Name != t.Name || ch.Name == ChainForward || ch.Name == ChainInput {
			continue
		}
		st.chains[ch.Name] = true
	}
	st.baseOK = checkBase(c, t) == nil
	sets, err := c.GetSets(t)
	if err != nil && !nft.IsNotExist(err) {
		return st, fmt.Errorf("list sets: %w", err)
	}
	for _, s := range sets {
		st.sets = append(st.sets, s.Name)
	}
	for _, m := range []string{MapIngress4, MapIngress6, MapEgress4, MapEgress6} {
		if !slices.Contains(st.sets, m) {
			continue
		}
		els, err := c.GetSetElements(&nftables.Set{Table: t, Name: m, IsMap: true})
		if err != nil {
			return st, fmt.Errorf("read map %s: %w", m, err)
		}
		for _, el := range els {
			a, ok := netip.AddrFromSlice(el.Key)
			if !ok {
				continue
			}
			st.maps[m][a] = verdictChain(el.Val)
		}
	}
	for _, s := range []string{SetPending4, SetPending6} {
		st.pending[s] = map[netip.Addr]string{}
		if !slices.Contains(st.sets, s) {
			continue
		}
		els, err := c.GetSetElements(&nftables.Set{Table: t, Name: s})
		if err != nil {
			return st, fmt.Errorf("read set %s: %w", s, err)
		}
		for _, el := range els {
			if a, ok := netip.AddrFromSlice(el.Key); ok {
				st.pending[s][a] = el.Comment
			}
		}
	}
	return st, nil
}

// verdictChain decodes the chain a jump verdict of a map element names (the element's data as
// the library hands it: the nested verdict attributes).
func verdictChain(b []byte) string {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return ""
	}
	var chain string
	for ad.Next() {
		if ad.Type() == 2 { // NFTA_VERDICT_CHAIN
			chain = strings.TrimRight(ad.String(), "\x00")
		}
	}
	return chain
}

// checkBase compares the base chains with BaseRules by their expressions and comments, so a
// rule edited in place (a verdict flipped, a match changed, the comment kept) counts as a
// difference and the next Apply or Hold rewrites the chain.
func checkBase(c *nftables.Conn, t *nftables.Table) error {
	rules := BaseRules()
	for _, ch := range baseChains(t) {
		if err := nft.CheckChainWith(c, ch, rules[ch.Name]); err != nil {
			return fmt.Errorf("policy %w", err)
		}
	}
	return nil
}

// ensureFixed queues the pending sets and the maps (created if missing) and returns them by name.
func ensureFixed(c *nftables.Conn, t *nftables.Table) (map[string]*nftables.Set, error) {
	out := map[string]*nftables.Set{}
	for _, s := range fixedSets(t) {
		if err := c.AddSet(s, nil); err != nil {
			return nil, fmt.Errorf("policy set %s: %w", s.Name, err)
		}
		out[s.Name] = s
	}
	return out, nil
}

func writeBase(c *nftables.Conn, t *nftables.Table) {
	rules := BaseRules()
	for _, ch := range baseChains(t) {
		nft.ReplaceChain(c, ch, rules[ch.Name])
	}
}

func addGroup(c *nftables.Conn, t *nftables.Table, name, dir string, g group) error {
	for _, s := range groupSets(t, name, g) {
		if err := c.AddSet(s.set, nil); err != nil {
			return fmt.Errorf("policy set %s: %w", s.set.Name, err)
		}
		if err := addElements(c, s.set, s.elements); err != nil {
			return err
		}
	}
	ch := c.AddChain(&nftables.Chain{Table: t, Name: name})
	for _, r := range groupRules(name, dir, g) {
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: r.Exprs, UserData: nft.Comment(r.Comment)})
	}
	return nil
}

func addElements(c *nftables.Conn, s *nftables.Set, els []nftables.SetElement) error {
	for chunk := range slices.Chunk(els, maxElementsPerMessage) {
		if err := c.SetAddElements(s, chunk); err != nil {
			return fmt.Errorf("elements of %s: %w", s.Name, err)
		}
	}
	return nil
}

func deleteElements(c *nftables.Conn, s *nftables.Set, els []nftables.SetElement) error {
	for chunk := range slices.Chunk(els, maxElementsPerMessage) {
		if err := c.SetDeleteElements(s, chunk); err != nil {
			return fmt.Errorf("elements of %s: %w", s.Name, err)
		}
	}
	return nil
}

// Hold puts addrs into the pending sets with owner as the comment, creating the table, the sets,
// the maps and the base chains if they are missing (the first ADD on a node may come before the
// agent's first Apply). The caller holds the network lock. Its cost does not depend on the pods
// or policies of the node: a dump of the two base chains and one transaction of a few elements.
func Hold(network, owner string, addrs []netip.Addr) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("policy rules: netlink: %w", err)
	}
	t := c.AddTable(Table(network))
	sets, err := ensureFixed(c, t)
	if err != nil {
		return err
	}
	if checkBase(c, t) != nil {
		writeBase(c, t)
	}
	for _, a := range addrs {
		set := sets[pendingSet(a)]
		if err := c.SetAddElements(set, []nftables.SetElement{{Key: a.Unmap().AsSlice(), Comment: owner}}); err != nil {
			return fmt.Errorf("pending element %s: %w", a, err)
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("hold %v for the policies of network %q: %w", addrs, network, err)
	}
	return nil
}

func pendingSet(a netip.Addr) string {
	if a.Unmap().Is6() {
		return SetPending6
	}
	return SetPending4
}

// Forget removes every element keyed by one of addrs: pending elements and map elements (DEL,
// GC, and the undo of a failed ADD). A missing table or element is fine; repeated calls succeed.
// The caller holds the network lock. Its cost grows with the node's local pods (one dump of the
// small per-node sets), not with the cluster.
func Forget(network string, addrs []netip.Addr) error {
	if len(addrs) == 0 {
		return nil
	}
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("policy rules: netlink: %w", err)
	}
	t := Table(network)
	if ok, err := nft.TableExistsWith(c, t); err != nil || !ok {
		return err
	}
	doomed := map[netip.Addr]bool{}
	for _, a := range addrs {
		doomed[a.Unmap()] = true
	}
	n := 0
	for _, s := range fixedSets(t) {
		els, err := c.GetSetElements(s)
		if nft.IsNotExist(err) {
			continue
		}
		if err != nil {
			return fmt.Errorf("read policy set %s: %w", s.Name, err)
		}
		var del []nftables.SetElement
		for _, el := range els {
			if a, ok := netip.AddrFromSlice(el.Key); ok && doomed[a] {
				del = append(del, nftables.SetElement{Key: el.Key})
			}
		}
		n += len(del)
		if err := deleteElements(c, s, del); err != nil {
			return err
		}
	}
	if n == 0 {
		return nil
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("forget %v in the policies of network %q: %w", addrs, network, err)
	}
	return nil
}

// PendingOwners lists the owners of the pending elements (GC removes those of attachments that
// are gone).
func PendingOwners(network string) (map[netip.Addr]string, error) {
	c, err := nftables.New()
	if err != nil {
		return nil, fmt.Errorf("policy rules: netlink: %w", err)
	}
	out := map[netip.Addr]string{}
	if ok, err := nft.TableExistsWith(c, Table(network)); err != nil || !ok {
		return out, err
	}
	for _, s := range fixedSets(Table(network)) {
		if s.IsMap {
			continue
		}
		els, err := c.GetSetElements(s)
		if nft.IsNotExist(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read policy set %s: %w", s.Name, err)
		}
		for _, el := range els {
			if a, ok := netip.AddrFromSlice(el.Key); ok {
				out[a] = el.Comment
			}
		}
	}
	return out, nil
}

// Dispatch reads the four dispatch maps: map name → pod address → the group chain it jumps to
// (operators' tools and the bench, which watches a policy change arrive).
func Dispatch(network string) (map[string]map[netip.Addr]string, error) {
	c, err := nftables.New()
	if err != nil {
		return nil, fmt.Errorf("policy rules: netlink: %w", err)
	}
	t := Table(network)
	out := map[string]map[netip.Addr]string{}
	if ok, err := nft.TableExistsWith(c, t); err != nil || !ok {
		return out, err
	}
	for _, m := range []string{MapIngress4, MapIngress6, MapEgress4, MapEgress6} {
		out[m] = map[netip.Addr]string{}
		els, err := c.GetSetElements(&nftables.Set{Table: t, Name: m, IsMap: true})
		if err != nil {
			return nil, fmt.Errorf("read map %s: %w", m, err)
		}
		for _, el := range els {
			if a, ok := netip.AddrFromSlice(el.Key); ok {
				out[m][a] = verdictChain(el.Val)
			}
		}
	}
	return out, nil
}

// Remove deletes the network's policy table (the agent with policies turned off). Missing is fine.
func Remove(network string) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("policy rules: netlink: %w", err)
	}
	if ok, err := nft.TableExistsWith(c, Table(network)); err != nil || !ok {
		return err
	}
	c.DelTable(Table(network))
	if err := c.Flush(); err != nil {
		return fmt.Errorf("remove the policy table of network %q: %w", network, err)
	}
	return nil
}
