package hostport

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
)

// BenchmarkAddDel measures one pod's ADD and DEL of two host ports (TCP and UDP on any address,
// dual-stack: four map elements and four index files) on a node that already has 1 or 500 pods
// with two host ports each. The cost should not depend on the number of pods (reported, not
// asserted):
//
//	go test ./hostport -run '^$' -bench AddDel -benchtime 200x
func BenchmarkAddDel(b *testing.B) {
	for _, existing := range []int{1, 500} {
		b.Run(fmt.Sprintf("existing=%d", existing), func(b *testing.B) {
			w := newWorld(b)
			populate := func() error {
				for i := range existing {
					ip4 := netip.AddrFrom4([4]byte{10, 244, byte(1 + i/250), byte(2 + i%250)})
					ip6 := netip.AddrFrom16([16]byte{0xfd, 0, 0, 0x10, 0x2, 0x44, 0, 1, 14: byte(i >> 8), 15: byte(i)})
					es, err := Plan(podMappings(20000+i, 30000+i), []netip.Addr{ip4, ip6})
					if err != nil {
						return err
					}
					if err := Add(w.cfg, Owner{ContainerID: fmt.Sprintf("existing-%d", i), IfName: "eth0"}, es); err != nil {
						return err
					}
				}
				return nil
			}
			es, err := Plan(podMappings(40000, 40001), []netip.Addr{pod4, pod6})
			if err != nil {
				b.Fatal(err)
			}
			owner := Owner{ContainerID: "measured", IfName: "eth0"}
			var add, del time.Duration
			err = w.ns.Do(func(ns.NetNS) error {
				if err := populate(); err != nil {
					return err
				}
				b.ResetTimer()
				for range b.N {
					t0 := time.Now()
					if err := Add(w.cfg, owner, es); err != nil {
						return err
					}
					t1 := time.Now()
					if err := Remove(w.cfg, owner, KeysOf(es)); err != nil {
						return err
					}
					add += t1.Sub(t0)
					del += time.Since(t1)
				}
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(add.Microseconds())/float64(b.N), "µs/add")
			b.ReportMetric(float64(del.Microseconds())/float64(b.N), "µs/del")
		})
	}
}

func podMappings(tcpPort, udpPort int) []Mapping {
	return []Mapping{
		{HostPort: uint16(tcpPort), ContainerPort: 8080, Protocol: "tcp"},
		{HostPort: uint16(udpPort), ContainerPort: 8081, Protocol: "udp"},
	}
}
