package core

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kubenet-dev/kubenet/internal/safedir"
)

func TestParseNetfilterBackend(t *testing.T) {
	for _, c := range []struct {
		in   string
		want NetfilterBackend
		err  bool
	}{
		{"", NetfilterAuto, false}, {"auto", NetfilterAuto, false}, {"nftables", NetfilterNFTables, false},
		{"iptables", NetfilterIPTables, false}, {"IPTABLES", "", true}, {"ebpf", "", true}, {"nftables ", "", true},
	} {
		got, err := parseNetfilterBackend(c.in)
		if (err != nil) != c.err || got != c.want {
			t.Errorf("parseNetfilterBackend(%q) = %q, %v", c.in, got, err)
		}
		if err != nil && !strings.Contains(err.Error(), "netfilterBackend") {
			t.Errorf("error %q does not name the key", err)
		}
	}
}

// TestBackendRecordIsHostile: the record in the data dir is read like every file there: garbage,
// an unknown backend, a symlink or a directory in its place are no record (the next ADD writes
// it anew), never an error that would stop DEL.
func TestBackendRecordIsHostile(t *testing.T) {
	outside := filepath.Join(t.TempDir(), "elsewhere.json")
	if err := os.WriteFile(outside, []byte(`{"backend":"iptables","reason":"planted"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		plant func(path string) error
		want  NetfilterBackend // "" no record
	}{
		{"valid", func(p string) error { return os.WriteFile(p, []byte(`{"backend":"iptables","reason":"r"}`), 0o644) }, NetfilterIPTables},
		{"garbage", func(p string) error { return os.WriteFile(p, []byte("\x00{{"), 0o644) }, ""},
		{"truncated", func(p string) error { return os.WriteFile(p, []byte(`{"backend":"ipt`), 0o644) }, ""},
		{"unknown backend", func(p string) error { return os.WriteFile(p, []byte(`{"backend":"ebpf"}`), 0o644) }, ""},
		{"auto is no backend", func(p string) error { return os.WriteFile(p, []byte(`{"backend":"auto"}`), 0o644) }, ""},
		{"symlink out of the data dir", func(p string) error { return os.Symlink(outside, p) }, ""},
		{"a directory", func(p string) error { return os.Mkdir(p, 0o755) }, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := c.plant(filepath.Join(dir, NetfilterFile)); err != nil {
				t.Fatal(err)
			}
			root, err := safedir.Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer root.Close()
			rec, err := readChoice(root)
			if err != nil {
				t.Fatalf("readChoice: %v", err)
			}
			if got := NetfilterBackend(""); rec != nil {
				got = rec.Backend
				if got != c.want {
					t.Errorf("record %+v, want backend %q", rec, c.want)
				}
			} else if c.want != "" {
				t.Errorf("no record, want backend %q", c.want)
			}
		})
	}
}

// TestChooseReusesAutoOfThisBoot: auto's answer is recorded with the boot and reused within it
// (no probe per ADD); an explicit backend is taken as configured.
func TestChooseReusesAutoOfThisBoot(t *testing.T) {
	boot := bootID()
	if boot == "" {
		t.Fatal("no boot id")
	}
	auto := &Config{Netfilter: NetfilterAuto}
	rec := &BackendChoice{Backend: NetfilterIPTables, Reason: "auto: recorded", Configured: NetfilterAuto, BootID: boot}
	if got, err := choose(auto, rec); err != nil || got != *rec {
		t.Errorf("choose(auto) with this boot's record = %+v, %v; want the record", got, err)
	}
	got, err := choose(&Config{Netfilter: NetfilterNFTables}, rec)
	if err != nil || got.Backend != NetfilterNFTables || got.Configured != NetfilterNFTables {
		t.Errorf("choose(nftables) = %+v, %v", got, err)
	}
}

func TestNodeSettingsNetfilterBackend(t *testing.T) {
	old := NodeSettings{Owner: "cni"} // written before the key existed: auto
	if d := old.differences(NodeSettings{Owner: "cni", NetfilterBackend: "auto"}); len(d) != 0 {
		t.Errorf("an old file differs from auto: %v", d)
	}
	if d := old.differences(NodeSettings{Owner: "cni", NetfilterBackend: "iptables"}); len(d) != 1 || !strings.Contains(d[0], "netfilterBackend") {
		t.Errorf("auto vs iptables: %v", d)
	}
}
