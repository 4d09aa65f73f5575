// Command floorplugin is the benchmark's floor: a CNI plugin that does only what no bridge
// plugin can skip, written the way such plugins are (Go, skel, vishvananda/netlink), so that
// the table can say how far kubenet's ADD and DEL are from the least any bridge plugin costs.
//
// ADD: a veth pair, the pod end created inside the pod's netns under CNI_IFNAME and the host end
// on the bridge (made, with its gateway address, by the node's first ADD); in the pod, the
// address and the default route via the gateway. DEL: the host end deleted, which takes the pod
// end with it. Nothing else: no address store (the address is a hash of the container ID, which
// is enough for one pod at a time), no netfilter, no sysctls, no record. Only for bench/.
//
// Configuration: {"type": "floorplugin", "bridge": "cbr0", "subnet": "10.244.0.0/22", "mtu": 1500};
// the gateway is the subnet's first host address.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"net/netip"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/kubenet-dev/kubenet/internal/ipnet"
)

type conf struct {
	types.PluginConf
	Bridge string       `json:"bridge"`
	Subnet netip.Prefix `json:"subnet"`
	MTU    int          `json:"mtu"`
}

func main() {
	skel.PluginMainFuncs(skel.CNIFuncs{Add: add, Del: del, Check: func(*skel.CmdArgs) error { return nil }},
		version.PluginSupports("1.0.0", "1.1.0"), "the benchmark's floor plugin")
}

func parse(stdin []byte) (*conf, error) {
	var c conf
	if err := json.Unmarshal(stdin, &c); err != nil {
		return nil, fmt.Errorf("configuration: %w", err)
	}
	if c.Bridge == "" || !c.Subnet.IsValid() || !c.Subnet.Addr().Is4() || c.Subnet.Bits() > 30 {
		return nil, fmt.Errorf("configuration: bridge %q and an IPv4 subnet (/30 or larger, got %v) are required", c.Bridge, c.Subnet)
	}
	return &c, nil
}

// hostName is the host end's name, derived from the container ID so that DEL finds it.
func hostName(containerID string) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(containerID))
	return fmt.Sprintf("fl%08x", h.Sum32())
}

// address is the pod's address: a host of the subnet picked by the container ID's hash, never
// the network, gateway or broadcast address.
func address(c *conf, containerID string) netip.Prefix {
	h := fnv.New32a()
	_, _ = h.Write([]byte(containerID))
	hosts := uint32(1)<<(32-c.Subnet.Bits()) - 3 // without network, gateway, broadcast
	base := c.Subnet.Masked().Addr().As4()
	n := uint32(base[0])<<24 | uint32(base[1])<<16 | uint32(base[2])<<8 | uint32(base[3])
	n += 2 + h.Sum32()%hosts
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}), c.Subnet.Bits())
}

func gateway(c *conf) netip.Addr { return c.Subnet.Masked().Addr().Next() }

// bridge returns the bridge, made with the gateway address on the node's first ADD.
func bridge(c *conf) (netlink.Link, error) {
	br, err := netlink.LinkByName(c.Bridge)
	if err == nil {
		return br, nil
	}
	if !errors.As(err, new(netlink.LinkNotFoundError)) {
		return nil, err
	}
	attrs := netlink.NewLinkAttrs()
	attrs.Name, attrs.MTU = c.Bridge, c.MTU
	if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: attrs}); err != nil && !errors.Is(err, unix.EEXIST) {
		return nil, fmt.Errorf("bridge %s: %w", c.Bridge, err)
	}
	if br, err = netlink.LinkByName(c.Bridge); err != nil {
		return nil, err
	}
	gw := netip.PrefixFrom(gateway(c), c.Subnet.Bits())
	if err := netlink.AddrAdd(br, &netlink.Addr{IPNet: ipnet.FromPrefix(gw)}); err != nil && !errors.Is(err, unix.EEXIST) {
		return nil, fmt.Errorf("bridge %s: address: %w", c.Bridge, err)
	}
	return br, netlink.LinkSetUp(br)
}

func add(args *skel.CmdArgs) error {
	c, err := parse(args.StdinData)
	if err != nil {
		return err
	}
	podNS, err := ns.GetNS(args.Netns)
	if err != nil {
		return err
	}
	defer podNS.Close()
	br, err := bridge(c)
	if err != nil {
		return err
	}
	attrs := netlink.NewLinkAttrs()
	attrs.Name, attrs.MTU, attrs.MasterIndex = hostName(args.ContainerID), c.MTU, br.Attrs().Index
	attrs.Flags = net.FlagUp
	veth := &netlink.Veth{LinkAttrs: attrs, PeerName: args.IfName, PeerNamespace: netlink.NsFd(int(podNS.Fd())), PeerMTU: uint32(c.MTU)}
	if err := netlink.LinkAdd(veth); err != nil {
		return fmt.Errorf("veth: %w", err)
	}
	addr := address(c, args.ContainerID)
	var mac net.HardwareAddr
	err = podNS.Do(func(ns.NetNS) error {
		link, err := netlink.LinkByName(args.IfName)
		if err != nil {
			return err
		}
		mac = link.Attrs().HardwareAddr
		if err := netlink.AddrAdd(link, &netlink.Addr{IPNet: ipnet.FromPrefix(addr), Flags: unix.IFA_F_NODAD}); err != nil {
			return fmt.Errorf("address: %w", err)
		}
		if err := netlink.LinkSetUp(link); err != nil {
			return err
		}
		return netlink.RouteAdd(&netlink.Route{LinkIndex: link.Attrs().Index, Dst: ipnet.FromPrefix(netip.MustParsePrefix("0.0.0.0/0")), Gw: gateway(c).AsSlice()})
	})
	if err != nil {
		return fmt.Errorf("pod interface: %w", err)
	}
	result := &current.Result{
		CNIVersion: current.ImplementedSpecVersion,
		Interfaces: []*current.Interface{{Name: args.IfName, Mac: mac.String(), Sandbox: args.Netns}},
		IPs:        []*current.IPConfig{{Interface: current.Int(0), Address: *ipnet.FromPrefix(addr), Gateway: gateway(c).AsSlice()}},
	}
	return types.PrintResult(result, c.CNIVersion)
}

func del(args *skel.CmdArgs) error {
	link, err := netlink.LinkByName(hostName(args.ContainerID))
	if errors.As(err, new(netlink.LinkNotFoundError)) {
		return nil
	}
	if err != nil {
		return err
	}
	return netlink.LinkDel(link)
}
