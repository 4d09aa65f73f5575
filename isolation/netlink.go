package isolation

import (
	"errors"
	"fmt"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// setExists asks the kernel for one set of the table. google/nftables' listing calls lose the
// errno, so "no such table or set" could not be told from a failure through them.
func setExists(s *nftables.Set) (bool, error) {
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
	if err != nil {
		return false, fmt.Errorf("netlink: %w", err)
	}
	defer conn.Close()
	ae := netlink.NewAttributeEncoder()
	ae.String(unix.NFTA_SET_TABLE, s.Table.Name)
	ae.String(unix.NFTA_SET_NAME, s.Name)
	attrs, err := ae.Encode()
	if err != nil {
		return false, err
	}
	_, err = conn.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETSET), Flags: netlink.Request},
		Data:   append([]byte{byte(s.Table.Family), unix.NFNETLINK_V0, 0, 0}, attrs...),
	})
	switch {
	case errors.Is(err, unix.ENOENT):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("set %s of table %s: %w", s.Name, s.Table.Name, err)
	}
	return true, nil
}
