// Package procs sets how many processors the Go runtime of a CNI plugin process uses, before
// anything else starts: the plugin's main package imports it for that side effect. Packages
// initialize in the order of their dependencies, and this one depends on nothing but the runtime
// and syscall, so it runs before the rest of the plugin's.
//
// STATUS runs on one processor. On nftables it is a handful of small kernel and file reads, one
// after the other on one goroutine, and runtimes call it every few seconds on every node. With a second
// processor the runtime starts and wakes threads to run its own background goroutines beside
// it, which made a STATUS about 0.3 ms (6 %) slower. The other verbs keep every processor: ADD
// and DEL overlap kernel waits on several goroutines, and with a single processor each of those
// would wait for the runtime's monitor to take the processor back from a thread blocked in the
// kernel.
//
// It is decided in init, from CNI_COMMAND alone, because those threads start while the other
// packages initialize. Work that does run side by side gives the processors back first (All).
package procs

import (
	"runtime"
	"syscall"
)

func init() {
	command, _ := syscall.Getenv("CNI_COMMAND")
	if n := For(command); n > 0 {
		runtime.GOMAXPROCS(n)
	}
}

// For is the number of processors a process running command gets; 0 leaves the runtime's
// default (one per CPU the process may use).
func For(command string) int {
	if command == "STATUS" {
		return 1
	}
	return 0
}

// All gives the process the runtime's default processors again, for work that runs side by side
// after init chose one: STATUS on the iptables backend parses several tables' listings at once,
// and on one processor a node with 500 pods and their host ports took it 13.2 instead of 11.9 ms.
func All() {
	if runtime.GOMAXPROCS(0) == 1 {
		runtime.SetDefaultGOMAXPROCS()
	}
}
