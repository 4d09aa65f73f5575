package nettest

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/kubenet-dev/kubenet/internal/ipnet"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// RequireRoot fails the test (it does not skip it) when the process cannot create namespaces:
// kubenet's behaviour can only be checked against the kernel, so a silent skip would hide gaps.
// It also fails a product package's test that is not in a *kernel_test.go file (kernelfile.go).
func RequireRoot(t testing.TB) {
	t.Helper()
	requireKernelTestFile(t)
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root (network namespaces, netlink, nftables); run `make test` as root")
	}
}

// NewNS creates a persistent network namespace with loopback up and removes it at cleanup. Its
// name carries this process's pid and start time, so that a later run can sweep it if this one
// dies before its cleanup (SweepStaleNamespaces).
func NewNS(t testing.TB) ns.NetNS {
	t.Helper()
	RequireRoot(t)
	n, err := newMarkedNS()
	if err != nil {
		t.Fatalf("create netns: %v", err)
	}
	return adoptNS(t, n)
}

// adoptNS brings loopback up in the namespace n, just created, and removes it at cleanup unless
// the test deleted it already (DeleteNS).
func adoptNS(t testing.TB, n ns.NetNS) ns.NetNS {
	t.Helper()
	t.Cleanup(func() {
		_ = n.Close()
		if _, err := os.Stat(n.Path()); err != nil {
			return // the test deleted it already
		}
		if err := RemoveNS(n.Path()); err != nil {
			t.Errorf("remove netns: %v", err)
		}
	})
	Do(t, n, func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(lo)
	})
	return n
}

// NewNamedNS creates the persistent network namespace /run/netns/<name> (`ip netns add`), with
// loopback up, and removes it at cleanup. A name, unlike NewNS's random one, lets a later run
// recognise what a dead run left (see test/e2e's sweep).
func NewNamedNS(t testing.TB, name string) ns.NetNS {
	t.Helper()
	RequireRoot(t)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	path := filepath.Join("/run/netns", name)
	n, err := ns.GetNS(path)
	if err != nil {
		_ = RemoveNS(path)
		t.Fatalf("open netns %s: %v", name, err)
	}
	return adoptNS(t, n)
}

// Do runs f inside n on a locked OS thread and fails the test on error.
func Do(t testing.TB, n ns.NetNS, f func() error) {
	t.Helper()
	if err := n.Do(func(ns.NetNS) error { return f() }); err != nil {
		t.Fatalf("in netns %s: %v", n.Path(), err)
	}
}

// Endpoint is one end of a veth link created by Link.
type Endpoint struct {
	NS     ns.NetNS
	IfName string
	Addrs  []netip.Prefix // addresses with their prefix length, e.g. 198.18.0.1/24
}

// Link connects a and b with a veth pair, assigns the addresses (without duplicate address
// detection, so IPv6 is usable at once) and brings both ends up.
func Link(t testing.TB, a, b Endpoint) {
	t.Helper()
	tmpName := fmt.Sprintf("ktmp%x", os.Getpid()^int(randUint32()))
	if len(tmpName) > 15 {
		tmpName = tmpName[:15]
	}
	Do(t, a.NS, func() error {
		veth := &netlink.Veth{
			LinkAttrs:     netlink.LinkAttrs{Name: a.IfName},
			PeerName:      tmpName,
			PeerNamespace: netlink.NsFd(int(b.NS.Fd())),
		}
		if err := netlink.LinkAdd(veth); err != nil {
			return fmt.Errorf("add veth %s: %w", a.IfName, err)
		}
		return configureLink(a.IfName, a.Addrs)
	})
	Do(t, b.NS, func() error {
		l, err := netlink.LinkByName(tmpName)
		if err != nil {
			return err
		}
		if err := netlink.LinkSetName(l, b.IfName); err != nil {
			return fmt.Errorf("rename %s to %s: %w", tmpName, b.IfName, err)
		}
		return configureLink(b.IfName, b.Addrs)
	})
}

func configureLink(name string, addrs []netip.Prefix) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return err
	}
	for _, p := range addrs {
		a := &netlink.Addr{IPNet: ipnet.FromPrefix(p), Flags: nodadFlag}
		if err := netlink.AddrAdd(l, a); err != nil {
			return fmt.Errorf("add %s to %s: %w", p, name, err)
		}
	}
	return netlink.LinkSetUp(l)
}

// AddRoute adds dst via gw inside n.
func AddRoute(t testing.TB, n ns.NetNS, dst netip.Prefix, gw netip.Addr) {
	t.Helper()
	Do(t, n, func() error {
		r := &netlink.Route{Dst: ipnet.FromPrefix(dst), Gw: gw.AsSlice()}
		if err := netlink.RouteAdd(r); err != nil {
			return fmt.Errorf("route %s via %s: %w", dst, gw, err)
		}
		return nil
	})
}

// WriteSysctl writes a /proc/sys value inside n (for example forwarding on a router namespace).
func WriteSysctl(t testing.TB, n ns.NetNS, path, value string) {
	t.Helper()
	Do(t, n, func() error {
		return os.WriteFile("/proc/sys/"+path, []byte(value), 0o644)
	})
}

// DeleteNS removes n's bind mount now, as a runtime does when a sandbox is gone: the namespace
// disappears once the last link and socket in it are closed. Cleanup then skips it.
func DeleteNS(t testing.TB, n ns.NetNS) {
	t.Helper()
	path := n.Path()
	_ = n.Close()
	if err := RemoveNS(path); err != nil {
		t.Fatal(err)
	}
}

// RemoveNS detaches the namespace's bind mount and removes the mount point. A lazy unmount,
// because parallel tests create namespaces under the same shared mount and a plain unmount can
// then fail with EBUSY while the namespace is in fact unused.
func RemoveNS(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil {
		return fmt.Errorf("unmount netns %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("remove netns %s: %w", path, err)
	}
	return nil
}
