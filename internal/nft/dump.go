package nft

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// TableRules reads the rules of every chain of table in one netlink dump and returns them by
// chain name; a missing table reads as no rules (DumpRules, then RuleDump.Rules).
func TableRules(table *nftables.Table) (map[string][]*nftables.Rule, error) {
	d, err := DumpRules(table)
	if err != nil {
		return map[string][]*nftables.Rule{}, err
	}
	return d.Rules()
}

// RuleDump is one dump of the rules of a table, kept as the kernel sent it: counting, digesting
// and decoding the rules are separate steps, so that a caller that recognises them (Verified)
// never pays for decoding.
type RuleDump struct {
	table *nftables.Table
	msgs  []netlink.Message
}

// DumpRules reads the rules of every chain of table in one netlink dump; a missing table holds
// no rules. google/nftables asks the kernel for one chain per request, and ADD reads all of a
// network's chains: one round trip instead of one per chain.
func DumpRules(table *nftables.Table) (*RuleDump, error) {
	msgs, err := dumpRules(table, "")
	if err != nil {
		return nil, err
	}
	return &RuleDump{table: table, msgs: msgs}, nil
}

// DumpChain reads the rules of one chain; a missing table or chain holds none.
func DumpChain(chain *nftables.Chain) (*RuleDump, error) {
	msgs, err := dumpRules(chain.Table, chain.Name)
	if err != nil {
		return nil, err
	}
	return &RuleDump{table: chain.Table, msgs: msgs}, nil
}

// ChainRuleCount counts the rules of one chain from one dump, without decoding them, and tells
// whether the chain exists: asked of the kernel (one more request) only when it holds no rule,
// since a rule always belongs to a chain. A missing table holds no chain.
func ChainRuleCount(chain *nftables.Chain) (n int, exists bool, err error) {
	d, err := DumpChain(chain)
	if err != nil {
		return 0, false, err
	}
	counts, err := d.Counts()
	if err != nil {
		return 0, false, err
	}
	if n := counts[chain.Name]; n > 0 {
		return n, true, nil
	}
	exists, err = chainExists(chain)
	return 0, exists, err
}

// chainExists asks the kernel for one chain by name (NFT_MSG_GETCHAIN, not a dump of the
// family's chains, which on a kube-proxy node are thousands).
func chainExists(chain *nftables.Chain) (bool, error) {
	attrs, err := netlink.MarshalAttributes([]netlink.Attribute{
		{Type: unix.NFTA_CHAIN_TABLE, Data: []byte(chain.Table.Name + "\x00")},
		{Type: unix.NFTA_CHAIN_NAME, Data: []byte(chain.Name + "\x00")},
	})
	if err != nil {
		return false, err
	}
	_, err = Exchange([]netlink.Message{{
		Header: netlink.Header{
			Type:  netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETCHAIN),
			Flags: netlink.Request | netlink.Acknowledge,
		},
		Data: append([]byte{byte(chain.Table.Family), unix.NFNETLINK_V0, 0, 0}, attrs...),
	}})
	switch {
	case IsNotExist(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("read chain %s of table %s: %w", chain.Name, chain.Table.Name, err)
	}
	return true, nil
}

// Rules decodes the dump and returns the rules by chain name. The kernel's messages are parsed
// by google/nftables itself, handed to it through the in-memory netlink connection of its
// WithTestDial option, so the rules come back exactly as GetRules would return them.
func (d *RuleDump) Rules() (map[string][]*nftables.Rule, error) {
	if len(d.msgs) == 0 {
		return map[string][]*nftables.Rule{}, nil
	}
	// Replies as google/nftables expects them from its own request: one batch, no multi-part
	// framing, its connection's port id and sequence number.
	parse := func(req []netlink.Message) ([]netlink.Message, error) {
		if len(req) == 0 {
			return nil, io.EOF // a second receive: nothing more
		}
		out := make([]netlink.Message, len(d.msgs))
		for i, m := range d.msgs {
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
	rules, err := c.GetRules(d.table, &nftables.Chain{Name: "", Table: d.table})
	if err != nil {
		return nil, fmt.Errorf("parse the rules of table %s: %w", d.table.Name, err)
	}
	out := map[string][]*nftables.Rule{}
	for _, r := range rules {
		if r.Chain != nil {
			out[r.Chain.Name] = append(out[r.Chain.Name], r)
		}
	}
	return out, nil
}

// rawRule is what a dumped rule is made of, undecoded: its chain, its expressions and its user
// data (the comment), as the kernel encodes them, sliced out of the dump's messages.
type rawRule struct {
	chain, exprs, userdata []byte
}

// raw splits the dump into its rules, in the kernel's order (chain by chain, each in order).
// The attributes are sliced out of the messages, not copied or collected: netlink's attribute
// decoders copy every attribute or gather them in a slice per message, which made this split
// cost ADD more than the digest it feeds.
func (d *RuleDump) raw() ([]rawRule, error) {
	out := make([]rawRule, 0, len(d.msgs))
	for _, m := range d.msgs {
		if len(m.Data) < 4 {
			continue
		}
		var r rawRule
		attrs := attrWalk{rest: m.Data[4:]} // after the nfgenmsg
		for attrs.next() {
			switch attrs.kind {
			case unix.NFTA_RULE_CHAIN:
				r.chain = bytes.TrimRight(attrs.value, "\x00")
			case unix.NFTA_RULE_EXPRESSIONS:
				r.exprs = attrs.value
			case unix.NFTA_RULE_USERDATA:
				r.userdata = attrs.value
			}
		}
		if attrs.err != nil {
			return nil, fmt.Errorf("read the rules of table %s: %w", d.table.Name, attrs.err)
		}
		out = append(out, r)
	}
	return out, nil
}

// attrWalk steps through the netlink attributes of a message, each one's kind (its type without
// the nested and byte-order flags) and value a slice of the message. A length that leaves the
// message ends the walk with err.
type attrWalk struct {
	rest  []byte
	kind  uint16
	value []byte
	err   error
}

func (w *attrWalk) next() bool {
	if len(w.rest) < unix.NLA_HDRLEN {
		return false
	}
	l := int(binary.NativeEndian.Uint16(w.rest))
	if l < unix.NLA_HDRLEN || l > len(w.rest) {
		w.err = fmt.Errorf("netlink attribute of length %d in %d bytes", l, len(w.rest))
		return false
	}
	w.kind = binary.NativeEndian.Uint16(w.rest[2:]) &^ (unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER)
	w.value = w.rest[unix.NLA_HDRLEN:l]
	w.rest = w.rest[min(len(w.rest), (l+unix.NLA_ALIGNTO-1)&^(unix.NLA_ALIGNTO-1)):]
	return true
}

// Counts returns the number of rules of every chain, without decoding them.
func (d *RuleDump) Counts() (map[string]int, error) {
	rules, err := d.raw()
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	for _, r := range rules {
		out[string(r.chain)]++
	}
	return out, nil
}

// dumpRules asks the kernel for every rule of table (NFT_MSG_GETRULE with the table), or of its
// chain chain when that is not "", over Exchange's blocking socket. A dump that a concurrent
// change interrupted is read again.
func dumpRules(table *nftables.Table, chain string) ([]netlink.Message, error) {
	ask := []netlink.Attribute{{Type: unix.NFTA_RULE_TABLE, Data: []byte(table.Name + "\x00")}}
	if chain != "" {
		ask = append(ask, netlink.Attribute{Type: unix.NFTA_RULE_CHAIN, Data: []byte(chain + "\x00")})
	}
	attrs, err := netlink.MarshalAttributes(ask)
	if err != nil {
		return nil, err
	}
	req := netlink.Message{
		Header: netlink.Header{
			Type:  netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETRULE),
			Flags: netlink.Request | netlink.Dump,
		},
		// nfgenmsg: family, version, resource id
		Data: append([]byte{byte(table.Family), unix.NFNETLINK_V0, 0, 0}, attrs...),
	}
	for attempt := 0; ; attempt++ {
		replies, err := Exchange([]netlink.Message{req})
		if errors.Is(err, unix.ENOENT) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("read the rules of table %s: %w", table.Name, err)
		}
		interrupted := slices.ContainsFunc(replies, func(m netlink.Message) bool { return m.Header.Flags&netlink.DumpInterrupted != 0 })
		if interrupted && attempt < 3 {
			continue
		}
		return slices.DeleteFunc(replies, func(m netlink.Message) bool { return m.Header.Type == netlink.Done }), nil
	}
}

// TableRuleCounts counts the rules of every chain of table, from one dump, without decoding
// them: what STATUS needs to tell missing rules (a flushed ruleset) from present ones, at the
// cost of the dump alone.
func TableRuleCounts(table *nftables.Table) (map[string]int, error) {
	d, err := DumpRules(table)
	if err != nil {
		return nil, err
	}
	return d.Counts()
}
