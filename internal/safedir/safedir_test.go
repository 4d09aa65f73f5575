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
