package agent

import (
	"encoding/binary"
	"slices"
	"testing"
	"time"

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

// FuzzParseTableEvents: whatever a datagram holds, parseTableEvents neither panics nor reads
// past it, completes at most one batch per message, and names only changes it read whole; a
// well-formed transaction after the fuzzed data's messages is still read when the fuzzed data
// ends on a message boundary.
func FuzzParseTableEvents(f *testing.F) {
	gen := nlMessage(unix.NFT_MSG_NEWGEN, nlAttr(nftaGenProcPID, []byte{0, 0, 0, 9}), nlAttr(nftaGenProcName, []byte("nft\x00")))
	chain := nlMessage(unix.NFT_MSG_NEWCHAIN, nlAttr(nftaTable, []byte("kubenet-x\x00")))
	f.Add(slices.Concat(chain, gen))
	f.Add(chain[:len(chain)-3])
	f.Add(nlMessage(unix.NFT_MSG_NEWSETELEM, nlAttr(nftaTable, []byte("t"))))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		var batch nftBatch
		got := parseTableEvents(data, &batch)
		if len(got) > len(data)/unix.NLMSG_HDRLEN {
			t.Fatalf("%d batches from %d bytes", len(got), len(data))
		}
		for _, b := range got {
			for _, c := range b.changes {
				if len(c.table) > len(data) {
					t.Fatalf("table name %q longer than the data", c.table)
				}
			}
		}
	})
}

// socketReader reads a blocking descriptor the way readTableEvents reads its socket
// (syscall.RawConn's Read, one call per datagram).
type socketReader int

func (s socketReader) Read(f func(fd uintptr) bool) error {
	for !f(uintptr(s)) {
	}
	return nil
}

// TestReadTableEventsTruncated: a datagram larger than the read buffer ends the subscription
// (the healer subscribes again and looks) instead of being cut silently: the cut transaction's
// changes, without their generation message, were taken into the next transaction's batch and
// credited to its writer, the agent itself perhaps, which wakes nothing.
func TestReadTableEventsTruncated(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	if err := unix.SetsockoptInt(fds[0], unix.SOL_SOCKET, unix.SO_SNDBUF, 1<<20); err != nil {
		t.Fatal(err)
	}
	chain := nlMessage(unix.NFT_MSG_NEWCHAIN, nlAttr(nftaTable, []byte("kubenet-x\x00")))
	genOf := func(comm string) []byte {
		return nlMessage(unix.NFT_MSG_NEWGEN, nlAttr(nftaGenProcPID, []byte{0, 0, 0, 9}), nlAttr(nftaGenProcName, []byte(comm+"\x00")))
	}
	var theirs []byte
	for len(theirs) < 70<<10 {
		theirs = append(theirs, chain...)
	}
	theirs = append(theirs, genOf("nft")...)
	for _, d := range [][]byte{theirs, genOf("kubenet-agent")} {
		if _, err := unix.Write(fds[0], d); err != nil {
			t.Fatal(err)
		}
	}
	out, done := make(chan nftBatch, 4), make(chan struct{})
	defer close(done)
	go readTableEvents(socketReader(fds[1]), out, done)
	select {
	case b := <-out:
		if b.err == nil && (b.comm != "nft" || len(b.changes) == 0) {
			t.Fatalf("first batch %d changes by %q, want the subscription ended or the changes by nft", len(b.changes), b.comm)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no batch")
	}
}
