package core

import (
	"fmt"
	"net/netip"

	"github.com/kubenet-dev/kubenet/internal/safedir"
)

// This file answers what operators read of a network on this node: its reservations, its
// node-wide settings and its netfilter backend. None of it takes a lock: a view, not a decision.

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
	dir, err := openDir(dataDir, network)
	if err != nil {
		return nil, fmt.Errorf("address store: %w", err)
	}
	defer dir.Close()
	allocs, err := dir.store.List()
	if err != nil {
		return nil, err
	}
	records, err := dir.records.List()
	if err != nil {
		return nil, err
	}
	pods := map[attachmentKey]string{}
	for _, r := range records {
		pods[r.key()] = r.Pod
	}
	out := make([]Allocation, 0, len(allocs))
	for _, a := range allocs {
		pod, recorded := pods[attachmentKey{a.ContainerID, a.IfName}]
		out = append(out, Allocation{Address: a.Addr, ContainerID: a.ContainerID, IfName: a.IfName, Pod: pod, Record: recorded})
	}
	return out, nil
}

// ReadNodeSettings returns the node-wide settings recorded for the network in dataDir, or nil
// when none are (or the file is unreadable as such: it is then rewritten by the next owner).
func ReadNodeSettings(dataDir, network string) (*NodeSettings, error) {
	return readFromDir(dataDir, network, readNodeSettings)
}

// ReadNetfilterRecord returns the backend record of the network in dataDir: which backend holds
// its rules on this node and why; nil before any ADD recorded one.
func ReadNetfilterRecord(dataDir, network string) (*BackendChoice, error) {
	return readFromDir(dataDir, network, readChoice)
}

// readFromDir opens the network's directory in dataDir, reads one of the node's files with read,
// and closes the directory again.
func readFromDir[T any](dataDir, network string, read func(*safedir.Dir) (*T, error)) (*T, error) {
	dir, err := openDir(dataDir, network)
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	return read(dir.root())
}

// NetfilterStatus says which backend holds the network's rules on this node and why, for STATUS
// and operators. Before the first ADD with auto nothing is decided yet: the first ADD probes the
// kernel (STATUS never does: it is polled, and a probe costs a transaction).
func NetfilterStatus(cfg *Config) (BackendChoice, error) {
	rec, err := ReadNetfilterRecord(cfg.DataDir, cfg.Network)
	if err != nil {
		return BackendChoice{}, err
	}
	if rec != nil {
		return *rec, nil
	}
	b := backendOf(cfg, nil)
	reason := "netfilterBackend is " + string(cfg.Netfilter) + "; no pod yet"
	if cfg.Netfilter == NetfilterAuto {
		reason = "auto: not decided yet; the first ADD probes the kernel"
	}
	return BackendChoice{Backend: b, Configured: cfg.Netfilter, Reason: reason}, nil
}
