package nettest

import (
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// Kernel tests are named by their file (test/README.md): in the product packages, a test that
// needs root (network namespaces, netlink, netfilter, tc, file ownership) lives in a file named
// kernel_test.go or <topic>_kernel_test.go, and every other test file is pure logic that `make
// unit` runs without root. Under test/ and bench/ every test needs root. RequireRoot holds the
// tests that reach it to the convention, as root too, so a misplaced kernel test fails `make
// test` instead of `make unit` on someone's laptop.

// requireKernelTestFile fails t when the test it runs lives in a product package's file that is
// not named as a kernel test.
func requireKernelTestFile(t testing.TB) {
	t.Helper()
	file, ok := runningTestFile()
	if !ok {
		return // not on a test's own goroutine: nothing to judge by
	}
	rel, ok := moduleRelative(file)
	if !ok {
		return
	}
	if misnamedKernelTest(rel) {
		t.Fatalf("%s: this test needs root, so it belongs in a file named kernel_test.go or <topic>_kernel_test.go (test/README.md)", rel)
	}
}

// runningTestFile is the source file of the Test or Benchmark function on this goroutine's
// stack: the frame just outside the testing package's runner.
func runningTestFile() (string, bool) {
	pcs := make([]uintptr, 100)
	frames := runtime.CallersFrames(pcs[:runtime.Callers(2, pcs)])
	var last runtime.Frame
	for {
		f, more := frames.Next()
		if strings.HasPrefix(f.Function, "testing.") {
			return last.File, last.File != ""
		}
		last = f
		if !more {
			return "", false
		}
	}
}

// moduleRelative is file relative to the module root, which is three levels above this file
// (test/nettest/kernelfile.go), also in a -trimpath build.
func moduleRelative(file string) (string, bool) {
	_, self, _, ok := runtime.Caller(0)
	if !ok {
		return "", false
	}
	root := filepath.Dir(filepath.Dir(filepath.Dir(self)))
	return strings.CutPrefix(filepath.ToSlash(file), filepath.ToSlash(root)+"/")
}

// misnamedKernelTest reports whether a test needing root in file rel (relative to the module)
// breaks the naming convention.
func misnamedKernelTest(rel string) bool {
	top, _, _ := strings.Cut(rel, "/")
	switch {
	case top == "test" || top == "bench":
		return false
	case strings.HasSuffix(rel, "kernel_test.go"):
		return false
	}
	return true
}
