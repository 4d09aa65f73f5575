package core

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/kubenet-dev/kubenet/ipam"
	"github.com/kubenet-dev/kubenet/netpol"
)

// The policy vocabulary the node agent compiles NetworkPolicies into: the netpol mechanism's
// own types, named here so that the agent reaches the mechanism only through the core.
type (
	PolicyRuleset   = netpol.Ruleset
	PolicyPod       = netpol.Pod
	PolicyDirection = netpol.Direction
	PolicyEntry     = netpol.Entry
	PolicyRange     = netpol.Range
	PolicyPorts     = netpol.Ports
	PolicyApplied   = netpol.Applied
)

// Protocol numbers of PolicyPorts.
const (
	PolicyTCP  = netpol.TCP
	PolicyUDP  = netpol.UDP
	PolicySCTP = netpol.SCTP
)

// PolicySingle and PolicyPrefix build a PolicyRange.
func PolicySingle(a netip.Addr) PolicyRange   { return netpol.Single(a) }
func PolicyPrefix(p netip.Prefix) PolicyRange { return netpol.PrefixRange(p) }

// PolicyOwner is how an attachment is named in the policy table (the pending elements'
// comments): the same "containerID/ifname" the hostPort elements use.
func PolicyOwner(containerID, ifName string) string { return containerID + "/" + ifName }

// IsPolicyTable tells whether an nftables table name is one of the networks' policy tables (the
// agent's healer watches them, so that a flushed ruleset brings the policies back too).
func IsPolicyTable(name string) bool { return strings.HasPrefix(name, netpol.TableName("")) }

// holdForPolicies puts the new pod's addresses into the pending sets before its interface
// exists, when the node enforces NetworkPolicy: the pod sends and receives nothing until the
// agent has installed its policies (ApplyPolicies). One small transaction, whatever the node's
// pods and the cluster's policies. The caller holds the network lock; the undo of the
// reservation forgets the addresses again.
func (a *addition) holdForPolicies() error {
	if !a.cfg.NetworkPolicy {
		return nil
	}
	if err := netpol.Hold(a.cfg.Network, PolicyOwner(a.att.ContainerID, a.att.IfName), prefixAddrs(a.ips)); err != nil {
		return fmt.Errorf("network policy: %w", err)
	}
	return nil
}

// forgetPolicies removes the policy elements of addrs (DEL; the caller holds the network lock).
// Policies live in nftables only: on the iptables backend there is no policy table (networkPolicy
// is refused there, and a switch removes the table), and nothing is asked of nftables, which such
// a node may not have at all.
func forgetPolicies(cfg *Config, addrs []netip.Addr) error {
	if cfg.filter().backend() != NetfilterNFTables {
		return nil
	}
	if err := netpol.Forget(cfg.Network, addrs); err != nil {
		return fmt.Errorf("network policy: %w", err)
	}
	return nil
}

// gcPolicies removes pending elements whose attachment has no record: ADD writes the record and
// the pending elements under one lock, and DEL forgets the elements before it removes the record,
// so only a crash between the two leaves such an element. Attachments with a record are DEL's
// and Collect's business; map elements of gone pods are the agent's (its next Apply removes every
// element of an address no record names).
func gcPolicies(cfg *Config, store *ipam.Store, records Records) error {
	if cfg.filter().backend() != NetfilterNFTables {
		return nil // see forgetPolicies
	}
	return withNetworkLock(store, func() error {
		owners, err := netpol.PendingOwners(cfg.Network)
		if err != nil {
			return fmt.Errorf("network policy: %w", err)
		}
		var doomed []netip.Addr
		for addr, owner := range owners {
			id, ifName, ok := strings.Cut(owner, "/")
			if !ok || id == "" || ifName == "" || strings.ContainsAny(ifName, "/\x00") {
				continue // not a comment ADD wrote: not ours to judge
			}
			rec, err := records.Load(Attachment{ContainerID: id, IfName: ifName})
			if err == nil && rec == nil {
				doomed = append(doomed, addr)
			}
		}
		return forgetPolicies(cfg, doomed)
	})
}

// ApplyPolicies installs the node's policies for the network: under the network lock it reads
// the attachment records (the node's pods and their addresses, as ADD wrote them: fresher than
// the API's pod status), lets compile turn them into a ruleset, and applies it. Holding the lock
// across the read and the write means no ADD or DEL runs in between, so a pending address is
// released only for the attachment that holds it now.
func ApplyPolicies(dataDir, network string, compile func([]Record) PolicyRuleset) (PolicyApplied, error) {
	store, err := ipam.Open(dataDir, network)
	if err != nil {
		return PolicyApplied{}, fmt.Errorf("address store: %w", err)
	}
	defer store.Close()
	var res PolicyApplied
	err = withNetworkLock(store, func() error {
		recs, err := NewRecords(store.Dir()).List()
		if err != nil {
			return err
		}
		res, err = netpol.Apply(network, compile(recs))
		return err
	})
	return res, err
}

// RemovePolicies deletes the network's policy table (NetworkPolicy turned off on the node). It
// reads only, when there is none.
func RemovePolicies(network string) error {
	if err := netpol.Remove(network); err != nil {
		return fmt.Errorf("network policy: %w", err)
	}
	return nil
}
