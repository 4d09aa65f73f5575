package cni

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/kubenet-dev/kubenet/core"
	"github.com/kubenet-dev/kubenet/hostport"
	"github.com/kubenet-dev/kubenet/masq"
	"github.com/kubenet-dev/kubenet/test/nettest"
	"github.com/kubenet-dev/kubenet/test/testkit"
)

// TestStatusSeesForeignFlushes: on the iptables backend (iptables-nft), whatever another tool
// does to kubenet's fixed chains, a whole table flushed or replaced by iptables, a table deleted
// or flushed or the whole ruleset flushed by nft, STATUS (which counts the chains over netlink
// where no legacy table of the name exists) must answer 50 naming a chain that is gone, the next
// ADD must put the chains back, and STATUS must then answer ready.
func TestStatusSeesForeignFlushes(t *testing.T) {
	t.Run("nftables only", func(t *testing.T) { statusSeesForeignFlushes(t, false) })
	// With legacy tables of the names in the namespace (another program ran iptables-legacy),
	// STATUS lists the chains with the tools instead: the same answers.
	t.Run("legacy tables present", func(t *testing.T) { statusSeesForeignFlushes(t, true) })
}

func statusSeesForeignFlushes(t *testing.T, legacy bool) {
	node, _, _ := hpNode(t)
	if legacy {
		for _, c := range [][]string{{"iptables-legacy", "nat"}, {"ip6tables-legacy", "nat"}, {"iptables-legacy", "mangle"}} {
			nettest.Run(t, node.NS, c[0], "-t", c[1], "-N", "OTHER-LEGACY")
		}
	}
	list := iptablesHostPortServer(t, node, "ff-srv", 30291)
	masqChain := masq.IPTablesChain("kubenet")
	nat := hostport.IPTablesChains("kubenet")["nat"]
	localnet := hostport.IPTablesChains("kubenet")["mangle"][0]
	restoreNAT := "printf '*nat\\n:PREROUTING ACCEPT [0:0]\\n:POSTROUTING ACCEPT [0:0]\\n:OUTPUT ACCEPT [0:0]\\n:INPUT ACCEPT [0:0]\\nCOMMIT\\n' | "
	cases := []struct {
		name string
		cmd  []string
		// gone are chains STATUS must name; each is looked for in the message.
		gone []string
	}{
		{"iptables -t nat -F", []string{"iptables", "-t", "nat", "-F"}, []string{masqChain, nat[2]}},
		{"ip6tables -t nat -F", []string{"ip6tables", "-t", "nat", "-F"}, []string{masqChain, nat[2]}},
		{"iptables -t nat -F; -X", []string{"sh", "-c", "iptables -t nat -F && iptables -t nat -X"}, []string{masqChain, nat[0], nat[2]}},
		{"iptables -t mangle -F", []string{"iptables", "-t", "mangle", "-F"}, []string{localnet}},
		{"iptables-nft-restore nat", []string{"sh", "-c", restoreNAT + "iptables-nft-restore"}, []string{masqChain, nat[0], nat[2]}},
		{"ip6tables-nft-restore nat", []string{"sh", "-c", restoreNAT + "ip6tables-nft-restore"}, []string{masqChain, nat[0], nat[2]}},
		{"nft flush ruleset", []string{"nft", "flush", "ruleset"}, []string{masqChain, nat[0], nat[2], localnet}},
		{"nft delete table ip nat", []string{"nft", "delete", "table", "ip", "nat"}, []string{masqChain, nat[0], nat[2]}},
		{"nft delete table ip6 nat", []string{"nft", "delete", "table", "ip6", "nat"}, []string{masqChain, nat[0], nat[2]}},
		{"nft delete table ip mangle", []string{"nft", "delete", "table", "ip", "mangle"}, []string{localnet}},
		{"nft flush table ip nat", []string{"nft", "flush", "table", "ip", "nat"}, []string{masqChain, nat[2]}},
		{"nft flush chain ip nat masq", []string{"nft", "flush", "chain", "ip", "nat", masqChain}, []string{masqChain}},
		{"nft flush chain ip6 nat hpsnat", []string{"nft", "flush", "chain", "ip6", "nat", nat[2]}, []string{nat[2]}},
		{"nft flush chain ip mangle localnet", []string{"nft", "flush", "chain", "ip", "mangle", localnet}, []string{localnet}},
	}
	if code, msg := testkit.StatusCode(t, node, list); code != 0 {
		t.Fatalf("STATUS before = %d %s", code, msg)
	}
	for i, c := range cases {
		nettest.Run(t, node.NS, c.cmd[0], c.cmd[1:]...)
		code, msg := testkit.StatusCode(t, node, list)
		if code != core.ErrPluginNotAvailable || !testkit.ContainsAll(msg, c.gone...) {
			t.Errorf("STATUS after %s = %d %q, want 50 naming %s", c.name, code, msg, strings.Join(c.gone, ", "))
		}
		node.MustAdd(t, list, node.NewPod(t, fmt.Sprintf("ff-next-%d", i)))
		if code, msg := testkit.StatusCode(t, node, list); code != 0 {
			t.Errorf("STATUS after %s and the next ADD = %d %s", c.name, code, msg)
		}
		for _, tool := range []string{"iptables", "ip6tables"} {
			if out := nettest.Run(t, node.NS, tool+"-save", "-t", "nat"); !strings.Contains(out, "-A "+masqChain+" ") {
				t.Errorf("after %s and the next ADD, %s nat lacks %s's rules:\n%s", c.name, tool, masqChain, out)
			}
		}
	}
}

// pathExec runs the plugin as libcni does, with PATH set to path: the node's tools are the
// ones found there.
type pathExec struct {
	*invoke.RawExec
	version.PluginDecoder
	path string
}

func (e *pathExec) ExecPlugin(ctx context.Context, pluginPath string, stdin []byte, environ []string) ([]byte, error) {
	environ = slices.DeleteFunc(slices.Clone(environ), func(v string) bool { return strings.HasPrefix(v, "PATH=") })
	return e.RawExec.ExecPlugin(ctx, pluginPath, stdin, append(environ, "PATH="+e.path))
}

// TestStatusWithLegacyTools: on a node whose iptables and ip6tables are the legacy ones (the
// plugin finds them first on its PATH), STATUS asks the tools, not nftables: ready while the
// legacy tables hold kubenet's chains, also after nft flush ruleset (which leaves them), and 50
// naming the chain once a legacy tool emptied it, until the next ADD.
func TestStatusWithLegacyTools(t *testing.T) {
	tools := t.TempDir()
	for _, tool := range []string{"iptables", "ip6tables"} {
		for _, suffix := range []string{"", "-save", "-restore"} {
			legacy, err := exec.LookPath(tool + "-legacy" + suffix)
			if err != nil {
				t.Skipf("no legacy iptables: %v", err)
			}
			if err := os.Symlink(legacy, filepath.Join(tools, tool+suffix)); err != nil {
				t.Fatal(err)
			}
		}
	}
	node, _, _ := hpNode(t)
	node.CNI = libcni.NewCNIConfigWithCacheDir([]string{binDir}, filepath.Join(node.Dir, "cache"), &pathExec{RawExec: &invoke.RawExec{Stderr: os.Stderr}, path: tools + ":" + os.Getenv("PATH")})
	list := iptablesHostPortServer(t, node, "lg-srv", 30292)
	masqChain := masq.IPTablesChain("kubenet")
	if out := nettest.Run(t, node.NS, "iptables-legacy-save", "-t", "nat"); !strings.Contains(out, "-A "+masqChain+" ") {
		t.Fatalf("the legacy nat table lacks %s: the plugin did not run the legacy tools:\n%s", masqChain, out)
	}
	if out := nettest.Run(t, node.NS, "iptables-nft-save", "-t", "nat"); strings.Contains(out, masqChain) {
		t.Fatalf("nftables holds %s: the plugin ran iptables-nft:\n%s", masqChain, out)
	}
	if code, msg := testkit.StatusCode(t, node, list); code != 0 {
		t.Fatalf("STATUS before = %d %s", code, msg)
	}
	nettest.Run(t, node.NS, "nft", "flush", "ruleset")
	if code, msg := testkit.StatusCode(t, node, list); code != 0 {
		t.Errorf("STATUS after nft flush ruleset, the legacy tables untouched = %d %s, want ready", code, msg)
	}
	nat := hostport.IPTablesChains("kubenet")["nat"]
	localnet := hostport.IPTablesChains("kubenet")["mangle"][0]
	for i, c := range []struct{ tool, table, chain string }{
		{"iptables-legacy", "nat", masqChain},
		{"ip6tables-legacy", "nat", masqChain},
		{"ip6tables-legacy", "nat", nat[2]},
		{"iptables-legacy", "mangle", localnet},
	} {
		nettest.Run(t, node.NS, c.tool, "-t", c.table, "-F", c.chain)
		code, msg := testkit.StatusCode(t, node, list)
		if code != core.ErrPluginNotAvailable || !strings.Contains(msg, c.chain) {
			t.Errorf("STATUS with %s -t %s -F %s = %d %q, want 50 naming the chain", c.tool, c.table, c.chain, code, msg)
		}
		node.MustAdd(t, list, node.NewPod(t, fmt.Sprintf("lg-next-%d", i)))
		if code, msg := testkit.StatusCode(t, node, list); code != 0 {
			t.Errorf("STATUS after %s was emptied and the next ADD = %d %s", c.chain, code, msg)
		}
	}
}

// iptablesHostPortServer sets node up with the iptables backend (dual-stack, SNAT), adds a pod
// name that publishes container port 8080 as hostPort over TCP (so the host-port chains count),
// and returns the configuration.
func iptablesHostPortServer(t *testing.T, node *nettest.Node, name string, hostPort int) *libcni.NetworkConfigList {
	t.Helper()
	list := node.ConfList(t, nettest.NetConf{
		PodCIDRs:           testkit.DualStack(),
		NonMasqueradeCIDRs: []netip.Prefix{nettest.NonMasquerade4, nettest.NonMasquerade6},
		NetfilterBackend:   "iptables",
	})
	srv := node.NewPod(t, name)
	srv.RT.CapabilityArgs = hpArgs(true, hpMapping{hostPort, 8080, "tcp", ""})
	node.MustAdd(t, list, srv)
	return list
}
