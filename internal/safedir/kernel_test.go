package safedir

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/kubenet-dev/kubenet/test/nettest"
)

func TestOpenRefusesDirsOthersCanWrite(t *testing.T) {
	nettest.RequireRoot(t) // files owned by another user (65534) than the test's
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

// TestMkdirAllAndSubCreate: missing directories are made (with their parents, and with the
// mode asked), existing ones opened as they are, and a file in the way is an error for MkdirAll.
func TestMkdirAllAndSubCreate(t *testing.T) {
	nettest.RequireRoot(t) // files owned by another user (65534) than the test's
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
