package bridge

import (
	"fmt"
	"net/netip"
	"os"
	"strings"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
)

// CheckBridge verifies that the bridge exists as cfg describes it: a bridge, holding every
// gateway address, with the pinned MAC, the MTU and the promiscuous mode.
func CheckBridge(cfg Config) (*netlink.Bridge, error) {
	br, err := lookup(cfg.Name)
	if err != nil {
		return nil, fmt.Errorf("bridge %q: %w", cfg.Name, err)
	}
	if cfg.MTU > 0 && br.MTU != cfg.MTU {
		return nil, fmt.Errorf("bridge %q has MTU %d, want %d", cfg.Name, br.MTU, cfg.MTU)
	}
	if mac := MAC(cfg.Gateways); br.HardwareAddr.String() != mac.String() {
		return nil, fmt.Errorf("bridge %q has MAC %s, want %s", cfg.Name, br.HardwareAddr, mac)
	}
	if promisc := br.Promisc != 0; promisc != cfg.Promisc {
		return nil, fmt.Errorf("bridge %q promiscuous=%v, want %v", cfg.Name, promisc, cfg.Promisc)
	}
	if claimed, ok := strings.CutPrefix(br.Alias, aliasPrefix); ok && cfg.Owner != "" && claimed != cfg.Owner {
		return nil, fmt.Errorf("bridge %q is used by kubenet network %q, not %q", cfg.Name, claimed, cfg.Owner)
	}
	have, err := linkPrefixes(br)
	if err != nil {
		return nil, fmt.Errorf("bridge %q: %w", cfg.Name, err)
	}
	for _, g := range cfg.Gateways {
		if !have[g] {
			return nil, fmt.Errorf("bridge %q lacks gateway address %s", cfg.Name, g)
		}
	}
	return br, nil
}

// CheckVeth verifies that the host end exists, sits on the bridge and has the MTU.
func CheckVeth(v Veth) (netlink.Link, error) {
	host, err := netlinksafe.LinkByName(v.HostName)
	if err != nil {
		return nil, fmt.Errorf("host veth %q: %w", v.HostName, err)
	}
	if host.Attrs().MasterIndex != v.Bridge.Index {
		return nil, fmt.Errorf("host veth %q is not on bridge %q", v.HostName, v.Bridge.Name)
	}
	if v.MTU > 0 && host.Attrs().MTU != v.MTU {
		return nil, fmt.Errorf("host veth %q has MTU %d, want %d", v.HostName, host.Attrs().MTU, v.MTU)
	}
	return host, nil
}

// CheckPod verifies, inside the pod's netns, that the interface is the peer of host, has the MTU,
// holds the addresses and has a default route per family via the gateway.
func CheckPod(podNS ns.NetNS, p Pod, host netlink.Link, mtu int) error {
	err := podNS.Do(func(ns.NetNS) error {
		link, err := netlinksafe.LinkByName(p.IfName)
		if err != nil {
			return err
		}
		veth, ok := link.(*netlink.Veth)
		if !ok {
			return fmt.Errorf("is a %s, not a veth", link.Type())
		}
		peer, err := netlink.VethPeerIndex(veth)
		if err != nil {
			return fmt.Errorf("peer: %w", err)
		}
		if peer != host.Attrs().Index {
			return fmt.Errorf("is not the peer of host veth %q", host.Attrs().Name)
		}
		if mtu > 0 && link.Attrs().MTU != mtu {
			return fmt.Errorf("has MTU %d, want %d", link.Attrs().MTU, mtu)
		}
		if p.MAC != nil && link.Attrs().HardwareAddr.String() != p.MAC.String() {
			return fmt.Errorf("has MAC %s, want %s", link.Attrs().HardwareAddr, p.MAC)
		}
		// A pod that accepted router advertisements would take routes from whoever sends them.
		if ra, err := os.ReadFile("/proc/sys/net/ipv6/conf/" + p.IfName + "/accept_ra"); err == nil && strings.TrimSpace(string(ra)) != "0" {
			return fmt.Errorf("accepts router advertisements (accept_ra=%s), want 0", strings.TrimSpace(string(ra)))
		}
		have, err := linkPrefixes(link)
		if err != nil {
			return err
		}
		for _, a := range p.Addrs {
			if !have[a] {
				return fmt.Errorf("lacks address %s", a)
			}
		}
		return checkDefaultRoutes(link, p.Gateways)
	})
	if err != nil {
		return fmt.Errorf("pod interface %q: %w", p.IfName, err)
	}
	return nil
}

func checkDefaultRoutes(link netlink.Link, gateways []netip.Addr) error {
	routes, err := netlinksafe.RouteList(link, netlink.FAMILY_ALL)
	if err != nil {
		return fmt.Errorf("routes: %w", err)
	}
	for _, gw := range gateways {
		found := false
		for _, r := range routes {
			via, _ := netip.AddrFromSlice(r.Gw)
			if isDefault(r) && via.Unmap() == gw {
				found = true
				break
			}
		}
		if !found {
			return fmt.Errorf("lacks the default route via %s", gw)
		}
	}
	return nil
}

// linkPrefixes is the set of l's addresses, read with the kernel-filtered dump (linkAddrs).
func linkPrefixes(l netlink.Link) (map[netip.Prefix]bool, error) {
	addrs, err := linkAddrs(l.Attrs().Index)
	if err != nil {
		return nil, err
	}
	have := map[netip.Prefix]bool{}
	for _, p := range addrs {
		have[p] = true
	}
	return have, nil
}
