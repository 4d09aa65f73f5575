package isolation

import (
	"fmt"
	"net"
	"net/netip"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/kubenet-dev/kubenet/internal/nft"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

// BenchmarkEnsureRemove measures what one pod's ADD (Ensure with its port, chains already in
// place) and DEL (Remove) cost in the kernel, dual-stack with anti-spoofing, on a node whose sets
// already hold 1 or 500 other pods, with and without Config.Known (as ADD has it: the chains
// recognised from a digest of their dump instead of decoded). The cost should not depend on the
// number of pods (reported, not asserted):
//
//	go test ./isolation -run '^$' -bench EnsureRemove -benchtime 200x
func BenchmarkEnsureRemove(b *testing.B) {
	port := func(i int) Port {
		return Port{
			Name:  fmt.Sprintf("vethbench%06d", i),
			Owner: fmt.Sprintf("pod-%d/eth0", i),
			MAC:   net.HardwareAddr{0x02, 0, 0, byte(i >> 16), byte(i >> 8), byte(i)},
			Addrs: []netip.Addr{netip.AddrFrom4([4]byte{10, 244, byte(i >> 8), byte(i)}),
				netip.AddrFrom16([16]byte{0xfd, 0, 14: byte(i >> 8), 15: byte(i)})},
		}
	}
	for _, c := range []struct {
		existing int
		known    bool
	}{{1, false}, {500, false}, {1, true}, {500, true}} {
		existing := c.existing
		b.Run(fmt.Sprintf("existing=%d/known=%v", existing, c.known), func(b *testing.B) {
			cfg := Config{Network: "bench", AntiSpoofing: true}
			if c.known {
				cfg.Known = &nft.Remembered{BinaryID: nft.BuildID()}
			}
			n := nettest.NewNS(b)
			measured := port(existing + 1)
			err := n.Do(func(ns.NetNS) error {
				others := make([]Port, existing)
				for i := range others {
					others[i] = port(i + 1)
				}
				if _, err := Ensure(cfg, others...); err != nil {
					return err
				}
				return nettest.AddRemoveLoop(b,
					func() error { _, err := Ensure(cfg, measured); return err },
					func() error { return Remove(cfg.Network, measured) })
			})
			if err != nil {
				b.Fatal(err)
			}
		})
	}
}
