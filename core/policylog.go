package core

import (
	"fmt"

	"github.com/kubenet-dev/kubenet/internal/policyrules"
	"github.com/kubenet-dev/kubenet/netpol"
)

// The policy's drops (netpol): counted per pod and direction in the kernel, and, when logging
// is on (PolicyNetwork.Log), sent rate-limited to NFLOG for the agent to read.

// PolicyDropCounts reads the network's drop counters and the drops the log's rate left unlogged,
// in the current network namespace. A network without policy tables has none.
func PolicyDropCounts(network string) ([]policyrules.PortDrops, uint64, error) {
	if err := validNetworkName(network); err != nil {
		return nil, 0, err
	}
	counts, limited, err := netpol.DropCounts(network)
	if err != nil {
		return nil, 0, fmt.Errorf("network policy: drop counters of network %s: %w", network, err)
	}
	return counts, limited, nil
}

// PolicyDropReader reads the drop log of one network: what its policy tables' rules send to the
// log's NFLOG group, which other networks' rules may send to as well.
type PolicyDropReader struct {
	network    string
	logNetwork string // the network as the kernel's log prefix names it (cut and hashed when long)
	group      dropGroupReader
}

// dropGroupReader reads every drop an NFLOG group receives (netpol.DropLogReader).
type dropGroupReader interface {
	Read() ([]policyrules.Drop, uint64, error)
	Close() error
}

// OpenPolicyDropLog binds the NFLOG group of the network's drop log (PolicyNetwork.Log.Group) in
// the network namespace netns (a file descriptor; 0: the caller's). One reader may bind a group
// in a namespace.
func OpenPolicyDropLog(network string, group uint16, netns int) (*PolicyDropReader, error) {
	if err := validNetworkName(network); err != nil {
		return nil, err
	}
	r, err := netpol.OpenDropLog(group, netns)
	if err != nil {
		return nil, fmt.Errorf("network policy of network %s: %w", network, err)
	}
	return newPolicyDropReader(network, r), nil
}

func newPolicyDropReader(network string, group dropGroupReader) *PolicyDropReader {
	return &PolicyDropReader{network: network, logNetwork: netpol.LogNetwork(network), group: group}
}

// Read waits for the next drops of the network, each named by the network's whole name, and
// tells how many of the group's messages were lost before them (of any network: the log cannot
// tell whose). An overrun of the socket's buffer returns policyrules.ErrOverrun; a closed reader
// returns an error that wraps os.ErrClosed.
func (r *PolicyDropReader) Read() ([]policyrules.Drop, uint64, error) {
	ds, lost, err := r.group.Read()
	ours := ds[:0]
	for _, d := range ds {
		if d.Network == r.logNetwork {
			d.Network = r.network
			ours = append(ours, d)
		}
	}
	return ours, lost, err
}

// Close unbinds the group and ends a Read.
func (r *PolicyDropReader) Close() error { return r.group.Close() }
