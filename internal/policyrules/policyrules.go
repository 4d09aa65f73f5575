// Package policyrules is the compiled form of NetworkPolicy on a node, the vocabulary between
// the agent's compiler (agent/policy), operators' tools (cmd/kubenetctl), the core and the kernel
// side (netpol): per local pod, the addresses, protocols and ports each direction allows
// (Ruleset), the limit on what one allow list may hold, and what installing a Ruleset did
// (Applied); the same rules as the kernel holds them, read back (Installed), and the judgement
// of a packet by them (Trace); what they dropped (Drop, PortDrops) and how drops are logged
// (DropLog). It is data and pure logic only: it knows neither Kubernetes objects nor nftables,
// and the kernel's objects only by name.
package policyrules

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kubenet-dev/kubenet/internal/ipnet"
)

// Protocol numbers a port rule can name (NetworkPolicyPort.protocol).
const (
	TCP  uint8 = 6
	UDP  uint8 = 17
	SCTP uint8 = 132
)

// Range is an inclusive range of addresses of one family: a pod's address (First == Last) or
// what is left of an ipBlock after its exceptions.
type Range struct{ First, Last netip.Addr }

// Single is the range of one address.
func Single(a netip.Addr) Range { return Range{a, a} }

// PrefixRange is the range of a prefix.
func PrefixRange(p netip.Prefix) Range {
	p = p.Masked()
	return Range{p.Addr(), ipnet.Last(p)}
}

func (r Range) String() string {
	if r.First == r.Last {
		return r.First.String()
	}
	return r.First.String() + "-" + r.Last.String()
}

// Valid tells whether r is a non-empty range of one family.
func (r Range) Valid() bool {
	return r.First.IsValid() && r.Last.IsValid() && r.First.Is4() == r.Last.Is4() && !r.First.Is4In6() && !r.Last.Is4In6() && r.First.Compare(r.Last) <= 0
}

// Ports is one protocol and an inclusive port range of it.
type Ports struct {
	Protocol    uint8
	First, Last uint16
}

func (p Ports) String() string {
	if p.First == p.Last {
		return fmt.Sprintf("%s/%d", protoName(p.Protocol), p.First)
	}
	return fmt.Sprintf("%s/%d-%d", protoName(p.Protocol), p.First, p.Last)
}

// Protocol numbers without ports that an operator names (trace).
const (
	ICMP   uint8 = 1
	ICMPv6 uint8 = 58
)

// ProtocolName names a protocol for operators: tcp, udp, sctp, icmp, icmpv6, or its number.
func ProtocolName(p uint8) string {
	switch p {
	case ICMP:
		return "icmp"
	case ICMPv6:
		return "icmpv6"
	}
	return protoName(p)
}

// ParseProtocol reads a protocol as ProtocolName writes it (any case), or as a number 0-255.
func ParseProtocol(s string) (uint8, error) {
	if n, err := strconv.ParseUint(s, 10, 8); err == nil {
		return uint8(n), nil
	}
	for p := range 256 {
		if strings.EqualFold(s, ProtocolName(uint8(p))) {
			return uint8(p), nil
		}
	}
	return 0, fmt.Errorf("protocol %q: want tcp, udp, sctp, icmp, icmpv6 or a number 0-255", s)
}

// protoName is the name a group's content address is made from: it must never change.
func protoName(p uint8) string {
	switch p {
	case TCP:
		return "tcp"
	case UDP:
		return "udp"
	case SCTP:
		return "sctp"
	}
	return fmt.Sprint(p)
}

// Entry allows one peer range: on every protocol and port (Ports nil), or on Ports.
type Entry struct {
	Peer  Range
	Ports *Ports
}

// Equal compares two entries by value (their ports too, not the pointers).
func (e Entry) Equal(o Entry) bool {
	if e.Peer != o.Peer || (e.Ports == nil) != (o.Ports == nil) {
		return false
	}
	return e.Ports == nil || *e.Ports == *o.Ports
}

// Direction is what one direction of a pod allows. A pod that is not Isolated in a direction
// (no policy of that type selects it) is not filtered in it; an isolated pod is allowed exactly
// the union of Allow.
type Direction struct {
	Isolated bool
	Allow    []Entry
	// Policies names ("namespace/name", sorted) the policies that isolate the pod in this
	// direction: what logs, metrics and explanations tell an operator. The kernel side does not
	// read it (two pods with the same Allow share one group whatever their policies).
	Policies []string
	// Audit says only audit (staged) policies isolate the pod in this direction: nothing is
	// enforced; what Allow does not hold is counted and logged as what they would drop, and
	// passes. An enforced policy that isolates the direction makes it an enforced one, and the
	// audit policies then change nothing (they could only add to the union of what is allowed).
	Audit bool
}

// Pod is one local pod whose policies are known.
type Pod struct {
	// Port is the interface index of the pod's bridge port (its host veth): the maps dispatch by
	// it, so every frame of the pod is judged, whatever address it carries. An index is never
	// given to another interface before the counter wraps, so a deleted pod's element can never
	// speak for a new pod.
	Port int
	// Name says who the pod is in logs ("namespace/name" or the attachment).
	Name string
	// IPs are the pod's addresses, its IPv6 link-local one included: before a pod's first
	// release, conntrack's entries of these addresses go (flows older than the pod).
	IPs     []netip.Addr
	Ingress Direction
	Egress  Direction
}

// Ruleset is the whole policy state of the node's pods. Pods not in it have no map elements:
// their guards drop everything they send and everything sent to them.
type Ruleset struct {
	Pods []Pod
	// PodCIDRs are the node's pod CIDRs: IPv6 neighbour discovery within them (and link-local)
	// is on the pods' own link and passes without a policy; a packet routed in from one of their
	// addresses but NodeAddrs must come from its pod's port.
	PodCIDRs []netip.Prefix
	// NodeAddrs are the node's own addresses in PodCIDRs (the bridge's): a packet routed into
	// the bridge from them is the node's (kube-proxy masquerades to them).
	NodeAddrs []netip.Addr
}

// MergeRanges sorts ranges of one family and joins overlapping and adjacent ones.
func MergeRanges(in []Range) []Range {
	if len(in) == 0 {
		return nil
	}
	rs := slices.Clone(in)
	slices.SortFunc(rs, func(a, b Range) int { return a.First.Compare(b.First) })
	out := []Range{rs[0]}
	for _, r := range rs[1:] {
		last := &out[len(out)-1]
		if next := last.Last.Next(); r.First.Compare(last.Last) <= 0 || (next.IsValid() && next == r.First) {
			if r.Last.Compare(last.Last) > 0 {
				last.Last = r.Last
			}
			continue
		}
		out = append(out, r)
	}
	return out
}

// MaxAllowEntries bounds a direction's allow list as the compiler hands it over, before anything
// is merged: the compiler stops expanding a pod's policies past it, and a longer list is not
// installed (a Refusal wrapping ErrTooBig).
const MaxAllowEntries = 1 << 19

// ErrTooBig says an allow list is over one of the limits on what it may cost the node
// (MaxAllowEntries, or the kernel side's limits on its sets).
var ErrTooBig = errors.New("allow list too big")

// Applied tells what installing a Ruleset (netpol.Apply) changed, for logs and metrics.
type Applied struct {
	Groups         int // groups in use
	NewGroups      int // groups created by this Apply
	RepairedGroups int // groups whose chain or sets differed from their plan and were rewritten
	RemovedGroups  int
	// EditedGroups are groups made of another group that went: its sets' elements edited, a new
	// chain for them (neither new nor removed groups).
	EditedGroups int
	MapChanges   int  // map elements added, changed or removed
	Released     int  // ports that got their first elements: their pods' policies came into force
	Conntrack    uint // conntrack entries of released pods' addresses removed (flows older than the pods)
	FixedWritten bool // a fixed chain, map or set was missing or differed and was rewritten
	Transactions int
	// LongestTransaction is the longest a transaction of this Apply took to send and be
	// answered: the kernel holds the network namespace's nftables mutex for a transaction, so
	// another writer of nftables (an ADD's rules) waits at most that long for it.
	LongestTransaction time.Duration
	// Refused are the allow lists that were not installed: over a limit, or refused by the
	// kernel. Their pods keep, in that direction, the group they had (none: denied; a pod that
	// was not isolated in it is denied too, never left open); everything else is applied.
	Refused []Refusal
	// Dispatch is, per port, the chain each direction's map element names once this Apply is
	// done: what the agent records of its pass, so that an operator's tool reading the kernel
	// later can tell a change made since from the agent's own.
	Dispatch map[int]Dispatch
}

// Dispatch names the chains a port's map elements go to: a group, the allow chain of a
// direction the pod is not isolated in, or "" (no element: held, denied).
type Dispatch struct {
	Ingress string `json:"ingress,omitempty"`
	Egress  string `json:"egress,omitempty"`
}

// Changed tells whether the apply wrote anything.
func (a Applied) Changed() bool {
	return a.NewGroups+a.EditedGroups+a.RepairedGroups+a.RemovedGroups+a.MapChanges+a.Released > 0 || a.FixedWritten
}

// Refusal is one allow list an apply did not install, and the pods that needed it.
type Refusal struct {
	Ingress bool     // the direction
	Pods    []string // Pod.Name of each pod that needed it
	Group   string   // the group's name, when the list got as far as one
	Cost    int      // what its sets would cost the kernel, in IPv4 prefixes (0: not counted)
	// Err wraps ErrTooBig for a list over a limit (it stays refused until it changes), else it
	// is the kernel's answer (a later apply tries again).
	Err error
}

// Allows tells whether the direction lets a connection with peer on protocol and port through:
// not isolated, isolated by staged policies only (Audit: they would drop it, but it passes), or
// one of its entries covers the peer and has no ports or covers the protocol and port. Port
// rules are of TCP, UDP or SCTP only, so for ICMP only entries without ports match, as in the
// kernel's sets.
func (d Direction) Allows(peer netip.Addr, protocol uint8, port uint16) bool {
	if !d.Isolated || d.Audit {
		return true
	}
	return slices.ContainsFunc(d.Allow, func(e Entry) bool {
		return e.Peer.Contains(peer) && (e.Ports == nil || (e.Ports.Protocol == protocol && e.Ports.First <= port && port <= e.Ports.Last))
	})
}

// Contains tells whether a lies in the range (an IPv4-mapped address counts as IPv4).
func (r Range) Contains(a netip.Addr) bool {
	a = a.Unmap()
	return r.Valid() && a.Is4() == r.First.Is4() && r.First.Compare(a) <= 0 && a.Compare(r.Last) <= 0
}
