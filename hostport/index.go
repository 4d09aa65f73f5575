package hostport

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/containernetworking/cni/pkg/utils"

	"github.com/kubenet-dev/kubenet/internal/safedir"
)

// IndexDirName is the directory, inside the network's data directory, that holds one small file
// per reservation:
//
//	kubenet-hostports/<protocol>-<port>/<hostIP>     e.g. tcp-8080/0.0.0.0, udp-53/2001:db8::1
//
// A conflict check for (protocol, port) reads one directory that holds at most one file per
// local address of the node, so it costs the same however many pods and ports the node has.
// Files are written atomically (temporary name, fsync, rename) under the network lock, like
// the address reservations next to them, and reached without following any symlink.
//
// A file whose content is not a reservation kubenet could have written (truncated, garbage, an
// owner or a destination that does not parse, a symlink or a directory in its place) is damaged:
// nobody can say from the file whose key it holds. It refuses its key to every new attachment
// (a conflict check fails closed), DEL asks the kernel's map element of the key whose it is, and
// GC repairs it from that element or removes it. It never makes an operation on other keys fail.
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
	Held Reservation // what stands in the way; a zero Owner: a damaged index file
}

func (e *ConflictError) Error() string {
	held := ""
	if e.Held.Key != e.Want {
		held = fmt.Sprintf(" (it overlaps %s)", e.Held.Key)
	}
	if e.Held.Owner == (Owner{}) {
		return fmt.Sprintf("%s is held by a damaged reservation file%s; GC removes it when no pod owns the port", e.Want, held)
	}
	return fmt.Sprintf("%s is already in use%s: held by container %q interface %q", e.Want, held, e.Held.Owner.ContainerID, e.Held.Owner.IfName)
}

// DamagedError is Lookup's error for a damaged reservation file.
type DamagedError struct {
	Key  Key
	Path string
	Err  error
}

func (e *DamagedError) Error() string {
	return fmt.Sprintf("hostport index %s: damaged reservation of %s: %v", e.Path, e.Key, e.Err)
}

func (e *DamagedError) Unwrap() error { return e.Err }

// Index is the reservation index of one network. Callers hold the network lock around every
// method: the check-then-write of Reserve is atomic only under it.
type Index struct{ networkDir string }

// NewIndex returns the index below the network's data directory.
func NewIndex(networkDir string) Index { return Index{networkDir: networkDir} }

// file is the JSON content of a reservation file. The key is in the path.
type file struct {
	Owner
	PodIP         netip.Addr `json:"podIP"`
	ContainerPort uint16     `json:"containerPort"`
}

func portDirName(protocol string, port uint16) string {
	return protocol + "-" + strconv.Itoa(int(port))
}

// parsePortDirName is the inverse of portDirName; false for anything else.
func parsePortDirName(name string) (string, uint16, bool) {
	protocol, portStr, ok := strings.Cut(name, "-")
	port, err := strconv.ParseUint(portStr, 10, 16)
	if _, known := protoNumber(protocol); !ok || err != nil || !known || port == 0 || portDirName(protocol, uint16(port)) != name {
		return "", 0, false
	}
	return protocol, uint16(port), true
}

// open opens the index directory (creating it when create is set); without create, a missing
// index is (nil, nil): it holds nothing. A symlink or a file in its place is replaced, never
// followed (safedir.OpenIn; callers hold the network lock).
func (ix Index) open(create bool) (*safedir.Dir, error) {
	d, err := safedir.OpenIn(ix.networkDir, IndexDirName, create)
	if err != nil {
		return nil, fmt.Errorf("hostport index: %w", err)
	}
	return d, nil
}

// openPort opens the (protocol, port) directory of the index; missing: (nil, nil) unless create.
// Something else in its place (a file, a symlink) is an error wrapping errDamagedDir.
func openPort(ixd *safedir.Dir, protocol string, port uint16, create bool) (*safedir.Dir, error) {
	d, err := ixd.Sub(portDirName(protocol, port), create, 0o755)
	switch {
	case err == nil:
		return d, nil
	case !create && errors.Is(err, fs.ErrNotExist):
		return nil, nil
	case safedir.IsNotDir(err), errors.Is(err, safedir.ErrUntrusted):
		return nil, fmt.Errorf("hostport index: %w: %v", errDamagedDir, err)
	}
	return nil, fmt.Errorf("hostport index: %w", err)
}

// errDamagedDir: something that is not a directory stands where a port's directory belongs.
var errDamagedDir = errors.New("not a directory")

// Lookup returns the reservation of exactly k, or ok=false when there is none. A damaged file
// gives a *DamagedError.
func (ix Index) Lookup(k Key) (r Reservation, ok bool, err error) {
	ixd, err := ix.open(false)
	if err != nil || ixd == nil {
		return Reservation{}, false, err
	}
	defer ixd.Close()
	return lookupIn(ixd, k)
}

func lookupIn(ixd *safedir.Dir, k Key) (Reservation, bool, error) {
	pd, err := openPort(ixd, k.Protocol, k.HostPort, false)
	if errors.Is(err, errDamagedDir) {
		return Reservation{}, false, &DamagedError{Key: k, Path: ixd.Join(portDirName(k.Protocol, k.HostPort)), Err: err}
	}
	if err != nil || pd == nil {
		return Reservation{}, false, err
	}
	defer pd.Close()
	return readReservation(pd, k)
}

// readReservation reads k's file in its port directory pd.
func readReservation(pd *safedir.Dir, k Key) (Reservation, bool, error) {
	name := k.HostIP.String()
	data, err := pd.ReadFile(name)
	if errors.Is(err, fs.ErrNotExist) {
		return Reservation{}, false, nil
	}
	if errors.Is(err, safedir.ErrNotRegular) {
		return Reservation{}, false, &DamagedError{Key: k, Path: pd.Join(name), Err: err}
	}
	if err != nil {
		return Reservation{}, false, fmt.Errorf("hostport index: %w", err)
	}
	r, err := parseReservation(k, data)
	if err != nil {
		return Reservation{}, false, &DamagedError{Key: k, Path: pd.Join(name), Err: err}
	}
	return r, true, nil
}

// parseReservation checks a file's content as strictly as a writer would have made it.
func parseReservation(k Key, data []byte) (Reservation, error) {
	var f file
	if err := json.Unmarshal(data, &f); err != nil {
		return Reservation{}, err
	}
	if err := f.Owner.Valid(); err != nil {
		return Reservation{}, err
	}
	if !f.PodIP.IsValid() || f.PodIP.Zone() != "" || f.PodIP.Is4In6() || f.PodIP.Is6() != k.Is6() || f.ContainerPort == 0 {
		return Reservation{}, fmt.Errorf("destination %s port %d does not fit %s", f.PodIP, f.ContainerPort, k)
	}
	return Reservation{Entry: Entry{Key: k, PodIP: f.PodIP, ContainerPort: f.ContainerPort}, Owner: f.Owner}, nil
}

// Valid tells whether o names an attachment the way CNI allows (container ID of letters, digits
// and "_.-"; a kernel interface name): only such owners are written, and only then is an element
// comment "<id>/<ifname>" unambiguous.
func (o Owner) Valid() error {
	if err := utils.ValidateContainerID(o.ContainerID); err != nil {
		return fmt.Errorf("owner container ID %q: %s", o.ContainerID, err.Msg)
	}
	if err := utils.ValidateInterfaceName(o.IfName); err != nil {
		return fmt.Errorf("owner interface name %q: %s", o.IfName, err.Msg)
	}
	return nil
}

// parseOwner reads an element comment (Owner.String); false for anything Owner.Valid refuses.
func parseOwner(comment string) (Owner, bool) {
	id, ifName, _ := strings.Cut(comment, "/")
	o := Owner{ContainerID: id, IfName: ifName}
	return o, o.Valid() == nil
}

// overlapping returns the reservations that overlap k and the keys of damaged files that may,
// reading only k's (protocol, port) directory. A damaged port directory counts as a damaged
// file of k.
func overlapping(ixd *safedir.Dir, k Key) ([]Reservation, []Key, error) {
	pd, err := openPort(ixd, k.Protocol, k.HostPort, false)
	if errors.Is(err, errDamagedDir) {
		return nil, []Key{k}, nil
	}
	if err != nil || pd == nil {
		return nil, nil, err
	}
	defer pd.Close()
	return reservationsIn(pd, k.Protocol, k.HostPort, k.overlaps)
}

// reservationsIn returns the reservations of the (protocol, port) directory pd whose key want
// accepts (nil: all), and the keys of its damaged files.
func reservationsIn(pd *safedir.Dir, protocol string, port uint16, want func(Key) bool) ([]Reservation, []Key, error) {
	entries, err := pd.ReadDir()
	if err != nil {
		return nil, nil, fmt.Errorf("hostport index: %w", err)
	}
	var keys []Key
	for _, e := range entries {
		if k, ok := keyFromName(protocol, port, e.Name()); ok && (want == nil || want(k)) {
			keys = append(keys, k)
		}
	}
	return sortOut(keys, func(k Key) (Reservation, bool, error) { return readReservation(pd, k) }, nil)
}

// sortOut reads each key with read and returns the reservations found that accept takes (nil:
// all) and the keys whose file is damaged; any other error stops it.
func sortOut(keys []Key, read func(Key) (Reservation, bool, error), accept func(Reservation) bool) ([]Reservation, []Key, error) {
	var out []Reservation
	var damaged []Key
	for _, k := range keys {
		r, found, err := read(k)
		var de *DamagedError
		switch {
		case errors.As(err, &de):
			damaged = append(damaged, k)
		case err != nil:
			return nil, nil, err
		case found && (accept == nil || accept(r)):
			out = append(out, r)
		}
	}
	return out, damaged, nil
}

// keyFromName parses a reservation file name. Temporary files (leading dot) and anything that
// is not a canonical address are not reservations.
func keyFromName(protocol string, port uint16, name string) (Key, bool) {
	if strings.HasPrefix(name, ".") {
		return Key{}, false
	}
	a, err := netip.ParseAddr(name)
	if err != nil || a.String() != name || a.Zone() != "" || a.Is4In6() {
		return Key{}, false
	}
	return Key{Protocol: protocol, HostPort: port, HostIP: a}, true
}

// Reserve records entries for owner, or changes nothing and returns a *ConflictError when one of
// them overlaps a reservation of another attachment or a damaged file. Reservations the owner
// already holds are rewritten (a retried ADD after a crash).
func (ix Index) Reserve(owner Owner, entries []Entry) error {
	if len(entries) == 0 {
		return nil
	}
	if err := owner.Valid(); err != nil {
		return fmt.Errorf("hostport index: %w", err)
	}
	ixd, err := ix.open(true)
	if err != nil {
		return err
	}
	defer ixd.Close()
	for _, e := range entries {
		held, damaged, err := overlapping(ixd, e.Key)
		if err != nil {
			return err
		}
		if len(damaged) > 0 {
			return &ConflictError{Want: e.Key, Held: Reservation{Entry: Entry{Key: damaged[0]}}}
		}
		for _, r := range held {
			if r.Owner != owner {
				return &ConflictError{Want: e.Key, Held: r}
			}
		}
	}
	if err := writeAll(ixd, owner, entries); err != nil {
		return errors.Join(err, ix.Release(owner, KeysOf(entries)))
	}
	return nil
}

// syncWorkers bounds the files writeAll writes (and syncs) at once.
const syncWorkers = 32

// writeAll writes owner's reservations of entries, up to syncWorkers at a time: one sync after
// another made a pod at the mapping limit hold the network lock for seconds on a busy disk.
func writeAll(ixd *safedir.Dir, owner Owner, entries []Entry) error {
	errs := make([]error, len(entries))
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(syncWorkers, len(entries)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				errs[i] = write(ixd, Reservation{Entry: entries[i], Owner: owner})
			}
		}()
	}
	for i := range entries {
		next <- i
	}
	close(next)
	wg.Wait()
	return errors.Join(errs...)
}

// rewrite writes r's file whatever stands under its name now (GC's repair of a damaged file;
// callers hold the network lock). A regular file is replaced atomically; anything else goes
// first.
func (ix Index) rewrite(r Reservation) error {
	ixd, err := ix.open(true)
	if err != nil {
		return err
	}
	defer ixd.Close()
	pd, err := openPort(ixd, r.Protocol, r.HostPort, false)
	if errors.Is(err, errDamagedDir) {
		if err := ixd.RemoveAll(portDirName(r.Protocol, r.HostPort)); err != nil {
			return wrapIndexErr(err)
		}
	} else if err != nil {
		return err
	}
	if pd != nil {
		if st, err := pd.Lstat(r.HostIP.String()); err == nil && st.Mode&syscall.S_IFMT != syscall.S_IFREG {
			err = pd.RemoveAll(r.HostIP.String())
			pd.Close()
			if err != nil {
				return wrapIndexErr(err)
			}
		} else {
			pd.Close()
		}
	}
	return write(ixd, r)
}

func write(ixd *safedir.Dir, r Reservation) error {
	pd, err := openPort(ixd, r.Protocol, r.HostPort, true)
	if err != nil {
		return err
	}
	defer pd.Close()
	data, err := json.Marshal(file{Owner: r.Owner, PodIP: r.PodIP, ContainerPort: r.ContainerPort})
	if err != nil {
		return err
	}
	if err := pd.WriteFile(r.HostIP.String(), data, 0o600, true); err != nil {
		return fmt.Errorf("hostport index: %w", err)
	}
	return nil
}

// Owned returns the reservations among keys that owner holds. Keys held by another attachment,
// by nobody or by a damaged file are left out: DEL of one attachment never touches what another
// one holds now.
func (ix Index) Owned(owner Owner, keys []Key) ([]Reservation, error) {
	owned, _, err := ix.owned(owner, keys)
	return owned, err
}

// owned is Owned that also returns the keys among keys whose file says nothing: damaged, or
// missing (a file lost with its element still in the kernel).
func (ix Index) owned(owner Owner, keys []Key) ([]Reservation, []Key, error) {
	if len(keys) == 0 {
		return nil, nil, nil
	}
	ixd, err := ix.open(false)
	if err != nil {
		return nil, nil, err
	}
	if ixd == nil {
		return nil, keys, nil
	}
	defer ixd.Close()
	var missing []Key
	owned, damaged, err := sortOut(keys, func(k Key) (Reservation, bool, error) {
		r, found, err := lookupIn(ixd, k)
		if err == nil && !found {
			missing = append(missing, k)
		}
		return r, found, err
	}, func(r Reservation) bool { return r.Owner == owner })
	return owned, append(damaged, missing...), err
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

// remove deletes the files of rs (whatever stands under their names: a damaged file too) and
// each (protocol, port) directory it leaves empty.
func (ix Index) remove(rs []Reservation) error {
	if len(rs) == 0 {
		return nil
	}
	ixd, err := ix.open(false)
	if err != nil || ixd == nil {
		return err
	}
	defer ixd.Close()
	var errs []error
	for _, r := range rs {
		errs = append(errs, removeKey(ixd, r.Key))
	}
	return errors.Join(errs...)
}

// removeKey removes k's file, then its port directory if that holds nothing else but temporary
// files that a killed writer left (callers hold the network lock: no writer is alive). A damaged
// port directory (a file in its place) goes as a whole.
func removeKey(ixd *safedir.Dir, k Key) error {
	dirName := portDirName(k.Protocol, k.HostPort)
	pd, err := openPort(ixd, k.Protocol, k.HostPort, false)
	if errors.Is(err, errDamagedDir) {
		return ixd.RemoveAll(dirName)
	}
	if err != nil || pd == nil {
		return err
	}
	defer pd.Close()
	if err := pd.RemoveAll(k.HostIP.String()); err != nil {
		return fmt.Errorf("hostport index: %w", err)
	}
	err = ixd.RemoveDir(dirName)
	if err == nil || !isNotEmptyOrGone(err) {
		return wrapIndexErr(err)
	}
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	// Another reservation of the port keeps the directory; temporary files do not.
	entries, err := pd.ReadDir()
	if err != nil {
		return fmt.Errorf("hostport index: %w", err)
	}
	for _, e := range entries {
		if !safedir.IsTemp(e.Name()) {
			return nil
		}
	}
	for _, e := range entries {
		if err := pd.Remove(e.Name()); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("hostport index: %w", err)
		}
	}
	if err := ixd.RemoveDir(dirName); err != nil && !isNotEmptyOrGone(err) {
		return fmt.Errorf("hostport index: %w", err)
	}
	return nil
}

func wrapIndexErr(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("hostport index: %w", err)
}

func isNotEmptyOrGone(err error) bool {
	return errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, syscall.EEXIST) || errors.Is(err, fs.ErrNotExist)
}

// All returns every readable reservation of the network (for GC, audits and re-installing
// elements; it reads the whole index). Damaged files are left out: see Damaged.
func (ix Index) All() ([]Reservation, error) {
	all, _, err := ix.scan()
	return all, err
}

// Damaged returns the keys of the damaged files of the index (damaged port directories count
// with the key of their wildcard address of both families).
func (ix Index) Damaged() ([]Key, error) {
	_, damaged, err := ix.scan()
	return damaged, err
}

// scan reads the whole index.
func (ix Index) scan() ([]Reservation, []Key, error) {
	ixd, err := ix.open(false)
	if err != nil || ixd == nil {
		return nil, nil, err
	}
	defer ixd.Close()
	entries, err := ixd.ReadDir()
	if err != nil {
		return nil, nil, fmt.Errorf("hostport index: %w", err)
	}
	var out []Reservation
	var damaged []Key
	for _, e := range entries {
		protocol, port, ok := parsePortDirName(e.Name())
		if !ok {
			continue
		}
		pd, err := openPort(ixd, protocol, port, false)
		if errors.Is(err, errDamagedDir) {
			damaged = append(damaged, Key{Protocol: protocol, HostPort: port, HostIP: netip.IPv4Unspecified()},
				Key{Protocol: protocol, HostPort: port, HostIP: netip.IPv6Unspecified()})
			continue
		}
		if err != nil {
			return nil, nil, err
		}
		if pd == nil {
			continue // removed while we were reading
		}
		rs, d, err := reservationsIn(pd, protocol, port, nil)
		pd.Close()
		if err != nil {
			return nil, nil, err
		}
		out = append(out, rs...)
		damaged = append(damaged, d...)
	}
	return out, damaged, nil
}

// RemoveTemp removes the temporary files that killed writers left in the index (callers hold
// the network lock, so no writer is alive), and each port directory that held nothing else.
func (ix Index) RemoveTemp() error {
	ixd, err := ix.open(false)
	if err != nil || ixd == nil {
		return err
	}
	defer ixd.Close()
	entries, err := ixd.ReadDir()
	if err != nil {
		return fmt.Errorf("hostport index: %w", err)
	}
	var errs []error
	for _, e := range entries {
		protocol, port, ok := parsePortDirName(e.Name())
		if !ok {
			continue
		}
		pd, err := openPort(ixd, protocol, port, false)
		if err != nil || pd == nil {
			continue // damaged directories are GC's through Damaged
		}
		files, err := pd.ReadDir()
		if err == nil {
			for _, f := range files {
				if safedir.IsTemp(f.Name()) {
					errs = append(errs, wrapIndexErr(pd.Remove(f.Name())))
				}
			}
		}
		pd.Close()
		if err := ixd.RemoveDir(e.Name()); err != nil && !isNotEmptyOrGone(err) {
			errs = append(errs, wrapIndexErr(err))
		}
	}
	return errors.Join(errs...)
}
