package bench

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/google/nftables"
	"golang.org/x/sys/unix"

	"github.com/kubenet-dev/kubenet/core"
	"github.com/kubenet-dev/kubenet/hostport"
	"github.com/kubenet-dev/kubenet/internal/nft"
	"github.com/kubenet-dev/kubenet/isolation"
	"github.com/kubenet-dev/kubenet/test/nettest"
	"github.com/kubenet-dev/kubenet/test/testkit"
)

var (
	pcRounds   = flag.Int("bench.packetcost-rounds", 10, "rounds of BenchmarkPacketCost: each measures every variant once, in rotating order")
	pcWindow   = flag.Duration("bench.packetcost-window", 3*time.Second, "length of one request/response window of BenchmarkPacketCost")
	pcVariants = flag.String("bench.packetcost-variants", "", "comma-separated variants of BenchmarkPacketCost to run (see its doc); empty: all")
)

// BenchmarkPacketCost measures what kubenet's rules cost a pod-to-pod packet in kernel CPU: two
// kubenet pods on one node (bridge netfilter on, as kubeadm requires), TCP request/response from
// A to B over one connection, and the benchmark process's system CPU per transaction (getrusage
// around each window). Both pods' sockets are this process's, and the veth's receive path runs
// in softirq on the sending CPU, charged to the sender: the kernel's whole per-packet work shows
// here. Transactions per second move by a factor of two with the machine's load; the CPU per
// transaction is steadier. The rules change between windows, the variants' order rotating
// round by round; the table gives the median of each and its range:
//
//   - "kubenet": the rules as kubenet installs them;
//   - "+ prerouting filter chain": with an empty filter chain on the IP prerouting hook added to
//     kubenet's inet table, as the localnet guard was before it moved off the IP prerouting hook;
//   - "- inet table": kubenet's inet table deleted (SNAT, host ports, localnet guard), and
//     with it conntrack and NAT's hooks, which nothing else then needs;
//   - "- inet table + empty NAT chain": the same with an empty NAT chain in a table of its own,
//     which keeps conntrack and NAT's hooks as any node with NAT rules has them (the
//     reference chain's are NAT chains): what the inet table costs beyond them;
//   - "- localnet guard": the localnet guard's two chains deleted (hostport.ChainLocalnetNAT,
//     hostport.ChainLocalnetInput), the rest of the inet table kept;
//   - "- bridge table": kubenet's bridge table deleted (isolation);
//   - "no tables": every table deleted: the bridge, conntrack and the veths alone.
//
// The tables are put back by kubenet's heal (core.HealNode) before the next window. Run it alone:
//
//	go test -run '^$' -bench '^BenchmarkPacketCost$' -benchtime 1x -timeout 30m ./bench/
func BenchmarkPacketCost(b *testing.B) {
	nettest.RequireRoot(b)
	binDir, err := pluginDir(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	node := benchNode{nettest.NewNode(b, binDir)}
	c := newChain(kubenetChain, kubenetConfList(b, node.Node, "nftables"), binDir, binDir, node.Dir)
	r := newRunner(b, node, []*chain{c}, options{podsPerRound: 2})
	if err := node.reset(c); err != nil {
		b.Fatal(err)
	}
	a, srv := r.attach(c, 0, podSpec{}), r.attach(c, 1, podSpec{})
	if _, err := node.addForIP(c, a); err != nil {
		b.Fatal(err)
	}
	dst, err := node.addForIP(c, srv)
	if err != nil {
		b.Fatal(err)
	}
	inet, bridge := nft.InetTable("kubenet"), nft.BridgeTable("kubenet")
	// The elements' "expires" counts down: not part of what is compared.
	expires := regexp.MustCompile(` expires \S+`)
	// Each table's chains and sets in name order: a chain the heal made again is listed after
	// the others, and only what they hold is compared.
	listRuleset := func() string {
		var out string
		for _, t := range []*nftables.Table{bridge, inet} {
			listed := expires.ReplaceAllString(nettest.Run(b, node.NS, "nft", "list", "table", nft.FamilyName(t.Family), t.Name), "")
			out += strings.Join(sortedBlocks(listed), "\n") + "\n"
		}
		return out
	}
	ruleset := listRuleset()
	b.Logf("kubenet's ruleset:\n%s", ruleset)
	cfg := testkit.PluginConfig(b, c.list)
	// The rules come back as kubenet's heal puts them back after a flush (the pods' elements
	// included): the bridge table's anti-spoofing rules do not load from nft's listing.
	restore := func() {
		nettest.Do(b, node.NS, func() error {
			_, err := core.HealNode(context.Background(), cfg, true)
			return err
		})
		if got := listRuleset(); got != ruleset {
			b.Fatalf("the heal did not put the ruleset back as it was:\n%s\nwant\n%s", got, ruleset)
		}
	}
	script := func(text string) string {
		p := filepath.Join(b.TempDir(), "variant.nft")
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			b.Fatal(err)
		}
		return p
	}
	prerouting := script(fmt.Sprintf("add chain inet %s packetcost-prerouting { type filter hook prerouting priority mangle; }\n", inet.Name))
	emptyBridgeChain := script(fmt.Sprintf("add chain bridge %s packetcost-bridge { type filter hook prerouting priority -199; }\n", bridge.Name))
	natOnly := script("add table ip packetcost\nadd chain ip packetcost postrouting { type nat hook postrouting priority srcnat; }\n")
	nftDo := func(args ...string) func() { return func() { nettest.Run(b, node.NS, "nft", args...) } }
	variants := []struct {
		name        string
		set, revert func()
	}{
		{"kubenet", func() {}, func() {}},
		{"+ prerouting filter chain", nftDo("-f", prerouting), nftDo("delete", "chain", "inet", inet.Name, "packetcost-prerouting")},
		{"- inet table", nftDo("delete", "table", "inet", inet.Name), restore},
		{"- inet table + empty NAT chain", func() { nftDo("delete", "table", "inet", inet.Name)(); nftDo("-f", natOnly)() },
			func() { nftDo("delete", "table", "ip", "packetcost")(); restore() }},
		{"- localnet guard", func() {
			for _, ch := range []string{hostport.ChainLocalnetNAT, hostport.ChainLocalnetInput} {
				nftDo("delete", "chain", "inet", inet.Name, ch)()
			}
		}, restore},
		{"- bridge table", nftDo("delete", "table", "bridge", bridge.Name), restore},
		{"- anti-spoof base chain", nftDo("delete", "chain", "bridge", bridge.Name, isolation.ChainAntiSpoof), restore},
		{"- pod-guard base chain", nftDo("delete", "chain", "bridge", bridge.Name, isolation.ChainGuard), restore},
		{"+ empty bridge base chain", nftDo("-f", emptyBridgeChain), nftDo("delete", "chain", "bridge", bridge.Name, "packetcost-bridge")},
		{"no tables", nftDo("flush", "ruleset"), restore},
	}
	var names []string
	for _, v := range variants {
		if selected(*pcVariants, v.name) {
			names = append(names, v.name)
		}
	}
	sysPerTx := map[string][]float64{}
	rate := map[string][]float64{}
	b.ResetTimer()
	for round := range *pcRounds {
		for k := range variants {
			v := variants[(k+round)%len(variants)]
			if !selected(*pcVariants, v.name) {
				continue
			}
			v.set()
			us, tps, err := sysMicrosPerTransaction(a.ns, srv.ns, dst, *pcWindow)
			v.revert()
			if err != nil {
				b.Fatalf("%s: %v", v.name, err)
			}
			sysPerTx[v.name] = append(sysPerTx[v.name], us)
			rate[v.name] = append(rate[v.name], tps)
		}
	}
	b.StopTimer()
	var out strings.Builder
	fmt.Fprintf(&out, "%d rounds of %s, load average %s\n\n| variant | sys µs / transaction, median (range) | transactions/s, median |\n|---|--:|--:|\n", *pcRounds, *pcWindow, loadAverage())
	for _, n := range names {
		xs := sysPerTx[n]
		fmt.Fprintf(&out, "| %s | %.1f (%.1f–%.1f) | %.0f |\n", n, nettest.Median(xs), minOf(xs), maxOf(xs), nettest.Median(rate[n]))
	}
	fmt.Print(out.String())
	for _, n := range names {
		b.ReportMetric(nettest.Median(sysPerTx[n]), strings.NewReplacer("+ ", "with-", "- ", "without-", ", ", "-", " ", "-").Replace(n)+"-sys-µs/tx")
	}
}

// sysMicrosPerTransaction runs one request/response window from one netns to dst in another and
// returns this process's system CPU per transaction (µs) and the transactions per second.
func sysMicrosPerTransaction(from, to ns.NetNS, dst netip.Addr, window time.Duration) (float64, float64, error) {
	var before, after unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &before); err != nil {
		return 0, 0, err
	}
	tps, err := nettest.RequestResponse(from, to, dst, window)
	if err != nil {
		return 0, 0, err
	}
	if err := unix.Getrusage(unix.RUSAGE_SELF, &after); err != nil {
		return 0, 0, err
	}
	sys := time.Duration(after.Stime.Nano() - before.Stime.Nano())
	// tps counts the window's transactions; the setup around it (listen, dial, close) is
	// charged to them too: a few hundred µs against seconds.
	n := tps * window.Seconds()
	return float64(sys.Microseconds()) / n, tps, nil
}

func minOf(xs []float64) float64 {
	m := xs[0]
	for _, x := range xs {
		m = min(m, x)
	}
	return m
}

func maxOf(xs []float64) float64 {
	m := xs[0]
	for _, x := range xs {
		m = max(m, x)
	}
	return m
}

// sortedBlocks splits nft's listing of one table into its objects (each "\tchain ..." or "\tset
// ..." line up to its closing "\t}") and returns them sorted, the table's own lines first.
func sortedBlocks(listing string) []string {
	var head, blocks []string
	var cur []string
	for _, line := range strings.Split(listing, "\n") {
		switch {
		case cur != nil:
			cur = append(cur, line)
			if line == "\t}" {
				blocks, cur = append(blocks, strings.Join(cur, "\n")), nil
			}
		case strings.HasPrefix(line, "\t") && strings.HasSuffix(line, "{"):
			cur = []string{line}
		case strings.TrimSpace(line) != "":
			head = append(head, line)
		}
	}
	slices.Sort(blocks)
	return append(head, blocks...)
}
