package policyrules

import (
	"errors"
	"net/netip"
	"time"
)

// DropLog says whether and how the drop chains send what they drop to the agent (NFLOG). Off
// (Group 0) the rules have no log action at all.
type DropLog struct {
	// Group is the NFLOG group (netlink multicast group of nfnetlink_log); 0: no logging.
	Group uint16
	// Rate and Burst bound the packets logged per second, per direction: the rest is counted
	// (the kernel side's rate-limited counter) and dropped unlogged.
	Rate, Burst uint32
}

// Defaults of DropLog.
const (
	DefaultLogGroup = 2700
	DefaultLogRate  = 100
	DefaultLogBurst = 100
)

// Drop is one packet a policy dropped, as the drop log hands it over.
type Drop struct {
	Time time.Time
	// Network is the network whose rules dropped it. The kernel's log prefix holds a name too
	// long for it cut and hashed; a reader opened for one network names its drops in full.
	Network string
	Ingress bool
	// Audit: not dropped; what the pod's staged policies would drop (an audit group passed it).
	Audit bool
	// Port is the pod's bridge port: the input port of an egress drop, the output port of an
	// ingress one.
	Port     int
	Src, Dst netip.Addr
	Proto    uint8  // IP protocol (IPv6: after the extension headers the log's snapshot holds)
	SrcPort  uint16 // TCP, UDP, SCTP; 0 otherwise
	DstPort  uint16
	ICMPType int // ICMP and ICMPv6: the type; else -1
}

// ErrOverrun says the drop log's receive buffer overflowed: the kernel dropped messages; how
// many, the next message's sequence number tells (the reader counts the gap).
var ErrOverrun = errors.New("drop log: receive buffer overrun")

// PortDrops is what the policies dropped on one pod's port in one direction, as the kernel
// counted it.
type PortDrops struct {
	Ingress bool
	Port    int
	Pod     string // the pod's name as the installed rules hold it (at most 128 bytes of it)
	// Audit: the pod's direction is an audit one, and the count is what its staged policies
	// would have dropped (nothing was).
	Audit          bool
	Packets, Bytes uint64
}
