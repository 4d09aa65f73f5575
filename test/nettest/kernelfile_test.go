package nettest

import (
	"strings"
	"testing"
)

func TestMisnamedKernelTest(t *testing.T) {
	cases := []struct {
		file string
		want bool
	}{
		{"bridge/kernel_test.go", false},
		{"overlay/firewall_kernel_test.go", false},
		{"internal/nft/probe_kernel_test.go", false},
		{"test/cni/demo_test.go", false},
		{"test/nettest/kernelfile_test.go", false},
		{"bench/bench_test.go", false},
		{"core/alongside_test.go", true},
		{"bridge/bridge_test.go", true},
		{"internal/links/links_test.go", true},
		{"overlay/kernel.go", true},
		{"testdata/x_test.go", true},
		{"cmd/kubenet/main_test.go", true},
	}
	for _, tc := range cases {
		if got := misnamedKernelTest(tc.file); got != tc.want {
			t.Errorf("misnamedKernelTest(%q) = %v, want %v", tc.file, got, tc.want)
		}
	}
}

// TestRunningTestFile finds this file from a helper and from a subtest's closure: the frames
// requireKernelTestFile judges by.
func TestRunningTestFile(t *testing.T) {
	check := func(t *testing.T) {
		t.Helper()
		file, ok := runningTestFile()
		rel, relOK := moduleRelative(file)
		if !ok || !relOK || rel != "test/nettest/kernelfile_test.go" {
			t.Errorf("runningTestFile() = %q, %v; relative %q, %v; want test/nettest/kernelfile_test.go", file, ok, rel, relOK)
		}
	}
	check(t)
	t.Run("subtest", func(t *testing.T) { check(t) })
	done := make(chan string)
	go func() {
		file, ok := runningTestFile()
		if ok {
			done <- file
		}
		close(done)
	}()
	if file := <-done; strings.HasSuffix(file, "_test.go") {
		t.Errorf("a goroutine of the test has no test frame, got %q", file)
	}
}
