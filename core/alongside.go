package core

import (
	"sync"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"
)

// alongside runs f on another goroutine, in the network namespace of the calling thread (the
// node's: the CNI binary runs there, the in-process plugin calls the core from a thread it moved
// there), and returns where its result will be. Should that namespace not be found, f runs
// before alongside returns.
func alongside(f func() error) <-chan error {
	done := make(chan error, 1)
	here, err := ns.GetCurrentNS()
	if err != nil {
		done <- f()
		return done
	}
	go func() {
		defer here.Close()
		// A goroutine that no one locked runs on a thread of the process's own namespace:
		// threads that enter another (a pod's) stay locked to their goroutine until they are
		// back. When the caller's thread is there too, as in the CNI binary, f runs as it is;
		// moving a thread into the namespace it is in cost every ADD a goroutine, a thread lock,
		// two setns calls and a /proc lookup.
		if sameNS(here) {
			done <- f()
			return
		}
		// Do locks the goroutine to a thread and moves that into here for f.
		done <- here.Do(func(ns.NetNS) error { return f() })
	}()
	return done
}

// sameNS tells whether the thread the caller runs on is in the namespace n. Only an unlocked
// goroutine may rely on the answer after it: it may move to another thread, but all of those
// are in the same namespace.
func sameNS(n ns.NetNS) bool {
	var want, have unix.Stat_t
	if unix.Fstat(int(n.Fd()), &want) != nil || unix.Stat("/proc/thread-self/ns/net", &have) != nil {
		return false
	}
	return want.Dev == have.Dev && want.Ino == have.Ino
}

// pending is the outcome of work running alongside, collected once however often it is asked.
type pending struct {
	done <-chan error
	once sync.Once
	err  error
}

func (p *pending) wait() error {
	p.once.Do(func() { p.err = <-p.done })
	return p.err
}
