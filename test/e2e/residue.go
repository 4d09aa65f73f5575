package e2e

import (
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/kubenet-dev/kubenet/core"
	"github.com/kubenet-dev/kubenet/hostport"
	"github.com/kubenet-dev/kubenet/internal/nettest"
	"github.com/kubenet-dev/kubenet/internal/nft"
)

// NodeState says where a node keeps kubenet's state: its network namespace, the plugin's
// dataDir and network name, and the node's pod CIDRs.
type NodeState struct {
	NS       ns.NetNS
	DataDir  string
	Network  string
	PodCIDRs []netip.Prefix
}

// Residue lists every per-pod trace of the network left on the node, found with netlink and
// the operator's tools rather than with the plugin's own code: links on a bridge, ifb devices,
// tbf and ingress qdiscs, address reservations, attachment records, hostPort index entries,
// hostPort map elements, and conntrack entries of pod addresses (in the pod CIDRs, not the
// gateway). What stays by design once
// the last pod is gone (the bridge, the node-wide nftables chains, the IPAM lock and
// last-reserved files) is not residue. An empty list means the node is clean.
func Residue(s NodeState) ([]string, error) {
	var left []string
	err := s.NS.Do(func(ns.NetNS) error {
		links, err := netlink.LinkList()
		if err != nil {
			return fmt.Errorf("list links: %w", err)
		}
		bridges := map[int]string{}
		for _, l := range links {
			if l.Type() == "bridge" {
				bridges[l.Attrs().Index] = l.Attrs().Name
			}
		}
		for _, l := range links {
			a := l.Attrs()
			if br, ok := bridges[a.MasterIndex]; ok {
				left = append(left, fmt.Sprintf("link %s on bridge %s", a.Name, br))
			}
			if l.Type() == "ifb" {
				left = append(left, "ifb device "+a.Name)
			}
			qdiscs, err := netlink.QdiscList(l)
			if err != nil {
				return fmt.Errorf("qdiscs of %s: %w", a.Name, err)
			}
			for _, q := range qdiscs {
				if q.Type() == "tbf" || q.Type() == "ingress" {
					left = append(left, fmt.Sprintf("%s qdisc on %s", q.Type(), a.Name))
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}

	netDir := filepath.Join(s.DataDir, s.Network)
	entries, err := os.ReadDir(netDir)
	if err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	for _, e := range entries {
		if _, err := netip.ParseAddr(e.Name()); err == nil {
			left = append(left, "address reservation "+filepath.Join(netDir, e.Name()))
		}
	}
	for _, dir := range []string{core.RecordDirName, hostport.IndexDirName} {
		_ = filepath.WalkDir(filepath.Join(netDir, dir), func(p string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				left = append(left, "file "+p)
			}
			return nil
		})
	}

	table := nft.TableName(s.Network)
	out, err := nettest.Output(s.NS, "nft", "list", "table", "inet", table)
	if err != nil && !strings.Contains(out, "No such file") {
		return nil, err
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "elements = ") {
			left = append(left, fmt.Sprintf("nftables table inet %s: %s", table, strings.TrimSpace(line)))
		}
	}

	for _, family := range []string{"ipv4", "ipv6"} {
		out, err := nettest.Output(s.NS, "conntrack", "-L", "-f", family)
		if err != nil {
			return nil, err
		}
		for _, line := range strings.Split(out, "\n") {
			if mentionsAny(line, s.PodCIDRs) {
				left = append(left, "conntrack entry "+strings.Join(strings.Fields(line), " "))
			}
		}
	}
	return left, nil
}

// mentionsAny tells whether a conntrack line names a pod address: one inside prefixes other
// than its gateway, which is the node's own address on the bridge (its IGMP and neighbour
// traffic is the node's, not a pod's).
func mentionsAny(line string, prefixes []netip.Prefix) bool {
	for _, f := range strings.Fields(line) {
		_, v, ok := strings.Cut(f, "=")
		if !ok {
			continue
		}
		a, err := netip.ParseAddr(v)
		if err != nil {
			continue
		}
		for _, p := range prefixes {
			if p.Contains(a) && a != p.Masked().Addr().Next() {
				return true
			}
		}
	}
	return false
}
