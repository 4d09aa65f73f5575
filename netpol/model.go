// Package netpol is the kernel side of NetworkPolicy on a kubenet node. It knows nothing of
// Kubernetes objects: its input is, per local pod, the addresses, protocols and ports each
// direction allows (Ruleset), and it never reads the API.
//
// Enforcement grants, guards deny. Two tc guards (guard.go) drop every frame that reaches them
// without a packet-mark bit: one on each pod's port towards the pod (MarkIngress), one where the
// bridge hands frames up to the node (MarkEgress); bridged frames between ports must carry
// MarkEgress to get MarkIngress. Only the policy rules set the bits, so anything that removes
// rules — `nft flush ruleset`, a deleted table, a damaged chain, a missing br_netfilter — leaves
// the pods with guards denied, never open; and a pod is denied from the moment ADD gave it its
// guard until its policies are installed, with nothing for ADD to write into the tables.
//
// Layout (see rules.go for the names):
//
//   - table bridge kubenetpolicy-<network>: base chains on the prerouting (frames from pods),
//     forward (port to port) and output (node to pod) hooks, after br_netfilter, dispatching by
//     the frame's input or output port through verdict maps to the pod's group chain, or to the
//     allow chains for a pod that is not isolated in that direction. A port with no element gets
//     no mark. One chain per distinct "allow list" (a group: pods with the same allowed peers
//     and ports share it, whatever the number of policies behind it) grants packets of known
//     connections and looks the peer address, protocol and port up in two concatenated interval
//     sets; it drops the rest;
//   - table inet kubenetpolicy-<network>: marks packets of connections conntrack knows (in IP
//     prerouting, which br_netfilter runs before the bridge chains) and every packet the node
//     sends (the node reaches every pod).
//
// The agent owns everything in the tables; the plugin only gives a new port its guard and drops
// a deleted port's map elements. Nothing is removed when the agent stops: a node whose agent is
// down keeps its last rules, and pods that start meanwhile stay denied.
package netpol

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"slices"
	"strings"

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

// Direction is what one direction of a pod allows. A pod that is not Isolated in a direction
// (no policy of that type selects it) is not filtered in it; an isolated pod is allowed exactly
// the union of Allow.
type Direction struct {
	Isolated bool
	Allow    []Entry
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

// box is a disjoint element of a ports set: addresses × one protocol × a port range.
type box struct {
	addrs Range
	ports Ports
}

// group is the canonical form of one direction's allow list: disjoint, sorted elements of the
// any-port set and of the ports set, per family. Equal allow lists give equal groups, whatever
// the order or the overlaps in which the compiler produced them.
type group struct {
	any4, any6     []Range
	ports4, ports6 []box
}

// canonical builds the group of allow.
func canonical(allow []Entry) group {
	var g group
	var any4, any6 []Range
	type portsKey struct {
		is6   bool
		proto uint8
	}
	byProto := map[portsKey][]Entry{}
	for _, e := range allow {
		if !e.Peer.Valid() {
			continue
		}
		is6 := e.Peer.First.Is6()
		if e.Ports == nil {
			if is6 {
				any6 = append(any6, e.Peer)
			} else {
				any4 = append(any4, e.Peer)
			}
			continue
		}
		if e.Ports.First > e.Ports.Last {
			continue
		}
		k := portsKey{is6, e.Ports.Protocol}
		byProto[k] = append(byProto[k], e)
	}
	g.any4, g.any6 = mergeRanges(any4), mergeRanges(any6)
	keys := make([]portsKey, 0, len(byProto))
	for k := range byProto {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b portsKey) int { return cmp.Compare(a.proto, b.proto) })
	for _, k := range keys {
		boxes := disjointBoxes(k.proto, byProto[k])
		if k.is6 {
			g.ports6 = append(g.ports6, boxes...)
		} else {
			g.ports4 = append(g.ports4, boxes...)
		}
	}
	return g
}

// disjointBoxes turns the port entries of one family and protocol into boxes that do not
// overlap (the kernel's concatenated interval sets refuse overlapping elements): the port axis is
// cut at every entry's bounds, each piece gets the union of the address ranges covering it, and
// neighbouring pieces with equal unions are joined again. The pieces are swept in order with the
// entries that cover the current one: a piece costs the entries covering it, not all of them (a
// policy of thousands of peers on hundreds of ports is hundreds of thousands of entries).
func disjointBoxes(proto uint8, entries []Entry) []box {
	cuts := []uint32{}
	for _, e := range entries {
		cuts = append(cuts, uint32(e.Ports.First), uint32(e.Ports.Last)+1)
	}
	slices.Sort(cuts)
	cuts = slices.Compact(cuts)
	byFirst := slices.Clone(entries)
	slices.SortFunc(byFirst, func(a, b Entry) int { return cmp.Compare(a.Ports.First, b.Ports.First) })
	type piece struct {
		first, last uint16
		addrs       []Range
	}
	var pieces []piece
	var active []Entry // the entries that cover the current piece
	next := 0
	for i := 0; i+1 < len(cuts); i++ {
		first, last := uint16(cuts[i]), uint16(cuts[i+1]-1)
		for ; next < len(byFirst) && byFirst[next].Ports.First <= first; next++ {
			active = append(active, byFirst[next])
		}
		// Every bound is a cut: an entry that reaches into the piece covers all of it.
		active = slices.DeleteFunc(active, func(e Entry) bool { return e.Ports.Last < first })
		if len(active) == 0 {
			continue
		}
		covering := make([]Range, len(active))
		for j, e := range active {
			covering[j] = e.Peer
		}
		addrs := mergeRanges(covering)
		if n := len(pieces); n > 0 && pieces[n-1].last+1 == first && slices.Equal(pieces[n-1].addrs, addrs) {
			pieces[n-1].last = last
			continue
		}
		pieces = append(pieces, piece{first, last, addrs})
	}
	var out []box
	for _, p := range pieces {
		for _, r := range p.addrs {
			out = append(out, box{addrs: r, ports: Ports{Protocol: proto, First: p.first, Last: p.last}})
		}
	}
	return out
}

// withoutAddr cuts a out of the ranges that hold it.
func withoutAddr(rs []Range, a netip.Addr) []Range {
	var out []Range
	for _, r := range rs {
		if a.Is4() != r.First.Is4() || a.Compare(r.First) < 0 || a.Compare(r.Last) > 0 {
			out = append(out, r)
			continue
		}
		if a != r.First {
			out = append(out, Range{r.First, a.Prev()})
		}
		if a != r.Last {
			out = append(out, Range{a.Next(), r.Last})
		}
	}
	return out
}

// mergeRanges sorts ranges of one family and joins overlapping and adjacent ones.
func mergeRanges(in []Range) []Range {
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

// name is the content address of the group: the chain and sets of a group are named after it,
// so equal allow lists share them and a changed list is a new name, swapped in atomically.
func (g group) name(dir string) string {
	var b strings.Builder
	for _, rs := range [][]Range{g.any4, g.any6} {
		for _, r := range rs {
			fmt.Fprintf(&b, "a%s;", r)
		}
	}
	for _, bs := range [][]box{g.ports4, g.ports6} {
		for _, x := range bs {
			fmt.Fprintf(&b, "p%s:%s;", x.addrs, x.ports)
		}
	}
	sum := sha256.Sum256([]byte(b.String()))
	return dir + "-" + hex.EncodeToString(sum[:8])
}

// String describes the group for logs and tests.
func (g group) String() string {
	var parts []string
	for _, rs := range [][]Range{g.any4, g.any6} {
		for _, r := range rs {
			parts = append(parts, r.String())
		}
	}
	for _, bs := range [][]box{g.ports4, g.ports6} {
		for _, x := range bs {
			parts = append(parts, x.addrs.String()+" "+x.ports.String())
		}
	}
	if len(parts) == 0 {
		return "nothing"
	}
	return strings.Join(parts, ", ")
}
