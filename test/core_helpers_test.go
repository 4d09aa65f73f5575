package test

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/kubenet-dev/kubenet/core"
	"github.com/kubenet-dev/kubenet/hostport"
	"github.com/kubenet-dev/kubenet/internal/nettest"
)

// trafficTimeout bounds one request; reachable paths answer in milliseconds.
const trafficTimeout = 5 * time.Second

// unreachableTimeout is how long a request that must fail is given before we call it failed.
const unreachableTimeout = 1500 * time.Millisecond

// sysctl reads /proc/sys/<key> inside n.
func sysctl(t testing.TB, n ns.NetNS, key string) string {
	t.Helper()
	var v string
	nettest.Do(t, n, func() error {
		b, err := os.ReadFile("/proc/sys/" + key)
		v = strings.TrimSpace(string(b))
		return err
	})
	return v
}

// link reads a link by name inside n.
func link(t testing.TB, n ns.NetNS, name string) netlink.Link {
	t.Helper()
	var l netlink.Link
	nettest.Do(t, n, func() error {
		var err error
		l, err = netlink.LinkByName(name)
		return err
	})
	return l
}

// linkExists tells whether name exists inside n.
func linkExists(t testing.TB, n ns.NetNS, name string) bool {
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

// addrs lists the global addresses of name inside n.
func addrs(t testing.TB, n ns.NetNS, name string) []netip.Prefix {
	t.Helper()
	var out []netip.Prefix
	nettest.Do(t, n, func() error {
		l, err := netlink.LinkByName(name)
		if err != nil {
			return err
		}
		as, err := netlink.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			return err
		}
		for _, a := range as {
			ip, _ := netip.AddrFromSlice(a.IP)
			ones, _ := a.Mask.Size()
			p := netip.PrefixFrom(ip.Unmap(), ones)
			if !p.Addr().IsLinkLocalUnicast() {
				out = append(out, p)
			}
		}
		return nil
	})
	return out
}

// defaultRoutes returns the gateways of the default routes inside n.
func defaultRoutes(t testing.TB, n ns.NetNS) []netip.Addr {
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

// gatewayOf is the first host address of cidr.
func gatewayOf(cidr netip.Prefix) netip.Addr { return cidr.Addr().Next() }

// assertNoResidue is the leak audit: nothing of the attachment remains on the node.
func assertNoResidue(t testing.TB, node *nettest.Node, network string, att core.Attachment, ips []netip.Addr) {
	t.Helper()
	names := core.NamesFor(network, att)
	for _, l := range []string{names.HostVeth, names.IFB} {
		if linkExists(t, node.NS, l) {
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
	record := filepath.Join(netDir, core.RecordDirName, att.ContainerID+"_"+att.IfName+".json")
	if _, err := os.Stat(record); err == nil {
		t.Errorf("leak: attachment record %s remains", record)
	}
	owner := att.ContainerID + "/" + att.IfName
	if ruleset, err := nettest.Output(node.NS, "nft", "list", "ruleset"); err == nil && strings.Contains(ruleset, `"`+owner+`"`) {
		t.Errorf("leak: nftables still holds elements of %s:\n%s", owner, ruleset)
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

// attachmentOf returns the kubenet attachment of a pod.
func attachmentOf(p *nettest.Pod) core.Attachment {
	return core.Attachment{ContainerID: p.RT.ContainerID, IfName: p.RT.IfName, NetNS: p.RT.NetNS}
}

// expectReachable sends one TCP request from src to dst and checks the source the server saw.
func expectReachable(t testing.TB, src ns.NetNS, srv *nettest.EchoServer, wantFrom netip.Addr) {
	t.Helper()
	r, err := nettest.TCPRequest(src, srv.Addr, "ping", trafficTimeout)
	if err := nettest.ExpectFrom(r, err, wantFrom); err != nil {
		t.Errorf("TCP to %s: %v", srv.Addr, err)
	}
}

func kubenetNames(p *nettest.Pod) core.Names { return core.NamesFor("kubenet", attachmentOf(p)) }

func slicesEqual(a, b []netip.Prefix) bool {
	return fmt.Sprint(sortedPrefixes(a)) == fmt.Sprint(sortedPrefixes(b))
}

func netipMust(s string) netip.Addr { return netip.MustParseAddr(s) }
