package shaping

import (
	"errors"
	"fmt"
	"math"
	"net"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/kubenet-dev/kubenet/test/nettest"
)

const (
	testVeth = "hostv"
	testIFB  = "kifbtest"
)

// world is a node netns with a veth whose other end sits in a "pod" netns, as ADD leaves it.
func world(t *testing.T) ns.NetNS {
	t.Helper()
	node, pod := nettest.NewNS(t), nettest.NewNS(t)
	nettest.Link(t, nettest.Endpoint{NS: node, IfName: testVeth}, nettest.Endpoint{NS: pod, IfName: "eth0"})
	return node
}

// state is what the kernel holds of kubenet's shaping in a netns, read without this package's
// own readers so the tests do not check Apply with the code that Check uses.
type state struct {
	vethTbf  *netlink.Tbf
	ifbTbf   *netlink.Tbf
	ingress  bool     // an ingress qdisc (not clsact) on the veth
	redirect []string // "<protocol>-><ifb name>" of each mirred filter on the veth
	ifbs     []string // ifb devices in the netns
	ifbUp    bool
	ifbMTU   int
	vethMTU  int
}

func readState(t *testing.T, n ns.NetNS) state {
	t.Helper()
	var s state
	nettest.Do(t, n, func() error {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		for _, l := range links {
			if _, ok := l.(*netlink.Ifb); ok {
				s.ifbs = append(s.ifbs, l.Attrs().Name)
			}
			qs, err := netlink.QdiscList(l)
			if err != nil {
				return err
			}
			for _, q := range qs {
				tbf, isTbf := q.(*netlink.Tbf)
				switch {
				case l.Attrs().Name == testVeth && isTbf:
					s.vethTbf = tbf
				case l.Attrs().Name == testIFB && isTbf:
					s.ifbTbf = tbf
				case l.Attrs().Name == testVeth && q.Type() == "ingress":
					s.ingress = true
				}
			}
			switch l.Attrs().Name {
			case testVeth:
				s.vethMTU = l.Attrs().MTU
				fs, err := netlink.FilterList(l, netlink.HANDLE_MIN_INGRESS)
				if err != nil && !errors.Is(err, unix.EINVAL) {
					return err
				}
				for _, f := range fs {
					for _, a := range f.(*netlink.U32).Actions {
						if m, ok := a.(*netlink.MirredAction); ok {
							to, err := netlink.LinkByIndex(m.Ifindex)
							if err != nil {
								return err
							}
							s.redirect = append(s.redirect, fmt.Sprintf("%#04x->%s", f.Attrs().Protocol, to.Attrs().Name))
						}
					}
				}
			case testIFB:
				s.ifbUp = l.Attrs().Flags&net.FlagUp != 0
				s.ifbMTU = l.Attrs().MTU
			}
		}
		return nil
	})
	return s
}

func do(t *testing.T, n ns.NetNS, f func() error) error {
	t.Helper()
	var err error
	nettest.Do(t, n, func() error { err = f(); return nil })
	return err
}

func TestApplyCheckRemove(t *testing.T) {
	cases := []struct {
		name   string
		limits Limits
	}{
		{"ingress only", Limits{Ingress: Limit{Rate: 10e6}}},
		{"egress only", Limits{Egress: Limit{Rate: 50e6}}},
		{"both, explicit burst", Limits{Ingress: Limit{Rate: 1e9, Burst: 2e6}, Egress: Limit{Rate: 1000}}},
		{"above 32-bit byte rates", Limits{Ingress: Limit{Rate: MaxRate}, Egress: Limit{Rate: 40e9}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			n := world(t)
			if err := do(t, n, func() error { return applyTo(testVeth, testIFB, c.limits) }); err != nil {
				t.Fatalf("Apply: %v", err)
			}
			s := readState(t, n)
			assertTbf(t, "veth", s.vethTbf, c.limits.Ingress, s.vethMTU)
			assertTbf(t, "ifb", s.ifbTbf, c.limits.Egress, s.vethMTU)
			if c.limits.Egress.Rate > 0 {
				if want := []string{"0x0003->" + testIFB}; fmt.Sprint(s.redirect) != fmt.Sprint(want) {
					t.Errorf("redirects = %v, want %v (ETH_P_ALL: IPv6 too)", s.redirect, want)
				}
				if !s.ifbUp || s.ifbMTU != s.vethMTU {
					t.Errorf("ifb up=%v mtu=%d, want up with the veth's mtu %d", s.ifbUp, s.ifbMTU, s.vethMTU)
				}
			} else if len(s.ifbs) > 0 || len(s.redirect) > 0 {
				t.Errorf("egress unlimited but ifbs %v, redirects %v", s.ifbs, s.redirect)
			}

			if err := do(t, n, func() error { return checkOn(testVeth, testIFB, c.limits) }); err != nil {
				t.Errorf("Check after Apply: %v", err)
			}
			other := c.limits
			other.Ingress.Rate, other.Egress.Rate = other.Egress.Rate, other.Ingress.Rate
			if err := do(t, n, func() error { return checkOn(testVeth, testIFB, other) }); err == nil {
				t.Errorf("Check with swapped limits %+v passed", other)
			}

			for i := range 2 { // Remove is repeatable
				if err := do(t, n, func() error { return Remove(testVeth, testIFB) }); err != nil {
					t.Fatalf("Remove #%d: %v", i+1, err)
				}
			}
			if s := readState(t, n); s.vethTbf != nil || len(s.redirect) > 0 || len(s.ifbs) > 0 {
				t.Errorf("after Remove: veth tbf %v, redirects %v, ifbs %v", s.vethTbf, s.redirect, s.ifbs)
			}
			if err := do(t, n, func() error { return checkOn(testVeth, testIFB, Limits{}) }); err != nil {
				t.Errorf("Check(no limits) after Remove: %v", err)
			}
		})
	}
}

// assertTbf checks the kernel's tbf against l: rate in bytes, and the bucket converted back to
// bits from the kernel's ticks (within a tick's rounding).
func assertTbf(t *testing.T, where string, got *netlink.Tbf, l Limit, mtu int) {
	t.Helper()
	if l.Rate == 0 {
		if got != nil {
			t.Errorf("%s: unexpected tbf %+v", where, got)
		}
		return
	}
	if got == nil {
		t.Fatalf("%s: no tbf", where)
	}
	if got.Rate != l.Rate/8 {
		t.Errorf("%s: tbf rate %d B/s, want %d", where, got.Rate, l.Rate/8)
	}
	bucket := float64(got.Buffer) / netlink.TickInUsec() / 1e6 * float64(got.Rate) * 8
	if want := float64(l.effectiveBurst(mtu)); bucket < want*0.999 || bucket > want*1.001+64 {
		t.Errorf("%s: bucket %.0f bits, want %.0f", where, bucket, want)
	}
	if uint64(got.Limit) < min(l.effectiveBurst(mtu)/8, math.MaxUint32) {
		t.Errorf("%s: queue limit %d B is smaller than the burst", where, got.Limit)
	}
}

func TestCheckFindsTampering(t *testing.T) {
	limits := Limits{Ingress: Limit{Rate: 10e6}, Egress: Limit{Rate: 20e6}}
	cases := []struct {
		name   string
		tamper func(veth, ifb netlink.Link) error
		want   string
	}{
		{"ifb deleted", func(_, ifb netlink.Link) error { return netlink.LinkDel(ifb) }, "ifb \"kifbtest\" is missing"},
		{"ifb down", func(_, ifb netlink.Link) error { return netlink.LinkSetDown(ifb) }, "is down"},
		{"veth tbf deleted", func(veth, _ netlink.Link) error {
			return netlink.QdiscDel(tbf(veth.Attrs().Index, limits.Ingress, 1500))
		}, "no tbf"},
		{"ifb tbf changed", func(_, ifb netlink.Link) error {
			return netlink.QdiscReplace(tbf(ifb.Attrs().Index, Limit{Rate: 30e6}, 1500))
		}, "rate 3750000 B/s"},
		{"redirect removed", func(veth, _ netlink.Link) error {
			return removeRedirects(veth)
		}, "no filter"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			n := world(t)
			if err := do(t, n, func() error { return applyTo(testVeth, testIFB, limits) }); err != nil {
				t.Fatalf("Apply: %v", err)
			}
			nettest.Do(t, n, func() error {
				veth, err := netlink.LinkByName(testVeth)
				if err != nil {
					return err
				}
				ifb, err := netlink.LinkByName(testIFB)
				if err != nil {
					return err
				}
				return c.tamper(veth, ifb)
			})
			err := do(t, n, func() error { return checkOn(testVeth, testIFB, limits) })
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("Check = %v, want an error containing %q", err, c.want)
			}
		})
	}
	t.Run("limits that were not applied", func(t *testing.T) {
		n := world(t)
		if err := do(t, n, func() error { return applyTo(testVeth, testIFB, limits) }); err != nil {
			t.Fatalf("Apply: %v", err)
		}
		err := do(t, n, func() error { return checkOn(testVeth, testIFB, Limits{}) })
		if err == nil || !strings.Contains(err.Error(), "not limited") {
			t.Errorf("Check(no limits) on a shaped veth = %v", err)
		}
	})
}

// TestApplyFailure makes Apply fail at its second half (the ifb exists, the redirect cannot be
// added) and at its first (a foreign device holds the ifb's name), and checks that nothing of
// kubenet's is left and nothing foreign was touched.
func TestApplyFailure(t *testing.T) {
	limits := Limits{Ingress: Limit{Rate: 10e6}, Egress: Limit{Rate: 10e6}}
	t.Run("after the ifb", func(t *testing.T) {
		n := world(t)
		// Another tool's ingress qdisc on the veth holds the handle clsact needs: Apply fails
		// after the veth's tbf, the ifb and the ifb's tbf exist, and leaves the qdisc alone.
		nettest.Do(t, n, func() error {
			l, err := netlink.LinkByName(testVeth)
			if err != nil {
				return err
			}
			return netlink.QdiscAdd(&netlink.Ingress{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: l.Attrs().Index, Handle: ingressHandle, Parent: netlink.HANDLE_INGRESS}})
		})
		err := do(t, n, func() error { return applyTo(testVeth, testIFB, limits) })
		if err == nil || !strings.Contains(err.Error(), "another qdisc") {
			t.Fatalf("Apply = %v, want the clsact qdisc refused", err)
		}
		if s := readState(t, n); s.vethTbf != nil || s.ifbTbf != nil || len(s.ifbs) > 0 || len(s.redirect) > 0 || !s.ingress {
			t.Errorf("left behind: veth tbf %v, ifb tbf %v, ifbs %v, redirects %v; the foreign ingress qdisc kept: %v", s.vethTbf, s.ifbTbf, s.ifbs, s.redirect, s.ingress)
		}
	})
	t.Run("name taken by another device", func(t *testing.T) {
		n := world(t)
		nettest.Do(t, n, func() error {
			return netlink.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: testIFB}})
		})
		err := do(t, n, func() error { return applyTo(testVeth, testIFB, limits) })
		if !errors.Is(err, ErrNotIFB) {
			t.Fatalf("Apply = %v, want ErrNotIFB", err)
		}
		if err := do(t, n, func() error { return Remove(testVeth, testIFB) }); err != nil {
			t.Errorf("Remove: %v", err)
		}
		if s := readState(t, n); s.vethTbf != nil || s.ingress {
			t.Errorf("left behind: veth tbf %v, ingress qdisc %v", s.vethTbf, s.ingress)
		}
		nettest.Do(t, n, func() error {
			l, err := netlink.LinkByName(testIFB)
			if err != nil {
				return fmt.Errorf("the foreign device was removed: %w", err)
			}
			if l.Type() != "bridge" {
				return fmt.Errorf("%s is now a %s", testIFB, l.Type())
			}
			return nil
		})
	})
	t.Run("leftover ifb of a crashed ADD is replaced", func(t *testing.T) {
		n := world(t)
		nettest.Do(t, n, func() error {
			return netlink.LinkAdd(&netlink.Ifb{LinkAttrs: netlink.LinkAttrs{Name: testIFB}})
		})
		if err := do(t, n, func() error { return applyTo(testVeth, testIFB, limits) }); err != nil {
			t.Fatalf("Apply: %v", err)
		}
		if err := do(t, n, func() error { return checkOn(testVeth, testIFB, limits) }); err != nil {
			t.Errorf("Check: %v", err)
		}
	})
}

// applyTo and checkOn run Apply and Check on the host veth named veth.
func applyTo(veth, ifb string, l Limits) error {
	host, err := netlink.LinkByName(veth)
	if err != nil {
		return err
	}
	return Apply(host, ifb, l)
}

func checkOn(veth, ifb string, l Limits) error {
	host, err := netlink.LinkByName(veth)
	if err != nil {
		return err
	}
	return Check(host, ifb, l)
}
