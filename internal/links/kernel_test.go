package links

import (
	"fmt"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/kubenet-dev/kubenet/test/nettest"
)

func TestDeleteTogether(t *testing.T) {
	nettest.RequireRoot(t)
	cases := []struct {
		name    string
		delete  []string // links passed to DeleteTogether; "" passes nil
		goneBy  []string // deleted before the call (passed as stale handles)
		want    []string // links left afterwards, besides lo, "bystander" and "grouped"
		wantErr bool
	}{
		{name: "veth and ifb", delete: []string{"va", "ifb0"}, want: []string{"vb", "vb-peer", "ifb1"}},
		{name: "veth alone", delete: []string{"va"}, want: []string{"vb", "vb-peer", "ifb0", "ifb1"}},
		{name: "ifb and veth", delete: []string{"ifb0", "va"}, want: []string{"vb", "vb-peer", "ifb1"}},
		{name: "nil entries", delete: []string{"", "va", ""}, want: []string{"vb", "vb-peer", "ifb0", "ifb1"}},
		{name: "nothing", delete: []string{"", ""}, want: []string{"va", "va-peer", "vb", "vb-peer", "ifb0", "ifb1"}},
		{name: "one already gone", delete: []string{"va", "ifb0"}, goneBy: []string{"ifb0"}, want: []string{"vb", "vb-peer", "ifb1"}},
		{name: "all already gone", delete: []string{"va", "ifb0"}, goneBy: []string{"va", "ifb0"}, want: []string{"vb", "vb-peer", "ifb1"}},
		{name: "three", delete: []string{"va", "ifb0", "ifb1"}, want: []string{"vb", "vb-peer"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			node := nettest.NewNS(t)
			nettest.Do(t, node, func() error {
				for _, l := range []netlink.Link{
					&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "va"}, PeerName: "va-peer"},
					&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "vb"}, PeerName: "vb-peer"},
					&netlink.Ifb{LinkAttrs: netlink.LinkAttrs{Name: "ifb0"}},
					&netlink.Ifb{LinkAttrs: netlink.LinkAttrs{Name: "ifb1"}},
					// Links DeleteTogether must never touch: one in the default group, one in
					// another group.
					&netlink.Ifb{LinkAttrs: netlink.LinkAttrs{Name: "bystander"}},
					&netlink.Ifb{LinkAttrs: netlink.LinkAttrs{Name: "grouped", Group: 7}},
				} {
					if err := netlink.LinkAdd(l); err != nil {
						return fmt.Errorf("add %s: %w", l.Attrs().Name, err)
					}
				}
				var args []netlink.Link
				for _, name := range tc.delete {
					if name == "" {
						args = append(args, nil)
						continue
					}
					l, err := netlink.LinkByName(name)
					if err != nil {
						return err
					}
					args = append(args, l)
				}
				for _, name := range tc.goneBy {
					l, _ := netlink.LinkByName(name)
					if err := netlink.LinkDel(l); err != nil {
						return err
					}
				}
				err := DeleteTogether(args...)
				if (err != nil) != tc.wantErr {
					return fmt.Errorf("DeleteTogether: %v, want error %v", err, tc.wantErr)
				}
				left, err := names()
				if err != nil {
					return err
				}
				want := append([]string{"bystander", "grouped", "lo"}, tc.want...)
				slices.Sort(want)
				if !slices.Equal(left, want) {
					return fmt.Errorf("links left %v, want %v", left, want)
				}
				return nil
			})
		})
	}
}

// A deletion that stopped after grouping the links (a crash) is finished by the next call.
func TestDeleteTogetherFinishesAStaleGroup(t *testing.T) {
	nettest.RequireRoot(t)
	node := nettest.NewNS(t)
	nettest.Do(t, node, func() error {
		for _, l := range []netlink.Link{
			&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "va"}, PeerName: "va-peer"},
			&netlink.Ifb{LinkAttrs: netlink.LinkAttrs{Name: "ifb0"}},
		} {
			if err := netlink.LinkAdd(l); err != nil {
				return fmt.Errorf("add %s: %w", l.Attrs().Name, err)
			}
		}
		va, _ := netlink.LinkByName("va")
		ifb, _ := netlink.LinkByName("ifb0")
		group := groupTag | va.Attrs().Index
		if err := netlink.LinkSetGroup(va, group); err != nil {
			return err
		}
		if err := netlink.LinkSetGroup(ifb, group); err != nil {
			return err
		}
		if err := DeleteTogether(va, ifb); err != nil {
			return err
		}
		left, err := names()
		if err != nil {
			return err
		}
		if !slices.Equal(left, []string{"lo"}) {
			return fmt.Errorf("links left %v, want only lo", left)
		}
		return nil
	})
}

func TestFind(t *testing.T) {
	nettest.RequireRoot(t)
	node := nettest.NewNS(t)
	nettest.Do(t, node, func() error {
		if l, err := Find("absent0"); l != nil || err != nil {
			return fmt.Errorf("Find(absent0) = %v, %v; want nil, nil", l, err)
		}
		l, err := Find("lo")
		if err != nil || l == nil || l.Attrs().Name != "lo" {
			return fmt.Errorf("Find(lo) = %v, %v; want lo", l, err)
		}
		return nil
	})
}

func names() ([]string, error) {
	all, err := netlink.LinkList()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, l := range all {
		out = append(out, l.Attrs().Name)
	}
	slices.Sort(out)
	return out, nil
}
