// Package nft holds what kubenet's netfilter users share: the name of each network's nftables
// tables and small builders for the match expressions they all need. Rules are programmed over
// netlink (github.com/google/nftables): no nft or iptables process is started on the hot path.
//
// Each feature package (masq, hairpin, hostport) owns its own chains inside the network's table
// and never touches another package's chains, so each can rebuild its chains atomically.
package nft

import (
	"net"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"
)

// TableName is the nftables table (family inet, and bridge for the dedup rules) that holds the
// rules of one CNI network, so two kubenet networks on one node never clobber each other.
func TableName(network string) string { return "kubenet-" + network }

// InetTable returns the network's inet table.
func InetTable(network string) *nftables.Table {
	return &nftables.Table{Family: nftables.TableFamilyINet, Name: TableName(network)}
}

// BridgeTable returns the network's bridge-family table.
func BridgeTable(network string) *nftables.Table {
	return &nftables.Table{Family: nftables.TableFamilyBridge, Name: TableName(network)}
}

// ChainHookInetIngress is the ingress hook of an inet-family chain (kernel 5.10 and later), whose
// Device names the one device it sees packets of. The kernel numbers it NF_INET_INGRESS, after
// the IP hooks (NF_INET_NUMHOOKS); nftables.ChainHookIngress is the netdev family's number (0,
// which in the inet family is prerouting).
var ChainHookInetIngress = nftables.ChainHookRef(unix.NF_INET_NUMHOOKS)

// Comment encodes s as rule user data the way the nft tool shows it (`comment "..."`).
func Comment(s string) []byte { return userdata.AppendString(nil, userdata.TypeComment, s) }

// RuleComment returns the comment of r, or "".
func RuleComment(r *nftables.Rule) string {
	s, _ := userdata.GetString(r.UserData, userdata.TypeComment)
	return s
}

// MatchFamily restricts an inet-family rule to IPv4 or IPv6 packets (nft adds this implicitly
// in front of `ip ...` matches; over netlink it has to be explicit).
func MatchFamily(a netip.Addr) []expr.Any {
	proto := byte(unix.NFPROTO_IPV4)
	if a.Is6() {
		proto = unix.NFPROTO_IPV6
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
	}
}

// Direction selects the source or destination address of a packet.
type Direction int

// Source and Destination address selectors.
const (
	Source Direction = iota
	Destination
)

func addrOffset(is6 bool, d Direction) (offset, length uint32) {
	switch {
	case is6 && d == Source:
		return 8, 16
	case is6:
		return 24, 16
	case d == Source:
		return 12, 4
	default:
		return 16, 4
	}
}

// MatchPrefix matches packets whose source or destination address is (or, with negate, is not)
// inside p. The caller must have matched the family first (MatchFamily).
func MatchPrefix(d Direction, p netip.Prefix, negate bool) []expr.Any {
	p = p.Masked()
	off, length := addrOffset(p.Addr().Is6(), d)
	op := expr.CmpOpEq
	if negate {
		op = expr.CmpOpNeq
	}
	exprs := []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: length}}
	if p.Bits() < p.Addr().BitLen() {
		mask := net.CIDRMask(p.Bits(), p.Addr().BitLen())
		exprs = append(exprs, &expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: length, Mask: mask, Xor: make([]byte, length)})
	}
	return append(exprs, &expr.Cmp{Op: op, Register: 1, Data: p.Addr().AsSlice()})
}

// MatchLocalDestination matches packets addressed to (negate: not to) an address of this node,
// like iptables' `-m addrtype --dst-type LOCAL`.
func MatchLocalDestination(negate bool) []expr.Any {
	op := expr.CmpOpEq
	if negate {
		op = expr.CmpOpNeq
	}
	return []expr.Any{
		&expr.Fib{Register: 1, FlagDADDR: true, ResultADDRTYPE: true},
		&expr.Cmp{Op: op, Register: 1, Data: nativeUint32(unix.RTN_LOCAL)},
	}
}

// IfName encodes an interface name the way the kernel compares it (NUL padded to IFNAMSIZ).
func IfName(name string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, name)
	return b
}

// nativeUint32 encodes v in host byte order, the order fib writes its result in.
func nativeUint32(v uint32) []byte { return binaryutil.NativeEndian.PutUint32(v) }

// Reg32 returns the register number of the i-th 32-bit data register (0-15) in the form the
// kernel dumps it: a 32-bit register that starts a 128-bit one is reported as that 128-bit
// register (NFT_REG_1..4), any other as NFT_REG32_xx. Both name the same storage; writing the
// dumped form makes a rule read back byte for byte as it was planned, which is what comparing
// rules by their expressions relies on.
func Reg32(i int) uint32 {
	if i%4 == 0 {
		return uint32(unix.NFT_REG_1 + i/4)
	}
	return uint32(unix.NFT_REG32_00 + i)
}
