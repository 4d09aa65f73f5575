package ipam

import (
	"bufio"
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// checkUnique fails unless got holds want distinct addresses.
func checkUnique(t *testing.T, got []netip.Addr, want int) {
	t.Helper()
	sorted := slices.Clone(got)
	slices.SortFunc(sorted, netip.Addr.Compare)
	if n := len(slices.Compact(sorted)); n != want || len(got) != want {
		t.Fatalf("%d allocations, %d distinct; want %d distinct", len(got), n, want)
	}
}

// underLock runs job(s, i) for every i < n, spread over one goroutine per store, each call under
// that store's lock, and returns the first error.
func underLock(stores []*testStore, n int, job func(s *testStore, i int) error) error {
	jobs := make(chan int, n)
	for i := range n {
		jobs <- i
	}
	close(jobs)
	errs := make(chan error, len(stores))
	var wg sync.WaitGroup
	for _, s := range stores {
		wg.Go(func() {
			for i := range jobs {
				err := s.Lock()
				if err == nil {
					err = job(s, i)
					if uerr := s.Unlock(); err == nil {
						err = uerr
					}
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs // nil when the channel is empty
}

// TestConcurrentStores: 16 goroutines, each with its own Store (own open file description, so the
// flock excludes them like separate processes), share 200 allocations and then 200 releases.
func TestConcurrentStores(t *testing.T) {
	const workers, total = 16, 200
	dataDir := t.TempDir()
	stores := make([]*testStore, workers)
	for i := range stores {
		stores[i] = openStoreAt(t, dataDir)
	}
	set := rangeSet(t, "10.0.0.0/24")
	id := func(i int) string { return "pod-" + strconv.Itoa(i) }

	got := make([]netip.Addr, total) // each index is written by one goroutine only
	err := underLock(stores, total, func(s *testStore, i int) (err error) {
		got[i], _, err = s.Allocate(0, set, id(i), "eth0")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	checkUnique(t, got, total)
	if n := len(list(t, stores[0])); n != total {
		t.Fatalf("List has %d reservations, want %d", n, total)
	}

	err = underLock(stores, total, func(s *testStore, i int) error {
		released, err := s.Release(id(i), "eth0", got[i:i+1])
		if err == nil && !slices.Equal(released, got[i:i+1]) {
			err = fmt.Errorf("Release(%s) released %v, want %s", id(i), released, got[i])
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if names := dirNames(t, stores[0].Path()); !slices.Equal(names, []string{"last_reserved_ip.0", "lock"}) {
		t.Errorf("directory after releasing everything = %v", names)
	}
}

// TestLockExcludes: a second Store of the same directory cannot take a held lock.
func TestLockExcludes(t *testing.T) {
	dataDir := t.TempDir()
	a, b := openStoreAt(t, dataDir), openStoreAt(t, dataDir)
	checkExclusion(t, b, a.Lock, a.Unlock)
	// Close drops the lock too, so a crashed holder never blocks the node.
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if ok, err := a.TryLock(); !ok || err != nil {
		t.Fatalf("TryLock after the holder closed = %v, %v", ok, err)
	}
}

// childEnv carries the data dir to the re-executed test binary; empty in a normal run.
const childEnv = "KUBENET_IPAM_TEST_CHILD"

// TestMultiProcess re-executes this test binary as 8 processes that allocate 25 addresses each
// from one directory, as concurrent CNI ADDs on a node would.
func TestMultiProcess(t *testing.T) {
	const procs, each = 8, 25
	dataDir := t.TempDir()
	cmds := make([]*exec.Cmd, procs)
	outs := make([]bytes.Buffer, procs)
	for i := range cmds {
		cmd := exec.Command(os.Args[0], "-test.run=^TestChildAllocator$", "-test.count=1")
		cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s,%d,%d", childEnv, dataDir, i, each))
		cmd.Stdout, cmd.Stderr = &outs[i], &outs[i]
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds[i] = cmd
	}
	var got []netip.Addr
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("child %d: %v\n%s", i, err, outs[i].String())
		}
		sc := bufio.NewScanner(&outs[i])
		for sc.Scan() {
			if rest, ok := strings.CutPrefix(sc.Text(), "ALLOCATED "); ok {
				got = append(got, netip.MustParseAddr(rest))
			}
		}
	}
	checkUnique(t, got, procs*each)
	if n := len(list(t, openStoreAt(t, dataDir))); n != procs*each {
		t.Errorf("List has %d reservations, want %d", n, procs*each)
	}
}

// TestChildAllocator is the body of one TestMultiProcess child; it does nothing in a normal run.
func TestChildAllocator(t *testing.T) {
	spec := os.Getenv(childEnv)
	if spec == "" {
		t.Skip("run by TestMultiProcess only")
	}
	parts := strings.Split(spec, ",")
	if len(parts) != 3 {
		t.Fatalf("bad %s=%q", childEnv, spec)
	}
	n, err := strconv.Atoi(parts[2])
	if err != nil {
		t.Fatal(err)
	}
	s := openStoreAt(t, parts[0])
	set := rangeSet(t, "10.0.0.0/24")
	for i := range n {
		a := allocate(t, s, 0, set, fmt.Sprintf("proc%s-%d", parts[1], i), "eth0")
		fmt.Printf("ALLOCATED %s\n", a)
	}
}
