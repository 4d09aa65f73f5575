package verblog

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestMain runs the tests, or, as a child of TestConcurrentProcesses, appends lines: the env
// says to which file, with which limit, as which writer, how many.
func TestMain(m *testing.M) {
	spec := os.Getenv("VERBLOG_WRITER")
	if spec == "" {
		os.Exit(m.Run())
	}
	f := strings.Split(spec, ",")
	maxBytes, _ := strconv.ParseInt(f[1], 10, 64)
	n, _ := strconv.Atoi(f[3])
	for i := range n {
		e := Entry{Time: time.Now(), Verb: "ADD", Container: f[2], Interface: strconv.Itoa(i), Result: &Result{IPs: []string{"10.244.1.2/24"}}}
		if err := Append(context.Background(), f[0], maxBytes, e); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	os.Exit(0)
}

// lines reads every line of path, failing the test on a line that is not one whole Entry.
func lines(t *testing.T, path string) []Entry {
	t.Helper()
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []Entry
	s := bufio.NewScanner(f)
	for s.Scan() {
		var e Entry
		if err := json.Unmarshal(s.Bytes(), &e); err != nil || e.Verb == "" {
			t.Fatalf("%s: line %q is not a whole entry: %v", path, s.Text(), err)
		}
		out = append(out, e)
	}
	return out
}

func TestAppend(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log", "kubenet.log") // the directory is created
	start := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	ok := Entry{Time: start, Verb: "ADD", Network: "kubenet", Container: "c1", Interface: "eth0", NetNS: "/run/netns/p", Pod: "default/web", DurationMs: 7.5, Result: &Result{IPs: []string{"10.244.1.2/24"}}}
	failed := Entry{Time: start, Verb: "DEL", Container: "c2", Error: &Error{Code: 7, Msg: strings.Repeat("x", 2*maxMsg)}}
	for _, e := range []Entry{ok, failed} {
		if err := Append(context.Background(), path, 1<<20, e); err != nil {
			t.Fatal(err)
		}
	}
	raw, _ := os.ReadFile(path)
	first := strings.SplitN(string(raw), "\n", 2)[0]
	want := `{"time":"2026-01-02T03:04:05Z","verb":"ADD","network":"kubenet","container":"c1","interface":"eth0","netns":"/run/netns/p","pod":"default/web","durationMs":7.5,"result":{"ips":["10.244.1.2/24"]}}`
	if first != want {
		t.Errorf("line\n got %s\nwant %s", first, want)
	}
	got := lines(t, path)
	if len(got) != 2 || got[1].Error == nil || got[1].Error.Code != 7 || len(got[1].Error.Msg) != maxMsg+3 {
		t.Errorf("entries %+v: want the DEL error with its message cut to %d bytes", got, maxMsg)
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o640 {
		t.Errorf("log mode %v, want 0640", st.Mode().Perm())
	}
}

// TestRotation: the file never passes the limit; when it would, it becomes <file>.1 (replacing
// the previous one) and the newest line starts the new file.
func TestRotation(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kubenet.log")
	const limit = 4096
	var last Entry
	for i := range 200 {
		last = Entry{Time: time.Unix(int64(i), 0).UTC(), Verb: "ADD", Container: fmt.Sprintf("c%03d", i)}
		if err := Append(context.Background(), path, limit, last); err != nil {
			t.Fatal(err)
		}
		for _, p := range []string{path, path + ".1"} {
			if st, err := os.Stat(p); err == nil && st.Size() > limit {
				t.Fatalf("after line %d %s holds %d bytes, over the limit %d", i, p, st.Size(), limit)
			}
		}
	}
	cur, old := lines(t, path), lines(t, path+".1")
	if len(old) == 0 || len(cur) == 0 {
		t.Fatalf("no rotation happened: %d lines, %d in .1", len(cur), len(old))
	}
	if cur[len(cur)-1].Container != last.Container {
		t.Errorf("newest line %+v, want %s", cur[len(cur)-1], last.Container)
	}
	// .1 holds the lines just before the current file's: one unbroken sequence.
	if a, b := old[len(old)-1].Container, cur[0].Container; a >= b {
		t.Errorf(".1 ends with %s, the file starts with %s: not consecutive", a, b)
	}
}

// TestConcurrentProcesses: plugin processes appending at once never interleave or lose lines,
// and with a small limit every file stays within it.
func TestConcurrentProcesses(t *testing.T) {
	const writers, each = 8, 150
	for _, c := range []struct {
		name  string
		limit int64
	}{{"no rotation: every line kept", 1 << 24}, {"rotating at 8 KiB", 8 << 10}} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "kubenet.log")
			var wg sync.WaitGroup
			errs := make(chan error, writers)
			for w := range writers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					cmd := exec.Command(os.Args[0])
					cmd.Env = append(os.Environ(), fmt.Sprintf("VERBLOG_WRITER=%s,%d,w%d,%d", path, c.limit, w, each))
					if out, err := cmd.CombinedOutput(); err != nil {
						errs <- fmt.Errorf("writer %d: %v: %s", w, err, out)
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			cur, old := lines(t, path), lines(t, path+".1")
			if c.limit == 1<<24 {
				seen := map[string]int{}
				for _, e := range cur {
					seen[e.Container+"/"+e.Interface]++
				}
				if len(cur) != writers*each || len(seen) != writers*each || len(old) != 0 {
					t.Errorf("%d lines (%d distinct), %d rotated; want %d, each once", len(cur), len(seen), len(old), writers*each)
				}
				return
			}
			for _, p := range []string{path, path + ".1"} {
				if st, err := os.Stat(p); err != nil || st.Size() > c.limit {
					t.Errorf("%s: %v, size over %d", p, err, c.limit)
				}
			}
			if len(old) == 0 {
				t.Error("no rotation happened")
			}
		})
	}
}
