package main

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseFlags(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		env     string // NODE_NAME
		wantErr string
		check   func(t *testing.T, o *options)
	}{
		{
			name: "defaults, node from the environment",
			env:  "node-a",
			check: func(t *testing.T, o *options) {
				if o.cfg.NodeName != "node-a" || !o.cfg.ManageRoutes || o.cfg.ConfDir != "/etc/cni/net.d" || o.cfg.BinDir != "/opt/cni/bin" ||
					o.cfg.BinSource != "" || o.cfg.Conflist.HairpinMode != "hairpin-veth" || o.metricsAddr != "127.0.0.1:9309" || o.cfg.RouteProtocol != 75 ||
					o.cfg.RuntimeEndpoint != "unix:///run/containerd/containerd.sock" || o.cfg.StaleGrace != 5*time.Minute || o.cfg.StaleInterval != time.Minute {
					t.Errorf("defaults: %+v", o)
				}
			},
		},
		{
			name: "dual-stack cluster CIDR becomes the non-masquerade CIDRs",
			args: []string{"--node-name=b", "--cluster-cidr=10.244.0.0/16, fd00:10:244::/48", "--mtu=1450", "--manage-routes=false"},
			check: func(t *testing.T, o *options) {
				want := []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:10:244::/48")}
				if !slices.Equal(o.cfg.Conflist.NonMasqueradeCIDRs, want) || o.cfg.Conflist.MTU != 1450 || o.cfg.ManageRoutes || o.cfg.NodeName != "b" {
					t.Errorf("parsed: %+v", o.cfg)
				}
			},
		},
		{
			name: "stale-attachment collection off, and its timing",
			args: []string{"--container-runtime-endpoint=", "--stale-gc-grace=30s", "--stale-gc-interval=10s"},
			check: func(t *testing.T, o *options) {
				if o.cfg.RuntimeEndpoint != "" || o.cfg.StaleGrace != 30*time.Second || o.cfg.StaleInterval != 10*time.Second {
					t.Errorf("parsed: %+v", o.cfg)
				}
			},
		},
		{name: "no grace", args: []string{"--stale-gc-grace=0s"}, wantErr: "must be positive"},
		{
			name: "iptables backend without policies",
			args: []string{"--netfilter-backend=iptables", "--network-policy=false"},
			check: func(t *testing.T, o *options) {
				if o.cfg.Conflist.NetfilterBackend != "iptables" || o.cfg.NetworkPolicy {
					t.Errorf("parsed: %+v", o.cfg)
				}
			},
		},
		{name: "iptables backend with policies", args: []string{"--netfilter-backend=iptables"}, wantErr: "--network-policy needs the nftables backend"},
		{name: "negative interval", args: []string{"--stale-gc-interval=-1s"}, wantErr: "must be positive"},
		{
			name: "drop log off by default",
			args: []string{},
			check: func(t *testing.T, o *options) {
				if o.cfg.PolicyDropLog.Group != 0 {
					t.Errorf("drop log %+v, want off", o.cfg.PolicyDropLog)
				}
			},
		},
		{
			name: "drop log on, its group and rate",
			args: []string{"--policy-log", "--policy-log-group=31", "--policy-log-rate=7"},
			check: func(t *testing.T, o *options) {
				if l := o.cfg.PolicyDropLog; l.Group != 31 || l.Rate != 7 || l.Burst != 7 {
					t.Errorf("drop log %+v", l)
				}
			},
		},
		{name: "drop log group 0", args: []string{"--policy-log", "--policy-log-group=0"}, wantErr: "--policy-log-group 0: must be between 1 and 65535"},
		{name: "drop log group too big", args: []string{"--policy-log-group=65536"}, wantErr: "--policy-log-group 65536"},
		// In bytes these overflow int64: 2^44 MiB wrapped to a limit of 0 (the garbage
		// collector running all the time), 2^63 MiB to a negative one.
		{name: "memory limit past int64 bytes", args: []string{"--memory-limit-mib=17592186044416"}, wantErr: "--memory-limit-mib 17592186044416: must be at most 8796093022207"},
		{name: "memory limit of 2^63 MiB", args: []string{"--memory-limit-mib=9223372036854775808"}, wantErr: "--memory-limit-mib 9223372036854775808"},
		{name: "negative memory limit", args: []string{"--memory-limit-mib=-1"}, wantErr: "memory-limit-mib"},
		{
			name: "largest memory limit",
			args: []string{"--memory-limit-mib=8796093022207"},
			check: func(t *testing.T, o *options) {
				if limit, set := softMemoryLimit(o.memLimitMiB, ""); !set || limit <= 0 {
					t.Errorf("softMemoryLimit(%d) = %d, %v", o.memLimitMiB, limit, set)
				}
			},
		},
		{name: "drop log rate 0", args: []string{"--policy-log-rate=0"}, wantErr: "--policy-log-rate 0"},
		{name: "drop log without policies", args: []string{"--policy-log", "--network-policy=false", "--netfilter-backend=iptables"}, wantErr: "--policy-log needs --network-policy"},
		{
			name: "service CIDRs",
			args: []string{"--service-cidr=10.96.0.0/12,fd00:10:96::/112"},
			check: func(t *testing.T, o *options) {
				if want := []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12"), netip.MustParsePrefix("fd00:10:96::/112")}; !slices.Equal(o.cfg.ServiceCIDRs, want) {
					t.Errorf("service CIDRs %v", o.cfg.ServiceCIDRs)
				}
			},
		},
		{name: "service CIDR that is no CIDR", args: []string{"--service-cidr=10.96.0.1"}, wantErr: `--service-cidr "10.96.0.1": not a network CIDR`},
		{name: "cluster CIDR with host bits", args: []string{"--cluster-cidr=10.244.1.1/16"}, wantErr: `--cluster-cidr "10.244.1.1/16"`},
		{name: "cluster CIDR that is no CIDR", args: []string{"--cluster-cidr=10.244.0.0"}, wantErr: "not a network CIDR"},
		{name: "stray argument", args: []string{"extra"}, wantErr: "unexpected arguments"},
		{name: "unknown flag", args: []string{"--pod-cidr=10.0.0.0/24"}, wantErr: "flag provided but not defined"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("NODE_NAME", tt.env)
			o, err := parseFlags(tt.args)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("parseFlags = %v, want an error mentioning %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, o)
		})
	}
}

// TestSoftMemoryLimit: --memory-limit-mib sets the runtime's soft limit in bytes; 0 sets none,
// and GOMEMLIMIT, when set, is left to the runtime.
func TestSoftMemoryLimit(t *testing.T) {
	for _, tc := range []struct {
		name       string
		mib        uint
		gomemlimit string
		want       int64
		set        bool
	}{
		{"default", defaultMemLimitMiB, "", defaultMemLimitMiB << 20, true},
		{"set", 256, "", 256 << 20, true},
		{"off", 0, "", 0, false},
		{"GOMEMLIMIT wins", 256, "300MiB", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got, set := softMemoryLimit(tc.mib, tc.gomemlimit); got != tc.want || set != tc.set {
				t.Errorf("softMemoryLimit(%d, %q) = %d, %v; want %d, %v", tc.mib, tc.gomemlimit, got, set, tc.want, tc.set)
			}
		})
	}
}
