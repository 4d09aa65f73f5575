package core

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
)

func TestParseConfigAntiSpoofing(t *testing.T) {
	for _, tc := range []struct {
		value string // "" leaves the key out
		want  bool
		code  uint // 0: accepted
	}{
		{"", true, 0},
		{"null", true, 0},
		{"true", true, 0},
		{"false", false, 0},
		{`"false"`, false, types.ErrInvalidNetworkConfig},
		{"0", false, types.ErrInvalidNetworkConfig},
	} {
		conf := `{"cniVersion":"1.0.0","name":"n","podCIDRs":["10.244.1.0/24"]`
		if tc.value != "" {
			conf += `,"antiSpoofing":` + tc.value
		}
		cfg, err := ParseConfig([]byte(conf + `}`))
		if tc.code != 0 {
			var e *types.Error
			if !errors.As(err, &e) || e.Code != tc.code || !strings.Contains(e.Msg, "antiSpoofing") {
				t.Errorf("antiSpoofing %s: error %v, want code %d naming the key", tc.value, err, tc.code)
			}
			continue
		}
		if err != nil {
			t.Fatalf("antiSpoofing %s: %v", tc.value, err)
		}
		if cfg.AntiSpoofing != tc.want {
			t.Errorf("antiSpoofing %q: %v, want %v", tc.value, cfg.AntiSpoofing, tc.want)
		}
	}
}

func TestPodMAC(t *testing.T) {
	a := Attachment{ContainerID: "c1", IfName: "eth0"}
	mac := a.key().podMAC("kubenet")
	if len(mac) != 6 || mac[0]&0x01 != 0 || mac[0]&0x02 == 0 {
		t.Fatalf("pod MAC %s: want a locally administered unicast address", mac)
	}
	if again := a.key().podMAC("kubenet"); again.String() != mac.String() {
		t.Errorf("pod MAC not stable: %s then %s", mac, again)
	}
	seen := map[string]string{mac.String(): "kubenet/c1/eth0"}
	for _, other := range []struct {
		network string
		att     Attachment
	}{
		{"other", a},
		{"kubenet", Attachment{ContainerID: "c2", IfName: "eth0"}},
		{"kubenet", Attachment{ContainerID: "c1", IfName: "eth1"}},
		// The parts are separated, so shifting a character between them changes the MAC.
		{"kubenetc", Attachment{ContainerID: "1", IfName: "eth0"}},
	} {
		m := other.att.key().podMAC(other.network).String()
		name := other.network + "/" + other.att.ContainerID + "/" + other.att.IfName
		if prev, dup := seen[m]; dup {
			t.Errorf("%s and %s share pod MAC %s", prev, name, m)
		}
		seen[m] = name
	}
}

// TestClaimNodeAntiSpoofing: antiSpoofing is a node-wide setting (it rewrites the chains of every
// pod). A settings file written before kubenet had the key reads as the default (on): callers
// with the default pass, another caller turning it off is refused.
func TestClaimNodeAntiSpoofing(t *testing.T) {
	dataDir := t.TempDir()
	cfg := func(owner, extra string) *Config {
		t.Helper()
		c, err := ParseConfig([]byte(`{"name":"kubenet","dataDir":"` + dataDir + `","podCIDRs":["10.244.1.0/24"]` + extra + `}`))
		if err != nil {
			t.Fatal(err)
		}
		c.Owner = owner
		return c
	}
	store, err := openDir(dataDir, "kubenet")
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	old := `{"owner":"kubenetctl","bridge":"cbr0","podCIDRs":["10.244.1.0/24"],"nonMasqueradeCIDRs":null,"mtu":0,"hairpinMode":"hairpin-veth"}`
	if err := os.WriteFile(filepath.Join(store.path(), NodeSettingsFile), []byte(old), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := claimNode(cfg(OwnerCNI, ""), store); err != nil {
		t.Errorf("claim against settings without antiSpoofing: %v", err)
	}
	if err := claimNode(cfg("kubenetctl", ""), store); err != nil {
		t.Fatalf("owner's claim: %v", err)
	}
	var e *types.Error
	if err := claimNode(cfg(OwnerCNI, `,"antiSpoofing":false`), store); !errors.As(err, &e) || e.Code != ErrNodeOwned || !strings.Contains(e.Msg, "antiSpoofing on on the node, off here") {
		t.Errorf("another caller turning anti-spoofing off: %v, want code %d naming it", err, ErrNodeOwned)
	}
}
