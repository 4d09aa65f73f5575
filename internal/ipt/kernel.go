package ipt

import (
	"bufio"
	"errors"
	"io/fs"
	"os"

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
	family, legacyNames := nftables.TableFamilyIPv4, "/proc/thread-self/net/ip_tables_names"
	switch f {
	case IPv4:
	case IPv6:
		family, legacyNames = nftables.TableFamilyIPv6, "/proc/thread-self/net/ip6_tables_names"
	default:
		return true
	}
	if legacy, err := listsLine(legacyNames, name); legacy || err != nil {
		return true
	}
	c, err := nft.NewConn()
	if err != nil {
		return true
	}
	found, err := nft.TableExistsWith(c, &nftables.Table{Name: name, Family: family})
	return err != nil || found
}

// listsLine tells whether the file at path has a line that is name; a missing file has none.
func listsLine(path, name string) (bool, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
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
