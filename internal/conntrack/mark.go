package conntrack

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// ctaMarkMask is CTA_MARK_MASK, which nl does not name: with it an update changes only the
// mark's bits it selects.
const ctaMarkMask = 21

// entry is one conntrack entry as a dump gives it: parsed for a Match, and the attributes
// that name it exactly (its original tuple and zone) for an update.
type entry struct {
	flow  netlink.ConntrackFlow
	names [][]byte
}

// SetMark sets bit in the mark of every conntrack entry of the current network namespace that
// set selects and clears it in every other one that has it, leaving the mark's other bits;
// it returns how many entries got the bit. An entry that ends in between is no error.
func SetMark(bit uint32, set Match) (uint, error) {
	if empty() {
		return 0, nil
	}
	entries, err := dump()
	if err != nil {
		return 0, err
	}
	var marked uint
	var errs []error
	for _, e := range entries {
		want, has := set(&e.flow), e.flow.Mark&bit != 0
		if want == has {
			continue
		}
		value := uint32(0)
		if want {
			value = bit
		}
		if err := update(e, bit, value); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("mark conntrack entry %s: %w", e.flow.String(), err))
			continue
		}
		if want {
			marked++
		}
	}
	return marked, errors.Join(errs...)
}

func dump() ([]entry, error) {
	req := nl.NewNetlinkRequest(unix.NFNL_SUBSYS_CTNETLINK<<8|nl.IPCTNL_MSG_CT_GET, unix.NLM_F_DUMP)
	req.AddData(&nl.Nfgenmsg{NfgenFamily: unix.AF_UNSPEC, Version: nl.NFNETLINK_V0})
	msgs, err := req.Execute(unix.NETLINK_NETFILTER, 0)
	if err != nil {
		return nil, fmt.Errorf("list conntrack: %w", err)
	}
	out := make([]entry, 0, len(msgs))
	for _, m := range msgs {
		if e, ok := parseEntry(m); ok {
			out = append(out, e)
		}
	}
	return out, nil
}

// update sets the mark's bits mask to value in the entry e names.
func update(e entry, mask, value uint32) error {
	req := nl.NewNetlinkRequest(unix.NFNL_SUBSYS_CTNETLINK<<8|nl.IPCTNL_MSG_CT_NEW, unix.NLM_F_ACK)
	req.AddData(&nl.Nfgenmsg{NfgenFamily: e.flow.FamilyType, Version: nl.NFNETLINK_V0})
	for _, a := range e.names {
		req.AddRawData(a)
	}
	req.AddData(nl.NewRtAttr(nl.CTA_MARK, nl.BEUint32Attr(value)))
	req.AddData(nl.NewRtAttr(ctaMarkMask, nl.BEUint32Attr(mask)))
	_, err := req.Execute(unix.NETLINK_NETFILTER, 0)
	return err
}

// attr is one netlink attribute: its type (without the nested and byte-order flags), its value
// and the whole attribute as it came (header and padding), to send back as it is.
type attr struct {
	typ        uint16
	value, raw []byte
}

func attrs(b []byte) []attr {
	var out []attr
	for len(b) >= 4 {
		l := int(binary.NativeEndian.Uint16(b))
		if l < 4 || l > len(b) {
			break
		}
		next := min((l+3)&^3, len(b))
		out = append(out, attr{typ: binary.NativeEndian.Uint16(b[2:]) & nl.NLA_TYPE_MASK, value: b[4:l], raw: b[:next]})
		b = b[next:]
	}
	return out
}

// parseEntry reads one dumped message: the nfgenmsg header, then the entry's attributes.
func parseEntry(m []byte) (entry, bool) {
	if len(m) < 4 {
		return entry{}, false
	}
	e := entry{flow: netlink.ConntrackFlow{FamilyType: m[0]}}
	orig := false
	for _, a := range attrs(m[4:]) {
		switch a.typ {
		case nl.CTA_TUPLE_ORIG:
			e.flow.Forward, orig = parseTuple(a.value), true
			e.names = append(e.names, a.raw)
		case nl.CTA_TUPLE_REPLY:
			e.flow.Reverse = parseTuple(a.value)
		case nl.CTA_ZONE:
			e.names = append(e.names, a.raw)
			if len(a.value) >= 2 {
				e.flow.Zone = binary.BigEndian.Uint16(a.value)
			}
		case nl.CTA_MARK:
			if len(a.value) >= 4 {
				e.flow.Mark = binary.BigEndian.Uint32(a.value)
			}
		}
	}
	return e, orig
}

// parseTuple reads a tuple's addresses, protocol and ports: those of every protocol that has
// them (SCTP, DCCP and UDP-Lite too, which netlink's own parser leaves at 0).
func parseTuple(b []byte) netlink.IPTuple {
	var t netlink.IPTuple
	for _, a := range attrs(b) {
		switch a.typ {
		case nl.CTA_TUPLE_IP:
			for _, ip := range attrs(a.value) {
				switch ip.typ {
				case nl.CTA_IP_V4_SRC, nl.CTA_IP_V6_SRC:
					t.SrcIP = ip.value
				case nl.CTA_IP_V4_DST, nl.CTA_IP_V6_DST:
					t.DstIP = ip.value
				}
			}
		case nl.CTA_TUPLE_PROTO:
			for _, p := range attrs(a.value) {
				switch {
				case p.typ == nl.CTA_PROTO_NUM && len(p.value) >= 1:
					t.Protocol = p.value[0]
				case p.typ == nl.CTA_PROTO_SRC_PORT && len(p.value) >= 2:
					t.SrcPort = binary.BigEndian.Uint16(p.value)
				case p.typ == nl.CTA_PROTO_DST_PORT && len(p.value) >= 2:
					t.DstPort = binary.BigEndian.Uint16(p.value)
				}
			}
		}
	}
	return t
}
