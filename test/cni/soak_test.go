package cni

import (
	"fmt"
	"net/netip"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/kubenet-dev/kubenet/test/testkit"

	"github.com/kubenet-dev/kubenet/test/nettest"
)

// soakDuration bounds the churn; KUBENET_SOAK overrides it (a Go duration) for longer local runs.
func soakDuration(t *testing.T) time.Duration {
	if s := os.Getenv("KUBENET_SOAK"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("KUBENET_SOAK=%q: %v", s, err)
		}
		return d
	}
	return 15 * time.Second
}

// TestConcurrencySoak churns 200 attachments, each with a host port of its own, with ADD, CHECK
// and DEL from 16 parallel plugin processes for a bounded time, on each backend: never one
// address for two live pods, no unexpected error (concurrent transactions and restores of many
// processes on one node), and nothing left at the end.
func TestConcurrencySoak(t *testing.T) {
	for _, backend := range backends {
		t.Run(backend, func(t *testing.T) { soak(t, backend) })
	}
}

func soak(t *testing.T, backend string) {
	const attachments, workers = 200, 16
	node := nettest.NewNode(t, binDir)
	list := node.ConfList(t, nettest.NetConf{PodCIDRs: testkit.DualStack(), NonMasqueradeCIDRs: []netip.Prefix{nettest.NonMasquerade4}, NetfilterBackend: backend})
	pods := make([]*nettest.Pod, attachments)
	for i := range pods {
		pods[i] = node.NewPod(t, fmt.Sprintf("soak-%03d", i))
		pods[i].RT.CapabilityArgs = hpArgs(false, hpMapping{31000 + i, 8080, "tcp", ""})
	}
	var mu sync.Mutex
	live := map[netip.Addr]string{}
	claim := func(p *nettest.Pod) error {
		mu.Lock()
		defer mu.Unlock()
		for _, ip := range p.IPs() {
			if other, taken := live[ip]; taken {
				return fmt.Errorf("address %s handed to %s while %s holds it", ip, p.RT.ContainerID, other)
			}
			live[ip] = p.RT.ContainerID
		}
		return nil
	}
	release := func(p *nettest.Pod) {
		mu.Lock()
		defer mu.Unlock()
		for _, ip := range p.IPs() {
			delete(live, ip)
		}
	}

	deadline := time.Now().Add(soakDuration(t))
	var cycles sync.WaitGroup
	var count [workers]int
	errs := make(chan error, workers)
	for w := range workers {
		cycles.Add(1)
		go func() {
			defer cycles.Done()
			// Worker w owns pods w, w+16, ... below 200 and only those: the runtime never runs two
			// operations on one pod at once. (Wrapping modulo 200 would hand a pod to a second
			// worker, since 200 is not a multiple of 16.)
			var own []*nettest.Pod
			for i := w; i < attachments; i += workers {
				own = append(own, pods[i])
			}
			for n := 0; time.Now().Before(deadline); n++ {
				p := own[n%len(own)]
				if err := node.Add(list, p); err != nil {
					errs <- fmt.Errorf("ADD %s: %w", p.RT.ContainerID, err)
					return
				}
				if err := claim(p); err != nil {
					errs <- err
					return
				}
				if err := node.Check(list, p); err != nil {
					errs <- fmt.Errorf("CHECK %s: %w", p.RT.ContainerID, err)
					return
				}
				release(p)
				if err := node.Del(list, p); err != nil {
					errs <- fmt.Errorf("DEL %s: %w", p.RT.ContainerID, err)
					return
				}
				count[w]++
			}
		}()
	}
	cycles.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	total := 0
	for _, c := range count {
		total += c
	}
	t.Logf("%d ADD/CHECK/DEL cycles by %d workers", total, workers)
	if total < workers {
		t.Errorf("only %d cycles completed", total)
	}
	for _, p := range pods {
		testkit.AssertNoResidue(t, node, "kubenet", testkit.AttachmentOf(p), nil)
	}
	if left := stateFiles(t, node); len(left) > 0 {
		t.Errorf("data dir holds %v after the soak", left)
	}
}
