// Package safedir gives access to kubenet's state directories without ever following a symbolic
// link below them and without ever leaving them. A Dir is an open directory; its methods take
// one name (a single path element) and work relative to the open directory with the *at system
// calls and openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS), so a symlink, a ".." or a directory
// swapped in by someone else is refused instead of followed. Open also refuses a directory that
// someone other than its owner (root or this process's user) may write to, one reached through
// such a directory, and one reached through a symbolic link that someone else may replace:
// whoever can write there could plant names for kubenet to trip over, or point the path
// elsewhere.
package safedir

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrUntrusted is wrapped by Open and Sub when a directory may be written by others.
var ErrUntrusted = errors.New("writable by others")

// ErrNotRegular is wrapped by ReadFile when the name is not a regular file (a symlink, a
// directory, a device, a fifo), or is one larger than MaxFileSize: nothing kubenet writes.
var ErrNotRegular = errors.New("not a regular file")

// MaxFileSize bounds what ReadFile reads: kubenet's state files are a few hundred bytes, and a
// huge (or sparse) file planted in the data dir must not exhaust the plugin's memory.
const MaxFileSize = 1 << 20

// Dir is an open directory.
type Dir struct {
	f    *os.File
	path string // for messages and for callers that need the path
}

// Open opens the directory at path, which must exist. Symbolic links in path itself are
// followed (where the state lives is the operator's choice), as long as nobody else can change
// where they lead (walk); nothing below it ever is. The directory must pass trusted.
func Open(path string) (*Dir, error) { return open(path, false, 0) }

func open(path string, create bool, perm os.FileMode) (*Dir, error) {
	fd, err := walk(path, create, perm)
	if err != nil {
		return nil, err
	}
	d := &Dir{f: os.NewFile(uintptr(fd), path), path: path}
	if err := d.trusted(); err != nil {
		d.Close()
		return nil, err
	}
	return d, nil
}

// maxLinks bounds the symbolic links one walk follows, as the kernel's 40.
const maxLinks = 40

// walk opens the directory at path one element at a time, resolving it as the kernel would, but
// through nothing that someone other than root or this process's user could change: every
// directory it passes through must pass checkTrust as an ancestor (a sticky one, as /tmp, may
// be writable by all), and in such a sticky directory a symbolic link is followed only when
// root or this user owns it (its owner may replace it at any moment). A link's target is walked
// by the same rules. The kernel's own resolution checks only the directory it ends at; a path
// through a directory or a link that another user controls could be pointed anywhere. With
// create, a missing directory is made (with perm) in the directory just checked.
func walk(path string, create bool, perm os.FileMode) (int, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return -1, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	fail := func(at string, err error) (int, error) {
		if at == path {
			return -1, &fs.PathError{Op: "open", Path: path, Err: err}
		}
		return -1, fmt.Errorf("open %s: %w", path, &fs.PathError{Op: "walk", Path: at, Err: err})
	}
	root := func() (int, error) { return unix.Open("/", unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0) }
	cur, err := root()
	if err != nil {
		return fail("/", err)
	}
	curPath, rest, links := "/", strings.Split(abs, "/"), 0
	for len(rest) > 0 {
		name := rest[0]
		rest = rest[1:]
		if name == "" || name == "." {
			continue
		}
		var dir unix.Stat_t
		if err := unix.Fstat(cur, &dir); err != nil {
			unix.Close(cur)
			return fail(curPath, err)
		}
		if err := checkTrust(curPath, &dir, true); err != nil {
			unix.Close(cur)
			return -1, fmt.Errorf("above %s: %w", path, err)
		}
		next := filepath.Join(curPath, name)
		var st unix.Stat_t
		if name != ".." {
			err := unix.Fstatat(cur, name, &st, unix.AT_SYMLINK_NOFOLLOW)
			if create && errors.Is(err, unix.ENOENT) {
				// One that another process made meanwhile will do: if it is not ours, the
				// next check refuses it.
				if err = unix.Mkdirat(cur, name, uint32(perm.Perm())); err == nil || errors.Is(err, unix.EEXIST) {
					err = unix.Fstatat(cur, name, &st, unix.AT_SYMLINK_NOFOLLOW)
				}
			}
			if err != nil {
				unix.Close(cur)
				return fail(next, err)
			}
		}
		if st.Mode&unix.S_IFMT == unix.S_IFLNK {
			links++
			target, err := readLink(cur, name, &dir, &st)
			if err == nil && links > maxLinks {
				err = unix.ELOOP
			}
			if err != nil {
				unix.Close(cur)
				return fail(next, err)
			}
			if filepath.IsAbs(target) {
				unix.Close(cur)
				if cur, err = root(); err != nil {
					return fail("/", err)
				}
				curPath = "/"
			}
			rest = append(strings.Split(target, "/"), rest...)
			continue
		}
		// O_NOFOLLOW: a link swapped in since the look is refused, not followed.
		fd, err := unix.Openat(cur, name, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
		unix.Close(cur)
		if err != nil {
			return fail(next, err)
		}
		cur, curPath = fd, next
	}
	return cur, nil
}

// readLink reads the symbolic link name in the directory dirFd (dir, its stat) whose own stat
// is st, refusing it when its owner is someone else and the directory lets its owner replace
// it (sticky and writable by others).
func readLink(dirFd int, name string, dir, st *unix.Stat_t) (string, error) {
	if dir.Mode&0o022 != 0 && st.Uid != 0 && int(st.Uid) != os.Geteuid() {
		return "", fmt.Errorf("%w: a symbolic link owned by uid %d in a directory others may write", ErrUntrusted, st.Uid)
	}
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlinkat(dirFd, name, buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}

// MkdirAll creates path and its missing parents with perm (like os.MkdirAll), then opens it;
// the directories are made on the way of Open's walk, so never where a link that others may
// repoint leads. A path that exists is opened without a look first: every verb opens the data
// dir.
func MkdirAll(path string, perm os.FileMode) (*Dir, error) {
	d, err := Open(path)
	if !errors.Is(err, fs.ErrNotExist) {
		return d, err
	}
	return open(path, true, perm)
}

// Path is the directory's path.
func (d *Dir) Path() string { return d.path }

// Join is the path of name inside the directory, for messages.
func (d *Dir) Join(name string) string { return filepath.Join(d.path, name) }

// Fd is the directory's descriptor (valid until Close).
func (d *Dir) Fd() int { return int(d.f.Fd()) }

// Close closes the directory.
func (d *Dir) Close() error { return d.f.Close() }

// checkName refuses anything but one path element.
func checkName(name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00") {
		return fmt.Errorf("%q is not a file name", name)
	}
	return nil
}

func (d *Dir) pathErr(op, name string, err error) error {
	return &fs.PathError{Op: op, Path: d.Join(name), Err: err}
}

// openBeneath opens name inside d without following any symlink and without leaving d.
func (d *Dir) openBeneath(name string, flags uint64, mode uint64) (int, error) {
	if err := checkName(name); err != nil {
		return -1, d.pathErr("open", name, err)
	}
	return d.openat2(name, flags, mode)
}

func (d *Dir) openat2(name string, flags uint64, mode uint64) (int, error) {
	for {
		fd, err := unix.Openat2(d.Fd(), name, &unix.OpenHow{
			Flags:   flags | unix.O_CLOEXEC | unix.O_NOFOLLOW,
			Mode:    mode,
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
		})
		if errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN) {
			continue // openat2 returns EAGAIN when a rename raced the lookup
		}
		if err != nil {
			return -1, d.pathErr("open", name, err)
		}
		return fd, nil
	}
}

// Sub opens the directory name inside d, creating it with perm first when create is set. With
// create, something else in its place (a symlink, a file) is replaced by the directory: Remove
// never removes a directory, so a directory another process made in the meantime stays. Without
// create it is an error.
func (d *Dir) Sub(name string, create bool, perm os.FileMode) (*Dir, error) {
	// Opened first: the directory exists on every call but a network's first.
	fd, err := d.openBeneath(name, unix.O_DIRECTORY|unix.O_RDONLY, 0)
	if create && errors.Is(err, fs.ErrNotExist) {
		fd, err = d.mkdirOpen(name, perm)
	}
	if create && IsNotDir(err) {
		if rerr := d.Remove(name); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
			return nil, err
		}
		fd, err = d.mkdirOpen(name, perm)
	}
	if err != nil {
		return nil, err
	}
	sub := &Dir{f: os.NewFile(uintptr(fd), d.Join(name)), path: d.Join(name)}
	if err := sub.trusted(); err != nil {
		sub.Close()
		return nil, err
	}
	return sub, nil
}

// mkdirOpen makes the directory name (one that another process made meanwhile will do) and
// opens it.
func (d *Dir) mkdirOpen(name string, perm os.FileMode) (int, error) {
	if err := unix.Mkdirat(d.Fd(), name, uint32(perm.Perm())); err != nil && !errors.Is(err, unix.EEXIST) {
		return -1, d.pathErr("mkdir", name, err)
	}
	return d.openBeneath(name, unix.O_DIRECTORY|unix.O_RDONLY, 0)
}

// OpenIn opens the directory name inside the directory at path (see Open for path). Missing, it
// is created when create is set and is (nil, nil) otherwise. Something that is not a directory
// in its place (a symlink, a file) is replaced either way: it cannot hold what the caller keeps
// there, and a lookup that fails on it would fail forever.
func OpenIn(path, name string, create bool) (*Dir, error) {
	root, err := Open(path)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	return root.OpenSub(name, create)
}

// OpenSub is OpenIn for a directory d already open: name inside it, (nil, nil) when missing and
// create is not set, and something that is not a directory in its place replaced either way.
// Through a d a caller holds open, no ancestor of d is walked again.
func (d *Dir) OpenSub(name string, create bool) (*Dir, error) {
	sub, err := d.Sub(name, create, 0o755)
	if !create && errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if !create && IsNotDir(err) {
		sub, err = d.Sub(name, true, 0o755)
	}
	return sub, err
}

// IsNotDir tells whether an error of Sub means that something other than a directory (a
// symlink, a file) stands under the name.
func IsNotDir(err error) bool {
	return errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.EXDEV)
}

// trusted checks that the directory is one, owned by root or by this process's user, and not
// writable by group or others.
func (d *Dir) trusted() error {
	var st unix.Stat_t
	if err := unix.Fstat(d.Fd(), &st); err != nil {
		return &fs.PathError{Op: "stat", Path: d.path, Err: err}
	}
	return checkTrust(d.path, &st, false)
}

func checkTrust(path string, st *unix.Stat_t, ancestor bool) error {
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return &fs.PathError{Op: "open", Path: path, Err: unix.ENOTDIR}
	}
	if st.Uid != 0 && int(st.Uid) != os.Geteuid() {
		return &fs.PathError{Op: "open", Path: path, Err: fmt.Errorf("%w: owned by uid %d", ErrUntrusted, st.Uid)}
	}
	// A sticky directory (/tmp) lets others create names but not touch ours; that is fine above
	// the state, never for the state directories themselves.
	if st.Mode&0o022 != 0 && !(ancestor && st.Mode&unix.S_ISVTX != 0) {
		return &fs.PathError{Op: "open", Path: path, Err: fmt.Errorf("%w: mode %04o", ErrUntrusted, st.Mode&0o7777)}
	}
	return nil
}

// ReadFile returns the content of the regular file name. A symlink, a directory or any other
// kind of file in its place gives an error wrapping ErrNotRegular; a missing one fs.ErrNotExist.
func (d *Dir) ReadFile(name string) ([]byte, error) {
	// O_NONBLOCK: a fifo planted under the name must not block the open.
	fd, err := d.openBeneath(name, unix.O_RDONLY|unix.O_NONBLOCK, 0)
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.EXDEV) {
		return nil, d.pathErr("open", name, ErrNotRegular)
	}
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), d.Join(name))
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, d.pathErr("read", name, ErrNotRegular)
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err == nil && len(data) > MaxFileSize {
		return nil, d.pathErr("read", name, fmt.Errorf("%w: larger than %d bytes", ErrNotRegular, MaxFileSize))
	}
	return data, err
}

// OpenFile opens (with unix.O_CREAT in flags: creates) the regular file name without following
// a symlink; anything but a regular file in its place is an error wrapping ErrNotRegular.
func (d *Dir) OpenFile(name string, flags int, perm os.FileMode) (*os.File, error) {
	fd, err := d.openBeneath(name, uint64(flags)|unix.O_NONBLOCK, uint64(perm.Perm()))
	// ENXIO: a fifo without a reader opened for writing (O_NONBLOCK), or a unix socket.
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.EXDEV) || errors.Is(err, unix.EISDIR) || errors.Is(err, unix.ENXIO) {
		return nil, d.pathErr("open", name, ErrNotRegular)
	}
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), d.Join(name))
	st, err := f.Stat()
	if err == nil && !st.Mode().IsRegular() {
		err = d.pathErr("open", name, ErrNotRegular)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// CreateTemp creates a new file named prefix followed by random characters with data in it
// (synced to disk when durable) and returns its name. prefix should start with "." so that
// directory scans can tell temporary files from real ones.
func (d *Dir) CreateTemp(prefix string, data []byte, perm os.FileMode, durable bool) (string, error) {
	for range 100 {
		var r [6]byte
		if _, err := rand.Read(r[:]); err != nil {
			return "", err
		}
		name := prefix + hex.EncodeToString(r[:])
		fd, err := d.openBeneath(name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, uint64(perm.Perm()))
		if errors.Is(err, unix.EEXIST) {
			continue
		}
		if err != nil {
			return "", err
		}
		f := os.NewFile(uintptr(fd), d.Join(name))
		_, err = f.Write(data)
		if err == nil {
			// The creation mode went through the umask; the file must have exactly perm.
			err = f.Chmod(perm.Perm())
		}
		if err == nil && durable {
			err = f.Sync()
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			_ = unix.Unlinkat(d.Fd(), name, 0)
			return "", err
		}
		return name, nil
	}
	return "", d.pathErr("create", prefix+"*", unix.EEXIST)
}

// Anon is a complete file that has no name yet: created with O_TMPFILE, it appears under a name
// only through Link, and a crash before that leaves nothing behind. Where the file system has no
// O_TMPFILE it is a temporary file (named with the prefix given to CreateAnon) that Close
// removes.
type Anon struct {
	d    *Dir
	f    *os.File
	temp string // the fallback's name; "" for an unnamed file
}

// CreateAnon makes an Anon in d holding data with mode perm, synced to disk when durable (so a
// name linked to it never shows less than data, whatever happens after).
func (d *Dir) CreateAnon(prefix string, data []byte, perm os.FileMode, durable bool) (*Anon, error) {
	fd, err := d.openat2(".", unix.O_TMPFILE|unix.O_WRONLY, uint64(perm.Perm()))
	if err != nil && !errors.Is(err, unix.EOPNOTSUPP) && !errors.Is(err, unix.EISDIR) && !errors.Is(err, unix.EINVAL) {
		return nil, err
	}
	a := &Anon{d: d}
	if err != nil {
		if a.temp, err = d.CreateTemp(prefix, data, perm, durable); err != nil {
			return nil, err
		}
		return a, nil
	}
	a.f = os.NewFile(uintptr(fd), d.Join("(unnamed)"))
	_, err = a.f.Write(data)
	if err == nil {
		err = a.f.Chmod(perm.Perm())
	}
	if err == nil && durable {
		err = a.f.Sync()
	}
	if err != nil {
		a.f.Close()
		return nil, err
	}
	return a, nil
}

// Link gives the file the name name in its directory; an existing name is an error wrapping
// fs.ErrExist (link(2) never replaces or follows). The file may be linked again under more names.
func (a *Anon) Link(name string) error {
	if err := checkName(name); err != nil {
		return a.d.pathErr("link", name, err)
	}
	if a.f == nil {
		return a.d.Link(a.temp, name)
	}
	err := unix.Linkat(int(a.f.Fd()), "", a.d.Fd(), name, unix.AT_EMPTY_PATH)
	if errors.Is(err, unix.EPERM) || errors.Is(err, unix.ENOENT) {
		// AT_EMPTY_PATH needs CAP_DAC_READ_SEARCH; the descriptor's /proc link does not.
		err = unix.Linkat(unix.AT_FDCWD, fmt.Sprintf("/proc/self/fd/%d", a.f.Fd()), a.d.Fd(), name, unix.AT_SYMLINK_FOLLOW)
	}
	if err != nil {
		return a.d.pathErr("link", name, err)
	}
	return nil
}

// Close lets go of the file: an unnamed one that was never linked disappears.
func (a *Anon) Close() error {
	if a.f == nil {
		if err := a.d.Remove(a.temp); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return nil
	}
	return a.f.Close()
}

// WriteFile replaces name atomically with data (synced when durable), so a crash leaves the old
// content or the new one. A new name is linked straight to an unnamed file (a crash leaves
// nothing else behind); an existing one is replaced by rename(2) from a temporary name, which
// replaces whatever name was (a symlink included) without following it.
func (d *Dir) WriteFile(name string, data []byte, perm os.FileMode, durable bool) error {
	if err := checkName(name); err != nil {
		return d.pathErr("write", name, err)
	}
	anon, err := d.CreateAnon(TempPrefix(name), data, perm, durable)
	if err != nil {
		return fmt.Errorf("write %s: %w", d.Join(name), err)
	}
	defer anon.Close()
	err = anon.Link(name)
	if err == nil || !errors.Is(err, fs.ErrExist) {
		return err
	}
	for range 100 {
		var r [6]byte
		if _, err := rand.Read(r[:]); err != nil {
			return err
		}
		tmp := TempPrefix(name) + hex.EncodeToString(r[:])
		if err := anon.Link(tmp); errors.Is(err, fs.ErrExist) {
			continue
		} else if err != nil {
			return fmt.Errorf("write %s: %w", d.Join(name), err)
		}
		if err := d.Rename(tmp, name); err != nil {
			_ = unix.Unlinkat(d.Fd(), tmp, 0)
			return fmt.Errorf("write %s: %w", d.Join(name), err)
		}
		return nil
	}
	return d.pathErr("write", name, unix.EEXIST)
}

// TempPrefix is the prefix of WriteFile's temporary files for name: a leading dot, so that
// directory scans skip them, and IsTemp recognises them.
func TempPrefix(name string) string { return "." + name + ".tmp-" }

// IsTemp tells whether a directory entry is a temporary file of WriteFile.
func IsTemp(name string) bool { return strings.HasPrefix(name, ".") && strings.Contains(name, ".tmp-") }

// Rename renames oldname to newname inside d, replacing newname.
func (d *Dir) Rename(oldname, newname string) error {
	if err := errors.Join(checkName(oldname), checkName(newname)); err != nil {
		return d.pathErr("rename", newname, err)
	}
	if err := unix.Renameat(d.Fd(), oldname, d.Fd(), newname); err != nil {
		return d.pathErr("rename", newname, err)
	}
	return nil
}

// Link makes newname a hard link of oldname inside d; it fails with an error wrapping
// fs.ErrExist when newname exists (whatever it is: link(2) never replaces or follows).
func (d *Dir) Link(oldname, newname string) error {
	if err := errors.Join(checkName(oldname), checkName(newname)); err != nil {
		return d.pathErr("link", newname, err)
	}
	if err := unix.Linkat(d.Fd(), oldname, d.Fd(), newname, 0); err != nil {
		return d.pathErr("link", newname, err)
	}
	return nil
}

// Remove removes the non-directory name (a symlink itself, never its target). A missing name is
// an error wrapping fs.ErrNotExist.
func (d *Dir) Remove(name string) error {
	if err := checkName(name); err != nil {
		return d.pathErr("remove", name, err)
	}
	if err := unix.Unlinkat(d.Fd(), name, 0); err != nil {
		return d.pathErr("remove", name, err)
	}
	return nil
}

// RemoveDir removes the empty directory name.
func (d *Dir) RemoveDir(name string) error {
	if err := checkName(name); err != nil {
		return d.pathErr("remove", name, err)
	}
	if err := unix.Unlinkat(d.Fd(), name, unix.AT_REMOVEDIR); err != nil {
		return d.pathErr("remove", name, err)
	}
	return nil
}

// RemoveAll removes name whatever it is: a file, a symlink (not its target), or a directory
// with everything below it, without following any symlink. A missing name is not an error.
func (d *Dir) RemoveAll(name string) error {
	err := d.Remove(name)
	if err == nil || errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if !errors.Is(err, unix.EISDIR) {
		return err
	}
	sub, err := d.Sub(name, false, 0)
	if err != nil {
		// A directory others may write is still ours to remove; open it without the trust check.
		fd, oerr := d.openBeneath(name, unix.O_DIRECTORY|unix.O_RDONLY, 0)
		if oerr != nil {
			return err
		}
		sub = &Dir{f: os.NewFile(uintptr(fd), d.Join(name)), path: d.Join(name)}
	}
	entries, err := sub.ReadDir()
	if err == nil {
		for _, e := range entries {
			if err = sub.RemoveAll(e.Name()); err != nil {
				break
			}
		}
	}
	sub.Close()
	if err != nil {
		return err
	}
	if err := d.RemoveDir(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// ReadDir lists the directory (without "." and ".."). Each entry's type is what the directory
// says (lstat's view: a symlink is a symlink).
func (d *Dir) ReadDir() ([]fs.DirEntry, error) {
	fd, err := unix.Openat(d.Fd(), ".", unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: d.path, Err: err}
	}
	f := os.NewFile(uintptr(fd), d.path)
	defer f.Close()
	entries, err := f.ReadDir(-1)
	if err != nil {
		return nil, err
	}
	return entries, nil
}

// Lstat returns the file information of name without following a symlink.
func (d *Dir) Lstat(name string) (unix.Stat_t, error) {
	var st unix.Stat_t
	if err := checkName(name); err != nil {
		return st, d.pathErr("lstat", name, err)
	}
	if err := unix.Fstatat(d.Fd(), name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return st, d.pathErr("lstat", name, err)
	}
	return st, nil
}
