package bridge

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
)

// ensureSysctl sets /proc/sys/<key> to value unless it already has it: reads are cheap, and
// skipping the write keeps repeated ADDs from racing each other on the same file.
func ensureSysctl(key, value string) error {
	return ensureSysctls(path.Dir(key), [][2]string{{path.Base(key), value}})
}

// ensureSysctls is ensureSysctl for several keys of the directory /proc/sys/<dir>, which is looked
// up once. That matters for a pod's interface: all namespaces share the sysctl directory entries,
// so looking up "eth0" compares against the eth0 of every pod on the node.
func ensureSysctls(dir string, values [][2]string) error {
	root, err := os.OpenRoot("/proc/sys/" + dir)
	if err != nil {
		return fmt.Errorf("sysctl %s: %w", dir, err)
	}
	defer root.Close()
	for _, kv := range values {
		if err := ensureIn(root, kv[0], kv[1]); err != nil {
			return fmt.Errorf("sysctl %s/%s=%s: %w", dir, kv[0], kv[1], err)
		}
	}
	return nil
}

func ensureIn(root *os.Root, name, value string) error {
	f, err := root.OpenFile(name, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	cur := make([]byte, 64)
	n, err := f.Read(cur)
	if err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	if string(bytes.TrimSpace(cur[:n])) == value {
		return nil
	}
	_, err = f.WriteAt([]byte(value), 0)
	return err
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
