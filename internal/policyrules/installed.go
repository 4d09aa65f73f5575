package policyrules

import "net/netip"

// Names of the kernel's objects that Installed is read from and that Trace's reasons name, so
// that an operator finds them in the ruleset; the kernel side (netpol) writes them under these
// names.
const (
	// AllowEgress and AllowIngress are the chains the map element of a direction a pod is not
	// isolated in names (Dispatch, InstalledPort).
	AllowEgress  = "allow-egress"
	AllowIngress = "allow-ingress"
	// MapEgress and MapIngress dispatch a port's frames to its direction's chain.
	MapEgress  = "egress-ports"
	MapIngress = "ingress-ports"
	// The sources sets hold port . address of every address a pod may send from.
	SetSourcesIPv4 = "egress-sources-ipv4"
	SetSourcesIPv6 = "egress-sources-ipv6"
	// The local-pods sets hold the node's pod CIDRs but the node's own addresses (LocalPods).
	SetLocalPodsIPv4 = "local-pods-ipv4"
	SetLocalPodsIPv6 = "local-pods-ipv6"
	// ChainNode marks the node's own packets: the node reaches every pod that is not held.
	ChainNode = "node"
)

// Installed is what the kernel holds of one network's policy tables, decoded back into the
// vocabulary of the ruleset: which chain each port's map elements go to, the addresses each port
// may send from, and each group's allow list as its sets' elements say. The kernel side reads it
// from the kernel alone, so an operator's tool can explain a pod's policies with the agent down.
type Installed struct {
	// Tables says the bridge table exists. Without it every guarded pod is denied everything.
	Tables bool
	// Damage lists what of the fixed layout (chains, maps and sets every network has) differs
	// from what an apply writes; the agent's next pass rewrites it. Empty: as written.
	Damage []string
	// Ports are the ports that have a map element or a source address.
	Ports map[int]InstalledPort
	// Groups are the group chains and sets there are, by group name.
	Groups map[string]InstalledGroup
	// LocalPods are the node's pod CIDRs without the node's own addresses (SetLocalPodsIPv4,
	// SetLocalPodsIPv6): a packet routed in from one of them without the egress bit is forged.
	LocalPods []Range
}

// InstalledPort is what the dispatch maps and the sources sets hold for one port.
type InstalledPort struct {
	// Egress and Ingress name the chain the port's map element goes to: a group, AllowEgress
	// or AllowIngress (not isolated), or "" (no element: held, denied everything).
	Egress, Ingress string
	// Sources are the addresses the port's pod may send from; a packet from any other gets no
	// egress.
	Sources []netip.Addr
}

// InstalledGroup is one group as the kernel holds it.
type InstalledGroup struct {
	Name    string
	Ingress bool // its direction: the peer is the source (ingress) or the destination (egress)
	// Audit: only staged policies isolate its pods; what its entries do not allow passes.
	Audit bool
	// Sets are the group sets its chain's rules look up (a slot's: named by no content), or,
	// for sets no chain looks up, those sets.
	Sets []string
	// Entries are its sets' elements (disjoint boxes: overlapping port ranges cut, neighbouring
	// peers joined), in the canonical order.
	Entries []Entry
	// Damage lists what is wrong with it: a missing chain, elements that cannot be decoded or
	// that are not the allow list its name stands for, rules that are not the ones its elements
	// call for. Empty: as an apply writes it.
	Damage []string
}
