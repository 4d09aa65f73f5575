package isolation

import (
	"errors"
	"fmt"

	"github.com/google/nftables"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// ruleComments returns the comments of the table's rules by chain, in order, from one dump of
// the whole table. google/nftables only dumps one chain per request, and ADD compares all of
// this package's chains: one request instead of nine. A missing table reads as no rules.
func ruleComments(table *nftables.Table) (map[string][]string, error) {
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
	if err != nil {
		return nil, fmt.Errorf("netlink: %w", err)
	}
	defer conn.Close()
	ae := netlink.NewAttributeEncoder()
	ae.String(unix.NFTA_RULE_TABLE, table.Name)
	attrs, err := ae.Encode()
	if err != nil {
		return nil, err
	}
	req := netlink.Message{
		Header: netlink.Header{
			Type:  netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETRULE),
			Flags: netlink.Request | netlink.Dump,
		},
		// struct nfgenmsg: family, version, resource id.
		Data: append([]byte{byte(table.Family), unix.NFNETLINK_V0, 0, 0}, attrs...),
	}
	// A dump that a concurrent change interrupts is repeated.
	for attempt := 0; ; attempt++ {
		msgs, err := conn.Execute(req)
		if errors.Is(err, unix.ENOENT) {
			return map[string][]string{}, nil
		}
		if err != nil {
			return nil, fmt.Errorf("dump rules of table %s: %w", table.Name, err)
		}
		out, interrupted, err := parseRules(msgs)
		if err != nil || !interrupted {
			return out, err
		}
		if attempt == 4 {
			return nil, fmt.Errorf("dump rules of table %s: interrupted by changes %d times", table.Name, attempt+1)
		}
	}
}

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

func parseRules(msgs []netlink.Message) (map[string][]string, bool, error) {
	out := map[string][]string{}
	interrupted := false
	for _, m := range msgs {
		interrupted = interrupted || m.Header.Flags&netlink.DumpInterrupted != 0
		if len(m.Data) < 4 {
			continue
		}
		ad, err := netlink.NewAttributeDecoder(m.Data[4:])
		if err != nil {
			return nil, false, fmt.Errorf("decode rule: %w", err)
		}
		var chain, comment string
		for ad.Next() {
			switch ad.Type() {
			case unix.NFTA_RULE_CHAIN:
				chain = ad.String()
			case unix.NFTA_RULE_USERDATA:
				comment, _ = userdata.GetString(ad.Bytes(), userdata.TypeComment)
			}
		}
		if err := ad.Err(); err != nil {
			return nil, false, fmt.Errorf("decode rule: %w", err)
		}
		out[chain] = append(out[chain], comment)
	}
	return out, interrupted, nil
}
