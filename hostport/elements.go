package hostport

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"syscall"

	"github.com/google/nftables"

	"github.com/kubenet-dev/kubenet/internal/nft"
)

// MaxEntriesPerTransaction bounds the map elements one nftables transaction adds or deletes. A
// transaction carries one message per map and operation, however many elements it holds (one
// message per element made a pod with ~120 dual-stack mappings overflow the socket with the
// kernel's acknowledgements: ENOBUFS after the kernel had committed). 256 elements of the
// largest kind (IPv6 hostIP key, owner comment) make about 40 KB per message, well inside the
// socket's send buffer. ADD never needs more than one transaction (MaxMappings gives at most
// 2*MaxMappings entries); DEL, GC and the restore after a flushed ruleset split larger sets.
const MaxEntriesPerTransaction = 256

// errOutcomeUnknown marks a transaction whose acknowledgements were lost (ENOBUFS): the kernel
// may or may not have committed it, so the caller reads the maps back.
var errOutcomeUnknown = errors.New("the kernel's answer was lost (ENOBUFS): outcome unknown")

// flush sends c's transaction (through b.commit when a test injects a fault). A lost answer is
// reported as errOutcomeUnknown.
func (b nftablesBackend) flush(c *nftables.Conn, what string) error {
	commit := (*nftables.Conn).Flush
	if b.commit != nil {
		commit = b.commit
	}
	err := commit(c)
	if err == nil {
		return nil
	}
	if errors.Is(err, syscall.ENOBUFS) {
		return fmt.Errorf("%s: %w: %v", what, errOutcomeUnknown, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// byMap groups reservations by the map that holds their element, in a fixed order.
func byMap(rs []Reservation) map[string][]nftables.SetElement {
	out := map[string][]nftables.SetElement{}
	for _, r := range rs {
		name := mapName(r.Key)
		out[name] = append(out[name], element(r))
	}
	return out
}

// chunks splits rs into pieces of at most MaxEntriesPerTransaction.
func chunks(rs []Reservation) [][]Reservation {
	var out [][]Reservation
	for len(rs) > MaxEntriesPerTransaction {
		out = append(out, rs[:MaxEntriesPerTransaction])
		rs = rs[MaxEntriesPerTransaction:]
	}
	if len(rs) > 0 {
		out = append(out, rs)
	}
	return out
}

// queueElements queues on c, for each map of rs, one message that adds (del false) or deletes
// (del true) rs's elements; maps are created first when missing. known holds the maps already
// queued on c.
func queueElements(c *nftables.Conn, table *nftables.Table, known map[string]*nftables.Set, rs []Reservation, del bool) error {
	groups := byMap(rs)
	for _, name := range []string{MapIPv4, MapIPv4Addr, MapIPv6, MapIPv6Addr} {
		els, ok := groups[name]
		if !ok {
			continue
		}
		s, ok := known[name]
		if !ok {
			var err error
			if s, err = addMap(c, table, name); err != nil {
				return err
			}
			known[name] = s
		}
		op, verb := c.SetAddElements, "add"
		if del {
			op, verb = c.SetDeleteElements, "delete"
		}
		if err := op(s, els); err != nil {
			return fmt.Errorf("hostport map %s: %s %d elements: %w", name, verb, len(els), err)
		}
	}
	return queueHairpin(c, table, known, rs, del)
}

// queueHairpin queues, for each family, one message that adds or deletes the hairpin elements of
// rs's pod addresses (one per address: an owner's mappings share it and go together). A
// reservation without an address (deleted by key) has none. A hairpin element that outlives its
// mappings only masquerades that address's connections to itself, which is what a pod reaching
// its own hostPort needs anyway.
func queueHairpin(c *nftables.Conn, table *nftables.Table, known map[string]*nftables.Set, rs []Reservation, del bool) error {
	byFamily := map[bool][]nftables.SetElement{}
	seen := map[netip.Addr]bool{}
	for _, r := range rs {
		if !r.PodIP.IsValid() || seen[r.PodIP] {
			continue
		}
		seen[r.PodIP] = true
		byFamily[r.PodIP.Is6()] = append(byFamily[r.PodIP.Is6()], hairpinElement(r))
	}
	for _, is6 := range []bool{false, true} {
		els := byFamily[is6]
		if len(els) == 0 {
			continue
		}
		name := hairpinSet(is6)
		s, ok := known[name]
		if !ok {
			s = hairpinSetDef(table, is6)
			if err := c.AddSet(s, nil); err != nil {
				return fmt.Errorf("hostport set %s: %w", name, err)
			}
			known[name] = s
		}
		op, verb := c.SetAddElements, "add"
		if del {
			op, verb = c.SetDeleteElements, "delete"
		}
		if err := op(s, els); err != nil {
			return fmt.Errorf("hostport set %s: %s %d elements: %w", name, verb, len(els), err)
		}
	}
	return nil
}

// keyOnly is rs with the values left out: deleting by key needs neither the pod address nor
// the port, so it removes an element whatever destination somebody gave it.
func keyOnly(rs []Reservation) []Reservation {
	out := make([]Reservation, len(rs))
	for i, r := range rs {
		out[i] = Reservation{Entry: Entry{Key: r.Key}}
	}
	return out
}

// present returns the kernel elements that hold one of rs's keys for rs's owner, whatever their
// destination. Elements of other owners, and elements without an owner (not made by kubenet),
// are never counted: nothing here removes them.
func present(c *nftables.Conn, network string, rs []Reservation) ([]Reservation, error) {
	type keyOwner struct {
		Key
		Owner
	}
	want := map[keyOwner]bool{}
	var maps []string
	for _, r := range rs {
		want[keyOwner{r.Key, r.Owner}] = true
		if name := mapName(r.Key); !slices.Contains(maps, name) {
			maps = append(maps, name)
		}
	}
	kernel, err := listElements(c, network, maps...)
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(kernel, func(r Reservation) bool { return !want[keyOwner{r.Key, r.Owner}] }), nil
}

// deleteKeys deletes the elements that hold rs's keys for rs's owners, whatever their values,
// after reading them back: the way out when a transaction's outcome is unknown, or when an
// element was changed behind kubenet's back so that the add-then-delete of uninstall clashes
// with it. It reports how many it found.
func (b nftablesBackend) deleteKeys(network string, rs []Reservation) (int, error) {
	c, err := nftables.New()
	if err != nil {
		return 0, fmt.Errorf("hostport rules: netlink: %w", err)
	}
	found, err := present(c, network, rs)
	if err != nil || len(found) == 0 {
		return 0, err
	}
	for _, part := range chunks(found) {
		table := c.AddTable(nft.InetTable(network))
		if err := queueElements(c, table, map[string]*nftables.Set{}, keyOnly(part), true); err != nil {
			return len(found), err
		}
		if err := b.flush(c, "remove hostports of network "+network); err != nil && !errors.Is(err, errOutcomeUnknown) {
			return len(found), err
		}
	}
	left, err := present(c, network, rs)
	if err == nil && len(left) > 0 {
		err = fmt.Errorf("remove hostports of network %q: %d elements are still there after deleting them, first %s", network, len(left), left[0].Entry)
	}
	return len(found), err
}

// addMap queues the map name (created if missing, as nftables adds do) on c.
func addMap(c *nftables.Conn, table *nftables.Table, name string) (*nftables.Set, error) {
	s := mapSet(table, name)
	if err := c.AddSet(s, nil); err != nil {
		return nil, fmt.Errorf("hostport map %s: %w", name, err)
	}
	return s, nil
}
