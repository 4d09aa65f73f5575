package hostport

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/kubenet-dev/kubenet/test/nettest"
)

// BenchmarkAddDel measures one pod's ADD and DEL of its host ports on a node that already has 1
// or 500 pods with two host ports each: a pod with two (TCP and UDP on any address, dual-stack:
// four map elements and four index files), and a pod at the limit, MaxMappings dual-stack
// mappings (2*MaxMappings elements and files). Add and Remove are what ADD and DEL do under the
// network lock, so µs/add and µs/del are how long the lock is held for the host ports. The cost
// should not depend on the number of pods (reported, not asserted):
//
//	go test ./hostport -run '^$' -bench AddDel -benchtime 200x
//	go test ./hostport -run '^$' -bench 'AddDel/mappings=128' -benchtime 20x
func BenchmarkAddDel(b *testing.B) {
	var atLimit []Mapping
	for i := range MaxMappings {
		atLimit = append(atLimit, Mapping{HostPort: uint16(40000 + i), ContainerPort: 8080, Protocol: Protocols()[i%2]})
	}
	for _, existing := range []int{1, 500} {
		for _, measured := range [][]Mapping{podMappings(40000, 40001), atLimit} {
			b.Run(fmt.Sprintf("mappings=%d/existing=%d", len(measured), existing), func(b *testing.B) { benchAddDel(b, existing, measured) })
		}
	}
}

func benchAddDel(b *testing.B, existing int, measured []Mapping) {
	w := newWorld(b)
	populate := func() error {
		if _, err := EnsureNode(w.cfg, false); err != nil {
			return err
		}
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
	es, err := Plan(measured, []netip.Addr{pod4, pod6})
	if err != nil {
		b.Fatal(err)
	}
	owner := Owner{ContainerID: "measured", IfName: "eth0"}
	err = w.ns.Do(func(ns.NetNS) error {
		if err := populate(); err != nil {
			return err
		}
		return nettest.AddRemoveLoop(b,
			func() error { return Add(w.cfg, owner, es) },
			func() error { return Remove(w.cfg, owner, KeysOf(es)) })
	})
	if err != nil {
		b.Fatal(err)
	}
}

func podMappings(tcpPort, udpPort int) []Mapping {
	return []Mapping{
		{HostPort: uint16(tcpPort), ContainerPort: 8080, Protocol: "tcp"},
		{HostPort: uint16(udpPort), ContainerPort: 8081, Protocol: "udp"},
	}
}
