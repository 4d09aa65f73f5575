package hostport

import (
	"errors"
	"fmt"
	"slices"

	"github.com/google/nftables"

	"github.com/kubenet-dev/kubenet/internal/nft"
)

// Backend is where host-port mappings and the fixed rules live in the kernel: nftables maps
// (NFTables, the default) or iptables rules (IPTables). The index, the conflict check, the
// conntrack flush and the order of the steps are the same for both; only this differs. The
// methods are unexported: the two implementations are the only ones.
type Backend interface {
	// install adds rs (one attachment's entries, at most MaxEntriesPerTransaction) in one
	// transaction per family. When the kernel's answer is lost it reads back and succeeds only
	// when every entry is there.
	install(cfg Config, rs []Reservation) error
	// uninstall removes whatever holds rs's keys for rs's owners, whatever its destination;
	// entries already gone are no error.
	uninstall(cfg Config, rs []Reservation) error
	// list returns the kernel's entries where keys live (nil: every entry of the network), with
	// the owners the kernel records (zero when an entry has none kubenet could have written).
	list(cfg Config, keys []Key) ([]Reservation, error)
	// checkNode returns every difference of the fixed objects from the plan, joined; each says
	// whether the object is missing altogether.
	checkNode(cfg Config) error
	// missingNode returns the fixed objects that are missing altogether, for STATUS; counts are
	// the rules per chain of the network's nftables table (the nftables backend's one dump).
	missingNode(cfg Config, counts map[string]int) ([]error, error)
	// ensureNode writes the fixed objects that differ, and tells whether one was missing
	// altogether (then the entries of running pods must be put back).
	ensureNode(cfg Config) (rep Repair, missing bool, err error)
	// home names where an entry of k lives, for messages.
	home(cfg Config, k Key) string
}

// NFTables is the nftables backend: one map element per entry in the network's inet table.
func NFTables() Backend { return nftablesBackend{} }

func (c Config) backend() Backend {
	if c.Backend == nil {
		return nftablesBackend{}
	}
	return c.Backend
}

type nftablesBackend struct {
	// commit sends a transaction; nil is (*nftables.Conn).Flush. Tests put a lost answer
	// (ENOBUFS) behind a transaction the kernel did or did not commit.
	commit func(*nftables.Conn) error
}

// install adds the elements (and their maps, when missing) in one transaction. When the
// kernel's answer is lost, the maps are read back: the transaction is atomic, so either every
// element is there (success) or none of this transaction's is.
func (b nftablesBackend) install(cfg Config, rs []Reservation) error {
	c, err := nft.NewConn()
	if err != nil {
		return fmt.Errorf("hostport rules: netlink: %w", err)
	}
	table := c.AddTable(nft.InetTable(cfg.Network))
	if err := queueElements(c, table, map[string]*nftables.Set{}, rs, false); err != nil {
		return err
	}
	err = b.flush(c, fmt.Sprintf("hostport rules for network %q", cfg.Network))
	if errors.Is(err, errOutcomeUnknown) {
		if ok, rerr := allPresent(b, cfg, rs); rerr == nil && ok {
			return nil
		}
	}
	return err
}

// uninstall deletes the elements of rs, in one transaction per MaxEntriesPerTransaction. Each
// element is first added with the value the index recorded and then deleted: adding an identical
// element is a no-op, so the transaction succeeds whether or not the element is still there (an
// ADD that crashed before its transaction, or a DEL that crashed after it), where a bare delete
// would fail as a whole; and it costs no read of the maps, which grow with the node's pods. When
// a transaction fails anyway (its answer was lost, or somebody changed an element's value so that
// the add clashes), the maps are read back and whatever holds rs's keys is deleted by key.
func (b nftablesBackend) uninstall(cfg Config, rs []Reservation) error {
	c, err := nft.NewConn()
	if err != nil {
		return fmt.Errorf("hostport rules: netlink: %w", err)
	}
	for _, part := range chunks(rs) {
		table := c.AddTable(nft.InetTable(cfg.Network))
		known := map[string]*nftables.Set{}
		if err := queueElements(c, table, known, part, false); err != nil {
			return err
		}
		if err := queueElements(c, table, known, part, true); err != nil {
			return err
		}
		if err := b.flush(c, fmt.Sprintf("remove hostports of network %q", cfg.Network)); err != nil {
			if _, rerr := b.deleteKeys(cfg.Network, part); rerr != nil {
				return errors.Join(err, rerr)
			}
		}
	}
	return nil
}

func (nftablesBackend) home(cfg Config, k Key) string {
	return fmt.Sprintf("no element in nftables map %s of network %q", mapName(k), cfg.Network)
}

func (nftablesBackend) list(cfg Config, keys []Key) ([]Reservation, error) {
	c, err := nftables.New()
	if err != nil {
		return nil, fmt.Errorf("hostport rules: netlink: %w", err)
	}
	maps := []string{MapIPv4, MapIPv4Addr, MapIPv6, MapIPv6Addr}
	if keys != nil {
		maps = nil
		for _, k := range keys {
			if name := mapName(k); !slices.Contains(maps, name) {
				maps = append(maps, name)
			}
		}
	}
	return listElements(c, cfg.Network, maps...)
}

// allPresent tells whether the kernel holds exactly rs (key, destination and owner), reading
// through b only where rs's keys live: how an install whose answer was lost finds out whether
// its transaction committed.
func allPresent(b Backend, cfg Config, rs []Reservation) (bool, error) {
	keys := make([]Key, len(rs))
	for i, r := range rs {
		keys[i] = r.Key
	}
	kernel, err := b.list(cfg, keys)
	if err != nil {
		return false, err
	}
	for _, r := range rs {
		if !slices.Contains(kernel, r) {
			return false, nil
		}
	}
	return true, nil
}
