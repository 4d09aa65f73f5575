package network

import (
	"errors"
	"fmt"
	"net"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
)

// GetPodIPs reads the global addresses of ifName inside the network namespace at netnsPath over
// netlink (kubelet ran nsenter and ip), IPv4 first, at most one per family. It fails when the
// interface has none.
func GetPodIPs(netnsPath, ifName string) ([]net.IP, error) {
	podNS, err := ns.GetNS(netnsPath)
	if err != nil {
		return nil, fmt.Errorf("pod network namespace %q: %w", netnsPath, err)
	}
	defer podNS.Close()
	var v4, v6 net.IP
	err = podNS.Do(func(ns.NetNS) error {
		l, err := netlinksafe.LinkByName(ifName)
		if err != nil {
			return err
		}
		addrs, err := netlinksafe.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			return err
		}
		for _, a := range addrs {
			if a.Scope != int(netlink.SCOPE_UNIVERSE) || a.IP.IsLinkLocalUnicast() {
				continue
			}
			if ip4 := a.IP.To4(); ip4 != nil {
				if v4 == nil {
					v4 = ip4
				}
			} else if v6 == nil {
				v6 = a.IP
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("addresses of %s in %s: %w", ifName, netnsPath, err)
	}
	var ips []net.IP
	for _, ip := range []net.IP{v4, v6} {
		if ip != nil {
			ips = append(ips, ip)
		}
	}
	if len(ips) == 0 {
		return nil, errors.New("no global address on " + ifName + " in " + netnsPath)
	}
	return ips, nil
}

// StatusOf builds a PodNetworkStatus from ips (the first is the primary address).
func StatusOf(ips []net.IP) *PodNetworkStatus {
	if len(ips) == 0 {
		return nil
	}
	return &PodNetworkStatus{IP: ips[0], IPs: ips}
}

// NetNSOf asks host for the sandbox's network namespace and refuses an empty answer.
func NetNSOf(host Host, id ContainerID) (string, error) {
	netns, err := host.GetNetNS(id.ID)
	if err != nil {
		return "", fmt.Errorf("network namespace of sandbox %s: %w", id.ID, err)
	}
	if netns == "" {
		return "", fmt.Errorf("network namespace of sandbox %s: the runtime returned none", id.ID)
	}
	return netns, nil
}

// StatusFromNetNS reads the sandbox's addresses from its DefaultInterfaceName inside its netns.
func StatusFromNetNS(host Host, id ContainerID) (*PodNetworkStatus, error) {
	netns, err := NetNSOf(host, id)
	if err != nil {
		return nil, err
	}
	ips, err := GetPodIPs(netns, DefaultInterfaceName)
	if err != nil {
		return nil, err
	}
	return StatusOf(ips), nil
}
