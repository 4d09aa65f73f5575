package core

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/kubenet-dev/kubenet/internal/policyrules"
	"github.com/kubenet-dev/kubenet/netpol"
)

// groupReads hands out one batch of drops per Read, then its error.
type groupReads struct {
	batches [][]policyrules.Drop
	lost    uint64
	err     error
}

func (g *groupReads) Read() ([]policyrules.Drop, uint64, error) {
	if len(g.batches) == 0 {
		return nil, 0, g.err
	}
	b := g.batches[0]
	g.batches = g.batches[1:]
	return b, g.lost, nil
}

func (g *groupReads) Close() error { return nil }

// TestPolicyDropReaderKeepsItsNetwork: the NFLOG group carries the drops of every network that
// logs to it, under the names the kernel's log prefix holds (a long one cut and hashed); a
// network's reader keeps its own, names them in full, and passes the group's losses and errors
// on.
func TestPolicyDropReaderKeepsItsNetwork(t *testing.T) {
	long := strings.Repeat("n", MaxNetworkNameLen)
	near := long[:MaxNetworkNameLen-1] + "m" // the same cut form; another hash
	drop := func(network string, port int) policyrules.Drop {
		return policyrules.Drop{Network: netpol.LogNetwork(network), Port: port}
	}
	for _, tt := range []struct {
		name, network string
		batch         []policyrules.Drop
		wantPorts     []int
	}{
		{"short name", "kubenet", []policyrules.Drop{drop("kubenet", 1), drop("other", 2), drop("kubenet", 3)}, []int{1, 3}},
		{"none of its own", "kubenet", []policyrules.Drop{drop("other", 2)}, nil},
		{"long name", long, []policyrules.Drop{drop(long, 1), drop(near, 2), {Network: long, Port: 3}}, []int{1}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := newPolicyDropReader(tt.network, &groupReads{batches: [][]policyrules.Drop{tt.batch}, lost: 4, err: policyrules.ErrOverrun})
			ds, lost, err := r.Read()
			var ports []int
			for _, d := range ds {
				ports = append(ports, d.Port)
				if d.Network != tt.network {
					t.Errorf("a drop of network %q, want %q", d.Network, tt.network)
				}
			}
			if err != nil || lost != 4 || !slices.Equal(ports, tt.wantPorts) {
				t.Errorf("ports %v, %d lost, %v; want ports %v, 4 lost", ports, lost, err, tt.wantPorts)
			}
			if _, _, err := r.Read(); !errors.Is(err, policyrules.ErrOverrun) {
				t.Errorf("second read: %v, want the group's overrun", err)
			}
		})
	}
}

func TestOpenPolicyDropLogRefusesABadNetworkName(t *testing.T) {
	for _, name := range []string{"", "../x", strings.Repeat("n", MaxNetworkNameLen+1)} {
		if r, err := OpenPolicyDropLog(name, policyrules.DefaultLogGroup, 0); err == nil {
			r.Close()
			t.Errorf("network %q: opened, want an error", name)
		} else if !strings.Contains(err.Error(), "name") {
			t.Errorf("network %q: %v, want an error naming the key", name, err)
		}
	}
}
