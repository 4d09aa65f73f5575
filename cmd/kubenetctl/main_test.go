package main

import (
	"bytes"
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

// TestUsageErrors: bad command lines exit 2 with one line on stderr, before any plugin runs.
func TestUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"frobnicate"},
		{"setup", "default"},
		{"setup", "default", "web"},
		{"ready", "extra"},
		{"ready", "--netns", "/x"},
		{"--no-such-flag", "ready"},
		{"status", "default", "web", "--netns", "/x", "--port", "80:80"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(args, &stdout, &stderr)
		if code != 2 {
			t.Errorf("%q: exit %d, want 2 (stderr %q)", args, code, stderr.String())
		}
		if lines := strings.Count(stderr.String(), "\n"); lines != 1 || !strings.HasPrefix(stderr.String(), "kubenetctl: ") {
			t.Errorf("%q: stderr %q, want one line", args, stderr.String())
		}
	}
	var stdout, stderr bytes.Buffer
	if code := run([]string{"-h"}, &stdout, &stderr); code != 0 || !strings.Contains(stdout.String(), "--network-plugin") && !strings.Contains(stdout.String(), "-network-plugin") {
		t.Errorf("-h: exit %d, usage %q", code, stdout.String())
	}
}
