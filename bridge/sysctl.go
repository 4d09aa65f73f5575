package bridge

import (
	"errors"
	"io/fs"
	"os"

	"github.com/kubenet-dev/kubenet/internal/sysctl"
)

// ErrNoBridgeNetfilter says that br_netfilter is not loaded in the caller's network namespace:
// bridged frames never reach the IP hooks, so neither conntrack nor kube-proxy sees traffic
// between pods of one bridge.
var ErrNoBridgeNetfilter = errors.New("br_netfilter is not loaded (modprobe br_netfilter): bridged traffic between pods never reaches conntrack and the IP hooks")

// CheckBridgeNetfilter returns ErrNoBridgeNetfilter when br_netfilter is absent from the
// caller's network namespace (its sysctls exist per namespace once the module is loaded).
func CheckBridgeNetfilter() error {
	_, err := os.Stat("/proc/sys/net/bridge/bridge-nf-call-iptables")
	if errors.Is(err, fs.ErrNotExist) {
		return ErrNoBridgeNetfilter
	}
	return err
}

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
