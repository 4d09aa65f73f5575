package verblog

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kubenet-dev/kubenet/test/nettest"
)

// TestHostileLogPaths: whatever stands at the log path, its rotation target or its lock, and
// whoever may write the directories, Append follows no symbolic link, writes nothing outside
// the log's directory, returns promptly, and refuses a directory others may write (the rules
// of the data dir). The outside file and the missing outside path stand for what an attacker
// would have kubenet write or create.
func TestHostileLogPaths(t *testing.T) {
	const limit = 4096
	cases := []struct {
		name    string
		setup   func(t *testing.T, parent, logDir, path, outside, missing string)
		wantErr string // "": the line is logged
		after   func(t *testing.T, path string)
	}{
		{
			name:    "symlink at the log path to a file outside",
			setup:   func(t *testing.T, _, _, path, outside, _ string) { must(t, os.Symlink(outside, path)) },
			wantErr: "not a regular file",
			after:   isSymlink,
		},
		{
			name:    "symlink at the log path to a path outside that does not exist",
			setup:   func(t *testing.T, _, _, path, _, missing string) { must(t, os.Symlink(missing, path)) },
			wantErr: "not a regular file",
		},
		{
			name: "symlink at the rotation target: rotation replaces the link, not its target",
			setup: func(t *testing.T, _, _, path, outside, _ string) {
				bigLine(t, path, limit-20)
				must(t, os.Symlink(outside, path+".1"))
			},
			after: func(t *testing.T, path string) {
				if st, err := os.Lstat(path + ".1"); err != nil || !st.Mode().IsRegular() {
					t.Errorf("%s.1 after rotation: %v %v, want the rotated log", path, st, err)
				}
				if old := lines(t, path+".1"); len(old) != 1 || old[0].Container != "old" {
					t.Errorf("rotated log holds %+v, want the old line", old)
				}
			},
		},
		{
			name:    "symlink at the lock path to a file outside",
			setup:   func(t *testing.T, _, _, path, outside, _ string) { must(t, os.Symlink(outside, path+".lock")) },
			wantErr: "not a regular file",
		},
		{
			name:    "symlink at the lock path to a path outside that does not exist",
			setup:   func(t *testing.T, _, _, path, _, missing string) { must(t, os.Symlink(missing, path+".lock")) },
			wantErr: "not a regular file",
		},
		{
			name:    "fifo at the log path",
			setup:   func(t *testing.T, _, _, path, _, _ string) { must(t, unix.Mkfifo(path, 0o600)) },
			wantErr: "not a regular file",
		},
		{
			name:    "fifo at the lock path",
			setup:   func(t *testing.T, _, _, path, _, _ string) { must(t, unix.Mkfifo(path+".lock", 0o600)) },
			wantErr: "not a regular file",
		},
		{
			name:    "directory at the log path",
			setup:   func(t *testing.T, _, _, path, _, _ string) { must(t, os.Mkdir(path, 0o755)) },
			wantErr: "not a regular file",
		},
		{
			name: "directory at the rotation target: the line is dropped, the file stays within its limit",
			setup: func(t *testing.T, _, _, path, _, _ string) {
				bigLine(t, path, limit-20)
				must(t, os.Mkdir(path+".1", 0o755))
			},
			wantErr: "rotate",
			after: func(t *testing.T, path string) {
				if cur := lines(t, path); len(cur) != 1 {
					t.Errorf("log holds %d lines, want only the old one", len(cur))
				}
			},
		},
		{
			name:    "log directory writable by all",
			setup:   func(t *testing.T, _, logDir, _, _, _ string) { must(t, os.Chmod(logDir, 0o777)) },
			wantErr: "writable by others: mode 0777",
		},
		{
			name:    "log directory writable by all, sticky (as /tmp): refused as the data dir would be",
			setup:   func(t *testing.T, _, logDir, _, _, _ string) { must(t, os.Chmod(logDir, 0o777|os.ModeSticky)) },
			wantErr: "writable by others: mode 1777",
		},
		{
			name:    "log directory writable by its group",
			setup:   func(t *testing.T, _, logDir, _, _, _ string) { must(t, os.Chmod(logDir, 0o775)) },
			wantErr: "writable by others: mode 0775",
		},
		{
			name:    "log directory owned by another user",
			setup:   func(t *testing.T, _, logDir, _, _, _ string) { must(t, os.Chown(logDir, 65534, 65534)) },
			wantErr: "owned by uid 65534",
		},
		{
			name:    "a directory above writable by all, not sticky",
			setup:   func(t *testing.T, parent, _, _, _, _ string) { must(t, os.Chmod(parent, 0o777)) },
			wantErr: "writable by others: mode 0777",
		},
		{
			name: "log directory a symlink another user owns in a sticky directory: they may repoint it",
			setup: func(t *testing.T, parent, logDir, _, outside, _ string) {
				must(t, os.Chmod(parent, 0o777|os.ModeSticky))
				must(t, os.Remove(logDir))
				must(t, os.Symlink(filepath.Dir(outside), logDir))
				must(t, os.Lchown(logDir, 65534, 65534))
			},
			wantErr: "a symbolic link owned by uid 65534",
		},
		{
			name:  "a directory above writable by all and sticky (as /tmp): allowed",
			setup: func(t *testing.T, parent, _, _, _, _ string) { must(t, os.Chmod(parent, 0o777|os.ModeSticky)) },
		},
		{
			name: "log directory missing: created",
			setup: func(t *testing.T, _, logDir, _, _, _ string) {
				must(t, os.Remove(logDir))
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			base := t.TempDir()
			parent := filepath.Join(base, "parent")
			logDir := filepath.Join(parent, "log")
			must(t, os.MkdirAll(logDir, 0o755))
			must(t, os.Chmod(parent, 0o755)) // whatever the umask made of it
			must(t, os.Chmod(logDir, 0o755))
			elsewhere := filepath.Join(base, "elsewhere")
			must(t, os.Mkdir(elsewhere, 0o755))
			outside := filepath.Join(elsewhere, "precious")
			must(t, os.WriteFile(outside, []byte("precious\n"), 0o644))
			missing := filepath.Join(elsewhere, "created-by-kubenet")
			path := filepath.Join(logDir, "kubenet.log")
			tc.setup(t, parent, logDir, path, outside, missing)

			_, err := appendWithin(t, context.Background(), path, limit, entry("new"))
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("Append: %v, want the line logged", err)
				}
				if cur := lines(t, path); len(cur) == 0 || cur[len(cur)-1].Container != "new" {
					t.Errorf("log holds %+v, want the new line last", cur)
				}
			} else if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Append: %v, want an error saying %q", err, tc.wantErr)
			}
			if b, err := os.ReadFile(outside); err != nil || string(b) != "precious\n" {
				t.Errorf("the file outside now holds %q (%v)", b, err)
			}
			if _, err := os.Lstat(missing); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s was created (%v)", missing, err)
			}
			if entries, _ := os.ReadDir(elsewhere); len(entries) != 1 {
				t.Errorf("the directory outside holds %d entries, want only the precious file", len(entries))
			}
			if tc.after != nil {
				tc.after(t, path)
			}
		})
	}
}

// TestNoSpace: on a full file system a write fails half-way; the half line is taken back, so
// that once there is room again the next line starts a line of its own and every line of the
// log is whole. The file system is a small tmpfs, mounted in a mount namespace of a child
// process (the test binary again) so that the machine's mounts never change.
func TestNoSpace(t *testing.T) {
	if dir := os.Getenv("VERBLOG_NOSPACE_DIR"); dir != "" {
		noSpace(t, dir)
		return
	}
	nettest.RequireRoot(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestNoSpace$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), "VERBLOG_NOSPACE_DIR="+t.TempDir())
	// A mount namespace of its own; Go makes its mounts private, so nothing propagates back.
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS, Pdeathsig: syscall.SIGKILL}
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestNoSpace") {
		t.Fatalf("child: %v\n%s", err, out)
	}
	t.Logf("child:\n%s", out)
}
