package bridge

import "github.com/kubenet-dev/kubenet/internal/sysctl"

// EnsureNodeSysctls turns on forwarding for the families in use and, where br_netfilter is
// present, makes bridged traffic visible to iptables/nftables (kube-proxy needs it to see
// pod-to-service traffic between pods on the same bridge).
func EnsureNodeSysctls(ipv4, ipv6 bool) error {
	type setting struct {
		key      string
		optional bool // absent without br_netfilter or IPv6; that is not an error
	}
	var settings []setting
	if ipv4 {
		settings = append(settings, setting{"net/ipv4/ip_forward", false}, setting{"net/bridge/bridge-nf-call-iptables", true})
	}
	if ipv6 {
		settings = append(settings, setting{"net/ipv6/conf/all/forwarding", false}, setting{"net/bridge/bridge-nf-call-ip6tables", true})
	}
	for _, s := range settings {
		if err := sysctl.Ensure(s.key, "1"); err != nil && !(s.optional && sysctl.IsAbsent(err)) {
			return err
		}
	}
	return nil
}
