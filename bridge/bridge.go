// Package bridge owns the node's pod bridge and each pod's veth pair: the bridge with its gateway
// addresses, pinned MAC and MTU; the veth with one end on the bridge and the other, renamed to
// the pod's interface name, inside the pod's network namespace with its addresses and routes.
package bridge

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/kubenet-dev/kubenet/internal/ipnet"
	"github.com/kubenet-dev/kubenet/internal/links"
	"github.com/kubenet-dev/kubenet/internal/sysctl"
)

// Config describes the bridge of one kubenet network.
type Config struct {
	Name string
	MTU  int
	// Gateways are the bridge's addresses: the first host address of each pod CIDR with the
	// CIDR's prefix length (10.244.1.1/24).
	Gateways []netip.Prefix
	Promisc  bool
	// Owner is the kubenet network that uses the bridge; its name goes into the bridge's alias,
	// so that another network configured with the same bridge is refused (Preflight).
	Owner string
	// NetfilterCall turns on the bridge's own nf_call_iptables and nf_call_ip6tables options:
	// br_netfilter then passes the bridge's frames through the IP hooks (conntrack, kube-proxy's
	// DNAT) whatever the node-wide bridge-nf-call sysctls say, which other tools turn off.
	NetfilterCall bool
}

// MAC is the address the bridge is pinned to: 0a:58 followed by the last four bytes of the first
// gateway, as old kubenet did. A bridge otherwise takes the lowest MAC of its ports and changes
// it as pods come and go, which makes every pod's neighbour entry for the gateway go stale.
func MAC(gateways []netip.Prefix) net.HardwareAddr {
	mac := net.HardwareAddr{0x0a, 0x58, 0, 0, 0, 0}
	if len(gateways) > 0 {
		b := gateways[0].Addr().AsSlice()
		copy(mac[2:], b[len(b)-4:])
	}
	return mac
}

// Ensure creates the bridge or brings an existing one to cfg: MTU, MAC, promiscuous mode,
// accept_ra=0, exactly the configured gateway addresses, and up. An existing bridge is adjusted in
// place (its ifindex and ports stay). It only writes what differs, so on a configured node it costs
// a few reads, fewer when seen (Preflight's, or the zero Seen) already holds them.
func Ensure(cfg Config, seen Seen) (*netlink.Bridge, error) {
	br := seen.bridge(cfg.Name)
	if br == nil {
		var err error
		if br, err = getOrCreate(cfg); err != nil {
			return nil, fmt.Errorf("bridge %q: %w", cfg.Name, err)
		}
	}
	if err := adjust(br, cfg, seen.addrs); err != nil {
		return nil, fmt.Errorf("bridge %q: %w", cfg.Name, err)
	}
	if cfg.NetfilterCall && (seen.link == nil || !seen.link.NetfilterCall) {
		if err := setNetfilterCall(br.Index); err != nil {
			return nil, fmt.Errorf("bridge %q: %w", cfg.Name, err)
		}
	}
	return br, nil
}

// NetfilterCall tells whether the seen bridge had its nf_call_iptables and nf_call_ip6tables
// options on.
func (s Seen) NetfilterCall() bool { return s.link != nil && s.link.NetfilterCall }

// Index is the seen bridge's interface index, 0 when it was not there.
func (s Seen) Index() int {
	if s.link == nil {
		return 0
	}
	return s.link.Index
}

// setNetfilterCall turns on the bridge's nf_call_iptables and nf_call_ip6tables options
// (`ip link set <bridge> type bridge nf_call_iptables 1 nf_call_ip6tables 1`), which the
// netlink library's Bridge type does not carry.
func setNetfilterCall(index int) error {
	req := nl.NewNetlinkRequest(unix.RTM_NEWLINK, unix.NLM_F_ACK)
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(index)
	req.AddData(msg)
	info := nl.NewRtAttr(unix.IFLA_LINKINFO, nil)
	info.AddRtAttr(nl.IFLA_INFO_KIND, nl.NonZeroTerminated("bridge"))
	data := info.AddRtAttr(nl.IFLA_INFO_DATA, nil)
	data.AddRtAttr(unix.IFLA_BR_NF_CALL_IPTABLES, []byte{1})
	data.AddRtAttr(unix.IFLA_BR_NF_CALL_IP6TABLES, []byte{1})
	req.AddData(info)
	if _, err := req.Execute(unix.NETLINK_ROUTE, 0); err != nil {
		return fmt.Errorf("turn on nf_call_iptables and nf_call_ip6tables: %w", err)
	}
	return nil
}

// bridge is the seen bridge called name with the attributes adjust looks at, nil when not seen.
func (s Seen) bridge(name string) *netlink.Bridge {
	if s.link == nil {
		return nil
	}
	attrs := netlink.LinkAttrs{Index: s.link.Index, Name: name, MTU: s.link.MTU, HardwareAddr: s.link.MAC, Alias: s.link.Alias, Promisc: s.link.Promisc}
	if s.link.Up {
		attrs.Flags = net.FlagUp
	}
	return &netlink.Bridge{LinkAttrs: attrs}
}

func getOrCreate(cfg Config) (*netlink.Bridge, error) {
	if br, err := lookup(cfg.Name); err == nil || !links.IsNotFound(err) {
		return br, err
	}
	attrs := netlink.NewLinkAttrs()
	attrs.Name = cfg.Name
	attrs.MTU = cfg.MTU
	attrs.HardwareAddr = MAC(cfg.Gateways)
	// Without an explicit queue length a bridge created over netlink can get txqueuelen 0, and a
	// qdisc on it then drops everything (kubernetes#25092).
	attrs.TxQLen = 1000
	err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: attrs})
	if err != nil && !errors.Is(err, syscall.EEXIST) {
		return nil, fmt.Errorf("create: %w", err)
	}
	// Another plugin process may have created it between our lookup and add; either way read back.
	return lookup(cfg.Name)
}

func lookup(name string) (*netlink.Bridge, error) {
	l, err := netlinksafe.LinkByName(name)
	if err != nil {
		return nil, err
	}
	br, ok := l.(*netlink.Bridge)
	if !ok {
		return nil, fmt.Errorf("%q exists and is a %s, not a bridge", name, l.Type())
	}
	return br, nil
}

// adjust writes what of br differs from cfg; addrs are br's addresses when known (nil: read them).
func adjust(br *netlink.Bridge, cfg Config, addrs []netip.Prefix) error {
	if cfg.MTU > 0 && br.MTU != cfg.MTU {
		if err := netlink.LinkSetMTU(br, cfg.MTU); err != nil {
			return fmt.Errorf("set MTU %d: %w", cfg.MTU, err)
		}
	}
	if mac := MAC(cfg.Gateways); br.HardwareAddr.String() != mac.String() {
		if err := netlink.LinkSetHardwareAddr(br, mac); err != nil {
			return fmt.Errorf("pin MAC %s: %w", mac, err)
		}
	}
	if cfg.Owner != "" && br.Alias != ownerAlias(cfg.Owner) {
		if err := netlink.LinkSetAlias(br, ownerAlias(cfg.Owner)); err != nil {
			return fmt.Errorf("set alias: %w", err)
		}
	}
	if promisc := br.Promisc != 0; promisc != cfg.Promisc {
		set := netlink.SetPromiscOff
		if cfg.Promisc {
			set = netlink.SetPromiscOn
		}
		if err := set(br); err != nil {
			return fmt.Errorf("set promiscuous=%v: %w", cfg.Promisc, err)
		}
	}
	// The bridge is a router interface for the pods; router advertisements on it must not change
	// the node's own routes.
	if err := sysctl.Ensure(fmt.Sprintf("net/ipv6/conf/%s/accept_ra", br.Name), "0"); err != nil && !sysctl.IsAbsent(err) {
		return err
	}
	if err := reconcileAddrs(br, cfg.Gateways, addrs); err != nil {
		return err
	}
	if br.Flags&net.FlagUp == 0 {
		if err := netlink.LinkSetUp(br); err != nil {
			return fmt.Errorf("set up: %w", err)
		}
	}
	return nil
}

// reconcileAddrs leaves exactly the gateway addresses (plus IPv6 link-local ones) on the bridge,
// which has have (nil: read them). A global address from an earlier pod CIDR would otherwise stay
// behind after the node's CIDR changed and make every later ADD fail or route wrongly (old
// kubenet's stale cbr0 address bug).
func reconcileAddrs(br *netlink.Bridge, gateways, have []netip.Prefix) error {
	if have == nil {
		var err error
		if have, err = linkAddrs(br.Index); err != nil {
			return err
		}
	}
	want := map[netip.Prefix]bool{}
	for _, g := range gateways {
		want[g] = false
	}
	for _, p := range have {
		if p.Addr().IsLinkLocalUnicast() {
			continue
		}
		if _, keep := want[p]; keep {
			want[p] = true
			continue
		}
		if err := netlink.AddrDel(br, &netlink.Addr{IPNet: ipnet.FromPrefix(p)}); err != nil && !errors.Is(err, syscall.EADDRNOTAVAIL) {
			return fmt.Errorf("remove stale address %s: %w", p, err)
		}
	}
	for _, g := range gateways {
		if want[g] {
			continue
		}
		// NODAD: the gateway must answer pods at once, not after a second of duplicate detection.
		addr := &netlink.Addr{IPNet: ipnet.FromPrefix(g), Flags: unix.IFA_F_NODAD}
		if err := netlink.AddrReplace(br, addr); err != nil {
			return fmt.Errorf("add gateway address %s: %w", g, err)
		}
	}
	return nil
}

// ErrNoBridge is NetfilterCallOn's error when there is no bridge of that name.
var ErrNoBridge = errors.New("no such bridge")

// NetfilterCallOn tells whether the bridge called name has its nf_call_iptables and
// nf_call_ip6tables options on (CHECK, STATUS, the agent's policy pass and healer).
func NetfilterCallOn(name string) (bool, error) {
	r, err := openRtnl()
	if err != nil {
		return false, err
	}
	defer r.Close()
	br, found, err := r.link(name)
	if err != nil {
		return false, fmt.Errorf("bridge %q: %w", name, err)
	}
	if !found {
		return false, fmt.Errorf("bridge %q: %w", name, ErrNoBridge)
	}
	return br.NetfilterCall, nil
}

// TurnOnNetfilterCall turns the nf_call options of the bridge called name on.
func TurnOnNetfilterCall(name string) error {
	br, err := lookup(name)
	if err != nil {
		return fmt.Errorf("bridge %q: %w", name, err)
	}
	if err := setNetfilterCall(br.Index); err != nil {
		return fmt.Errorf("bridge %q: %w", name, err)
	}
	return nil
}
