package core

import (
	"github.com/kubenet-dev/kubenet/netpol"
)

// The policy's drops (netpol): counted per pod and direction in the kernel, and, when logging
// is on, sent rate-limited to NFLOG for the agent to read.
type (
	// PolicyDropLog says whether and how the drop chains log (Group 0: not at all).
	PolicyDropLog = netpol.DropLog
	// PolicyDrop is one dropped packet as the log hands it over.
	PolicyDrop = netpol.Drop
	// PolicyPortDrops is the drop counter of one pod's port in one direction.
	PolicyPortDrops = netpol.PortDrops
	// PolicyDropLogReader reads the drop log.
	PolicyDropLogReader = netpol.DropLogReader
)

// Defaults of PolicyDropLog.
const (
	DefaultPolicyLogGroup = netpol.DefaultLogGroup
	DefaultPolicyLogRate  = netpol.DefaultLogRate
	DefaultPolicyLogBurst = netpol.DefaultLogBurst
)

// ErrPolicyLogOverrun says the drop log's socket overflowed: messages were lost.
var ErrPolicyLogOverrun = netpol.ErrOverrun

// PolicyDropCounts reads the network's drop counters and the drops the log's rate left unlogged.
func PolicyDropCounts(network string) ([]PolicyPortDrops, uint64, error) {
	return netpol.DropCounts(network)
}

// PolicyLogNetwork is the network's name as a PolicyDrop's Network holds it (cut and hashed
// when the name is too long for the kernel's log prefix).
func PolicyLogNetwork(network string) string { return netpol.LogNetwork(network) }

// OpenPolicyDropLog binds the drop log's NFLOG group in the network namespace netns (a file
// descriptor; 0: the caller's).
func OpenPolicyDropLog(group uint16, netns int) (*PolicyDropLogReader, error) {
	return netpol.OpenDropLog(group, netns)
}
