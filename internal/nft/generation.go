package nft

import (
	"encoding/binary"
	"fmt"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Generations reads the nftables generation of one network namespace: the kernel counts it up
// with every transaction it commits there, whoever sends it, so a generation that did not move
// tells that no table of the namespace changed meanwhile. The socket stays open from read to
// read: closing a netfilter netlink socket waits for the release of whatever the namespace's
// last transactions removed.
type Generations struct{ conn *netlink.Conn }

// OpenGenerations opens a socket in the calling thread's network namespace.
func OpenGenerations() (*Generations, error) {
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
	if err != nil {
		return nil, fmt.Errorf("nftables generation: netlink: %w", err)
	}
	return &Generations{conn: conn}, nil
}

// Read asks the kernel for the current generation (NFT_MSG_GETGEN).
func (g *Generations) Read() (uint32, error) {
	replies, err := g.conn.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETGEN), Flags: netlink.Request},
		// nfgenmsg: family, version, resource id
		Data: []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, 0},
	})
	if err != nil {
		return 0, fmt.Errorf("nftables generation: %w", err)
	}
	for _, m := range replies {
		if id, ok := generationOf(m); ok {
			return id, nil
		}
	}
	return 0, fmt.Errorf("nftables generation: no NFTA_GEN_ID in the kernel's %d replies", len(replies))
}

// generationOf is the generation a NEWGEN message carries. Pure.
func generationOf(m netlink.Message) (uint32, bool) {
	if m.Header.Type != netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_NEWGEN) || len(m.Data) < 4 {
		return 0, false
	}
	ad, err := netlink.NewAttributeDecoder(m.Data[4:])
	if err != nil {
		return 0, false
	}
	for ad.Next() {
		if ad.Type() == unix.NFTA_GEN_ID && len(ad.Bytes()) == 4 {
			return binary.BigEndian.Uint32(ad.Bytes()), true
		}
	}
	return 0, false
}

// Close closes the socket; a nil Generations has none.
func (g *Generations) Close() error {
	if g == nil {
		return nil
	}
	return g.conn.Close()
}
