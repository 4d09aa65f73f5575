package nettest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
)

// Process is a long-running command (a daemon of a simulated cluster) started inside a network
// namespace, with its output in a log file. It is stopped by its pid at cleanup, and killed by
// the kernel if the test binary dies first. The child inherits the namespace of the thread that
// starts it, so it never sees the test's own namespace.
type Process struct {
	Name string
	Log  string // combined stdout and stderr
	cmd  *exec.Cmd
	done chan struct{}
	err  error // Wait's result, once done is closed
}

// StartProcess runs name with args inside n.
func StartProcess(t testing.TB, n ns.NetNS, log, name string, args ...string) *Process {
	t.Helper()
	out, err := os.OpenFile(log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	p := &Process{Name: name, Log: log, done: make(chan struct{})}
	p.cmd = exec.Command(name, args...)
	p.cmd.Stdout, p.cmd.Stderr = out, out
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	exited, err := StartOnOwnThread(n, p.cmd)
	if err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		p.err = <-exited
		close(p.done)
	}()
	t.Cleanup(func() {
		if err := p.Stop(); err != nil {
			t.Errorf("stop %s: %v", name, err)
		}
		if t.Failed() {
			t.Logf("last lines of %s's log %s:\n%s", name, log, Tail(log, 40))
		}
	})
	return p
}

// Pid is the process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Done is closed when the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Stop sends SIGTERM, waits up to 10 s, then sends SIGKILL. It returns nil when the process
// exited on the signal or cleanly, and is a no-op once the process has exited.
func (p *Process) Stop() error {
	select {
	case <-p.done:
		return nil
	default:
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("SIGTERM to pid %d: %w", p.Pid(), err)
	}
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("pid %d ignored SIGTERM for 10s and was killed", p.Pid())
	}
	var ee *exec.ExitError
	if p.err != nil && !(errors.As(p.err, &ee) && (ee.ExitCode() == 0 || ee.ExitCode() == -1)) {
		return fmt.Errorf("pid %d: %w", p.Pid(), p.err)
	}
	return nil
}

// Kill ends the process with SIGKILL, as a crash or an OOM kill would, and waits for it.
func (p *Process) Kill() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

// ErrExited is returned by WhileRunning when a process ended before the condition held.
var ErrExited = errors.New("process exited")

// WhileRunning polls f like Eventually, but gives up at once when one of procs exits: a daemon
// that crashed at start will never become ready, and its log says why.
func WhileRunning(timeout time.Duration, f func() error, procs ...*Process) error {
	var exited *Process
	err := Eventually(timeout, func() error {
		for _, p := range procs {
			select {
			case <-p.done:
				exited = p
				return nil
			default:
			}
		}
		return f()
	})
	if exited != nil {
		return fmt.Errorf("%w: %s (%v):\n%s", ErrExited, exited.Name, exited.err, Tail(exited.Log, 20))
	}
	return err
}

// Tail returns the last n lines of file (or why it cannot).
func Tail(file string, n int) string {
	b, err := os.ReadFile(file)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// StartOnOwnThread starts cmd inside n from a thread of its own and waits for it there; the
// channel receives Wait's result when the child exits. The thread enters n for good and lives
// exactly as long as the child, which matters with Pdeathsig: the signal follows the forking
// thread, not the process, and a thread shared with other goroutines could be retired early (the
// netns helpers end threads they tainted) and take the child with it. Set cmd.SysProcAttr's
// Pdeathsig so the kernel kills the child if the test binary dies first.
func StartOnOwnThread(n ns.NetNS, cmd *exec.Cmd) (<-chan error, error) {
	started := make(chan error, 1)
	exited := make(chan error, 1)
	go func() {
		// Never unlocked: the thread dies with this goroutine, after the child.
		runtime.LockOSThread()
		if err := n.Set(); err != nil {
			started <- fmt.Errorf("enter netns %s: %w", n.Path(), err)
			return
		}
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		exited <- cmd.Wait()
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return exited, nil
}
