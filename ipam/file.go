package ipam

import (
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"strconv"
	"strings"

	"github.com/containernetworking/cni/pkg/utils"
	"golang.org/x/sys/unix"

	"github.com/kubenet-dev/kubenet/internal/safedir"
)

// Names inside a network directory. Reservation files are named by their address.
const (
	cursorPrefix = "last_reserved_ip."
	// tempPrefix starts with a dot so that List (and host-local, which parses names as
	// addresses) never take a half-made file for a reservation.
	tempPrefix = ".kubenet-"
	lineBreak  = "\r\n" // host-local's separator between container ID and ifname
)

// owner is who a reservation file says holds its address. An empty ifname is a legacy file that
// holds only the container ID; host-local releases those by ID alone, and so do we.
type owner struct{ id, ifname string }

// checkOwner rejects IDs and ifnames that would not read back as written (host-local trims
// whitespace and splits on the line break) and an empty ID, which would match garbage files.
func checkOwner(id, ifname string) error {
	if id == "" || strings.TrimSpace(id) != id || strings.ContainsAny(id, "\r\n") {
		return fmt.Errorf("invalid container ID %q", id)
	}
	if strings.TrimSpace(ifname) != ifname || strings.ContainsAny(ifname, "\r\n") {
		return fmt.Errorf("invalid interface name %q", ifname)
	}
	return nil
}

func (o owner) content() []byte { return []byte(o.id + lineBreak + o.ifname) }

// holds reports whether the file belongs to (id, ifname), legacy ID-only files included.
func (o owner) holds(id, ifname string) bool {
	return o.id == id && (o.ifname == ifname || o.ifname == "")
}

func (o owner) String() string {
	if o.ifname == "" {
		return "container " + o.id
	}
	return "container " + o.id + " " + o.ifname
}

// parseOwner reads "<id>\r\n<ifname>" or a legacy "<id>". ok is false for content that no
// writer produces: empty (left by a crashed host-local), more than two lines, or an ID or an
// interface name that CNI would never have passed (host-local and kubenet only write what skel
// or the core validated), such as the bytes of a damaged disk block.
func parseOwner(data []byte) (o owner, ok bool) {
	id, ifname, _ := strings.Cut(strings.TrimSpace(string(data)), "\n")
	o = owner{strings.TrimSpace(id), strings.TrimSpace(ifname)}
	if utils.ValidateContainerID(o.id) != nil || o.ifname != "" && utils.ValidateInterfaceName(o.ifname) != nil {
		return owner{}, false
	}
	return o, true
}

// readOwner reads the reservation of a. The error wraps fs.ErrNotExist when a is free. Anything
// but a regular file under a's name (a symlink, a directory) holds a for nobody: ok is false.
func (s *Store) readOwner(a netip.Addr) (owner, bool, error) {
	data, err := s.root.ReadFile(a.String())
	if errors.Is(err, safedir.ErrNotRegular) {
		return owner{}, false, nil
	}
	if err != nil {
		return owner{}, false, err
	}
	o, ok := parseOwner(data)
	return o, ok, nil
}

// reservationAddr tells reservation names from everything else in the directory: the lock, the
// cursors, temporary files and names that are not canonical addresses (the allocator would never
// look at those, so they reserve nothing). A symlink or a directory under an address's name does
// take the address (link(2) fails on it), so it counts, and GC sees it as garbage.
func reservationAddr(e fs.DirEntry) (netip.Addr, bool) {
	name := e.Name()
	if strings.HasPrefix(name, ".") {
		return netip.Addr{}, false
	}
	a, err := netip.ParseAddr(name)
	if err != nil || a.String() != name {
		return netip.Addr{}, false
	}
	return a, true
}

// writeTemp makes a complete file with data that has no name yet (safedir.Anon): a crash before
// claim leaves nothing behind. With durable, the data reaches the disk before the file can be
// linked anywhere.
func (s *Store) writeTemp(kind string, data []byte, durable bool) (*safedir.Anon, error) {
	return s.root.CreateAnon(tempPrefix+kind+"-", data, 0o600, durable)
}

// removeTemp lets go of a file of writeTemp (after use or on failure).
func (s *Store) removeTemp(f *safedir.Anon) { _ = f.Close() }

// claim makes the complete file tmp appear under a's name, or fails with an error wrapping
// fs.ErrExist if a is taken. link(2) never replaces a name, so unlike host-local's
// create-then-write there is no moment at which an empty reservation exists.
func (s *Store) claim(tmp *safedir.Anon, a netip.Addr) error {
	return tmp.Link(a.String())
}

func cursorName(setIndex int) string { return cursorPrefix + strconv.Itoa(setIndex) }

// readCursor returns the last reserved address of a set, or the zero Addr. The cursor only
// decides where the search starts, so a missing or damaged one just restarts at the beginning.
func (s *Store) readCursor(setIndex int) netip.Addr {
	data, err := s.root.ReadFile(cursorName(setIndex))
	if err != nil {
		return netip.Addr{}
	}
	a, err := netip.ParseAddr(strings.TrimSpace(string(data)))
	if err != nil {
		return netip.Addr{}
	}
	return a
}

// writeCursor rewrites the cursor in place. It is not synced and not atomic: a cursor lost or
// cut short in a crash costs one search from the start (readCursor ignores what does not parse),
// not an extra file and fsync on every allocation.
func (s *Store) writeCursor(setIndex int, a netip.Addr) error {
	open := func() (*os.File, error) {
		return s.root.OpenFile(cursorName(setIndex), unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC, 0o600)
	}
	f, err := open()
	if errors.Is(err, safedir.ErrNotRegular) {
		// A symlink or a fifo in its place is replaced, never followed (the caller holds the
		// lock); a directory is not removed: the allocation fails, and says why.
		if err = s.root.Remove(cursorName(setIndex)); err == nil {
			f, err = open()
		}
	}
	if err != nil {
		return fmt.Errorf("write cursor %d: %w", setIndex, err)
	}
	_, err = f.WriteString(a.String())
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write cursor %d: %w", setIndex, err)
	}
	return nil
}
