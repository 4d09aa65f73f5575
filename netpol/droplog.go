package netpol

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/kubenet-dev/kubenet/internal/nft"
	"github.com/kubenet-dev/kubenet/internal/policyrules"
)

// DropCounts reads the drop counters of the network's pods and the drops that were not logged
// because the log's rate was over (CounterLogRateLimited). A missing table reads as none.
func DropCounts(network string) ([]policyrules.PortDrops, uint64, error) {
	c, err := nftables.New()
	if err != nil {
		return nil, 0, fmt.Errorf("policy rules: netlink: %w", err)
	}
	bt := BridgeTable(network)
	if ok, err := nft.TableExistsWith(c, bt); err != nil || !ok {
		return nil, 0, err
	}
	var out []policyrules.PortDrops
	for _, dir := range []string{egressDir, ingressDir} {
		els, err := c.GetSetElements(dropsSet(bt, dir))
		if nft.IsNotExist(err) {
			continue
		}
		if err != nil {
			return nil, 0, fmt.Errorf("read set %s: %w", dropsName(dir), err)
		}
		for _, e := range els {
			if len(e.Key) != 4 {
				continue
			}
			d := policyrules.PortDrops{Ingress: dir == ingressDir, Port: int(binary.NativeEndian.Uint32(e.Key)), Pod: e.Comment}
			d.Pod, d.Audit = strings.CutPrefix(d.Pod, auditComment)
			if e.Counter != nil {
				d.Packets, d.Bytes = e.Counter.Packets, e.Counter.Bytes
			}
			out = append(out, d)
		}
	}
	var limited uint64
	objs, err := c.GetNamedObjects(bt)
	if err != nil && !nft.IsNotExist(err) {
		return nil, 0, fmt.Errorf("list objects of %s: %w", bt.Name, err)
	}
	for _, o := range objs {
		if n, ok := o.(*nftables.NamedObj); ok && n.Name == CounterLogRateLimited {
			if ctr, ok := n.Obj.(*expr.Counter); ok {
				limited = ctr.Packets
			}
		}
	}
	return out, limited, nil
}

// nfnetlink_log's message types, attributes and values (linux/netfilter/nfnetlink_log.h; x/sys
// has none of them).
const (
	nfulnlMsgPacket = 0
	nfulnlMsgConfig = 1

	nfulaPacketHdr     = 1
	nfulaTimestamp     = 3
	nfulaIfindexIndev  = 4
	nfulaIfindexOutdev = 5
	nfulaPhysIndev     = 6
	nfulaPhysOutdev    = 7
	nfulaPayload       = 9
	nfulaPrefix        = 10
	nfulaSeq           = 12

	nfulaCfgCmd     = 1
	nfulaCfgMode    = 2
	nfulaCfgTimeout = 4
	nfulaCfgFlags   = 6

	nfulnlCfgCmdBind  = 1
	nfulnlCopyPacket  = 2
	nfulnlCfgFlagsSeq = 0x1
)

// DropLogReader receives the drops that the rules of Options.Log.Group send to NFLOG, in the
// network namespace it was opened in. One reader may bind a group in a namespace.
type DropLogReader struct {
	conn  *netlink.Conn
	group uint16
	seq   uint32
	seen  bool
}

// OpenDropLog binds the NFLOG group in the network namespace netns (a file descriptor; 0: the
// caller's), asks for the packets' first LogSnaplen bytes, per-message sequence numbers (lost
// messages show as gaps) and a flush every 100 ms at the latest.
func OpenDropLog(group uint16, netns int) (*DropLogReader, error) {
	if group == 0 {
		return nil, errors.New("drop log: group 0 means no logging")
	}
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: netns})
	if err != nil {
		return nil, fmt.Errorf("drop log: netlink: %w", err)
	}
	// A burst at the log's rate fits in the socket's buffer; past it the kernel says ENOBUFS
	// and the messages are lost (counted by the gaps).
	_ = conn.SetReadBuffer(1 << 20)
	r := &DropLogReader{conn: conn, group: group}
	mode := make([]byte, 6)
	binary.BigEndian.PutUint32(mode, LogSnaplen)
	mode[4] = nfulnlCopyPacket
	for _, attrs := range [][]netlink.Attribute{
		{{Type: nfulaCfgCmd, Data: []byte{nfulnlCfgCmdBind}}},
		{{Type: nfulaCfgMode, Data: mode}},
		{{Type: nfulaCfgFlags, Data: binary.BigEndian.AppendUint16(nil, nfulnlCfgFlagsSeq)}},
		{{Type: nfulaCfgTimeout, Data: binary.BigEndian.AppendUint32(nil, 10)}}, // 1/100 s
	} {
		if err := r.config(attrs); err != nil {
			conn.Close()
			if errors.Is(err, unix.EBUSY) {
				return nil, fmt.Errorf("drop log: NFLOG group %d is bound by another process: %w", group, err)
			}
			return nil, fmt.Errorf("drop log: configure NFLOG group %d: %w", group, err)
		}
	}
	return r, nil
}

// config sends one NFULNL_MSG_CONFIG for the reader's group and waits for the kernel's answer.
func (r *DropLogReader) config(attrs []netlink.Attribute) error {
	b, err := netlink.MarshalAttributes(attrs)
	if err != nil {
		return err
	}
	hdr := []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, byte(r.group >> 8), byte(r.group)}
	_, err = r.conn.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_ULOG<<8 | nfulnlMsgConfig), Flags: netlink.Request | netlink.Acknowledge},
		Data:   append(hdr, b...),
	})
	return err
}

// Close unbinds the group (the kernel drops the instance with the socket) and ends a Read.
func (r *DropLogReader) Close() error { return r.conn.Close() }

// Read waits for the next messages and returns the drops they carry, and how many messages the
// sequence numbers say were lost before them (each Drop's Network as LogNetwork names it). An
// overrun of the socket's buffer returns policyrules.ErrOverrun (and the drops the messages
// after it hold come with the next Read); a closed reader returns an error that wraps
// os.ErrClosed.
func (r *DropLogReader) Read() ([]policyrules.Drop, uint64, error) {
	msgs, err := r.conn.Receive()
	if errors.Is(err, unix.ENOBUFS) {
		return nil, 0, policyrules.ErrOverrun
	}
	if err != nil {
		if errors.Is(err, os.ErrClosed) || errors.Is(err, net.ErrClosed) {
			return nil, 0, fmt.Errorf("drop log: %w", os.ErrClosed)
		}
		return nil, 0, fmt.Errorf("drop log: receive: %w", err)
	}
	var out []policyrules.Drop
	var lost uint64
	for _, m := range msgs {
		if m.Header.Type != netlink.HeaderType(unix.NFNL_SUBSYS_ULOG<<8|nfulnlMsgPacket) || len(m.Data) < 4 {
			continue
		}
		d, seq, hasSeq, ok := parseDropMessage(m.Data[4:])
		if hasSeq {
			if r.seen && seq-r.seq > 1 {
				lost += uint64(seq - r.seq - 1)
			}
			r.seq, r.seen = seq, true
		}
		if ok {
			out = append(out, d)
		}
	}
	return out, lost, nil
}

// parseDropMessage decodes the attributes of one NFULNL_MSG_PACKET of kubenet's drop rules. ok
// is false for a message of another prefix or an unreadable packet.
func parseDropMessage(b []byte) (d policyrules.Drop, seq uint32, hasSeq, ok bool) {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return d, 0, false, false
	}
	ad.ByteOrder = binary.BigEndian
	var prefix string
	var payload []byte
	var indev, outdev, physIn, physOut uint32
	for ad.Next() {
		switch ad.Type() {
		case nfulaPrefix:
			prefix = strings.TrimRight(string(ad.Bytes()), "\x00")
		case nfulaPayload:
			payload = ad.Bytes()
		case nfulaIfindexIndev:
			indev = ad.Uint32()
		case nfulaIfindexOutdev:
			outdev = ad.Uint32()
		case nfulaPhysIndev:
			physIn = ad.Uint32()
		case nfulaPhysOutdev:
			physOut = ad.Uint32()
		case nfulaSeq:
			seq, hasSeq = ad.Uint32(), true
		case nfulaTimestamp:
			if t := ad.Bytes(); len(t) == 16 {
				d.Time = time.Unix(int64(binary.BigEndian.Uint64(t)), int64(binary.BigEndian.Uint64(t[8:]))*1000)
			}
		}
	}
	if ad.Err() != nil {
		return d, seq, hasSeq, false
	}
	network, ingress, audit, known := ParseLogPrefix(prefix)
	if !known {
		return d, seq, hasSeq, false
	}
	d.Network, d.Ingress, d.Audit = network, ingress, audit
	if d.Time.IsZero() {
		d.Time = time.Now()
	}
	// The bridge family names the port as the physical device and the bridge as the device
	// (nfnetlink_log with br_netfilter); without br_netfilter the port is the device.
	d.Port = int(first(physIn, indev))
	if ingress {
		d.Port = int(first(physOut, outdev))
	}
	return d, seq, hasSeq, parsePacket(payload, &d)
}

func first(a, b uint32) uint32 {
	if a != 0 {
		return a
	}
	return b
}

// parsePacket reads addresses, protocol and ports from a packet that starts at its IP header
// (what the bridge family's NFLOG payload holds).
func parsePacket(p []byte, d *policyrules.Drop) bool {
	d.ICMPType = -1
	if len(p) < 1 {
		return false
	}
	var l4 []byte
	switch p[0] >> 4 {
	case 4:
		ihl := int(p[0]&0x0f) * 4
		if len(p) < 20 || ihl < 20 {
			return false
		}
		d.Src, _ = netip.AddrFromSlice(p[12:16])
		d.Dst, _ = netip.AddrFromSlice(p[16:20])
		d.Proto = p[9]
		if binary.BigEndian.Uint16(p[6:8])&0x1fff == 0 && len(p) >= ihl {
			l4 = p[ihl:] // only the first fragment carries the transport header
		}
	case 6:
		if len(p) < 40 {
			return false
		}
		d.Src, _ = netip.AddrFromSlice(p[8:24])
		d.Dst, _ = netip.AddrFromSlice(p[24:40])
		next, off := p[6], 40
		for isIPv6ExtHeader(next) && len(p) >= off+8 {
			if next == unix.IPPROTO_FRAGMENT && binary.BigEndian.Uint16(p[off+2:off+4])&0xfff8 != 0 {
				d.Proto = p[off]
				return true // a later fragment: no transport header
			}
			hlen := (int(p[off+1]) + 1) * 8
			if next == unix.IPPROTO_FRAGMENT {
				hlen = 8
			}
			next, off = p[off], off+hlen
		}
		d.Proto = next
		if len(p) >= off {
			l4 = p[off:]
		}
	default:
		return false
	}
	switch d.Proto {
	case unix.IPPROTO_TCP, unix.IPPROTO_UDP, unix.IPPROTO_SCTP:
		if len(l4) >= 4 {
			d.SrcPort, d.DstPort = binary.BigEndian.Uint16(l4), binary.BigEndian.Uint16(l4[2:])
		}
	case unix.IPPROTO_ICMP, unix.IPPROTO_ICMPV6:
		if len(l4) >= 1 {
			d.ICMPType = int(l4[0])
		}
	}
	return true
}

func isIPv6ExtHeader(next uint8) bool {
	switch next {
	case unix.IPPROTO_HOPOPTS, unix.IPPROTO_ROUTING, unix.IPPROTO_FRAGMENT, unix.IPPROTO_DSTOPTS:
		return true
	}
	return false
}
