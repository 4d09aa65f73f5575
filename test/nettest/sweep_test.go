package nettest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// startProcess starts a child that lives until killed and returns it with its creator tag.
func startProcess(t *testing.T) (*exec.Cmd, string) {
	t.Helper()
	cmd := exec.Command("sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	tag, err := creatorTag(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	return cmd, tag
}

func TestStaleCreator(t *testing.T) {
	own, err := creatorTag(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	pid, start, _ := strings.Cut(own, "-")
	dead, deadTag := startProcess(t)
	_ = dead.Process.Kill()
	_ = dead.Wait()
	for _, c := range []struct {
		name  string
		stale bool
	}{
		{nsPrefix + own + "-00aa", false},                                    // this process
		{nsPrefix + pid + "-1" + start + "-00aa", true},                      // this pid, another start: a reused pid
		{nsPrefix + deadTag + "-00aa", true},                                 // a process that exited
		{"cnitest-" + deadTag, false},                                        // someone else's naming
		{nsPrefix + "x-1-00aa", false},                                       // malformed pid
		{nsPrefix + deadTag, false},                                          // no random part
		{nsPrefix + strings.Replace(deadTag, "-", "-x", 1) + "-00aa", false}, // malformed start
	} {
		if got := staleCreator(c.name); got != c.stale {
			t.Errorf("staleCreator(%q) = %v, want %v", c.name, got, c.stale)
		}
	}
}

// TestSweepStaleNamespaces: the sweep removes exactly the test namespaces of processes that are
// gone; a live process's (another test run), this process's, and other names stay.
func TestSweepStaleNamespaces(t *testing.T) {
	RequireRoot(t)
	_, aliveTag := startProcess(t)
	victim, victimTag := startProcess(t)
	own, _ := creatorTag(os.Getpid())
	suffix := fmt.Sprintf("-%x", os.Getpid())
	names := map[string]bool{ // name -> removed by the sweep after victim dies
		nsPrefix + victimTag + suffix:   true,
		nsPrefix + aliveTag + suffix:    false,
		nsPrefix + own + suffix:         false,
		"kubenet-sweeptest" + suffix:    false,
		nsPrefix + "notapid-1" + suffix: false,
	}
	for name := range names {
		n, err := newNamedNS(name)
		if err != nil {
			t.Fatal(err)
		}
		n.Close()
		t.Cleanup(func() {
			if _, err := os.Stat(filepath.Join(nsRunDir, name)); err == nil {
				_ = RemoveNS(filepath.Join(nsRunDir, name))
			}
		})
	}
	var log bytes.Buffer
	if err := SweepStaleNamespaces(&log); err != nil {
		t.Fatal(err)
	}
	for name := range names {
		if _, err := os.Stat(filepath.Join(nsRunDir, name)); err != nil {
			t.Errorf("%s was removed while its creator lives: %v", name, err)
		}
	}
	_ = victim.Process.Kill()
	_ = victim.Wait()
	if err := SweepStaleNamespaces(&log); err != nil {
		t.Fatal(err)
	}
	for name, removed := range names {
		_, err := os.Stat(filepath.Join(nsRunDir, name))
		if gone := os.IsNotExist(err); gone != removed {
			t.Errorf("%s: removed=%v, want %v", name, gone, removed)
		}
	}
	if want := nsPrefix + victimTag + suffix; !strings.Contains(log.String(), want) {
		t.Errorf("sweep log %q does not name %s", log.String(), want)
	}
}

// TestSweepOnSignal: a test binary interrupted by SIGINT removes its own namespaces before it
// exits (its tests' cleanups never run). The helper below is this test binary run again.
func TestSweepOnSignal(t *testing.T) {
	RequireRoot(t)
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "KUBENET_SIGNAL_HELPER=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	lines := bufio.NewScanner(out)
	var path, named string
	for lines.Scan() {
		if p, ok := strings.CutPrefix(lines.Text(), "named "); ok {
			named = p
		}
		if p, ok := strings.CutPrefix(lines.Text(), "netns "); ok {
			path = p
			break
		}
	}
	if path == "" || named == "" {
		t.Fatalf("the helper made no namespace: %s", stderr.String())
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	go func() { _, _ = bufio.NewReader(out).WriteTo(&bytes.Buffer{}) }()
	err = cmd.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 130 {
		t.Errorf("helper ended with %v, want exit 130", err)
	}
	for _, p := range []string{path, named} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			_ = RemoveNS(p)
			t.Errorf("the interrupted run left %s (stat: %v); stderr: %s", p, err, stderr.String())
		}
	}
}

// TestMain runs the package's tests, or, in TestSweepOnSignal's child, the signal helper:
// watch for signals, make a namespace, print its path and wait to be interrupted.
func TestMain(m *testing.M) {
	if os.Getenv("KUBENET_SIGNAL_HELPER") != "1" {
		os.Exit(m.Run())
	}
	defer sweepOnSignal()()
	n, err := newMarkedNS()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// A namespace made by name, as the e2e clusters make theirs.
	named, err := newNamedNS(fmt.Sprintf("kubenet-k8s-sweeptest-%d-node1", os.Getpid()))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println("named " + named.Path())
	fmt.Println("netns " + n.Path())
	time.Sleep(time.Minute)
	os.Exit(1)
}
