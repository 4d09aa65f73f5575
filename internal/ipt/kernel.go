package ipt

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/google/nftables"

	"github.com/kubenet-dev/kubenet/internal/nft"
)

// MayHaveTable tells, without running a tool, whether the kernel may hold the family's table
// name in the caller's network namespace: false only when neither kind of iptables has it.
// iptables-nft keeps its tables in nftables, under the same name in the family's nftables
// family; iptables-legacy lists the tables it has made in /proc/net/ip_tables_names (and the
// ip6_ one), which is missing while its module is not loaded. (/proc/net is the main thread's
// namespace; the calling thread's is read, through /proc/thread-self.) A chain can only be in
// an existing table, so a caller looking for one skips the tools (two execs of each family) when
// this says no; whatever cannot be read counts as maybe.
func (f Family) MayHaveTable(name string) bool {
	family, ok := f.onlyInNFTables(name)
	if !ok {
		return true
	}
	c, err := nft.NewConn()
	if err != nil {
		return true
	}
	found, err := nft.TableExistsWith(c, &nftables.Table{Name: name, Family: family})
	return err != nil || found
}

// listsLine tells whether the file at path has a line that is name; a missing file has none,
// unless its directory is missing too.
func listsLine(path, name string) (bool, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		// The list is missing while the legacy module is not loaded, but so is every file
		// under /proc/thread-self where that does not resolve (no procfs at /proc, or one of a
		// pid namespace this process is not in): then nothing is known of the legacy tables,
		// and a legacy tool's chains counted in nftables would read as missing for good.
		if _, err := os.Stat(filepath.Dir(path)); err != nil {
			return false, fmt.Errorf("%s unreadable: %w", filepath.Dir(path), err)
		}
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer f.Close()
	lines := bufio.NewScanner(f)
	for lines.Scan() {
		if lines.Text() == name {
			return true, nil
		}
	}
	return false, lines.Err()
}

// onlyInNFTables tells whether the family's table name can only be in nftables in the calling
// thread's namespace (iptables-nft's table of that name, in the returned nftables family): the
// legacy module lists no such table. False for ebtables, and when the list cannot be read.
func (f Family) onlyInNFTables(name string) (nftables.TableFamily, bool) {
	family, legacyNames := nftables.TableFamilyIPv4, "/proc/thread-self/net/ip_tables_names"
	switch f {
	case IPv4:
	case IPv6:
		family, legacyNames = nftables.TableFamilyIPv6, "/proc/thread-self/net/ip6_tables_names"
	default:
		return 0, false
	}
	legacy, err := listsLine(legacyNames, name)
	return family, !legacy && err == nil
}

// RuleCounts counts the rules of the named chains of table, by name; a chain that does not exist
// is not in the map. Where only iptables-nft can hold the table (onlyInNFTables) the kernel is
// asked over netlink, one dump per chain, nothing decoded: what the tool would list, without its
// process, which cost about a millisecond per chain however small the chain. Else the chains are
// listed with the tools (State.Chains). Counting is what STATUS needs: a chain that is gone or
// emptied, by a reload or a flush. (A node whose tools were switched from nft to legacy since
// kubenet last wrote, leaving kubenet's chains behind in nftables, counts those; the next write
// of the legacy tool makes its table, and from then on the tool is asked.)
func (s *State) RuleCounts(ctx context.Context, f Family, table string, names ...string) (map[string]int, error) {
	out := map[string]int{}
	if family, ok := f.onlyInNFTables(table); ok {
		t := &nftables.Table{Name: table, Family: family}
		for _, name := range names {
			n, exists, err := nft.ChainRuleCount(&nftables.Chain{Name: name, Table: t})
			if err != nil {
				return nil, fmt.Errorf("%s table %s: %w", f.command(), table, err)
			}
			if exists {
				out[name] = n
			}
		}
		return out, nil
	}
	t, err := s.Chains(ctx, f, table, names...)
	if err != nil {
		return nil, err
	}
	for name, rules := range t.Chains {
		out[name] = len(rules)
	}
	return out, nil
}
