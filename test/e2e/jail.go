package e2e

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/kubenet-dev/kubenet/test/nettest"
)

// Jail is where a container runtime runs during a test: a private mount namespace and PID
// namespace whose PID 1 (a small shell) was started inside a node's network namespace. Every
// process the runtime starts (shims, conmon, runc, containers) lives in the jail's PID
// namespace, so ending PID 1 ends them all; every mount it makes (overlay root filesystems,
// netns bind mounts, its tmpfs state) lives in the jail's mount namespace, so none of it shows
// on the machine; and /run and /var/lib are fresh tmpfs inside, so defaults the configuration
// does not reach (libcni's cache in /var/lib/cni, runc's and podman's run dirs) cannot leave
// files behind either. Its network namespace is the node's: pods' bridge, rules and traffic
// stay there.
type Jail struct {
	// CgroupParent is a cgroup (v1, cgroupfs driver) unique to this jail under which the
	// runtime must place pods and containers; the jail removes it at the end.
	CgroupParent string

	holder *proc
	uts    bool // the jail has its own UTS namespace
	closed bool
}

// Bind is a directory bind-mounted over a path inside the jail (e.g. a private
// /etc/containers), so the runtime reads the test's files where it expects its system's.
type Bind struct {
	Source, Target string
	// Create makes Target first when missing: only for a target inside an Overlay, where
	// that writes to the overlay's upper directory, never to the machine's.
	Create bool
}

// Overlay makes a directory of the machine (Target, e.g. /etc) writable inside the jail: an
// overlay whose lower layer is the machine's directory and whose changes land in Upper, so a
// daemon may create /etc/cni/net.d or /opt/cni/bin without touching the machine's.
type Overlay struct{ Target, Upper, Work string }

// JailConfig says what a jail holds beyond its private mount and PID namespaces and its fresh
// /run and /var/lib.
type JailConfig struct {
	// Hostname, when set, gives the jail a UTS namespace of its own with that host name: a
	// node's daemons and host-network pods see the node's name, not the machine's.
	Hostname string
	// NetnsSys mounts a sysfs of the jail's network namespace over /sys (so /sys/class/net
	// lists the node's links) with the machine's cgroup hierarchies bound back in.
	NetnsSys bool
	// Overlays are applied first, then Binds (so a bind may land inside an overlay).
	Overlays []Overlay
	Binds    []Bind
	// CgroupParent is the cgroup the jail removes at the end (a daemon places its pods and
	// containers below it); empty: a random one.
	CgroupParent string
}

// NewJail starts a jail inside netns. It stops at cleanup: SIGTERM to PID 1 (the kernel then
// kills every other process in the PID namespace), SIGKILL if that takes too long, and the
// removal of the jail's cgroups.
func NewJail(t testing.TB, netns ns.NetNS, binds ...Bind) *Jail {
	t.Helper()
	return StartJail(t, netns, JailConfig{Binds: binds})
}

// StartJail starts a jail inside netns as cfg says; it stops at cleanup like NewJail's, or
// earlier with Kill.
func StartJail(t testing.TB, netns ns.NetNS, cfg JailConfig) *Jail {
	t.Helper()
	j := &Jail{CgroupParent: cfg.CgroupParent}
	if j.CgroupParent == "" {
		var suffix [4]byte
		_, _ = rand.Read(suffix[:])
		j.CgroupParent = "/kubenet-e2e-" + hex.EncodeToString(suffix[:])
	}

	script := []string{
		"set -eu",
		// The new mount namespace starts with copies of the machine's mounts and their shared
		// propagation: make them private first, so nothing below propagates back.
		"mount --make-rprivate /",
		"mount -t proc proc /proc",
		"mount -t tmpfs -o mode=0755 tmpfs /run",
		"mount -t tmpfs -o mode=0755 tmpfs /var/lib",
	}
	if cfg.Hostname != "" {
		script = append(script, fmt.Sprintf("hostname %q", cfg.Hostname))
	}
	if cfg.NetnsSys {
		// sysfs shows the links of the namespace of the process that mounts it; the cgroup
		// hierarchies below the machine's /sys are carried over through /run.
		script = append(script,
			"mkdir /run/.machine-sys",
			"mount --rbind /sys /run/.machine-sys",
			"mount -t sysfs sysfs /sys",
			"mount --rbind /run/.machine-sys/fs/cgroup /sys/fs/cgroup",
			"umount -l /run/.machine-sys",
			"rmdir /run/.machine-sys",
		)
	}
	for _, o := range cfg.Overlays {
		script = append(script, fmt.Sprintf("mount -t overlay overlay -o lowerdir=%s,upperdir=%s,workdir=%s %s", o.Target, o.Upper, o.Work, o.Target))
	}
	for _, b := range cfg.Binds {
		if b.Create {
			script = append(script, fmt.Sprintf("mkdir -p %q", b.Target))
		}
		script = append(script, fmt.Sprintf("mount --bind %q %q", b.Source, b.Target))
	}
	script = append(script,
		// PID 1 ignores signals it has no handler for; this one ends the jail on SIGTERM.
		// Waiting in a loop also reaps the orphans (exited shims) the kernel hands to PID 1.
		"trap 'exit 0' TERM",
		"echo ready",
		"while :; do sleep 1000 & wait $!; done",
	)
	flags := syscall.CLONE_NEWNS | syscall.CLONE_NEWPID
	if cfg.Hostname != "" {
		flags |= syscall.CLONE_NEWUTS
		j.uts = true
	}
	cmd := exec.Command("bash", "-c", strings.Join(script, "\n"))
	// Pdeathsig: should the test binary itself die (a go test timeout skips cleanups), the
	// kernel kills PID 1 and with it the whole jail. It fires when the forking thread exits, so
	// the jail is forked from a thread that lives exactly as long as the jail.
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: uintptr(flags), Pdeathsig: syscall.SIGKILL}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	// The child inherits the network namespace of the thread that forks it.
	exited, err := nettest.StartOnOwnThread(netns, cmd)
	if err != nil {
		t.Fatalf("start jail: %v", err)
	}
	j.holder = watchWaited(cmd, exited)
	t.Cleanup(func() { j.close(t) })

	ready := make(chan error, 1)
	go func() {
		line, err := bufio.NewReader(stdout).ReadString('\n')
		if err == nil && strings.TrimSpace(line) != "ready" {
			err = fmt.Errorf("unexpected %q", line)
		}
		ready <- err
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case err := <-ready:
		if err != nil {
			t.Fatalf("jail setup failed: %v: %s", err, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("jail setup did not finish within 30s: %s", stderr.String())
	}
	return j
}

// Pid is the jail's PID 1 as the machine sees it; /proc/<Pid>/root is the jail's file system.
func (j *Jail) Pid() int { return j.holder.cmd.Process.Pid }

// Kill ends every process of the jail at once (SIGKILL to PID 1, as a power cut would) and
// removes its cgroups; the jail's mounts go with it. The cleanup then has nothing left to do.
func (j *Jail) Kill() error {
	if j.closed {
		return nil
	}
	j.closed = true
	_ = j.holder.cmd.Process.Kill()
	if err := j.holder.wait(30 * time.Second); err != nil {
		return err
	}
	return removeCgroupWhenEmpty(j.CgroupParent, 30*time.Second)
}

// Command returns a command that runs name inside the jail: its mount, PID and network
// namespaces.
func (j *Jail) Command(name string, args ...string) *exec.Cmd {
	flags := []string{"-t", strconv.Itoa(j.holder.cmd.Process.Pid), "-m", "-p", "-n"}
	if j.uts {
		flags = append(flags, "-u")
	}
	return exec.Command("nsenter", append(append(flags, "--", name), args...)...)
}

// Run runs name inside the jail and returns its combined output, failing the test on error.
func (j *Jail) Run(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := j.Output(name, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Output runs name inside the jail and returns its combined output.
func (j *Jail) Output(name string, args ...string) (string, error) {
	out, err := j.Command(name, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// close ends the jail and removes its cgroups.
func (j *Jail) close(t testing.TB) {
	t.Helper()
	if j.closed {
		return
	}
	j.closed = true
	_ = j.holder.cmd.Process.Signal(syscall.SIGTERM)
	if err := j.holder.wait(20 * time.Second); err != nil {
		t.Errorf("jail: %v; killing it", err)
		_ = j.holder.cmd.Process.Kill()
		<-j.holder.exited
	}
	if err := removeCgroupWhenEmpty(j.CgroupParent, 30*time.Second); err != nil {
		t.Errorf("leak: %v", err)
	}
}

// removeCgroupWhenEmpty retries removeCgroup until timeout: the kernel takes a moment to empty
// the cgroups of processes that were just killed.
func removeCgroupWhenEmpty(parent string, timeout time.Duration) error {
	return nettest.Eventually(timeout, func() error { return removeCgroup(parent) })
}

// proc is a started process whose exit is awaited once, in the background.
type proc struct {
	cmd    *exec.Cmd
	exited chan struct{}
}

func watch(cmd *exec.Cmd) *proc {
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	return watchWaited(cmd, waited)
}

// watchWaited is watch for a command that someone else waits for; waited gets Wait's result.
func watchWaited(cmd *exec.Cmd, waited <-chan error) *proc {
	p := &proc{cmd: cmd, exited: make(chan struct{})}
	go func() {
		<-waited
		close(p.exited)
	}()
	return p
}

// wait waits for the process to exit, at most timeout.
func (p *proc) wait(timeout time.Duration) error {
	select {
	case <-p.exited:
		return nil
	case <-time.After(timeout):
		return fmt.Errorf("pid %d still running after %s", p.cmd.Process.Pid, timeout)
	}
}

// cgroupRoot is where cgroup v1 hierarchies are mounted (cgroupfs driver, no systemd).
const cgroupRoot = "/sys/fs/cgroup"

// removeCgroup removes the cgroup directory parent, and every cgroup below it, from each
// hierarchy, deepest first (a cgroup can only be removed with rmdir once it is empty). It fails
// when a cgroup still has processes.
func removeCgroup(parent string) error {
	hierarchies, err := os.ReadDir(cgroupRoot)
	if err != nil {
		return fmt.Errorf("cgroups: %w", err)
	}
	var errs []error
	for _, h := range hierarchies {
		root := filepath.Join(cgroupRoot, h.Name(), parent)
		if _, err := os.Stat(root); err != nil {
			continue
		}
		var dirs []string
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			if err := syscall.Rmdir(dirs[i]); err != nil && !errors.Is(err, syscall.ENOENT) {
				errs = append(errs, fmt.Errorf("cgroup %s: %w", dirs[i], err))
			}
		}
	}
	return errors.Join(errs...)
}

// Daemon is a long-running runtime process (containerd) started inside a jail.
type Daemon struct {
	Name    string
	LogFile string
	proc    *proc
	stopped bool
}

// StartDaemon starts name inside the jail with its output in logFile, and stops it at cleanup.
func (j *Jail) StartDaemon(t testing.TB, logFile, name string, args ...string) *Daemon {
	t.Helper()
	log, err := os.Create(logFile)
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	cmd := j.Command(name, args...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	d := &Daemon{Name: name, LogFile: logFile, proc: watch(cmd)}
	t.Cleanup(func() {
		if err := d.Stop(); err != nil {
			t.Error(err)
		}
		if t.Failed() {
			t.Logf("last lines of %s's log:\n%s", name, nettest.Tail(logFile, 40))
		}
	})
	return d
}

// Pid is the daemon's process ID in the machine's PID namespace: the child nsenter forked into
// the jail's PID namespace.
func (d *Daemon) Pid() (int, error) {
	p := d.proc.cmd.Process.Pid
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", p, p))
	if err != nil {
		return 0, fmt.Errorf("%s: children of nsenter %d: %w", d.Name, p, err)
	}
	fields := strings.Fields(string(b))
	if len(fields) != 1 {
		return 0, fmt.Errorf("%s: nsenter %d has children %q, want one", d.Name, p, fields)
	}
	return strconv.Atoi(fields[0])
}

// Exited tells whether the daemon's process has ended (by Stop, or on its own).
func (d *Daemon) Exited() bool {
	select {
	case <-d.proc.exited:
		return true
	default:
		return false
	}
}

// Stopped tells whether Stop was called.
func (d *Daemon) Stopped() bool { return d.stopped }

// Stop sends SIGTERM to the daemon by its pid and waits for it to exit, then SIGKILL if it has
// not exited within 30s.
func (d *Daemon) Stop() error {
	if d.stopped || d.Exited() {
		d.stopped = true
		return nil
	}
	d.stopped = true
	pid, err := d.Pid()
	if err != nil {
		_ = d.proc.cmd.Process.Kill()
		<-d.proc.exited
		return err
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		return fmt.Errorf("stop %s (pid %d): %w", d.Name, pid, err)
	}
	if err := d.proc.wait(30 * time.Second); err != nil {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		<-d.proc.exited
		return fmt.Errorf("%s did not stop on SIGTERM: %w", d.Name, err)
	}
	return nil
}
