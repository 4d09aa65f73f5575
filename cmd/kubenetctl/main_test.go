package main

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"github.com/kubenet-dev/kubenet/network"
)

func TestParsePort(t *testing.T) {
	cases := []struct {
		in      string
		want    network.PortMapping
		wantErr string
	}{
		{in: "8080:80", want: network.PortMapping{HostPort: 8080, ContainerPort: 80}},
		{in: "53:53/udp", want: network.PortMapping{HostPort: 53, ContainerPort: 53, Protocol: "UDP"}},
		{in: "80:80/TCP@198.18.0.1", want: network.PortMapping{HostPort: 80, ContainerPort: 80, Protocol: "TCP", HostIP: "198.18.0.1"}},
		{in: "80:80@[2001:db8::1]", want: network.PortMapping{HostPort: 80, ContainerPort: 80, HostIP: "2001:db8::1"}},
		{in: "80", wantErr: "want HOSTPORT:CONTAINERPORT"},
		{in: "0:80", wantErr: "from 1 to 65535"},
		{in: "70000:80", wantErr: "from 1 to 65535"},
		{in: "80:80/icmp", wantErr: "tcp, udp or sctp"},
		{in: "80:80@node", wantErr: "not an IP address"},
	}
	for _, c := range cases {
		t.Run(c.in, func(t *testing.T) {
			got, err := parsePort(c.in)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("error %v, want %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if *got != c.want {
				t.Errorf("got %+v, want %+v", *got, c.want)
			}
		})
	}
}

func TestSandboxID(t *testing.T) {
	a, b := sandboxID("/var/run/netns/a", ""), sandboxID("/var/run/netns/b", "")
	if a == b || a != sandboxID("/var/run/netns/a", "") || !strings.HasPrefix(a, "kubenetctl-") {
		t.Errorf("derived IDs %q, %q: want stable, distinct, prefixed", a, b)
	}
	if got := sandboxID("/x", "given"); got != "given" {
		t.Errorf("--id ignored: %q", got)
	}
}

// TestUsageErrors: bad command lines, and flag values the plugins refuse, exit 2 with one line on
// stderr, before any plugin acts.
func TestUsageErrors(t *testing.T) {
	dataDir := t.TempDir()
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "missing command"},
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"setup", "default"}, "setup needs NAMESPACE NAME, got 1"},
		{[]string{"setup", "default", "web"}, "setup needs --netns"},
		{[]string{"ready", "extra"}, "ready takes no arguments"},
		{[]string{"ready", "--netns", "/x"}, "ready does not take --netns"},
		{[]string{"--no-such-flag", "ready"}, "no-such-flag"},
		{[]string{"status", "default", "web", "--netns", "/x", "--port", "80:80"}, "status does not take --port"},
		{[]string{"node", "--all"}, "node does not take --all"},
		{[]string{"gc"}, "gc needs --valid"},
		{[]string{"gc", "--all", "--valid", "x"}, "not both"},
		{[]string{"--log-level", "loud", "ready"}, "--log-level"},
		{[]string{"--hairpin-mode", "sometimes", "ready"}, `--hairpin-mode "sometimes"`},
		{[]string{"--pod-cidr", "10.244.1.5/24", "ready"}, `"10.244.1.5/24" is not a network address`},
		{[]string{"--pod-cidr", "10.244.1.0/24,10.244.2.0/24", "ready"}, "one CIDR per family"},
		{[]string{"--network-plugin", "calico", "ready"}, `network plugin "calico" not found`},
		{[]string{"--kubenet-data-dir", dataDir, "--non-masquerade-cidr", "10.0.0.1/8", "ready"}, "nonMasqueradeCIDRs"},
		{[]string{"--kubenet-data-dir", dataDir, "--network-plugin-mtu", "100", "ready"}, "mtu"},
		{[]string{"--kubenet-data-dir", dataDir, "--network-plugin-mtu", "100", "gc", "--all"}, "mtu"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(c.args, &stdout, &stderr)
		if code != exitUsage {
			t.Errorf("%q: exit %d, want 2 (stderr %q)", c.args, code, stderr.String())
		}
		if lines := strings.Count(stderr.String(), "\n"); lines != 1 || !strings.HasPrefix(stderr.String(), "kubenetctl: ") || !strings.Contains(stderr.String(), c.want) {
			t.Errorf("%q: stderr %q, want one line naming %q", c.args, stderr.String(), c.want)
		}
	}
}

// TestUsageText: -h prints the usage made from the command table (every command with its
// synopsis and summary) and the flags, and exits 0.
func TestUsageText(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run([]string{"-h"}, &stdout, &stderr); code != exitOK {
		t.Fatalf("-h: exit %d", code)
	}
	for _, c := range commands() {
		line := strings.TrimSpace("kubenetctl [flags] " + c.name + " " + c.synopsis)
		if !strings.Contains(stdout.String(), line) || !strings.Contains(stdout.String(), c.summary) {
			t.Errorf("usage lacks %q or its summary:\n%s", line, stdout.String())
		}
	}
	if !strings.Contains(stdout.String(), "-take-over-node") {
		t.Errorf("usage lacks the flags:\n%s", stdout.String())
	}
}

// TestDocsListEveryCommand: docs/networkplugin.md and the package documentation show every
// command of the table with its synopsis, so the docs cannot fall behind the code.
func TestDocsListEveryCommand(t *testing.T) {
	var docs []string
	for _, f := range []string{"../../docs/networkplugin.md", "main.go"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, string(b))
	}
	for _, c := range commands() {
		line := strings.TrimSpace("kubenetctl [flags] " + c.name + " " + c.synopsis)
		for i, d := range docs {
			if !strings.Contains(d, line) {
				t.Errorf("document %d does not show %q", i, line)
			}
		}
	}
}
