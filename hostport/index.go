package hostport

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/kubenet-dev/kubenet/internal/atomicfile"
)

// IndexDirName is the directory, inside the network's data directory, that holds one small file
// per reservation:
//
//	kubenet-hostports/<protocol>-<port>/<hostIP>     e.g. tcp-8080/0.0.0.0, udp-53/2001:db8::1
//
// A conflict check for (protocol, port) reads one directory that holds at most one file per
// local address of the node, so it costs the same however many pods and ports the node has.
// Files are written atomically (temporary name, fsync, rename) under the network lock, like
// the address reservations next to them.
const IndexDirName = "kubenet-hostports"

// Reservation is an entry and the attachment that holds it: what a reservation file stores and
// what an nftables element carries in its comment.
type Reservation struct {
	Entry
	Owner Owner
}

// ConflictError reports a mapping whose key overlaps a reservation of another attachment.
type ConflictError struct {
	Want Key         // what the attachment asked for
	Held Reservation // what stands in the way
}

func (e *ConflictError) Error() string {
	held := ""
	if e.Held.Key != e.Want {
		held = fmt.Sprintf(" (it overlaps %s)", e.Held.Key)
	}
	return fmt.Sprintf("%s is already in use%s: held by container %q interface %q", e.Want, held, e.Held.Owner.ContainerID, e.Held.Owner.IfName)
}

// Index is the reservation index of one network. Callers hold the network lock around every
// method: the check-then-write of Reserve is atomic only under it.
type Index struct{ dir string }

// NewIndex returns the index below the network's data directory.
func NewIndex(networkDir string) Index { return Index{dir: filepath.Join(networkDir, IndexDirName)} }

// file is the JSON content of a reservation file. The key is in the path.
type file struct {
	Owner
	PodIP         netip.Addr `json:"podIP"`
	ContainerPort uint16     `json:"containerPort"`
}

func (ix Index) portDir(protocol string, port uint16) string {
	return filepath.Join(ix.dir, protocol+"-"+strconv.Itoa(int(port)))
}

func (ix Index) path(k Key) string {
	return filepath.Join(ix.portDir(k.Protocol, k.HostPort), k.HostIP.String())
}

// Lookup returns the reservation of exactly k, or ok=false when there is none.
func (ix Index) Lookup(k Key) (r Reservation, ok bool, err error) {
	data, err := os.ReadFile(ix.path(k))
	if errors.Is(err, fs.ErrNotExist) {
		return Reservation{}, false, nil
	}
	if err != nil {
		return Reservation{}, false, fmt.Errorf("hostport index: %w", err)
	}
	var f file
	if err := json.Unmarshal(data, &f); err != nil {
		return Reservation{}, false, fmt.Errorf("hostport index %s: %w", ix.path(k), err)
	}
	return Reservation{Entry: Entry{Key: k, PodIP: f.PodIP, ContainerPort: f.ContainerPort}, Owner: f.Owner}, true, nil
}

// overlapping returns the reservations that overlap k, reading only k's (protocol, port)
// directory.
func (ix Index) overlapping(k Key) ([]Reservation, error) {
	return ix.reservationsIn(ix.portDir(k.Protocol, k.HostPort), k.Protocol, k.HostPort, k.overlaps)
}

// reservationsIn returns the reservations of the (protocol, port) directory dir whose key want
// accepts (nil: all).
func (ix Index) reservationsIn(dir, protocol string, port uint16, want func(Key) bool) ([]Reservation, error) {
	names, err := readNames(dir)
	if err != nil {
		return nil, err
	}
	var out []Reservation
	for _, name := range names {
		k, ok := keyFromName(protocol, port, name)
		if !ok || want != nil && !want(k) {
			continue
		}
		r, found, err := ix.Lookup(k)
		if err != nil {
			return nil, err
		}
		if found {
			out = append(out, r)
		}
	}
	return out, nil
}

// readNames lists a directory; a missing directory is empty.
func readNames(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("hostport index: %w", err)
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names, nil
}

// keyFromName parses a reservation file name. Temporary files (leading dot) and anything that
// is not a canonical address are not reservations.
func keyFromName(protocol string, port uint16, name string) (Key, bool) {
	if strings.HasPrefix(name, ".") {
		return Key{}, false
	}
	a, err := netip.ParseAddr(name)
	if err != nil || a.String() != name {
		return Key{}, false
	}
	return Key{Protocol: protocol, HostPort: port, HostIP: a}, true
}

// Reserve records entries for owner, or changes nothing and returns a *ConflictError when one of
// them overlaps a reservation of another attachment. Reservations the owner already holds are
// rewritten (a retried ADD after a crash).
func (ix Index) Reserve(owner Owner, entries []Entry) error {
	for _, e := range entries {
		held, err := ix.overlapping(e.Key)
		if err != nil {
			return err
		}
		for _, r := range held {
			if r.Owner != owner {
				return &ConflictError{Want: e.Key, Held: r}
			}
		}
	}
	if err := ix.write(owner, entries); err != nil {
		return errors.Join(err, ix.Release(owner, KeysOf(entries)))
	}
	return nil
}

// write stores owner's reservations of entries, syncing the files together (atomicfile.WriteAll):
// one sync after another made a pod at the mapping limit hold the network lock for seconds on a
// busy disk.
func (ix Index) write(owner Owner, entries []Entry) error {
	files := make([]atomicfile.File, 0, len(entries))
	for _, e := range entries {
		if err := os.MkdirAll(ix.portDir(e.Protocol, e.HostPort), 0o755); err != nil {
			return fmt.Errorf("hostport index: %w", err)
		}
		data, err := json.Marshal(file{Owner: owner, PodIP: e.PodIP, ContainerPort: e.ContainerPort})
		if err != nil {
			return err
		}
		files = append(files, atomicfile.File{Path: ix.path(e.Key), Data: data})
	}
	if err := atomicfile.WriteAll(files, 0o600); err != nil {
		return fmt.Errorf("hostport index: %w", err)
	}
	return nil
}

// Owned returns the reservations among keys that owner holds. Keys held by another attachment
// or by nobody are left out: DEL of one attachment never touches what another one holds now.
func (ix Index) Owned(owner Owner, keys []Key) ([]Reservation, error) {
	var out []Reservation
	for _, k := range keys {
		r, ok, err := ix.Lookup(k)
		if err != nil {
			return nil, err
		}
		if ok && r.Owner == owner {
			out = append(out, r)
		}
	}
	return out, nil
}

// Release removes owner's reservations among keys, and each (protocol, port) directory it
// leaves empty.
func (ix Index) Release(owner Owner, keys []Key) error {
	owned, err := ix.Owned(owner, keys)
	if err != nil {
		return err
	}
	return ix.remove(owned)
}

func (ix Index) remove(rs []Reservation) error {
	var errs []error
	for _, r := range rs {
		if err := os.Remove(ix.path(r.Key)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("hostport index: %w", err))
			continue
		}
		// Only an empty directory can be removed; another reservation of the port keeps it.
		if err := os.Remove(ix.portDir(r.Protocol, r.HostPort)); err != nil && !isNotEmptyOrGone(err) {
			errs = append(errs, fmt.Errorf("hostport index: %w", err))
		}
	}
	return errors.Join(errs...)
}

func isNotEmptyOrGone(err error) bool {
	return errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, syscall.EEXIST) || errors.Is(err, fs.ErrNotExist)
}

// All returns every reservation of the network (for GC and audits; it reads the whole index).
func (ix Index) All() ([]Reservation, error) {
	dirs, err := readNames(ix.dir)
	if err != nil {
		return nil, err
	}
	var out []Reservation
	for _, d := range dirs {
		protocol, portStr, ok := strings.Cut(d, "-")
		port, err := strconv.ParseUint(portStr, 10, 16)
		if _, known := protoNumber(protocol); !ok || err != nil || !known {
			continue
		}
		rs, err := ix.reservationsIn(filepath.Join(ix.dir, d), protocol, uint16(port), nil)
		if err != nil {
			return nil, err
		}
		out = append(out, rs...)
	}
	return out, nil
}
