package core

import (
	"fmt"
	"net/netip"

	"github.com/kubenet-dev/kubenet/ipam"
)

// Allocation is one reserved address as an operator sees it: who holds it, and whether kubenet
// has a record of that attachment (no record: host-local made it, or a crashed ADD left it).
type Allocation struct {
	Address     netip.Addr `json:"address"`
	ContainerID string     `json:"containerID"`
	IfName      string     `json:"ifname,omitempty"`
	Pod         string     `json:"pod,omitempty"`
	Record      bool       `json:"record"`
}

// Allocations lists the reservations of a network in dataDir with their records' pods. It only
// reads, without the network lock: an operator's view, not a decision.
func Allocations(dataDir, network string) ([]Allocation, error) {
	store, err := ipam.Open(dataDir, network)
	if err != nil {
		return nil, fmt.Errorf("address store: %w", err)
	}
	defer store.Close()
	allocs, err := store.List()
	if err != nil {
		return nil, err
	}
	records, err := NewRecords(store.Dir()).List()
	if err != nil {
		return nil, err
	}
	pods := map[attachmentKey]string{}
	for _, r := range records {
		pods[attachmentKey{r.ContainerID, r.IfName}] = r.Pod
	}
	out := make([]Allocation, 0, len(allocs))
	for _, a := range allocs {
		pod, recorded := pods[attachmentKey{a.ContainerID, a.IfName}]
		out = append(out, Allocation{Address: a.Addr, ContainerID: a.ContainerID, IfName: a.IfName, Pod: pod, Record: recorded})
	}
	return out, nil
}
