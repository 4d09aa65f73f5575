package testkit

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/kubenet-dev/kubenet/core"
	"github.com/kubenet-dev/kubenet/hostport"
	"github.com/kubenet-dev/kubenet/internal/ipt"
	"github.com/kubenet-dev/kubenet/isolation"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

// The readers of what kubenet keeps in the kernel (HostPortElements, IsolationElements,
// NetfilterRuleset) look where the node's backend keeps it: nftables, or iptables, ip6tables and
// ebtables. They read with the tools an operator would use (nft, iptables-save, ip6tables-save,
// ebtables-save), not with the code under test; ipt.Parse and ipt.Tokens only split the -save
// tools' text into chains and words.

// network is the tests' network.
const network = "kubenet"

// NodeBackend is the netfilter backend that holds the tests' network's rules on node: the
// "backend" of the record kubenet keeps in <dataDir>/kubenet/kubenet-netfilter.json, or, without
// a readable record, the netfilterBackend of the node's conflist (node.NetfilterBackend). ""
// when neither says (auto with nothing recorded yet, or a damaged record on an auto node): the
// readers then look in both backends.
func NodeBackend(node *nettest.Node) core.NetfilterBackend {
	known := func(b core.NetfilterBackend) bool {
		return b == core.NetfilterNFTables || b == core.NetfilterIPTables
	}
	var rec struct {
		Backend core.NetfilterBackend `json:"backend"`
	}
	if b, err := os.ReadFile(filepath.Join(node.DataDir(), network, core.NetfilterFile)); err == nil && json.Unmarshal(b, &rec) == nil && known(rec.Backend) {
		return rec.Backend
	}
	if b := core.NetfilterBackend(node.NetfilterBackend); known(b) {
		return b
	}
	return ""
}

// reads tells whether the readers look in backend b on a node whose backend is nodeBackend.
func reads(nodeBackend, b core.NetfilterBackend) bool { return nodeBackend == "" || nodeBackend == b }

// saveTable runs tool (iptables-save, ip6tables-save, ebtables-save) for one table inside the
// node and parses what it prints.
func saveTable(t testing.TB, node *nettest.Node, f ipt.Family, tool, table string) *ipt.Table {
	t.Helper()
	return ipt.Parse(f, table, []byte(nettest.Run(t, node.NS, tool, "-t", table)))
}

// iptablesHostPorts reads the host-port DNAT rules of the tests' network from the nat table of
// iptables and ip6tables: one element per rule, as the nftables map that would hold its key
// (any local address, or one), its destination and its owner (the rule's comment; an
// interface name spelt in hex, "id/x:<hex>", is decoded). A rule kubenet could not have written
// keeps its text as the key and has no owner.
func iptablesHostPorts(t testing.TB, node *nettest.Node) []HostPortElement {
	t.Helper()
	chain := "KUBENET-HPDNAT-" + ipt.ChainSuffix(network)
	var out []HostPortElement
	for _, fam := range []struct {
		f    ipt.Family
		tool string
		is6  bool
	}{{ipt.IPv4, "iptables-save", false}, {ipt.IPv6, "ip6tables-save", true}} {
		anyMap, addrMap := hostport.MapIPv4, hostport.MapIPv4Addr
		if fam.is6 {
			anyMap, addrMap = hostport.MapIPv6, hostport.MapIPv6Addr
		}
		for _, rule := range saveTable(t, node, fam.f, fam.tool, "nat").Chains[chain] {
			tok := ipt.Tokens(rule)
			e := HostPortElement{Map: anyMap, Key: argOf(tok, "-p") + " . " + argOf(tok, "--dport"), Comment: ownerOf(argOf(tok, "--comment"))}
			if d := argOf(tok, "-d"); d != "" {
				e.Map, e.Key = addrMap, strings.TrimSuffix(strings.TrimSuffix(d, "/32"), "/128")+" . "+e.Key
			}
			to, err := netip.ParseAddrPort(argOf(tok, "--to-destination"))
			if err != nil || argOf(tok, "-j") != "DNAT" || argOf(tok, "--dport") == "" {
				out = append(out, HostPortElement{Map: e.Map, Key: rule})
				continue
			}
			e.Value = to.Addr().String() + " . " + strconv.Itoa(int(to.Port()))
			out = append(out, e)
		}
	}
	return out
}

// argOf returns the word after flag in a rule's words, or "".
func argOf(tok []string, flag string) string {
	if i := slices.Index(tok, flag); i >= 0 && i+1 < len(tok) {
		return tok[i+1]
	}
	return ""
}

// ownerOf decodes an iptables owner comment: "id/ifname", or "id/x:<hex of ifname>" for an
// interface name the tools would not print as it is. Anything else is returned as it is.
func ownerOf(comment string) string {
	id, enc, ok := strings.Cut(comment, "/x:")
	if !ok {
		return comment
	}
	b, err := hex.DecodeString(enc)
	if err != nil {
		return comment
	}
	return id + "/" + string(b)
}

// ebtablesIsolation derives the isolation elements of the tests' network from the ebtables nat
// table, with what each rule permits in the terms of the nftables sets:
//
//	KUBENET-PODS dispatch rule "-i <port> -j <chain>"     pod-ports: port
//	in <chain>: the final "-j DROP" (all else dropped)     anti-spoof-ports: port
//	            "-s ! <mac> -j DROP"                       mac: port . mac
//	            "-p IPv4 --ip-src <a> -j RETURN"           ipv4: port . a
//	            "-p ARP ... --arp-ip-src <a> --arp-mac-src <mac> -j RETURN"
//	                                                       ipv4: port . a (unless 0.0.0.0), mac: port . mac
//	            "-p IPv6 --ip6-src <a> -j RETURN"          ipv6: port . a
//
// The guard jump and the rules that let :: send DAD and MLD give nothing; any other rule of a
// pod chain is an element of set "rule" with the rule's text. Each element carries the chain it
// was read from (ebtables rules have no comments, so Comment is empty); a pod chain no dispatch
// rule leads to gives its elements with port "?".
func ebtablesIsolation(t testing.TB, node *nettest.Node) []IsolationElement {
	t.Helper()
	table := saveTable(t, node, ipt.Bridge, "ebtables-save", isolation.EbtablesTable())
	suffix := ipt.ChainSuffix(network)
	var out []IsolationElement
	reached := map[string]bool{}
	for _, rule := range table.Chains["KUBENET-PODS-"+suffix] {
		tok := ipt.Tokens(rule)
		port, chain := argOf(tok, "-i"), argOf(tok, "-j")
		reached[chain] = true
		out = append(out, IsolationElement{Set: isolation.SetPodPorts, Key: port, Chain: chain})
		out = append(out, podChainElements(port, chain, "KUBENET-GUARD-"+suffix, table.Chains[chain])...)
	}
	var orphans []string
	for chain := range table.Chains {
		if strings.HasPrefix(chain, "KNP-"+suffix+"-") && !reached[chain] {
			orphans = append(orphans, chain)
		}
	}
	slices.Sort(orphans)
	for _, chain := range orphans {
		out = append(out, podChainElements("?", chain, "KUBENET-GUARD-"+suffix, table.Chains[chain])...)
	}
	return out
}

// podChainElements reads the rules of one pod chain (see ebtablesIsolation).
func podChainElements(port, chain, guard string, rules []string) []IsolationElement {
	var out []IsolationElement
	add := func(set, value string) {
		e := IsolationElement{Set: set, Key: port, Chain: chain}
		if value != "" {
			e.Key += " . " + value
		}
		if !slices.Contains(out, e) {
			out = append(out, e)
		}
	}
	for _, rule := range rules {
		tok := ipt.Tokens(rule)
		proto, verdict := argOf(tok, "-p"), argOf(tok, "-j")
		switch {
		case slices.Equal(tok, []string{"-j", guard}):
		case slices.Equal(tok, []string{"-j", "DROP"}):
			add(isolation.SetAntiSpoofPorts, "")
		case len(tok) == 5 && tok[0] == "-s" && tok[1] == "!" && verdict == "DROP":
			add(isolation.SetMAC, macOf(tok[2]))
		case len(tok) == 6 && proto == "IPv4" && argOf(tok, "--ip-src") != "" && verdict == "RETURN":
			add(isolation.SetIPv4, argOf(tok, "--ip-src"))
		case proto == "ARP" && argOf(tok, "--arp-mac-src") != "" && verdict == "RETURN":
			if a := argOf(tok, "--arp-ip-src"); a != "0.0.0.0" {
				add(isolation.SetIPv4, a)
			}
			add(isolation.SetMAC, macOf(argOf(tok, "--arp-mac-src")))
		case len(tok) == 6 && proto == "IPv6" && argOf(tok, "--ip6-src") != "" && verdict == "RETURN":
			add(isolation.SetIPv6, argOf(tok, "--ip6-src"))
		case proto == "IPv6" && argOf(tok, "--ip6-src") == "::" && argOf(tok, "--ip6-proto") == "ipv6-icmp" && verdict == "RETURN":
		default:
			add("rule", rule)
		}
	}
	return out
}

// macOf spells a MAC as nft does (lower case, two digits per byte).
func macOf(s string) string {
	if m, err := net.ParseMAC(s); err == nil {
		return m.String()
	}
	return s
}

// IsolationMark is what ties the isolation elements of port to their attachment (owner) on a
// node whose backend is b: with nftables the elements' comment, with iptables the pod chain
// that port's dispatch rule leads to (ebtables rules have no comment; the chain's name is a hash
// of the port's). Set and Key are empty.
func IsolationMark(b core.NetfilterBackend, port, owner string) IsolationElement {
	if b != core.NetfilterIPTables {
		return IsolationElement{Comment: owner}
	}
	return IsolationElement{Chain: EbtablesPodChain(port)}
}

// EbtablesPodChain is the name of the ebtables chain of the pod behind port in the tests'
// network: "KNP-<network hash>-<10 hex digits of sha256(port)>".
func EbtablesPodChain(port string) string {
	sum := sha256.Sum256([]byte(port))
	return "KNP-" + ipt.ChainSuffix(network) + "-" + hex.EncodeToString(sum[:5])
}

// counters are the packet and byte counts the -save tools print with chains' policies.
var counters = regexp.MustCompile(`\[[0-9]+:[0-9]+\]`)

// NetfilterRuleset is everything the node's backend holds, as its tools print it: nft list
// ruleset without state (counters, elements' expiry countdowns) once no ended element is listed
// (nettest.SettledRuleset), or every table of iptables-save, ip6tables-save and ebtables-save
// without their comment lines (timestamps) and counters. For comparing the node before and after
// something. A tool that fails adds its error text.
func NetfilterRuleset(t testing.TB, node *nettest.Node) string {
	t.Helper()
	b := NodeBackend(node)
	var out strings.Builder
	if reads(b, core.NetfilterNFTables) {
		text, err := nettest.SettledRuleset(node.NS, "-s")
		if err != nil {
			text += err.Error()
		}
		out.WriteString(text)
	}
	if reads(b, core.NetfilterIPTables) {
		for _, tool := range []string{"iptables-save", "ip6tables-save", "ebtables-save"} {
			text, _ := nettest.Output(node.NS, tool)
			for _, line := range strings.Split(text, "\n") {
				if !strings.HasPrefix(line, "#") {
					out.WriteString(counters.ReplaceAllString(line, "") + "\n")
				}
			}
		}
	}
	return out.String()
}
