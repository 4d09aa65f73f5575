package agent

import (
	"encoding/binary"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

// nlMessage is a netlink message of nftables' subsystem with its attributes (type, payload).
func nlMessage(msgType uint16, attrs ...[]byte) []byte {
	body := []byte{unix.NFPROTO_INET, 0, 0, 0} // nfgenmsg
	for _, a := range attrs {
		body = append(body, a...)
	}
	msg := make([]byte, unix.NLMSG_HDRLEN, unix.NLMSG_HDRLEN+len(body))
	binary.NativeEndian.PutUint32(msg[0:4], uint32(unix.NLMSG_HDRLEN+len(body)))
	binary.NativeEndian.PutUint16(msg[4:6], unix.NFNL_SUBSYS_NFTABLES<<8|msgType)
	msg = append(msg, body...)
	return append(msg, make([]byte, nlmsgAlign(len(msg))-len(msg))...)
}

func nlAttr(typ uint16, payload []byte) []byte {
	a := make([]byte, unix.NLA_HDRLEN, nlaAlign(unix.NLA_HDRLEN+len(payload)))
	binary.NativeEndian.PutUint16(a[0:2], uint16(unix.NLA_HDRLEN+len(payload)))
	binary.NativeEndian.PutUint16(a[2:4], typ)
	a = append(a, payload...)
	return append(a, make([]byte, cap(a)-len(a))...)
}

// TestParseTableEvents: a transaction's notifications become one batch at its generation
// message, with its table, chain, rule and set changes (elements left out) and the committing
// thread; truncated or malformed data is skipped without reading past it.
func TestParseTableEvents(t *testing.T) {
	pid := binary.BigEndian.AppendUint32(nil, 4242)
	chain := nlMessage(unix.NFT_MSG_NEWCHAIN, nlAttr(nftaTable, []byte("kubenet-x\x00")), nlAttr(3, []byte("c\x00")))
	elems := nlMessage(unix.NFT_MSG_NEWSETELEM, nlAttr(nftaTable, []byte("kubenet-x\x00")))
	delTable := nlMessage(unix.NFT_MSG_DELTABLE, nlAttr(nftaTable, []byte("kubenet-y\x00")))
	gen := nlMessage(unix.NFT_MSG_NEWGEN, nlAttr(1, []byte{0, 0, 0, 7}), nlAttr(nftaGenProcPID, pid), nlAttr(nftaGenProcName, []byte("nft\x00")))
	whole := slices.Concat(chain, elems, delTable, gen)
	want := nftBatch{changes: []nftChange{{unix.NFT_MSG_NEWCHAIN, "kubenet-x"}, {unix.NFT_MSG_DELTABLE, "kubenet-y"}}, pid: 4242, comm: "nft"}

	var batch nftBatch
	got := parseTableEvents(whole, &batch)
	if len(got) != 1 || !slices.Equal(got[0].changes, want.changes) || got[0].pid != want.pid || got[0].comm != want.comm {
		t.Fatalf("batches %+v, want [%+v]", got, want)
	}
	// A transaction's notifications may come in several datagrams.
	batch = nftBatch{}
	if got := parseTableEvents(slices.Concat(chain, elems), &batch); len(got) != 0 {
		t.Errorf("a batch %+v before the generation message", got)
	}
	if got := parseTableEvents(slices.Concat(delTable, gen), &batch); len(got) != 1 || !slices.Equal(got[0].changes, want.changes) {
		t.Errorf("batches %+v over two datagrams, want [%+v]", got, want)
	}

	for _, tc := range []struct {
		name string
		data []byte
	}{
		{"cut in its header", whole[:10]},
		{"cut in its attributes", whole[:len(chain)-6]},
		{"message longer than the datagram", func() []byte {
			b := slices.Clone(chain)
			binary.NativeEndian.PutUint32(b[0:4], 1<<20)
			return b
		}()},
		{"message shorter than its header", func() []byte {
			b := slices.Clone(chain)
			binary.NativeEndian.PutUint32(b[0:4], 3)
			return b
		}()},
		{"attribute longer than its message", nlMessage(unix.NFT_MSG_NEWCHAIN, []byte{0xff, 0x00, 1, 0, 'k', 0, 0, 0})},
		{"attribute shorter than its header", nlMessage(unix.NFT_MSG_NEWCHAIN, []byte{2, 0, 1, 0})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b nftBatch
			if got := parseTableEvents(tc.data, &b); len(got) != 0 || len(b.changes) != 0 {
				t.Errorf("batches %+v, pending %+v from malformed data", got, b)
			}
		})
	}
}
