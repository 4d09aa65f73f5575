package core

import (
	"sync"

	"github.com/containernetworking/plugins/pkg/ns"
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
		// Do locks the goroutine to a thread and moves that into here for f.
		done <- here.Do(func(ns.NetNS) error { return f() })
	}()
	return done
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
