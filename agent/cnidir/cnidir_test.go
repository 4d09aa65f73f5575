package cnidir

import (
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/containernetworking/cni/libcni"

	"github.com/kubenet-dev/kubenet/core"
)

func TestRender(t *testing.T) {
	p := netip.MustParsePrefix
	dual := []netip.Prefix{p("10.244.1.0/24"), p("fd00:10:244:1::/64")}
	tests := []struct {
		name    string
		opts    Options
		wantErr string // substring; "" = valid
		check   func(t *testing.T, c *core.Config, plugin map[string]any)
	}{
		{
			name: "dual-stack with every setting",
			opts: Options{PodCIDRs: dual, NonMasqueradeCIDRs: []netip.Prefix{p("10.244.0.0/16"), p("fd00:10:244::/48")},
				MTU: 1450, HairpinMode: "promiscuous-bridge", Bridge: "kbr0", DataDir: "/var/lib/kubenet"},
			check: func(t *testing.T, c *core.Config, plugin map[string]any) {
				if !slices.Equal(c.PodCIDRs(), dual) || c.MTU != 1450 || string(c.Hairpin) != "promiscuous-bridge" ||
					c.Bridge != "kbr0" || c.DataDir != "/var/lib/kubenet" || len(c.NonMasqueradeCIDRs) != 2 {
					t.Errorf("plugin config %+v does not carry the options", c)
				}
			},
		},
		{
			name: "iptables backend",
			opts: Options{PodCIDRs: dual, NetfilterBackend: "iptables"},
			check: func(t *testing.T, c *core.Config, plugin map[string]any) {
				if plugin["netfilterBackend"] != "iptables" || c.Netfilter != core.NetfilterIPTables {
					t.Errorf("netfilterBackend: conflist %v, plugin config %q", plugin["netfilterBackend"], c.Netfilter)
				}
			},
		},
		{name: "unknown backend", opts: Options{PodCIDRs: dual, NetfilterBackend: "ebpf"}, wantErr: "netfilterBackend"},
		{
			name: "defaults are left to the plugin",
			opts: Options{PodCIDRs: []netip.Prefix{p("10.244.1.0/24")}},
			check: func(t *testing.T, c *core.Config, plugin map[string]any) {
				for _, k := range []string{"mtu", "hairpinMode", "bridge", "dataDir", "nonMasqueradeCIDRs", "netfilterBackend"} {
					if _, ok := plugin[k]; ok {
						t.Errorf("key %s written although unset: %v", k, plugin[k])
					}
				}
				if c.Bridge != core.DefaultBridge || c.MTU != 0 || c.Network != DefaultName {
					t.Errorf("plugin defaults not applied: %+v", c)
				}
				caps, _ := plugin["capabilities"].(map[string]any)
				for _, k := range []string{"portMappings", "bandwidth", "ipRanges", "io.kubernetes.cri.pod-annotations"} {
					if caps[k] != true {
						t.Errorf("capability %s missing: %v", k, caps)
					}
				}
			},
		},
		{
			name: "IPv6 only",
			opts: Options{PodCIDRs: []netip.Prefix{p("fd00:10:244:1::/64")}},
			check: func(t *testing.T, c *core.Config, _ map[string]any) {
				if len(c.PodCIDRs()) != 1 || !c.PodCIDRs()[0].Addr().Is6() {
					t.Errorf("pod CIDRs %v", c.PodCIDRs())
				}
			},
		},
		{name: "no pod CIDR", opts: Options{}, wantErr: "no pod CIDR"},
		{name: "host bits set", opts: Options{PodCIDRs: []netip.Prefix{p("10.244.1.5/24")}}, wantErr: "podCIDRs"},
		{name: "two IPv4 CIDRs", opts: Options{PodCIDRs: []netip.Prefix{p("10.244.1.0/24"), p("10.245.1.0/24")}}, wantErr: "one IPv4 CIDR, one IPv6 CIDR"},
		{name: "bad hairpin mode", opts: Options{PodCIDRs: dual, HairpinMode: "hairpin"}, wantErr: "hairpinMode"},
		{name: "MTU out of range", opts: Options{PodCIDRs: dual, MTU: 100}, wantErr: "mtu"},
		{name: "IPv6 with an MTU below 1280", opts: Options{PodCIDRs: dual, MTU: 1200}, wantErr: "IPv6 needs at least 1280"},
		{name: "bridge name too long", opts: Options{PodCIDRs: dual, Bridge: "a-very-long-bridge-name"}, wantErr: "bridge"},
		{name: "relative data dir", opts: Options{PodCIDRs: dual, DataDir: "state"}, wantErr: "dataDir"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := Render(tt.opts)
			network, netErr := NetworkConfig(tt.opts)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Render = %v, want an error mentioning %q\n%s", err, tt.wantErr, out)
				}
				if netErr == nil {
					t.Fatalf("NetworkConfig accepted what Render refuses: %+v", network)
				}
				return
			}
			if netErr != nil {
				t.Fatal(netErr)
			}
			if err != nil {
				t.Fatal(err)
			}
			// What a runtime does with the file: libcni loads it, then hands the plugin its entry.
			list, err := libcni.ConfListFromBytes(out)
			if err != nil {
				t.Fatalf("libcni refuses the conflist: %v\n%s", err, out)
			}
			// libcni 1.2+ reads cniVersions and picks the highest it knows; older clients read
			// cniVersion (checked below).
			if list.CNIVersion != "1.1.0" || list.Name != DefaultName || len(list.Plugins) != 1 || list.Plugins[0].Network.Type != "kubenet" {
				t.Fatalf("conflist header: version %s name %s plugins %d\n%s", list.CNIVersion, list.Name, len(list.Plugins), out)
			}
			var raw map[string]any
			if err := json.Unmarshal(out, &raw); err != nil {
				t.Fatal(err)
			}
			if raw["cniVersion"] != DefaultCNIVersion {
				t.Errorf("cniVersion = %v, want %s for runtimes that predate cniVersions", raw["cniVersion"], DefaultCNIVersion)
			}
			plugin := raw["plugins"].([]any)[0].(map[string]any)
			plugin["name"], plugin["cniVersion"] = list.Name, list.CNIVersion
			stdin, _ := json.Marshal(plugin)
			c, err := core.ParseConfig(stdin)
			if err != nil {
				t.Fatalf("the plugin refuses its entry: %v\n%s", err, stdin)
			}
			tt.check(t, c, plugin)
			// The agent's own calls into the core work on what the runtime passes the plugin
			// (but for the version, which is the runtime's pick among cniVersions).
			network.CNIVersion = c.CNIVersion
			if !reflect.DeepEqual(network, c) {
				t.Errorf("NetworkConfig = %+v, the plugin parses the file as %+v", network, c)
			}
		})
	}
}

func TestRenderIsStable(t *testing.T) {
	// The agent compares bytes to decide whether to write: the same options must render the
	// same bytes every time (no map order, no timestamps).
	o := Options{PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}, HairpinMode: "none", MTU: 1500}
	first, err := Render(o)
	if err != nil {
		t.Fatal(err)
	}
	for range 20 {
		again, _ := Render(o)
		if string(again) != string(first) {
			t.Fatalf("render differs:\n%s\n%s", first, again)
		}
	}
}

func inode(t *testing.T, path string) uint64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

func TestWriteFile(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "net.d") // created on demand
	path := filepath.Join(dir, DefaultFileName)
	steps := []struct {
		name    string
		data    string
		written bool
	}{
		{"new file", "one", true},
		{"same content: untouched", "one", false},
		{"new content: replaced", "two", true},
		{"back again", "one", true},
	}
	var lastInode uint64
	for _, s := range steps {
		written, err := WriteFile(path, []byte(s.data), 0o644)
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if written != s.written {
			t.Fatalf("%s: written = %v, want %v", s.name, written, s.written)
		}
		got, _ := os.ReadFile(path)
		if string(got) != s.data {
			t.Fatalf("%s: file holds %q", s.name, got)
		}
		ino := inode(t, path)
		// A write is a rename of a new file: the inode changes, which is what makes it atomic.
		if written == (ino == lastInode) {
			t.Fatalf("%s: inode %d -> %d, written %v", s.name, lastInode, ino, written)
		}
		lastInode = ino
		entries, _ := os.ReadDir(dir)
		if len(entries) != 1 {
			t.Fatalf("%s: leftovers in the conf dir: %v", s.name, entries)
		}
		if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o644 {
			t.Fatalf("%s: mode %v", s.name, fi.Mode())
		}
	}
}

func TestInstallBinary(t *testing.T) {
	src := filepath.Join(t.TempDir(), "kubenet")
	bin := filepath.Join(t.TempDir(), "opt-cni-bin")
	tests := []struct {
		name      string
		src       string // content; "" = no source file
		installed bool
		wantErr   bool
	}{
		{name: "fresh node", src: "v1", installed: true},
		{name: "same binary: not copied", src: "v1", installed: false},
		{name: "upgrade", src: "v2", installed: true},
		{name: "source missing", src: "", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			os.Remove(src)
			if tt.src != "" {
				if err := os.WriteFile(src, []byte(tt.src), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			installed, err := InstallBinary(src, bin, "kubenet")
			if (err != nil) != tt.wantErr || installed != tt.installed {
				t.Fatalf("InstallBinary = %v, %v; want installed %v, error %v", installed, err, tt.installed, tt.wantErr)
			}
			if tt.wantErr {
				return
			}
			fi, err := os.Stat(filepath.Join(bin, "kubenet"))
			if err != nil {
				t.Fatal(err)
			}
			got, _ := os.ReadFile(filepath.Join(bin, "kubenet"))
			if string(got) != tt.src || fi.Mode().Perm() != 0o755 {
				t.Fatalf("installed %q mode %v, want %q 0755", got, fi.Mode(), tt.src)
			}
		})
	}
}
