//go:build kubenet_crashtest

package core

import (
	"os"
	"syscall"
)

// crashPoint kills the process with SIGKILL when KUBENET_CRASH_AT names this point. Only test
// binaries (built with -tags kubenet_crashtest) have it: they show that DEL and GC leave nothing
// behind whatever instruction a crash interrupts.
func crashPoint(name string) {
	if os.Getenv("KUBENET_CRASH_AT") == name {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way; never return into the next step
	}
}
