package nft

import (
	"errors"
	"fmt"
	"io"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// TableRules reads the rules of every chain of table in one netlink dump and returns them by
// chain name; a missing table reads as no rules. google/nftables asks the kernel for one chain
// per request, and ADD and STATUS read all of a network's chains: one round trip instead of one
// per chain is most of what that read costs. The kernel's messages are parsed by google/nftables
// itself, handed to it through the in-memory netlink connection of its WithTestDial option, so
// the rules come back exactly as GetRules would return them.
func TableRules(table *nftables.Table) (map[string][]*nftables.Rule, error) {
	msgs, err := dumpTableRules(table)
	if err != nil || len(msgs) == 0 {
		return map[string][]*nftables.Rule{}, err
	}
	// Replies as google/nftables expects them from its own request: one batch, no multi-part
	// framing, its connection's port id and sequence number.
	parse := func(req []netlink.Message) ([]netlink.Message, error) {
		if len(req) == 0 {
			return nil, io.EOF // a second receive: nothing more
		}
		out := make([]netlink.Message, len(msgs))
		for i, m := range msgs {
			m.Header.Flags &^= netlink.Multi
			m.Header.PID, m.Header.Sequence = req[0].Header.PID, req[0].Header.Sequence
			out[i] = m
		}
		return out, nil
	}
	c, err := nftables.New(nftables.WithTestDial(parse))
	if err != nil {
		return nil, err
	}
	rules, err := c.GetRules(table, &nftables.Chain{Name: "", Table: table})
	if err != nil {
		return nil, fmt.Errorf("parse the rules of table %s: %w", table.Name, err)
	}
	out := map[string][]*nftables.Rule{}
	for _, r := range rules {
		if r.Chain != nil {
			out[r.Chain.Name] = append(out[r.Chain.Name], r)
		}
	}
	return out, nil
}

// dumpTableRules asks the kernel for every rule of table (NFT_MSG_GETRULE with the table and no
// chain).
func dumpTableRules(table *nftables.Table) ([]netlink.Message, error) {
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
	if err != nil {
		return nil, fmt.Errorf("netlink: %w", err)
	}
	defer conn.Close()
	attrs, err := netlink.MarshalAttributes([]netlink.Attribute{{Type: unix.NFTA_RULE_TABLE, Data: []byte(table.Name + "\x00")}})
	if err != nil {
		return nil, err
	}
	msgs, err := conn.Execute(netlink.Message{
		Header: netlink.Header{
			Type:  netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETRULE),
			Flags: netlink.Request | netlink.Dump,
		},
		// nfgenmsg: family, version, resource id
		Data: append([]byte{byte(table.Family), unix.NFNETLINK_V0, 0, 0}, attrs...),
	})
	if errors.Is(err, unix.ENOENT) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the rules of table %s: %w", table.Name, err)
	}
	return msgs, nil
}

// TableRuleCounts counts the rules of every chain of table, from one dump, without decoding
// them: what STATUS needs to tell missing rules (a flushed ruleset) from present ones, at the
// cost of the dump alone.
func TableRuleCounts(table *nftables.Table) (map[string]int, error) {
	msgs, err := dumpTableRules(table)
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	for _, m := range msgs {
		if len(m.Data) < 4 {
			continue
		}
		ad, err := netlink.NewAttributeDecoder(m.Data[4:])
		if err != nil {
			return nil, fmt.Errorf("read the rules of table %s: %w", table.Name, err)
		}
		for ad.Next() {
			if ad.Type() == unix.NFTA_RULE_CHAIN {
				out[ad.String()]++
			}
		}
		if err := ad.Err(); err != nil {
			return nil, fmt.Errorf("read the rules of table %s: %w", table.Name, err)
		}
	}
	return out, nil
}
