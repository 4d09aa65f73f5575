package isolation

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/kubenet-dev/kubenet/internal/ipt"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

// TestEbtablesReadsBack writes the node's chains and two pods' chains into a fresh namespace and
// reads them back: everything is in ebtables-save's canonical form (a second Ensure writes
// nothing and CHECK passes), Remove takes one pod's chain and dispatch rule and nothing else, and
// GC removes the ports keep rejects and pod chains nothing leads to.
func TestEbtablesReadsBack(t *testing.T) {
	for _, antiSpoofing := range []bool{true, false} {
		t.Run(map[bool]string{true: "anti-spoofing", false: "guard only"}[antiSpoofing], func(t *testing.T) {
			node := nettest.NewNS(t)
			cfg := Config{Network: "kubenet-test", AntiSpoofing: antiSpoofing}
			a := Port{Name: "veth0123456789a", Owner: "a/eth0", MAC: net.HardwareAddr{0x0a, 0x58, 0x0a, 0xf4, 0x01, 0x02},
				Addrs: []netip.Addr{netip.MustParseAddr("10.244.1.2"), netip.MustParseAddr("fd00:10:244:1::2")}}
			b := Port{Name: "veth0123456789b", Owner: "b/eth0", MAC: net.HardwareAddr{0x0a, 0x58, 0x0a, 0xf4, 0x01, 0x03},
				Addrs: []netip.Addr{netip.MustParseAddr("10.244.1.3")}}
			ctx := context.Background()
			ensure := func(ports ...Port) (rebuilt bool) {
				nettest.Do(t, node, func() (err error) {
					rebuilt, err = EnsureEbtables(ctx, &ipt.State{}, cfg, ports...)
					return err
				})
				return rebuilt
			}
			if !ensure(a, b) {
				t.Error("first Ensure did not report a rebuild")
			}
			before := nettest.Run(t, node, "ebtables-save", "-t", "nat")
			if ensure(a, b) {
				t.Error("second Ensure reported a rebuild")
			}
			if after := nettest.Run(t, node, "ebtables-save", "-t", "nat"); stripComments(after) != stripComments(before) {
				t.Errorf("a second Ensure changed the table:\nbefore\n%s\nafter\n%s", before, after)
			}
			nettest.Do(t, node, func() error {
				for _, p := range []Port{a, b} {
					if err := CheckEbtables(ctx, &ipt.State{}, cfg, p); err != nil {
						t.Errorf("CHECK of %s: %v\n%s", p.Name, err, before)
					}
				}
				return RemoveEbtables(ctx, &ipt.State{}, cfg.Network, a)
			})
			out := nettest.Run(t, node, "ebtables-save", "-t", "nat")
			if strings.Contains(out, a.Name) || strings.Contains(out, ebtablesPod(cfg.Network, a.Name)) || !strings.Contains(out, b.Name) {
				t.Errorf("after removing %s:\n%s", a.Name, out)
			}
			// An orphan pod chain (a crash between its creation and its dispatch rule).
			nettest.Run(t, node, "ebtables", "-t", "nat", "-N", ebtablesPod(cfg.Network, "vethorphan"))
			nettest.Do(t, node, func() error {
				stale, err := GCEbtables(ctx, &ipt.State{}, cfg.Network, func(port, _ string) bool { return port != b.Name })
				if len(stale) != 1 || stale[0] != b.Name {
					t.Errorf("GC removed %v, want [%s]", stale, b.Name)
				}
				return err
			})
			out = nettest.Run(t, node, "ebtables-save", "-t", "nat")
			if strings.Contains(out, "KNP-") || strings.Contains(out, b.Name) || !strings.Contains(out, ebtablesGuard(cfg.Network)) {
				t.Errorf("after GC:\n%s", out)
			}
		})
	}
}

// stripComments drops the tool's "# Generated ... on <time>" lines.
func stripComments(s string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// ebtablesTestPort is the i-th IPv4 pod port of the guard's tests.
func ebtablesTestPort(i byte) Port {
	return Port{Name: fmt.Sprintf("veth%011d", i), Owner: fmt.Sprintf("p%d/eth0", i), MAC: net.HardwareAddr{0x0a, 0x58, 0x0a, 0xf4, 0x01, i},
		Addrs: []netip.Addr{netip.AddrFrom4([4]byte{10, 244, 1, i})}}
}

// TestEbtablesGuardWrittenOnlyWhenChanged: a pod's Ensure leaves an intact guard alone (its rules
// keep their kernel handles: rewriting it costs the transaction a wait for the kernel to release
// the old rules), and puts a guard back that lost a rule, or had one changed in place, or was
// emptied.
func TestEbtablesGuardWrittenOnlyWhenChanged(t *testing.T) {
	node := nettest.NewNS(t)
	cfg := Config{Network: "kubenet-test", AntiSpoofing: true}
	ctx := context.Background()
	guard := ebtablesGuard(cfg.Network)
	port := ebtablesTestPort
	ensure := func(p Port) {
		t.Helper()
		nettest.Do(t, node, func() error {
			_, err := EnsureEbtables(ctx, &ipt.State{}, cfg, p)
			return err
		})
	}
	// The guard as nftables holds it (ebtables-nft keeps it there), rule handles included.
	kernelGuard := func() string { return nettest.Run(t, node, "nft", "-a", "list", "chain", "bridge", "nat", guard) }
	// The guard as ebtables-save shows it: its policy (which ebtables -L does not show) and rules.
	planned := func() []string {
		saved := ipt.Parse(ipt.Bridge, "nat", []byte(nettest.Run(t, node, "ebtables-save", "-t", "nat")))
		return append([]string{"policy " + saved.Policies[guard]}, saved.Chains[guard]...)
	}
	ensure(port(1))
	want := planned()
	if len(want) != 1+len(EbtablesNodePlan(cfg).Chains[0].Rules) || want[0] != "policy RETURN" {
		t.Fatalf("guard after the first Ensure: %q", want)
	}
	before := kernelGuard()
	ensure(port(2))
	if after := kernelGuard(); after != before {
		t.Errorf("a pod's Ensure rewrote the intact guard:\nbefore\n%s\nafter\n%s", before, after)
	}
	for i, damage := range [][]string{
		{"-D", guard, "-p", "802_1Q", "-j", "DROP"},        // a rule lost
		{"-I", guard, "1", "-p", "802_1Q", "-j", "ACCEPT"}, // a rule more
		{"-F", guard},           // emptied
		{"-P", guard, "ACCEPT"}, // its policy changed
	} {
		nettest.Run(t, node, "ebtables", append([]string{"-t", "nat"}, damage...)...)
		ensure(port(byte(3 + i)))
		if got := planned(); !slices.Equal(got, want) {
			t.Errorf("after ebtables %q and a pod's Ensure the guard is\n%q\nwant\n%q", damage, got, want)
		}
	}
}

// TestEbtablesGuardEditsTheListingHides: a pod's Ensure puts back a guard that another tool
// changed in a way ebtables -L does not show, and CHECK reports it. ebtables-nft keeps a user
// chain's policy as a last rule of the chain, which -L leaves out (it prints "policy: RETURN"
// whatever the policy is): a guard made to ACCEPT hands every pod's frames to the bridge
// before the pod's own chain checks its MAC and addresses. And -L prints "-p 802_1Q" for rules
// that do not match 802.1Q frames: an ether type compared with <, under a zero mask, or compared
// twice. The kernel's guard, as nft lists it, is compared with the guard as first written; the
// node's healing (many ports, the table read with ebtables-save, which does show the policy) puts
// them back too.
func TestEbtablesGuardEditsTheListingHides(t *testing.T) {
	node := nettest.NewNS(t)
	cfg := Config{Network: "kubenet-test", AntiSpoofing: true}
	ctx := context.Background()
	guard := ebtablesGuard(cfg.Network)
	port := ebtablesTestPort
	// The guard as nftables holds it, without rule handles (a rewrite changes them).
	kernelGuard := func(t *testing.T) string {
		out := nettest.Run(t, node, "nft", "list", "chain", "bridge", "nat", guard)
		return regexp.MustCompile(`counter packets \d+ bytes \d+`).ReplaceAllString(out, "counter")
	}
	nettest.Do(t, node, func() error {
		_, err := EnsureEbtables(ctx, &ipt.State{}, cfg, port(1))
		return err
	})
	want := kernelGuard(t)
	// The handle of the guard's first rule, the one that drops 802.1Q frames.
	firstHandle := func(t *testing.T) string {
		m := regexp.MustCompile(`(?m)^\s*ether type 8021q counter .* # handle (\d+)$`).FindStringSubmatch(nettest.Run(t, node, "nft", "-a", "list", "chain", "bridge", "nat", guard))
		if m == nil {
			t.Fatalf("no 802.1Q rule in the guard:\n%s", kernelGuard(t))
		}
		return m[1]
	}
	for i, edit := range []struct {
		name string
		cmd  func(*testing.T) []string
	}{
		{"policy ACCEPT", func(t *testing.T) []string { return []string{"ebtables", "-t", "nat", "-P", guard, "ACCEPT"} }},
		{"ether type <", func(t *testing.T) []string {
			return []string{"nft", "replace", "rule", "bridge", "nat", guard, "handle", firstHandle(t), "ether", "type", "<", "8021q", "counter", "drop"}
		}},
		{"zero mask", func(t *testing.T) []string {
			return []string{"nft", "replace", "rule", "bridge", "nat", guard, "handle", firstHandle(t), "ether", "type", "and", "0x0", "==", "0x8100", "counter", "drop"}
		}},
		{"compared twice", func(t *testing.T) []string {
			return []string{"nft", "replace", "rule", "bridge", "nat", guard, "handle", firstHandle(t), "ether", "type", "ip", "ether", "type", "8021q", "counter", "drop"}
		}},
	} {
		for _, path := range []struct {
			name  string
			ports []Port
		}{
			{"ADD", []Port{port(byte(2 + i))}},
			// More than portsByName: the healing's path, which reads the table with ebtables-save.
			{"healing", []Port{port(1), port(byte(2 + i)), port(byte(10 + i))}},
		} {
			t.Run(edit.name+"/"+path.name, func(t *testing.T) {
				// Each edit starts from the guard as planned (a failed case leaves its edit).
				nettest.Do(t, node, func() error {
					return (&ipt.State{}).Restore(ctx, ipt.Bridge, ebtablesTable, writeChain(nil, EbtablesNodePlan(cfg).Chains[0]))
				})
				cmd := edit.cmd(t)
				nettest.Run(t, node, cmd[0], cmd[1:]...)
				if kernelGuard(t) == want {
					t.Fatalf("%q changed nothing", cmd)
				}
				nettest.Do(t, node, func() error {
					if err := CheckNodeEbtables(ctx, &ipt.State{}, cfg); err == nil {
						t.Errorf("CHECK after %q: nil, want the guard's difference", cmd)
					}
					_, err := EnsureEbtables(ctx, &ipt.State{}, cfg, path.ports...)
					return err
				})
				if got := kernelGuard(t); got != want {
					t.Errorf("after %q and an Ensure of %d ports the guard is\n%s\nwant\n%s", cmd, len(path.ports), got, want)
				}
				nettest.Do(t, node, func() error {
					if err := CheckNodeEbtables(ctx, &ipt.State{}, cfg); err != nil {
						t.Errorf("CHECK after the Ensure: %v", err)
					}
					return nil
				})
			})
		}
	}
}

// TestEbtablesGuardDeletedRebuilds: the guard chain can only be deleted once no rule jumps to it,
// that is once every pod's chain lost its first rule (flushed, by hand or by another tool):
// those pods then pass everything. A pod's Ensure that finds the guard gone puts it back and
// reports a rebuild, so that its caller puts back every running pod's chain too.
func TestEbtablesGuardDeletedRebuilds(t *testing.T) {
	node := nettest.NewNS(t)
	cfg := Config{Network: "kubenet-test", AntiSpoofing: true}
	ctx := context.Background()
	port := ebtablesTestPort
	ensure := func(p Port) (rebuilt bool) {
		nettest.Do(t, node, func() (err error) {
			rebuilt, err = EnsureEbtables(ctx, &ipt.State{}, cfg, p)
			return err
		})
		return rebuilt
	}
	ensure(port(1))
	pod := ebtablesPod(cfg.Network, port(1).Name)
	guard := ebtablesGuard(cfg.Network)
	if out, err := nettest.Output(node, "nft", "delete", "chain", "bridge", "nat", guard); err == nil {
		t.Fatalf("nft deleted the guard while a pod's chain jumps to it:\n%s", out)
	}
	nettest.Run(t, node, "ebtables", "-t", "nat", "-F", pod)
	nettest.Run(t, node, "nft", "delete", "chain", "bridge", "nat", guard)
	if !ensure(port(2)) {
		t.Errorf("a pod's Ensure after the guard was deleted did not report a rebuild; the first pod's chain is left\n%s",
			nettest.Run(t, node, "ebtables", "-t", "nat", "-L", pod))
	}
}
