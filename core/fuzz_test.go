package core

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
)

// requireCNIError fails unless err is a CNI error with one of the codes.
func requireCNIError(t *testing.T, err error, codes ...uint) {
	t.Helper()
	var e *types.Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v (%T) is not a CNI error", err, err)
	}
	for _, c := range codes {
		if e.Code == c {
			return
		}
	}
	t.Fatalf("error code %d (%s), want one of %v", e.Code, e.Msg, codes)
}

// checkValidConfig asserts the invariants every accepted configuration must hold, since ADD trusts
// them without checking again.
func checkValidConfig(t *testing.T, cfg *Config) {
	t.Helper()
	if cfg.Network == "" || cfg.Bridge == "" || len(cfg.Bridge) > 15 || !strings.HasPrefix(cfg.DataDir, "/") {
		t.Fatalf("accepted config with bad basics: %+v", cfg)
	}
	if n := len(cfg.Ranges); n < 1 || n > 2 {
		t.Fatalf("accepted %d range sets", n)
	}
	seen4, seen6 := false, false
	for _, set := range cfg.Ranges {
		for _, r := range set {
			if r.Subnet.Masked() != r.Subnet || !r.Subnet.Contains(r.Gateway) {
				t.Fatalf("accepted range %+v", r)
			}
		}
		if is4 := set[0].Subnet.Addr().Is4(); (is4 && seen4) || (!is4 && seen6) {
			t.Fatalf("accepted two range sets of one family: %v", cfg.PodCIDRs())
		} else if is4 {
			seen4 = true
		} else {
			seen6 = true
		}
	}
	if cfg.MTU != 0 && (cfg.MTU < 576 || cfg.MTU > 65535) {
		t.Fatalf("accepted MTU %d", cfg.MTU)
	}
	for _, pm := range cfg.Runtime.PortMappings {
		if pm.HostPort < 1 || pm.HostPort > 65535 || pm.ContainerPort < 1 || pm.ContainerPort > 65535 {
			t.Fatalf("accepted ports %+v", pm)
		}
		if pm.Protocol != "tcp" && pm.Protocol != "udp" && pm.Protocol != "sctp" {
			t.Fatalf("accepted protocol %q", pm.Protocol)
		}
		if pm.HostIP != "" {
			if _, err := netip.ParseAddr(pm.HostIP); err != nil {
				t.Fatalf("accepted hostIP %q", pm.HostIP)
			}
		}
	}
}

func FuzzParseConfig(f *testing.F) {
	for _, seed := range []string{
		`{"cniVersion":"1.0.0","name":"kubenet","type":"kubenet","podCIDRs":["10.244.1.0/24","fd00::/64"]}`,
		`{"name":"n","podCIDRs":["10.0.0.0/30"],"mtu":1500,"hairpinMode":"none","bridge":"br0","dataDir":"/x"}`,
		`{"name":"n","nonMasqueradeCIDRs":["10.0.0.0/8"],"runtimeConfig":{"ipRanges":[[{"subnet":"10.1.0.0/24","gateway":"10.1.0.9"}]]}}`,
		`{"name":"n","podCIDRs":["10.0.0.0/24"],"prevResult":{"cniVersion":"1.0.0","ips":[{"address":"10.0.0.2/24"}]}}`,
		`{"name":`, `[]`, `{"podCIDRs":null}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := ParseConfig(data)
		if err != nil {
			requireCNIError(t, err, types.ErrDecodingFailure, types.ErrInvalidNetworkConfig)
			return
		}
		checkValidConfig(t, cfg)
	})
}

func FuzzRuntimeConfig(f *testing.F) {
	for _, seed := range []string{
		`{"portMappings":[{"hostPort":8080,"containerPort":80,"protocol":"TCP","hostIP":"0.0.0.0"}]}`,
		`{"PortMappings":[{"HostPort":53,"ContainerPort":53,"Protocol":"udp","HostIP":"::"}]}`,
		`{"bandwidth":{"ingressRate":10000000,"ingressBurst":4294967295,"egressRate":1000000}}`,
		`{"Bandwidth":{"IngressRate":1,"EgressBurst":0}}`,
		`{"io.kubernetes.cri.pod-annotations":{"kubernetes.io/ingress-bandwidth":"10M","kubernetes.io/egress-bandwidth":"1.5G"}}`,
		`{"ipRanges":[[{"subnet":"10.9.0.0/24","rangeStart":"10.9.0.10","rangeEnd":"10.9.0.20"}],[{"subnet":"fd00:9::/64"}]]}`,
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, runtimeConfig string) {
		conf := `{"cniVersion":"1.1.0","name":"n","podCIDRs":["10.0.0.0/24"],"runtimeConfig":` + runtimeConfig + `}`
		cfg, err := ParseConfig([]byte(conf))
		if err != nil {
			requireCNIError(t, err, types.ErrDecodingFailure, types.ErrInvalidNetworkConfig)
			return
		}
		checkValidConfig(t, cfg)
	})
}

// FuzzTeardownConfig: DEL and GC accept any configuration whose name and data dir are valid,
// never panic, and pass on only valid host ports and pod CIDRs.
func FuzzTeardownConfig(f *testing.F) {
	for _, seed := range []string{
		`{"cniVersion":"1.1.0","name":"kubenet","podCIDRs":["10.244.1.0/24"],"runtimeConfig":{"portMappings":[{"hostPort":0}]}}`,
		`{"name":"n","dataDir":"/x","runtimeConfig":{"ipRanges":[[{"subnet":"banana"}]],"portMappings":"x"}}`,
		`{"name":"n","podCIDRs":["fd00::/64","10.0.0.0/24","10.1.0.0/24"],"bridge":7}`,
		`{"name":"n","prevResult":{"ips":[{"interface":-1}]}}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := ParseTeardownConfig(data)
		if err != nil {
			requireCNIError(t, err, types.ErrDecodingFailure, types.ErrInvalidNetworkConfig)
			return
		}
		if validNetworkName(cfg.Network) != nil || !strings.HasPrefix(cfg.DataDir, "/") || validBridgeName(cfg.Bridge) != nil || len(cfg.Ranges) > 2 {
			t.Fatalf("teardown config with bad basics: %+v", cfg)
		}
		for _, pm := range cfg.Runtime.PortMappings {
			if err := validatePortMapping(&pm, "x"); err != nil {
				t.Fatalf("kept an invalid mapping %+v: %v", pm, err)
			}
		}
		for _, p := range cfg.PodCIDRs() {
			if _, err := parsePodCIDR(p.String()); err != nil {
				t.Fatalf("kept pod CIDR %s: %v", p, err)
			}
		}
	})
}

// FuzzGCList: the GC list parser never panics, and what it accepts names only valid attachments.
func FuzzGCList(f *testing.F) {
	for _, seed := range []string{
		`{"cni.dev/valid-attachments":[{"containerID":"a","ifname":"eth0"}]}`,
		`{"cni.dev/valid-attachments":null,"cni.dev/attachments":[{"containerID":"b"}]}`,
		`{"cni.dev/valid-attachments":[null,{}]}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		valid, err := ParseValidAttachments(data)
		if err != nil {
			requireCNIError(t, err, types.ErrDecodingFailure, types.ErrInvalidNetworkConfig)
			return
		}
		for _, v := range valid {
			if err := (Attachment{ContainerID: v.ContainerID, IfName: v.IfName}).Validate(); err != nil {
				t.Fatalf("accepted %+v: %v", v, err)
			}
		}
	})
}

// FuzzPrevResult: whatever prevResult a runtime caches, CHECK's reading of it never panics.
func FuzzPrevResult(f *testing.F) {
	for _, seed := range []string{
		`{"cniVersion":"1.1.0","interfaces":[{"name":"eth0"}],"ips":[{"interface":0,"address":"10.0.0.2/24"}]}`,
		`{"cniVersion":"0.3.1","ips":[{"version":"4","interface":-1,"address":"10.0.0.2/24"}]}`,
		`{"cniVersion":"0.2.0","ip4":{"ip":"10.0.0.2/24"}}`,
		`{"cniVersion":"1.1.0","ips":[null]}`,
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, prev string) {
		cfg, err := ParseCheckConfig([]byte(`{"cniVersion":"1.1.0","name":"n","podCIDRs":["10.0.0.0/24"],"prevResult":` + prev + `}`))
		if err != nil || cfg.PrevResult == nil {
			return
		}
		if _, err := prevAddrs(cfg.PrevResult, Attachment{ContainerID: "c", IfName: "eth0"}); err != nil {
			requireCNIError(t, err, types.ErrInvalidNetworkConfig)
		}
	})
}
