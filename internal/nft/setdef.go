package nft

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// SetDefinition is a set's definition as the kernel holds it: what it compares when a set is
// added again under the same name (the kernel refuses it with EEXIST unless all of it is the
// same). google/nftables reads less of it back: not a set's expressions (a counter on every
// element), and a verdict map's key type is overwritten by its data type.
type SetDefinition struct {
	Flags             uint32
	KeyType, KeyLen   uint32
	DataType, DataLen uint32
	Exprs             []string // names of the set's expressions (counter, ...)
}

// nftables attributes of a set that golang.org/x/sys/unix does not name.
const (
	nftaSetExpr        = 0x11 // NFTA_SET_EXPR
	nftaSetExpressions = 0x12 // NFTA_SET_EXPRESSIONS
	nftSetConcat       = 0x80 // NFT_SET_CONCAT
	verdictDataType    = 0xffffff00
)

// PlannedDefinition is the definition google/nftables gives s when it adds it (AddSet).
func PlannedDefinition(s *nftables.Set) SetDefinition {
	var d SetDefinition
	for _, f := range []struct {
		on   bool
		flag uint32
	}{{s.Anonymous, unix.NFT_SET_ANONYMOUS}, {s.Constant, unix.NFT_SET_CONSTANT}, {s.Interval, unix.NFT_SET_INTERVAL},
		{s.IsMap, unix.NFT_SET_MAP}, {s.HasTimeout, unix.NFT_SET_TIMEOUT}, {s.Dynamic, unix.NFT_SET_EVAL}, {s.Concatenation, nftSetConcat}} {
		if f.on {
			d.Flags |= f.flag
		}
	}
	d.KeyType, d.KeyLen = s.KeyType.GetNFTMagic(), s.KeyType.Bytes
	if s.IsMap {
		d.DataType = s.DataType.GetNFTMagic()
		if s.DataType.Name == nftables.TypeVerdict.Name {
			d.DataType = verdictDataType
		}
	}
	if s.Counter {
		d.Exprs = []string{"counter"}
	}
	return d
}

// Same tells whether d is defined as want: a verdict map's data length is the kernel's own (the
// size of a verdict), and is not compared.
func (d SetDefinition) Same(want SetDefinition) bool {
	return d.Flags == want.Flags && d.KeyType == want.KeyType && d.KeyLen == want.KeyLen && d.DataType == want.DataType &&
		(want.DataType == verdictDataType || d.DataLen == want.DataLen) && slices.Equal(d.Exprs, want.Exprs)
}

// SetDefinitions reads the definitions of the sets of table t (none when t does not exist),
// over the Generations' socket (kept open: closing one waits for a grace period).
func (g *Generations) SetDefinitions(t *nftables.Table) (map[string]SetDefinition, error) {
	attrs, err := netlink.MarshalAttributes([]netlink.Attribute{{Type: unix.NFTA_SET_TABLE, Data: append([]byte(t.Name), 0)}})
	if err != nil {
		return nil, fmt.Errorf("sets of table %s: %w", t.Name, err)
	}
	replies, err := g.conn.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETSET), Flags: netlink.Request | netlink.Dump},
		Data:   append([]byte{byte(t.Family), unix.NFNETLINK_V0, 0, 0}, attrs...),
	})
	if IsNotExist(err) {
		return map[string]SetDefinition{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("sets of table %s: %w", t.Name, err)
	}
	out := map[string]SetDefinition{}
	for _, m := range replies {
		if m.Header.Type != netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_NEWSET) || len(m.Data) < 4 {
			continue
		}
		name, d, err := setDefinitionOf(m.Data[4:])
		if err != nil {
			return nil, fmt.Errorf("sets of table %s: %w", t.Name, err)
		}
		out[name] = d
	}
	return out, nil
}

// setDefinitionOf decodes a NEWSET message's attributes. Pure.
func setDefinitionOf(b []byte) (string, SetDefinition, error) {
	var d SetDefinition
	var name string
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return "", d, err
	}
	ad.ByteOrder = binary.BigEndian
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_SET_NAME:
			name = ad.String()
		case unix.NFTA_SET_FLAGS:
			d.Flags = ad.Uint32()
		case unix.NFTA_SET_KEY_TYPE:
			d.KeyType = ad.Uint32()
		case unix.NFTA_SET_KEY_LEN:
			d.KeyLen = ad.Uint32()
		case unix.NFTA_SET_DATA_TYPE:
			d.DataType = ad.Uint32()
		case unix.NFTA_SET_DATA_LEN:
			d.DataLen = ad.Uint32()
		case nftaSetExpr:
			d.Exprs = append(d.Exprs, exprName(ad.Bytes()))
		case nftaSetExpressions:
			list, err := netlink.NewAttributeDecoder(ad.Bytes())
			if err != nil {
				return "", d, err
			}
			for list.Next() {
				d.Exprs = append(d.Exprs, exprName(list.Bytes()))
			}
		}
	}
	return name, d, ad.Err()
}

// exprName is the NFTA_EXPR_NAME of an expression's attributes ("?" when it has none).
func exprName(b []byte) string {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return "?"
	}
	for ad.Next() {
		if ad.Type() == unix.NFTA_EXPR_NAME {
			return string(bytes.TrimRight(ad.Bytes(), "\x00"))
		}
	}
	return "?"
}
