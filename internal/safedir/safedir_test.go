package safedir

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// plant prepares a state directory with the traps an attacker with write access could set, and
// a victim file outside it that must never be read, written or removed through the traps.
func plant(t *testing.T) (state, victim string) {
	t.Helper()
	root := t.TempDir()
	state = filepath.Join(root, "state")
	outside := filepath.Join(root, "outside")
	for _, d := range []string{state, outside} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	victim = filepath.Join(outside, "secret")
	if err := os.WriteFile(victim, []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Symlink(victim, filepath.Join(state, "link-to-file")))
	must(os.Symlink(outside, filepath.Join(state, "link-to-dir")))
	must(os.Symlink("../outside/secret", filepath.Join(state, "relative-link")))
	must(os.Mkdir(filepath.Join(state, "a-dir"), 0o755))
	must(os.Symlink(victim, filepath.Join(state, "a-dir", "inner-link")))
	must(syscall.Mkfifo(filepath.Join(state, "fifo"), 0o600))
	must(os.WriteFile(filepath.Join(state, "plain"), []byte("ok"), 0o600))
	must(os.Mkdir(filepath.Join(state, "open-dir"), 0o777))
	must(os.Chmod(filepath.Join(state, "open-dir"), 0o777))
	return state, victim
}

func victimIntact(t *testing.T, victim string) {
	t.Helper()
	b, err := os.ReadFile(victim)
	if err != nil || string(b) != "secret" {
		t.Fatalf("the file outside the state directory was touched: %q %v", b, err)
	}
}

func TestNeverFollowsOrEscapes(t *testing.T) {
	cases := []struct {
		name string
		op   func(d *Dir) error
		want error // nil: must succeed
	}{
		{"read a symlink to a file outside", func(d *Dir) error { _, err := d.ReadFile("link-to-file"); return err }, ErrNotRegular},
		{"read a relative symlink out", func(d *Dir) error { _, err := d.ReadFile("relative-link"); return err }, ErrNotRegular},
		{"read a fifo without blocking", func(d *Dir) error { _, err := d.ReadFile("fifo"); return err }, ErrNotRegular},
		{"read a directory", func(d *Dir) error { _, err := d.ReadFile("a-dir"); return err }, ErrNotRegular},
		{"read with a path", func(d *Dir) error { _, err := d.ReadFile("../outside/secret"); return err }, errAny},
		{"read dot-dot", func(d *Dir) error { _, err := d.ReadFile(".."); return err }, errAny},
		{"read through a symlinked dir", func(d *Dir) error { _, err := d.ReadFile("link-to-dir/secret"); return err }, errAny},
		{"open a symlinked dir", func(d *Dir) error { _, err := d.Sub("link-to-dir", false, 0); return err }, errAny},
		{"create over a symlinked dir replaces the symlink", func(d *Dir) error {
			sub, err := d.Sub("link-to-dir", true, 0o755)
			if err != nil {
				return err
			}
			defer sub.Close()
			if entries, err := sub.ReadDir(); err != nil || len(entries) != 0 {
				return fmt.Errorf("the new directory holds %v %v", entries, err)
			}
			return nil
		}, nil},
		{"create over a file replaces the file", func(d *Dir) error { _, err := d.Sub("plain", true, 0o755); return err }, nil},
		{"open a dir others can write", func(d *Dir) error { _, err := d.Sub("open-dir", false, 0); return err }, ErrUntrusted},
		{"open a file as dir", func(d *Dir) error { _, err := d.Sub("plain", false, 0); return err }, errAny},
		{"lock-open a symlink with O_CREAT", func(d *Dir) error { _, err := d.OpenFile("link-to-file", os.O_RDWR|os.O_CREATE, 0o600); return err }, ErrNotRegular},
		{"lock-open a fifo", func(d *Dir) error { _, err := d.OpenFile("fifo", os.O_RDWR|os.O_CREATE, 0o600); return err }, ErrNotRegular},
		{"write-open a fifo nobody reads", func(d *Dir) error {
			_, err := d.OpenFile("fifo", os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
			return err
		}, ErrNotRegular},
		{"link onto a symlink", func(d *Dir) error { return d.Link("plain", "link-to-file") }, fs.ErrExist},
		{"write replaces the symlink, not its target", func(d *Dir) error { return d.WriteFile("link-to-file", []byte("new"), 0o600, true) }, nil},
		{"remove a symlink removes the link", func(d *Dir) error { return d.Remove("link-to-file") }, nil},
		{"remove-all a dir holding a symlink", func(d *Dir) error { return d.RemoveAll("a-dir") }, nil},
		{"remove-all a symlinked dir", func(d *Dir) error { return d.RemoveAll("link-to-dir") }, nil},
		{"read a plain file", func(d *Dir) error {
			b, err := d.ReadFile("plain")
			if err == nil && string(b) != "ok" {
				return errors.New("wrong content " + string(b))
			}
			return err
		}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			state, victim := plant(t)
			d, err := Open(state)
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			err = tc.op(d)
			switch {
			case tc.want == nil && err != nil:
				t.Fatalf("want success, got %v", err)
			case tc.want == errAny && err == nil, tc.want != nil && tc.want != errAny && !errors.Is(err, tc.want):
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			victimIntact(t, victim)
			if _, err := os.Stat(filepath.Dir(victim)); err != nil {
				t.Fatalf("the directory outside is gone: %v", err)
			}
		})
	}
}

// errAny marks cases where any error will do.
var errAny = errors.New("any error")

func TestOpenRefusesDirsOthersCanWrite(t *testing.T) {
	const other = 65534
	link := func(target, link string, owner int) string {
		t.Helper()
		if err := os.Symlink(target, link); err != nil {
			t.Fatal(err)
		}
		if err := os.Lchown(link, owner, owner); err != nil {
			t.Fatal(err)
		}
		return link
	}
	chown := func(dir string, owner int) string {
		t.Helper()
		if err := os.Chown(dir, owner, owner); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	sticky := os.ModeSticky | 0o777
	cases := []struct {
		name    string
		prepare func(root string) string // returns the state dir to open
		want    error                    // nil: opened
	}{
		{"private", func(root string) string { return mkdir(t, root, "s", 0o755) }, nil},
		{"world-writable", func(root string) string { return mkdir(t, root, "s", 0o777) }, ErrUntrusted},
		{"group-writable", func(root string) string { return mkdir(t, root, "s", 0o775) }, ErrUntrusted},
		{"below a world-writable parent", func(root string) string { return mkdir(t, mkdir(t, root, "p", 0o777), "s", 0o755) }, ErrUntrusted},
		{"below a sticky world-writable parent (/tmp)", func(root string) string { return mkdir(t, mkdir(t, root, "p", sticky), "s", 0o755) }, nil},
		{"a symlink to a private dir (the operator's choice)", func(root string) string {
			return link(mkdir(t, root, "s", 0o755), filepath.Join(root, "link"), 0)
		}, nil},
		{"a relative symlink with .. to a private dir", func(root string) string {
			mkdir(t, root, "s", 0o755)
			return link("../s", filepath.Join(mkdir(t, root, "a", 0o755), "link"), 0)
		}, nil},
		{"a symlink of ours in a sticky world-writable dir (/tmp)", func(root string) string {
			return link(mkdir(t, root, "s", 0o755), filepath.Join(mkdir(t, root, "p", sticky), "link"), 0)
		}, nil},
		{"a symlink another user owns in a private dir: only we may replace it", func(root string) string {
			return link(mkdir(t, root, "s", 0o755), filepath.Join(mkdir(t, root, "q", 0o755), "link"), other)
		}, nil},
		{"a symlink another user owns in a sticky world-writable dir (/tmp): they may repoint it", func(root string) string {
			return link(mkdir(t, root, "s", 0o755), filepath.Join(mkdir(t, root, "p", sticky), "link"), other)
		}, ErrUntrusted},
		{"our symlink to such a symlink", func(root string) string {
			evil := link(mkdir(t, root, "s", 0o755), filepath.Join(mkdir(t, root, "p", sticky), "evil"), other)
			return link(evil, filepath.Join(root, "link"), 0)
		}, ErrUntrusted},
		{"through a directory another user owns, to a private dir", func(root string) string {
			theirs := chown(mkdir(t, root, "theirs", 0o755), other)
			return link(mkdir(t, root, "s", 0o755), filepath.Join(theirs, "link"), other)
		}, ErrUntrusted},
		{"a loop of symlinks", func(root string) string {
			link(filepath.Join(root, "b"), filepath.Join(root, "a"), 0)
			return link(filepath.Join(root, "a"), filepath.Join(root, "b"), 0)
		}, syscall.ELOOP},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := tc.prepare(t.TempDir())
			d, err := Open(dir)
			if tc.want == nil {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				d.Close()
				return
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
		})
	}
}

func mkdir(t *testing.T, parent, name string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(parent, name)
	if err := os.Mkdir(p, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestWriteFileIsAtomicAndExact(t *testing.T) {
	d, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	for _, content := range []string{"first", "second, longer", ""} {
		if err := d.WriteFile("f", []byte(content), 0o600, true); err != nil {
			t.Fatal(err)
		}
		b, err := d.ReadFile("f")
		if err != nil || string(b) != content {
			t.Fatalf("read back %q %v, want %q", b, err, content)
		}
	}
	st, err := d.Lstat("f")
	if err != nil || st.Mode&0o777 != 0o600 {
		t.Fatalf("mode %o %v, want 0600", st.Mode&0o777, err)
	}
	entries, err := d.ReadDir()
	if err != nil || len(entries) != 1 {
		t.Fatalf("directory holds %v %v, want only f (no temporary file left)", entries, err)
	}
}

// TestMkdirAllAndSubCreate: missing directories are made (with their parents, and with the
// mode asked), existing ones opened as they are, and a file in the way is an error for MkdirAll.
func TestMkdirAllAndSubCreate(t *testing.T) {
	root := t.TempDir()
	nested := filepath.Join(root, "a", "b")
	cases := []struct {
		name    string
		do      func() (*Dir, error)
		path    string
		wantErr bool
	}{
		{"MkdirAll of a missing path", func() (*Dir, error) { return MkdirAll(nested, 0o750) }, nested, false},
		{"MkdirAll of an existing path", func() (*Dir, error) { return MkdirAll(nested, 0o700) }, nested, false},
		{"MkdirAll through a file", func() (*Dir, error) {
			if err := os.WriteFile(filepath.Join(root, "file"), nil, 0o600); err != nil {
				return nil, err
			}
			return MkdirAll(filepath.Join(root, "file", "c"), 0o755)
		}, "", true},
		{"MkdirAll through a symlink another user owns in a sticky dir makes nothing where it leads", func() (*Dir, error) {
			p := mkdir(t, root, "sticky", os.ModeSticky|0o777)
			evil := filepath.Join(p, "evil")
			if err := os.Symlink(mkdir(t, root, "target", 0o755), evil); err != nil {
				return nil, err
			}
			if err := os.Lchown(evil, 65534, 65534); err != nil {
				return nil, err
			}
			d, err := MkdirAll(filepath.Join(evil, "new", "deeper"), 0o755)
			if _, serr := os.Lstat(filepath.Join(root, "target", "new")); !errors.Is(serr, fs.ErrNotExist) {
				t.Errorf("a directory was made where the link leads: %v", serr)
			}
			if !errors.Is(err, ErrUntrusted) {
				t.Errorf("MkdirAll: %v, want %v", err, ErrUntrusted)
			}
			return d, err
		}, "", true},
		{"Sub creates a missing directory", func() (*Dir, error) {
			d, err := Open(nested)
			if err != nil {
				return nil, err
			}
			defer d.Close()
			return d.Sub("new", true, 0o750)
		}, filepath.Join(nested, "new"), false},
		{"Sub without create of a missing directory", func() (*Dir, error) {
			d, err := Open(nested)
			if err != nil {
				return nil, err
			}
			defer d.Close()
			return d.Sub("missing", false, 0o755)
		}, "", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d, err := tc.do()
			if tc.wantErr {
				if err == nil {
					d.Close()
					t.Fatal("no error")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			st, err := os.Stat(tc.path)
			if err != nil || !st.IsDir() || st.Mode().Perm() != 0o750 || d.Path() != tc.path {
				t.Errorf("%s: %v %v, path %q; want a directory of mode 0750 at %s", tc.name, st, err, d.Path(), tc.path)
			}
		})
	}
}
