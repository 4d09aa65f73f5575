package bridge

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
)

// ensureSysctl sets /proc/sys/<key> to value unless it already has it: reads are cheap, and
// skipping the write keeps repeated ADDs from racing each other on the same file.
func ensureSysctl(key, value string) error {
	path := "/proc/sys/" + key
	cur, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("sysctl %s: %w", key, err)
	}
	if string(bytes.TrimSpace(cur)) == value {
		return nil
	}
	if err := os.WriteFile(path, []byte(value), 0o644); err != nil {
		return fmt.Errorf("sysctl %s=%s: %w", key, value, err)
	}
	return nil
}

// isAbsent tells whether err only says that the sysctl does not exist (IPv6 disabled, no br_netfilter).
func isAbsent(err error) bool { return errors.Is(err, fs.ErrNotExist) }

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
		if err := ensureSysctl(s.key, "1"); err != nil && !(s.optional && isAbsent(err)) {
			return err
		}
	}
	return nil
}
