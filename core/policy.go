package core

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"

	"github.com/kubenet-dev/kubenet/internal/policyrules"
	"github.com/kubenet-dev/kubenet/isolation"
	"github.com/kubenet-dev/kubenet/netpol"
)

// IsPolicyTable tells whether an nftables table name is one of the networks' policy tables (the
// agent's healer watches them, so that a flushed ruleset brings the policies back too).
func IsPolicyTable(name string) bool { return strings.HasPrefix(name, netpol.TableName("")) }

// PolicyNetwork is what a policy pass works on.
type PolicyNetwork struct {
	DataDir, Network, Bridge string
	// PodCIDRs are the node's pod CIDRs (neighbour discovery within them is on-link).
	PodCIDRs []netip.Prefix
	// Verify reads every group set back and rewrites those that differ (netpol.Options).
	Verify bool
	// CutEstablished marks cut, after an apply that changed the rules, conntrack's entries of the
	// connections the new rules deny (netpol.CutDenied), so that they stop at their next packet
	// instead of flowing until they end. CutAgain does it even when nothing changed: the rules in
	// force may deny connections no cut has removed yet (the agent's first pass, the pass after a
	// failed one).
	CutEstablished, CutAgain bool
	// Log is whether and how the drop chains log (off: no log action in the rules).
	Log policyrules.DropLog
	// Applier, kept by the caller from one pass to the next, remembers the allow lists' groups
	// of the last pass, so that a pass computes only what changed; nil: a pass on its own.
	Applier *PolicyApplier
}

// PolicyApplier is what one caller's policy passes carry from one to the next: the groups the
// allow lists of its last pass made and the netlink socket they went through
// (netpol.Applier). Not safe for concurrent passes.
type PolicyApplier struct{ applier *netpol.Applier }

// NewPolicyApplier returns the applier of a caller's passes.
func NewPolicyApplier() *PolicyApplier { return &PolicyApplier{netpol.NewApplier()} }

// Committed tells whether a transaction the kernel announces as committed through netlink port
// portid was one of this applier's passes (lately): the agent's own writes, which its healer
// must not take for another tool's.
func (a *PolicyApplier) Committed(portid uint32) bool { return a.applier.Committed(portid) }

// Close closes the netlink socket the applier keeps open from pass to pass; a later pass opens
// another.
func (a *PolicyApplier) Close() { a.applier.Close() }

// PolicyLocal is one attachment of the node, from its record, with what the policy rules need
// of it from the kernel.
type PolicyLocal struct {
	Record
	// Port is the interface index of the attachment's host veth when it is a port of the
	// network's bridge, else 0: a pod being set up or torn down, which stays held.
	Port int
	// LinkLocal is the pod interface's IPv6 link-local address (derived from the MAC ADD gave
	// it): one of the pod's addresses for the policies too.
	LinkLocal netip.Addr
}

// PolicyPass is what ApplyPolicies did besides the rules.
type PolicyPass struct {
	Applied policyrules.Applied
	// Guarded counts ports and bridges whose missing guard was put back; NetfilterCall says the
	// bridge's nf_call options were off and were turned on.
	Guarded       int
	NetfilterCall bool
	// Unguarded says why ports could not get their guard (an older kubenet's ingress qdisc in
	// the way): their pods are judged by the rules all the same, without the backstop.
	Unguarded error
	// Cut counts the conntrack entries of denied connections marked cut (CutEstablished); CutErr
	// says why they could not be (the rules are applied all the same).
	Cut    uint
	CutErr error
	// Unrecorded says why the pass, applied, could not be recorded in PolicyStateFile: the
	// kernel holds the rules, operators' tools only miss the policies' names.
	Unrecorded error
}

// ApplyPolicies installs the node's policies for the network: it reads the attachment records
// (the node's pods and their addresses, as ADD wrote them: fresher than the API's pod status),
// finds each one's bridge port, lets compile turn them into a ruleset and applies it. It takes no
// lock: ADD and DEL write nothing into the policy tables, and a port is the pod's as long as it
// exists (a recreated veth is a new port, held until a later pass). On the way it puts back what
// another tool may have removed: the guards of the bridge and of every local port, and the
// bridge's nf_call options.
func ApplyPolicies(n PolicyNetwork, compile func([]PolicyLocal) policyrules.Ruleset) (PolicyPass, error) {
	var pass PolicyPass
	dir, err := openDir(n.DataDir, n.Network)
	if err != nil {
		return pass, fmt.Errorf("address store: %w", err)
	}
	defer dir.Close()
	br, locals, err := readLocals(n.Network, n.Bridge, dir.records, nil)
	if err != nil {
		return pass, err
	}
	if br != nil {
		if pass.Guarded, pass.NetfilterCall, err = ensureBridgePolicy(br); err != nil {
			return pass, err
		}
	}
	for _, l := range locals {
		if l.Port <= 0 {
			continue
		}
		g, err := ensureGuard(netpol.CheckPortGuard, netpol.GuardPort, l.Port)
		if err != nil {
			pass.Unguarded = errors.Join(pass.Unguarded, fmt.Errorf("%s: %w", l.key().names(n.Network).HostVeth, err))
		}
		pass.Guarded += g
	}
	rs := compile(locals)
	rs.PodCIDRs = n.PodCIDRs
	if br != nil {
		if rs.NodeAddrs, err = linkAddrs(br); err != nil {
			return pass, err
		}
	}
	applier := netpol.NewApplier()
	if n.Applier != nil {
		applier = n.Applier.applier
	} else {
		defer applier.Close()
	}
	pass.Applied, err = applier.Apply(n.Network, rs, netpol.Options{Verify: n.Verify, Log: n.Log})
	if err == nil {
		pass.Unrecorded = writePolicyState(dir.root(), rs, pass.Applied)
	}
	switch {
	case err != nil:
	case n.CutEstablished && (pass.Applied.Changed() || n.CutAgain):
		pass.Cut, pass.CutErr = cutDenied(rs, pass.Applied)
	case !n.CutEstablished && n.CutAgain:
		// Strict mode off (an earlier run may have had it on): what that run cut flows again.
		if pass.CutErr = netpol.ClearCuts(); pass.CutErr != nil {
			pass.CutErr = fmt.Errorf("network policy: clear the marks of cut connections: %w", pass.CutErr)
		}
	}
	return pass, err
}

// cutDenied marks cut the conntrack entries of connections rs denies; the node's own addresses,
// on every link, are those of connections the node opened, which no policy filters.
func cutDenied(rs policyrules.Ruleset, applied policyrules.Applied) (uint, error) {
	addrs, err := linkAddrs(nil)
	if err != nil {
		return 0, err
	}
	n, err := netpol.CutDenied(rs, applied, addrs)
	if err != nil {
		return n, fmt.Errorf("network policy: cut denied connections: %w", err)
	}
	return n, nil
}

// PolicyDispatch is the chain ApplyPolicies sends a pod's direction d to, with the entries it
// allows: the direction's allow chain when d is not isolated, else the group of d's allow list
// (netpol names groups by their content). ok is false when the list is over a limit: a pass
// refuses it, and the pod keeps what it had. Pure.
func PolicyDispatch(ingress bool, d policyrules.Direction) (chain string, entries []policyrules.Entry, ok bool) {
	switch {
	case d.Isolated:
		return netpol.GroupFor(ingress, d.Audit, d.Allow)
	case ingress:
		return policyrules.AllowIngress, nil, true
	}
	return policyrules.AllowEgress, nil, true
}

// PolicyInspection is what operators' tools read of a network's policies on the node, with the
// agent up or down.
type PolicyInspection struct {
	// Locals are the network's attachment records, each with its bridge port as a policy pass
	// pairs them.
	Locals []PolicyLocal
	// NodeAddrs are the addresses of every link of the network namespace: the node's own, whose
	// packets reach every pod that is not held.
	NodeAddrs []netip.Addr
	// Installed is the network's policy tables, read back from the kernel.
	Installed policyrules.Installed
}

// InspectPolicies reads the network's attachment records and its policy state from the data
// dir and the kernel of the current network namespace. It only reads.
func InspectPolicies(dataDir, network, bridgeName string) (PolicyInspection, error) {
	var in PolicyInspection
	dir, err := openDir(dataDir, network)
	if err != nil {
		return in, fmt.Errorf("address store: %w", err)
	}
	defer dir.Close()
	if _, in.Locals, err = readLocals(network, bridgeName, dir.records, nil); err != nil {
		return in, err
	}
	if in.NodeAddrs, err = linkAddrs(nil); err != nil {
		return in, err
	}
	if in.Installed, err = netpol.Inspect(network); err != nil {
		return in, fmt.Errorf("network policy: read back the tables of network %s: %w", network, err)
	}
	return in, nil
}

// readLocals finds the bridge and its ports, then reads the attachment records and pairs each
// with its port. The links come first: ADD writes a record before it creates the veth and DEL
// removes it after deleting the veth, so a port listed first belongs to the record read after
// it, or is gone by then (a gone port's elements match nothing; the new veth stays held). Read
// the other way round, a container deleted and added again between the two reads would pair
// its old record's addresses with its new port. afterLinks, when not nil, runs between the
// two reads (tests).
func readLocals(network, bridgeName string, records Records, afterLinks func()) (*netlink.Bridge, []PolicyLocal, error) {
	br, ports, err := bridgePorts(bridgeName)
	if err != nil {
		return nil, nil, err
	}
	if afterLinks != nil {
		afterLinks()
	}
	recs, err := records.List()
	if err != nil {
		return nil, nil, err
	}
	locals := make([]PolicyLocal, 0, len(recs))
	for _, r := range recs {
		k := r.key()
		locals = append(locals, PolicyLocal{Record: r, Port: ports[k.names(network).HostVeth], LinkLocal: isolation.LinkLocal(k.podMAC(network))})
	}
	return br, locals, nil
}

// linkAddrs are the addresses of a link (nil: of every link), both families.
func linkAddrs(l netlink.Link) ([]netip.Addr, error) {
	addrs, err := netlinksafe.AddrList(l, netlink.FAMILY_ALL)
	if err != nil {
		name := "the node's links"
		if l != nil {
			name = l.Attrs().Name
		}
		return nil, fmt.Errorf("network policy: addresses of %s: %w", name, err)
	}
	out := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			out = append(out, ip.Unmap())
		}
	}
	return out, nil
}

// bridgePorts finds the bridge and its ports by name (nil and none when there is no bridge yet).
func bridgePorts(name string) (*netlink.Bridge, map[string]int, error) {
	all, err := netlinksafe.LinkList()
	if err != nil {
		return nil, nil, fmt.Errorf("network policy: list links: %w", err)
	}
	var br *netlink.Bridge
	for _, l := range all {
		if b, ok := l.(*netlink.Bridge); ok && l.Attrs().Name == name {
			br = b
		}
	}
	ports := map[string]int{}
	if br == nil {
		return nil, ports, nil
	}
	for _, l := range all {
		if l.Attrs().MasterIndex == br.Index && l.Type() == "veth" {
			ports[l.Attrs().Name] = l.Attrs().Index
		}
	}
	return br, ports, nil
}

// RemovePolicies deletes the network's policy tables and the guards of its bridge and of every
// port on it (NetworkPolicy turned off on the node: nothing marks packets any more, so a guard
// left behind would cut its pod off). It reads only, when there is nothing.
func RemovePolicies(network, bridgeName string) error {
	br, ports, err := bridgePorts(bridgeName)
	if err != nil {
		return err
	}
	var errs []error
	if br != nil {
		idx := make([]int, 0, len(ports))
		for _, p := range ports {
			idx = append(idx, p)
		}
		errs = append(errs, netpol.Unguard(br.Attrs().Index, idx))
	}
	if err := netpol.Remove(network); err != nil {
		errs = append(errs, fmt.Errorf("network policy: %w", err))
	}
	return errors.Join(errs...)
}
