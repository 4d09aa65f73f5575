package core

import (
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/kubenet-dev/kubenet/test/nettest"
)

// TestAlongsideRunsInTheCallersNamespace: work run alongside sees the namespace of the thread
// that started it, whether that is the process's own (the CNI binary: no move) or one the caller
// moved its locked thread into (the in-process plugin: moved there), and the thread it used goes
// back where it was.
func TestAlongsideRunsInTheCallersNamespace(t *testing.T) {
	node := nettest.NewNS(t)
	home, err := ns.GetCurrentNS()
	if err != nil {
		t.Fatal(err)
	}
	defer home.Close()
	cases := []struct {
		name   string
		caller ns.NetNS
	}{
		{"from the process's namespace", home},
		{"from a thread moved into another", node},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var seen bool
			nettest.Do(t, c.caller, func() error {
				return <-alongside(func() error {
					seen = sameNS(c.caller)
					return nil
				})
			})
			if !seen {
				t.Errorf("the work alongside ran outside %s", c.caller.Path())
			}
			// Every unlocked thread is back home: a goroutine after the call runs there.
			done := make(chan bool)
			go func() { done <- sameNS(home) }()
			if !<-done {
				t.Error("a goroutine after alongside runs outside the process's namespace")
			}
		})
	}
}
