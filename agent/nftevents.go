package agent

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// nftChange is what the healer reads of one nftables change notification: its type
// (unix.NFT_MSG_NEWTABLE ... NFT_MSG_DELSET) and the table of the object it changed.
type nftChange struct {
	msgType uint16
	table   string
}

// nftBatch is one committed transaction as the kernel announces it: the changes of tables,
// chains, rules and sets (element notifications are skipped unread: every pod's ADD and DEL and
// every policy group makes them), then the generation message naming the thread that committed
// it. err ends the subscription: the socket overflowed (ENOBUFS: notifications were lost) or
// could not be read.
type nftBatch struct {
	changes []nftChange
	pid     uint32 // the committing thread's id in the initial PID namespace
	portid  uint32 // the committing socket's netlink port id (the generation message's header)
	comm    string // its name
	err     error
}

// tableEventsBuffer is the receive buffer asked for the subscription's socket: a policy pass at
// issue 27's size commits tens of thousands of element notifications in a few transactions, and
// an overflow costs a heal pass and a policy check. The kernel charges it only while queued.
const tableEventsBuffer = 8 << 20

// nftables netlink attributes the healer reads (linux/netfilter/nf_tables.h): the table of a
// table, chain, rule or set message is attribute 1 of each; a generation message has the
// committing thread's id and name.
const (
	nftaTable       = 1 // NFTA_TABLE_NAME, NFTA_CHAIN_TABLE, NFTA_RULE_TABLE, NFTA_SET_TABLE
	nftaGenProcPID  = 2 // NFTA_GEN_PROC_PID, big endian
	nftaGenProcName = 3 // NFTA_GEN_PROC_NAME
	nlaTypeMask     = 0x3fff
	nfgenmsgLen     = 4
)

// subscribeTables subscribes, in the calling goroutine's network namespace, to nftables' change
// notifications (NFNLGRP_NFTABLES) with a receive buffer of rcvbuf bytes and returns them as batches, one per committed transaction,
// until closeFn is called or the subscription ends (the channel closes after a batch with err).
// It reads with one buffer and decodes only message types, table names and the generation
// message: google/nftables' Monitor decoded every element of every notification, which was a
// fifth of what the agent allocated while pods churned.
func subscribeTables(rcvbuf int) (events <-chan nftBatch, closeFn func(), err error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, nil, fmt.Errorf("nftables events: socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		_ = unix.Close(fd)
		return nil, nil, fmt.Errorf("nftables events: bind: %w", err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_ADD_MEMBERSHIP, unix.NFNLGRP_NFTABLES); err != nil {
		_ = unix.Close(fd)
		return nil, nil, fmt.Errorf("nftables events: join group: %w", err)
	}
	// Beyond net.core.rmem_max needs CAP_NET_ADMIN (the agent has it); without, the largest
	// the node allows.
	if unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, rcvbuf) != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, rcvbuf)
	}
	// A non-blocking descriptor is polled by the runtime: Close wakes a pending read.
	f := os.NewFile(uintptr(fd), "nftables events")
	rc, err := f.SyscallConn()
	if err != nil {
		_ = f.Close()
		return nil, nil, fmt.Errorf("nftables events: %w", err)
	}
	out, done := make(chan nftBatch, 64), make(chan struct{})
	go readTableEvents(rc, out, done)
	return out, sync.OnceFunc(func() { close(done); _ = f.Close() }), nil
}

// rawReader is the socket as readTableEvents reads it (syscall.RawConn).
type rawReader interface {
	Read(func(fd uintptr) bool) error
}

// readTableEvents reads notifications into batches until done is closed or the socket fails.
func readTableEvents(rc rawReader, out chan<- nftBatch, done <-chan struct{}) {
	defer close(out)
	send := func(b nftBatch) bool {
		select {
		case out <- b:
			return true
		case <-done:
			return false
		}
	}
	buf := make([]byte, 1<<16) // larger than any notification datagram (NLMSG_GOODSIZE)
	var batch nftBatch
	for {
		var n int
		var rerr error
		if err := rc.Read(func(fd uintptr) bool {
			// MSG_TRUNC: the datagram's whole length, which tells a cut one.
			n, _, rerr = unix.Recvfrom(int(fd), buf, unix.MSG_TRUNC)
			return !errors.Is(rerr, unix.EAGAIN) && !errors.Is(rerr, unix.EINTR)
		}); err != nil {
			return // closed
		}
		if rerr == nil && n > len(buf) {
			// Its generation message lost, its changes would count as the next transaction's,
			// whose writer may be the agent: like an overflow, only a pass can tell.
			rerr = fmt.Errorf("a notification of %d bytes cut to %d", n, len(buf))
		}
		if rerr != nil {
			send(nftBatch{err: fmt.Errorf("nftables events: %w", rerr)})
			return
		}
		for _, b := range parseTableEvents(buf[:n], &batch) {
			if !send(b) {
				return
			}
		}
	}
}

// parseTableEvents adds the netlink messages in data to batch and returns the batches they
// complete (a generation message ends one). Malformed messages are skipped.
func parseTableEvents(data []byte, batch *nftBatch) []nftBatch {
	var complete []nftBatch
	for len(data) >= unix.NLMSG_HDRLEN {
		size := int(binary.NativeEndian.Uint32(data[0:4]))
		typ := binary.NativeEndian.Uint16(data[4:6])
		if size < unix.NLMSG_HDRLEN || size > len(data) {
			break
		}
		header, body := data[:unix.NLMSG_HDRLEN], data[unix.NLMSG_HDRLEN:size]
		data = data[min(nlmsgAlign(size), len(data)):]
		if typ>>8 != unix.NFNL_SUBSYS_NFTABLES || len(body) < nfgenmsgLen {
			continue
		}
		attrs := body[nfgenmsgLen:]
		switch msg := typ & 0xff; msg {
		case unix.NFT_MSG_NEWTABLE, unix.NFT_MSG_DELTABLE, unix.NFT_MSG_NEWCHAIN, unix.NFT_MSG_DELCHAIN,
			unix.NFT_MSG_NEWRULE, unix.NFT_MSG_DELRULE, unix.NFT_MSG_NEWSET, unix.NFT_MSG_DELSET:
			if table, ok := attribute(attrs, nftaTable); ok {
				batch.changes = append(batch.changes, nftChange{msgType: msg, table: cString(table)})
			}
		case unix.NFT_MSG_NEWGEN:
			batch.portid = binary.NativeEndian.Uint32(header[12:16])
			if pid, ok := attribute(attrs, nftaGenProcPID); ok && len(pid) == 4 {
				batch.pid = binary.BigEndian.Uint32(pid)
			}
			if comm, ok := attribute(attrs, nftaGenProcName); ok {
				batch.comm = cString(comm)
			}
			complete = append(complete, *batch)
			*batch = nftBatch{}
		}
	}
	return complete
}

// attribute finds the payload of the first netlink attribute of type typ.
func attribute(attrs []byte, typ uint16) ([]byte, bool) {
	for len(attrs) >= unix.NLA_HDRLEN {
		size := int(binary.NativeEndian.Uint16(attrs[0:2]))
		if size < unix.NLA_HDRLEN || size > len(attrs) {
			return nil, false
		}
		if binary.NativeEndian.Uint16(attrs[2:4])&nlaTypeMask == typ {
			return attrs[unix.NLA_HDRLEN:size], true
		}
		attrs = attrs[min(nlaAlign(size), len(attrs)):]
	}
	return nil, false
}

func nlmsgAlign(n int) int { return (n + unix.NLMSG_ALIGNTO - 1) &^ (unix.NLMSG_ALIGNTO - 1) }
func nlaAlign(n int) int   { return (n + unix.NLA_ALIGNTO - 1) &^ (unix.NLA_ALIGNTO - 1) }

// cString is a NUL-terminated attribute as a string.
func cString(b []byte) string {
	s, _, _ := strings.Cut(string(b), "\x00")
	return s
}
