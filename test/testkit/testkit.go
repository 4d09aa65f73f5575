// Package testkit holds the helpers the end-to-end test packages share (test/cni drives the CNI
// binary, test/shim the NetworkPlugin layer): reading kernel state inside a namespace, the leak
// audit, and traffic checks.
package testkit

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/kubenet-dev/kubenet/core"
	"github.com/kubenet-dev/kubenet/hostport"
	"github.com/kubenet-dev/kubenet/masq"
	"github.com/kubenet-dev/kubenet/netpol"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

// TrafficTimeout bounds one request; reachable paths answer in milliseconds.
const TrafficTimeout = 5 * time.Second

// UnreachableTimeout is how long a request that must fail is given before we call it failed.
const UnreachableTimeout = 1500 * time.Millisecond

// Sysctl reads /proc/sys/<key> inside n.
func Sysctl(t testing.TB, n ns.NetNS, key string) string {
	t.Helper()
	var v string
	nettest.Do(t, n, func() error {
		b, err := os.ReadFile("/proc/sys/" + key)
		v = strings.TrimSpace(string(b))
		return err
	})
	return v
}

// Link reads a link by name inside n.
func Link(t testing.TB, n ns.NetNS, name string) netlink.Link {
	t.Helper()
	var l netlink.Link
	nettest.Do(t, n, func() error {
		var err error
		l, err = netlink.LinkByName(name)
		return err
	})
	return l
}

// WaitAddrUsable waits until a is an address of the interface ifname inside n that has passed
// duplicate address detection: a tentative IPv6 address neither receives nor can be a source, so
// traffic from or to an interface's link-local address in its first second fails (connect:
// cannot assign requested address) where the interface keeps DAD on (a pod of an IPv4-only
// network).
func WaitAddrUsable(t testing.TB, n ns.NetNS, ifname string, a netip.Addr, timeout time.Duration) {
	t.Helper()
	err := nettest.Eventually(timeout, func() error {
		for _, have := range linkAddrs(t, n, ifname) {
			if ip, ok := netip.AddrFromSlice(have.IP); !ok || ip.Unmap() != a.WithZone("") {
				continue
			}
			if have.Flags&(unix.IFA_F_TENTATIVE|unix.IFA_F_DADFAILED) != 0 {
				return fmt.Errorf("%s on %s has flags %#x (tentative or DAD failed)", a, ifname, have.Flags)
			}
			return nil
		}
		return fmt.Errorf("%s is not an address of %s", a, ifname)
	})
	if err != nil {
		t.Fatalf("address %s on %s not usable within %v: %v", a, ifname, timeout, err)
	}
}

// LinkExists tells whether name exists inside n.
func LinkExists(t testing.TB, n ns.NetNS, name string) bool {
	t.Helper()
	found := false
	nettest.Do(t, n, func() error {
		_, err := netlink.LinkByName(name)
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		found = err == nil
		return err
	})
	return found
}

// Addrs lists the global addresses of name inside n.
func Addrs(t testing.TB, n ns.NetNS, name string) []netip.Prefix {
	t.Helper()
	return slices.DeleteFunc(AllAddrs(t, n, name), func(p netip.Prefix) bool { return p.Addr().IsLinkLocalUnicast() })
}

// AllAddrs lists every address of name inside n, link-local ones included.
func AllAddrs(t testing.TB, n ns.NetNS, name string) []netip.Prefix {
	t.Helper()
	var out []netip.Prefix
	for _, a := range linkAddrs(t, n, name) {
		ip, _ := netip.AddrFromSlice(a.IP)
		ones, _ := a.Mask.Size()
		out = append(out, netip.PrefixFrom(ip.Unmap(), ones))
	}
	return out
}

// linkAddrs returns every address of name inside n as netlink reports it, flags included.
func linkAddrs(t testing.TB, n ns.NetNS, name string) []netlink.Addr {
	t.Helper()
	var out []netlink.Addr
	nettest.Do(t, n, func() error {
		l, err := netlink.LinkByName(name)
		if err != nil {
			return err
		}
		out, err = netlink.AddrList(l, netlink.FAMILY_ALL)
		return err
	})
	return out
}

// DefaultRoutes returns the gateways of the default routes inside n.
func DefaultRoutes(t testing.TB, n ns.NetNS) []netip.Addr {
	t.Helper()
	var out []netip.Addr
	nettest.Do(t, n, func() error {
		rs, err := netlink.RouteList(nil, netlink.FAMILY_ALL)
		if err != nil {
			return err
		}
		for _, r := range rs {
			if r.Dst != nil {
				if ones, _ := r.Dst.Mask.Size(); ones != 0 {
					continue
				}
			}
			gw, _ := netip.AddrFromSlice(r.Gw)
			out = append(out, gw.Unmap())
		}
		return nil
	})
	return out
}

// AssertNoResidue is the leak audit: nothing of the attachment remains on the node.
func AssertNoResidue(t testing.TB, node *nettest.Node, network string, att core.Attachment, ips []netip.Addr) {
	t.Helper()
	names := core.NamesFor(network, att)
	for _, l := range []string{names.HostVeth, names.IFB} {
		if LinkExists(t, node.NS, l) {
			t.Errorf("leak: link %s of %s/%s still exists", l, att.ContainerID, att.IfName)
		}
	}
	netDir := filepath.Join(node.DataDir(), network)
	entries, _ := os.ReadDir(netDir)
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		b, _ := os.ReadFile(filepath.Join(netDir, e.Name()))
		if strings.HasPrefix(string(b), att.ContainerID) {
			t.Errorf("leak: reservation %s still held by %s", e.Name(), att.ContainerID)
		}
	}
	record := core.RecordPath(netDir, att)
	if _, err := os.Stat(record); err == nil {
		t.Errorf("leak: attachment record %s remains", record)
	}
	owner := att.ContainerID + "/" + att.IfName
	if ruleset, err := nettest.SettledRuleset(node.NS); err != nil {
		t.Error(err)
	} else if strings.Contains(ruleset, `"`+owner+`"`) {
		t.Errorf("leak: nftables still holds elements of %s:\n%s", owner, ruleset)
	}
	// The policy maps, source sets and drop counters are keyed by port index: an element of a port that no
	// longer exists is the deleted pod's.
	nettest.Do(t, node.NS, func() error {
		maps, err := netpol.Dispatch(network)
		if err != nil {
			return err
		}
		for m, ports := range maps {
			for port, chain := range ports {
				if _, err := netlink.LinkByIndex(port); err != nil {
					t.Errorf("leak: policy map %s holds port %d (%s), which no link has (%v)", m, port, chain, err)
				}
			}
		}
		sources, err := netpol.Sources(network)
		if err != nil {
			return err
		}
		for port, addrs := range sources {
			if _, err := netlink.LinkByIndex(port); err != nil {
				t.Errorf("leak: the policy's source sets hold port %d (%v), which no link has (%v)", port, addrs, err)
			}
		}
		drops, _, err := netpol.DropCounts(network)
		if err != nil {
			return err
		}
		for _, d := range drops {
			if _, err := netlink.LinkByIndex(d.Port); err != nil {
				t.Errorf("leak: the policy's drop counters hold port %d (%s, ingress %v), which no link has (%v)", d.Port, d.Pod, d.Ingress, err)
			}
		}
		return nil
	})
	// Whichever backend ran: iptables rules name their owner in a comment, ebtables rules the
	// pod's bridge port.
	for tool, mark := range map[string]string{"iptables-save": owner, "ip6tables-save": owner, "ebtables-save": names.HostVeth} {
		if out, err := nettest.Output(node.NS, tool); err == nil && strings.Contains(out, mark) {
			t.Errorf("leak: %s still shows rules of %s:\n%s", tool, mark, out)
		}
	}
	_ = filepath.WalkDir(filepath.Join(netDir, hostport.IndexDirName), func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if b, _ := os.ReadFile(p); strings.Contains(string(b), `"`+att.ContainerID+`"`) {
				t.Errorf("leak: hostPort reservation %s still held by %s", p, att.ContainerID)
			}
		}
		return nil
	})
	cache := filepath.Join(node.Dir, "cache", "results", network+"-"+att.ContainerID+"-"+att.IfName)
	if _, err := os.Stat(cache); err == nil {
		t.Errorf("leak: libcni cache %s remains", cache)
	}
	for _, ip := range ips {
		family := "ipv4"
		if ip.Is6() {
			family = "ipv6"
		}
		for _, dir := range []string{"--orig-src", "--reply-src"} {
			out, _ := nettest.Output(node.NS, "conntrack", "-L", "-f", family, dir, ip.String())
			if strings.Contains(out, ip.String()) {
				t.Errorf("leak: conntrack entries of %s remain:\n%s", ip, out)
			}
		}
	}
}

// AttachmentOf returns the kubenet attachment of a pod.
func AttachmentOf(p *nettest.Pod) core.Attachment {
	return core.Attachment{ContainerID: p.RT.ContainerID, IfName: p.RT.IfName, NetNS: p.RT.NetNS}
}

// ExpectReachable sends one TCP request from src to dst and checks the source the server saw.
func ExpectReachable(t testing.TB, src ns.NetNS, srv *nettest.EchoServer, wantFrom netip.Addr) {
	t.Helper()
	r, err := nettest.TCPRequest(src, srv.Addr, "ping", TrafficTimeout)
	if err := nettest.ExpectFrom(r, err, wantFrom); err != nil {
		t.Errorf("TCP to %s: %v", srv.Addr, err)
	}
}

func KubenetNames(p *nettest.Pod) core.Names { return core.NamesFor("kubenet", AttachmentOf(p)) }

func SamePrefixes(a, b []netip.Prefix) bool {
	return fmt.Sprint(SortedPrefixes(a)) == fmt.Sprint(SortedPrefixes(b))
}

// CheckMasqRules reads the SNAT chain back from the kernel and compares it with the plan.
func CheckMasqRules(t testing.TB, node ns.NetNS, cidrs []netip.Prefix) {
	t.Helper()
	want := masq.Plan(masq.Config{Network: "kubenet", PodCIDRs: cidrs,
		NonMasqueradeCIDRs: []netip.Prefix{nettest.NonMasquerade4, nettest.NonMasquerade6}})
	var got []*nftables.Rule
	nettest.Do(t, node, func() error {
		c, err := nftables.New()
		if err != nil {
			return err
		}
		table := &nftables.Table{Family: nftables.TableFamilyINet, Name: "kubenet-kubenet"}
		got, err = c.GetRules(table, &nftables.Chain{Name: masq.ChainName, Table: table})
		return err
	})
	if len(got) != len(want) {
		t.Fatalf("SNAT chain has %d rules, want %d (per family: own CIDR, non-masquerade CIDR, local, masquerade)", len(got), len(want))
	}
	out := nettest.Run(t, node, "nft", "list", "chain", "inet", "kubenet-kubenet", masq.ChainName)
	for _, c := range cidrs {
		if !ContainsAll(out, "saddr "+c.String(), "masquerade", "fib daddr type local") {
			t.Errorf("SNAT chain lacks the rules of %s:\n%s", c, out)
		}
	}
}

func ContainsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

func SortedPrefixes(ps []netip.Prefix) []netip.Prefix {
	out := slices.Clone(ps)
	slices.SortFunc(out, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	return out
}

func SortedAddrs(as []netip.Addr) []netip.Addr {
	out := slices.Clone(as)
	slices.SortFunc(out, func(a, b netip.Addr) int { return a.Compare(b) })
	return out
}

// HostPortTable is the nftables table of the tests' network ("kubenet").
const HostPortTable = "kubenet-kubenet"

// HostPortElement is one element of the network's hostPort maps, as the nft tool shows it: the
// map that holds it, its key ("[address . ]protocol . port"), its value ("pod address . port")
// and its comment (the owner, "containerID/ifname"). On the iptables backend each DNAT rule reads
// as the element the nftables backend would hold for it.
type HostPortElement struct {
	Map, Key, Value, Comment string
}

func (e HostPortElement) String() string {
	return fmt.Sprintf("%s: %s : %s [%s]", e.Map, e.Key, e.Value, e.Comment)
}

// HostPortElements lists the host ports the node's backend holds (see NodeBackend): the elements
// of the four hostPort maps with the nft tool, or the DNAT rules with iptables-save and
// ip6tables-save (not with the code under test). Missing maps and chains are empty.
func HostPortElements(t testing.TB, node *nettest.Node) []HostPortElement {
	t.Helper()
	var out []HostPortElement
	b := NodeBackend(node)
	if reads(b, core.NetfilterIPTables) {
		out = iptablesHostPorts(t, node)
	}
	if !reads(b, core.NetfilterNFTables) {
		return out
	}
	for _, m := range []string{hostport.MapIPv4, hostport.MapIPv4Addr, hostport.MapIPv6, hostport.MapIPv6Addr} {
		for _, raw := range NFTElements(t, node, "inet", "map", m) {
			var el [2]json.RawMessage
			var key struct {
				Concat []any `json:"concat"`
				Elem   struct {
					Val struct {
						Concat []any `json:"concat"`
					} `json:"val"`
					Comment string `json:"comment"`
				} `json:"elem"`
			}
			var val struct {
				Concat []any `json:"concat"`
			}
			if err := json.Unmarshal(raw, &el); err != nil {
				t.Fatalf("element of %s: %v", m, err)
			}
			if err := errors.Join(json.Unmarshal(el[0], &key), json.Unmarshal(el[1], &val)); err != nil {
				t.Fatalf("element of %s: %v", m, err)
			}
			k := key.Concat
			if k == nil {
				k = key.Elem.Val.Concat
			}
			out = append(out, HostPortElement{Map: m, Key: joinConcat(k), Value: joinConcat(val.Concat), Comment: key.Elem.Comment})
		}
	}
	return out
}

// NFTElements returns the elements of the set or map (kind) name in the tests' network's table
// of family, as the nft tool shows them in JSON. A missing set or map has none.
func NFTElements(t testing.TB, node *nettest.Node, family, kind, name string) []json.RawMessage {
	t.Helper()
	text, err := nettest.Output(node.NS, "nft", "-j", "list", kind, family, HostPortTable, name)
	if err != nil {
		if strings.Contains(text, "No such file") {
			return nil
		}
		t.Fatal(err)
	}
	var doc struct {
		Nftables []map[string]struct {
			Elem []json.RawMessage `json:"elem"`
		} `json:"nftables"`
	}
	if err := json.Unmarshal([]byte(text), &doc); err != nil {
		t.Fatalf("nft -j list %s %s: %v\n%s", kind, name, err, text)
	}
	var out []json.RawMessage
	for _, o := range doc.Nftables {
		out = append(out, o[kind].Elem...)
	}
	return out
}

func joinConcat(parts []any) string {
	s := make([]string, len(parts))
	for i, p := range parts {
		s[i] = fmt.Sprint(p)
	}
	return strings.Join(s, " . ")
}

// HostPortIndexFiles lists the files of the hostPort reservation index.
func HostPortIndexFiles(t testing.TB, node *nettest.Node) []string {
	t.Helper()
	var out []string
	for _, f := range DataDirFiles(t, node) {
		if strings.Contains(f, hostport.IndexDirName+string(filepath.Separator)) {
			out = append(out, f)
		}
	}
	return out
}

// HostPortConntrack lists the node's conntrack entries whose original destination port is in ports;
// with translatedOnly, only those whose destination was translated (the reply comes from
// another address than the one the client sent to).
func HostPortConntrack(t testing.TB, node *nettest.Node, translatedOnly bool, ports ...int) []string {
	t.Helper()
	var out []string
	nettest.Do(t, node.NS, func() error {
		for _, family := range []netlink.InetFamily{netlink.FAMILY_V4, netlink.FAMILY_V6} {
			flows, err := netlink.ConntrackTableList(netlink.ConntrackTable, family)
			if err != nil {
				return err
			}
			for _, f := range flows {
				if !slices.Contains(ports, int(f.Forward.DstPort)) || translatedOnly && f.Forward.DstIP.Equal(f.Reverse.SrcIP) {
					continue
				}
				out = append(out, f.String())
			}
		}
		return nil
	})
	return out
}

// AssertNoHostPortResidue is the hostPort leak audit: no map element, no index file, no conntrack entry
// that ties one of the ports to a pod (untranslated entries of the same ports, made by requests
// that tests expect to fail, are the node's own), and no rule that names a pod address.
func AssertNoHostPortResidue(t testing.TB, node *nettest.Node, podIPs []netip.Addr, ports ...int) {
	t.Helper()
	if els := HostPortElements(t, node); len(els) > 0 {
		t.Errorf("leak: hostPort map elements remain: %v", els)
	}
	if files := HostPortIndexFiles(t, node); len(files) > 0 {
		t.Errorf("leak: hostPort index files remain: %v", files)
	}
	if flows := HostPortConntrack(t, node, true, ports...); len(flows) > 0 {
		t.Errorf("leak: conntrack entries of the host ports remain:\n%s", strings.Join(flows, "\n"))
	}
	ruleset := NetfilterRuleset(t, node)
	for _, ip := range podIPs {
		// "10.244.1.2 " in nft's listing; "10.244.1.2:80", "[fd00::2]:80" and "10.244.1.2/32"
		// in iptables'.
		named := []string{ip.String() + " ", ip.String() + "/", "[" + ip.String() + "]"}
		if ip.Is4() {
			named = append(named, ip.String()+":")
		}
		if slices.ContainsFunc(named, func(n string) bool { return strings.Contains(ruleset, n) }) {
			t.Errorf("leak: the ruleset still names pod address %s:\n%s", ip, ruleset)
		}
	}
}

// DataDirFiles lists every file below the node's data dir (relative paths, sorted).
func DataDirFiles(t testing.TB, node *nettest.Node) []string {
	t.Helper()
	var out []string
	_ = filepath.WalkDir(node.DataDir(), func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel(node.DataDir(), p)
			out = append(out, rel)
		}
		return nil
	})
	sort.Strings(out)
	return out
}

// GatewayOf is the first host address of cidr (the bridge address kubenet gives it).
func GatewayOf(cidr netip.Prefix) netip.Addr { return cidr.Addr().Next() }

// DualStack is the tests' node's pair of pod CIDRs.
func DualStack() []netip.Prefix { return []netip.Prefix{nettest.PodCIDR4, nettest.PodCIDR6} }

// CNICode extracts the CNI error code from a libcni error.
func CNICode(err error) uint {
	var e *types.Error
	if errors.As(err, &e) {
		return e.Code
	}
	return 0
}

// MustAddr parses an address or panics (test tables).
func MustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }

// PolicyPort is the index of the pod's bridge port in the node n (the policy maps' key), 0 when
// its host veth does not exist.
func PolicyPort(n ns.NetNS, network string, p *nettest.Pod) (int, error) {
	port := 0
	err := n.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(core.NamesFor(network, AttachmentOf(p)).HostVeth)
		if err == nil {
			port = l.Attrs().Index
		}
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return err
	})
	return port, err
}

// PolicyChains returns the chains the node's policy maps send port to (ingress, egress): "" for
// a port without elements, which its guard holds.
func PolicyChains(n ns.NetNS, network string, port int) (ingress, egress string, err error) {
	err = n.Do(func(ns.NetNS) error {
		maps, err := netpol.Dispatch(network)
		ingress, egress = maps[netpol.MapIngress][port], maps[netpol.MapEgress][port]
		return err
	})
	return ingress, egress, err
}
