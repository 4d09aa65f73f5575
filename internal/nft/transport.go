package nft

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// NewConn returns a google/nftables connection whose every operation is one exchange over a
// blocking netlink socket of its own (Exchange): mdlayher/netlink, which google/nftables dials
// otherwise, parks the goroutine in Go's network poller for every read and seeds a random number
// generator for every socket, which is most of what a small transaction costs a short-lived
// process. For small requests: a transaction of one pod's elements, a dump of a few objects.
func NewConn() (*nftables.Conn, error) {
	return nftables.New(nftables.WithTestDial(Exchange))
}

// exchangeTimeout bounds the wait for each reply of an Exchange.
const exchangeTimeout = 10 * time.Second

// Exchange sends msgs (a request, or a batch of them) to the kernel's nfnetlink over a new
// blocking socket and returns every reply up to the last one due: the end of a dump, or an
// acknowledgement for each message that asked for one. An error reply ends the exchange with its
// errno, whichever message it answers. Called with no messages (google/nftables reading on after
// the replies), it returns none.
func Exchange(msgs []netlink.Message) ([]netlink.Message, error) {
	if len(msgs) == 0 {
		return nil, nil
	}
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, os.NewSyscallError("socket", err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, os.NewSyscallError("bind", err)
	}
	// The kernel answers at once; the bound only keeps a verb from hanging should a reply due
	// never come.
	timeout := unix.NsecToTimeval(exchangeTimeout.Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &timeout); err != nil {
		return nil, os.NewSyscallError("setsockopt", err)
	}
	var out []byte
	acks, dump := 0, false
	for _, m := range msgs {
		if m.Header.Length == 0 { // a request of this package's, not one google/nftables framed
			m.Header.Length = uint32(unix.NLMSG_HDRLEN + len(m.Data))
		}
		b, err := m.MarshalBinary()
		if err != nil {
			return nil, err
		}
		out = append(out, b...)
		if m.Header.Flags&netlink.Dump == netlink.Dump {
			dump = true
		} else if m.Header.Flags&netlink.Acknowledge != 0 {
			acks++
		}
	}
	if err := unix.Sendto(fd, out, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, os.NewSyscallError("sendto", err)
	}
	var replies []netlink.Message
	for acks > 0 || dump {
		datagram, err := receive(fd)
		if err != nil {
			return replies, err
		}
		got, err := parseMessages(datagram)
		if err != nil {
			return replies, err
		}
		for _, r := range got {
			// As if the replies came from the connection google/nftables dialled, whose
			// requests carry its port id (mdlayher/netlink checks it on a dump's replies).
			r.Header.PID = msgs[0].Header.PID
			switch r.Header.Type {
			case netlink.Error:
				if len(r.Data) < 4 {
					return replies, errors.New("netlink: short error message")
				}
				if errno := -int32(binary.NativeEndian.Uint32(r.Data[:4])); errno != 0 {
					return replies, unix.Errno(errno)
				}
				acks--
			case netlink.Done:
				dump = false
			}
			replies = append(replies, r)
		}
	}
	return replies, nil
}

// receive reads the next datagram into a buffer of its exact size, which the messages parsed from
// it may keep: the kernel first tells the size without consuming it (MSG_PEEK with MSG_TRUNC). A
// buffer of the largest size instead (64 KiB) is zeroed on every call and, not escaping, grows the
// stack of every goroutine that calls Exchange to 128 KiB: in a short-lived plugin process that
// was some twenty page faults per dump.
func receive(fd int) ([]byte, error) {
	for {
		n, _, err := unix.Recvfrom(fd, nil, unix.MSG_PEEK|unix.MSG_TRUNC)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, os.NewSyscallError("recvfrom", err)
		}
		buf := make([]byte, max(n, unix.NLMSG_HDRLEN))
		m, _, err := unix.Recvfrom(fd, buf, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, os.NewSyscallError("recvfrom", err)
		}
		return buf[:m], nil
	}
}

// parseMessages splits a datagram into its netlink messages.
func parseMessages(b []byte) ([]netlink.Message, error) {
	var out []netlink.Message
	for len(b) >= unix.NLMSG_HDRLEN {
		var m netlink.Message
		l := int(binary.NativeEndian.Uint32(b[:4]))
		if l < unix.NLMSG_HDRLEN || l > len(b) {
			return out, fmt.Errorf("netlink: message of length %d in %d bytes", l, len(b))
		}
		if err := m.UnmarshalBinary(b[:l]); err != nil {
			return out, err
		}
		out = append(out, m)
		b = b[min(len(b), (l+unix.NLMSG_ALIGNTO-1)&^(unix.NLMSG_ALIGNTO-1)):]
	}
	return out, nil
}

// BatchReceiveBuffer is a receive buffer for the acknowledgements of some twenty thousand
// messages (an acknowledgement takes about 768 bytes of it). The kernel acknowledges every
// message of a transaction before the sender reads the first acknowledgement: a transaction of
// a few hundred messages (a policy pass that removes a hundred groups with their sets)
// overflows the default buffer (ENOBUFS), and its sender sees a transaction the kernel
// committed fail.
const BatchReceiveBuffer = 16 << 20

// BatchSendBuffer is a send buffer for a transaction of thousands of messages: a transaction is
// one datagram, which sendmsg refuses (EMSGSIZE) when it is bigger than the socket's send buffer
// (about 208 KiB by default): a policy switch that edits a few hundred groups in place, with
// their new chains and map elements, is bigger.
const BatchSendBuffer = 16 << 20

// SendBuffer is a google/nftables socket option that raises the socket's send buffer to bytes,
// past net.core.wmem_max (SO_SNDBUFFORCE, which the agent's CAP_NET_ADMIN allows), else as far
// as wmem_max lets it.
func SendBuffer(bytes int) nftables.SockOption {
	return forcedBuffer(unix.SO_SNDBUFFORCE, bytes, (*netlink.Conn).SetWriteBuffer)
}

// ReceiveBuffer is SendBuffer for the receive buffer (SO_RCVBUFFORCE, else net.core.rmem_max).
func ReceiveBuffer(bytes int) nftables.SockOption {
	return forcedBuffer(unix.SO_RCVBUFFORCE, bytes, (*netlink.Conn).SetReadBuffer)
}

// PortID is a google/nftables socket option that hands record the netlink port id the kernel
// bound the socket to: the kernel's notification of a transaction committed through the socket
// carries it (the generation message's header), so that a watcher can tell the transactions of
// one writer from everybody else's.
func PortID(record func(uint32)) nftables.SockOption {
	return func(c *netlink.Conn) error {
		raw, err := c.SyscallConn()
		if err != nil {
			return err
		}
		var sa unix.Sockaddr
		var serr error
		if err := raw.Control(func(fd uintptr) { sa, serr = unix.Getsockname(int(fd)) }); err != nil {
			return err
		}
		if serr != nil {
			return fmt.Errorf("netlink port id: %w", serr)
		}
		if nl, ok := sa.(*unix.SockaddrNetlink); ok {
			record(nl.Pid)
		}
		return nil
	}
}

// forcedBuffer sets a buffer's size with the forcing socket option opt, else with set.
func forcedBuffer(opt, bytes int, set func(*netlink.Conn, int) error) nftables.SockOption {
	return func(c *netlink.Conn) error {
		raw, err := c.SyscallConn()
		if err != nil {
			return err
		}
		var serr error
		if err := raw.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, opt, bytes) }); err != nil {
			return err
		}
		if serr != nil {
			return set(c, bytes)
		}
		return nil
	}
}
