package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/kubenet-dev/kubenet/core"
	"github.com/kubenet-dev/kubenet/hostport"
	"github.com/kubenet-dev/kubenet/internal/ipt"
	"github.com/kubenet-dev/kubenet/internal/nft"
	"github.com/kubenet-dev/kubenet/netpol"
	"github.com/kubenet-dev/kubenet/test/nettest"
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
// nftables elements (nftResidue), iptables and ebtables rules and chains of pods (iptResidue)
// and conntrack entries of pod addresses (in the pod CIDRs, not
// the gateway). What stays by design once the last pod is gone (the bridge, the node-wide
// nftables chains and empty sets, the IPAM lock and last-reserved files) is not residue. An
// empty list means the node is clean.
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

	for _, tb := range []struct{ family, name string }{
		{"inet", nft.TableName(s.Network)},   // the hostPort maps
		{"bridge", nft.TableName(s.Network)}, // the isolation sets, keyed by the pods' bridge ports
		{"inet", netpol.TableName(s.Network)},
		{"bridge", netpol.TableName(s.Network)},
	} {
		dump, err := nftListTable(s.NS, tb.family, tb.name)
		if err != nil {
			return nil, err
		}
		found, err := nftResidue(dump)
		if err != nil {
			return nil, fmt.Errorf("nft -j list table %s %s: %w", tb.family, tb.name, err)
		}
		left = append(left, found...)
	}

	found, err := iptResidue(s)
	if err != nil {
		return nil, err
	}
	left = append(left, found...)

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

// iptResidue lists what the iptables backend's tables hold of pods, read with the -save tools:
// a pod's host ports are rules in KUBENET-HPDNAT-<net> (and its hairpin rule in
// KUBENET-HPHAIR-<net>), its isolation a dispatch rule in ebtables' KUBENET-PODS-<net> and a
// chain KNP-<net>-*. Once no pod is left, any of them is residue; the fixed chains stay by design.
// A node on the nftables backend has none of them.
func iptResidue(s NodeState) ([]string, error) {
	suffix := ipt.ChainSuffix(s.Network)
	var left []string
	for _, tool := range []struct {
		fam  ipt.Family
		save string
	}{{ipt.IPv4, "iptables-save"}, {ipt.IPv6, "ip6tables-save"}, {ipt.Bridge, "ebtables-save"}} {
		out, err := nettest.Output(s.NS, tool.save, "-t", "nat")
		if err != nil {
			return nil, fmt.Errorf("%s: %w", tool.save, err)
		}
		t := ipt.Parse(tool.fam, "nat", []byte(out))
		for chain, rules := range t.Chains {
			switch {
			case chain == "KUBENET-HPDNAT-"+suffix || chain == "KUBENET-HPHAIR-"+suffix || chain == "KUBENET-PODS-"+suffix:
				for _, r := range rules {
					left = append(left, fmt.Sprintf("%s rule of chain %s: %s", tool.fam, chain, r))
				}
			case strings.HasPrefix(chain, "KNP-"+suffix+"-"):
				left = append(left, fmt.Sprintf("%s chain %s of a pod", tool.fam, chain))
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

// nftListTable is `nft -j list table family name` in the node's namespace once no ended element
// is listed (nettest.SettledRuleset); nil when the table does not exist.
func nftListTable(n ns.NetNS, family, name string) ([]byte, error) {
	if _, err := nettest.SettledRuleset(n); err != nil {
		return nil, err
	}
	var stdout, stderr bytes.Buffer
	err := n.Do(func(ns.NetNS) error {
		cmd := exec.Command("nft", "-j", "list", "table", family, name)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		return cmd.Run()
	})
	var exit *exec.ExitError
	if errors.As(err, &exit) && strings.Contains(stderr.String(), "No such file or directory") {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("nft -j list table %s %s: %w: %s", family, name, err, stderr.Bytes())
	}
	return stdout.Bytes(), nil
}

// nftResidue lists what a table of the network (as `nft -j list table` prints it; nil: no
// table) holds of pods. Every set and map element of kubenet's tables belongs to a pod: the
// hostPort maps' (keyed by host port, leading to a pod address), the isolation sets' (keyed by
// a pod's bridge port) and, in the NetworkPolicy tables, the verdict maps' (keyed by a pod's
// bridge port) and the groups' sets (a group, its chain and sets, exists only while a pod on the
// node is isolated by that allow list). So once no pod is left on the node, any element but the
// on-link set's, and any policy chain but the fixed ones, is residue. Rules and empty sets stay
// by design.
func nftResidue(dump []byte) ([]string, error) {
	if dump == nil {
		return nil, nil
	}
	type set struct {
		Family string            `json:"family"`
		Table  string            `json:"table"`
		Name   string            `json:"name"`
		Elem   []json.RawMessage `json:"elem"`
	}
	var d struct {
		Nftables []struct {
			Set   *set `json:"set"`
			Map   *set `json:"map"`
			Chain *struct {
				Family string `json:"family"`
				Table  string `json:"table"`
				Name   string `json:"name"`
			} `json:"chain"`
		} `json:"nftables"`
	}
	if err := json.Unmarshal(dump, &d); err != nil {
		return nil, err
	}
	var left []string
	for _, o := range d.Nftables {
		for kind, s := range map[string]*set{"set": o.Set, "map": o.Map} {
			if s == nil || (strings.HasPrefix(s.Table, netpol.TableName("")) && !netpol.IsPodState(s.Name)) {
				continue
			}
			for _, e := range s.Elem {
				var b bytes.Buffer
				if err := json.Compact(&b, e); err != nil {
					return nil, err
				}
				left = append(left, fmt.Sprintf("nftables %s %s %s %s: element %s", s.Family, s.Table, kind, s.Name, b.String()))
			}
		}
		if c := o.Chain; c != nil && strings.HasPrefix(c.Table, netpol.TableName("")) && netpol.IsPodState(c.Name) {
			left = append(left, fmt.Sprintf("nftables %s %s: chain %s, a policy group no pod on the node is in", c.Family, c.Table, c.Name))
		}
	}
	return left, nil
}
