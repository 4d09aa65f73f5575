package core

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/kubenet-dev/kubenet/internal/safedir"
)

// TestClaimNode: the first caller records its node-wide settings; the same settings pass for
// anyone; the owner may change them; another caller with different ones is refused with code 104
// naming each difference and changes nothing, unless it takes the node over; a file that is not
// kubenet's settings counts as none.
func TestClaimNode(t *testing.T) {
	dataDir := t.TempDir()
	cfg := func(owner string, takeOver bool, extra string) *Config {
		t.Helper()
		c, err := ParseConfig([]byte(fmt.Sprintf(`{"name":"kubenet","dataDir":%q,"podCIDRs":["10.244.1.0/24","fd00:10:244:1::/64"],
			"nonMasqueradeCIDRs":["fd00::/8","10.0.0.0/8"]%s}`, dataDir, extra)))
		if err != nil {
			t.Fatal(err)
		}
		c.Owner, c.TakeOverNode = owner, takeOver
		return c
	}
	store, err := openDir(dataDir, "kubenet")
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	file := filepath.Join(store.path(), NodeSettingsFile)
	recorded := func() NodeSettings {
		t.Helper()
		s, err := ReadNodeSettings(dataDir, "kubenet")
		if err != nil || s == nil {
			t.Fatalf("recorded settings: %v, %v", s, err)
		}
		return *s
	}

	if err := claimNode(cfg(OwnerCNI, false, ""), store); err != nil {
		t.Fatalf("first claim: %v", err)
	}
	first := recorded()
	if first.Owner != OwnerCNI || fmt.Sprint(first.NonMasqueradeCIDRs) != "[10.0.0.0/8 fd00::/8]" || fmt.Sprint(first.PodCIDRs) != "[10.244.1.0/24 fd00:10:244:1::/64]" {
		t.Errorf("recorded %+v", first)
	}

	// Same settings from another caller (order of the list does not matter): allowed, owner kept.
	if err := claimNode(cfg("kubenetctl", false, `,"nonMasqueradeCIDRs":["10.0.0.0/8","fd00::/8"]`), store); err != nil {
		t.Errorf("same settings, other caller: %v", err)
	}
	if got := recorded(); got.Owner != OwnerCNI {
		t.Errorf("owner %q after another caller with the same settings, want cni", got.Owner)
	}

	// Another caller with different settings: refused, every difference named, nothing written.
	other := cfg("kubenetctl", false, `,"podCIDRs":["10.244.1.0/24"],"nonMasqueradeCIDRs":["10.0.0.0/8"],"mtu":1400,"hairpinMode":"promiscuous-bridge","bridge":"br1","antiSpoofing":false`)
	err = claimNode(other, store)
	var te *types.Error
	if !asCNI(err, &te) || te.Code != ErrNodeOwned {
		t.Fatalf("different settings, other caller: %v, want code %d", err, ErrNodeOwned)
	}
	for _, want := range []string{`belong to the CNI configuration (cni)`, "bridge cbr0 on the node, br1 here", "podCIDRs [10.244.1.0/24 fd00:10:244:1::/64] on the node, [10.244.1.0/24] here",
		"nonMasqueradeCIDRs [10.0.0.0/8 fd00::/8] on the node, [10.0.0.0/8] here", "mtu 0 on the node, 1400 here", "hairpinMode hairpin-veth on the node, promiscuous-bridge here", "antiSpoofing on on the node, off here", "--take-over-node"} {
		if !strings.Contains(te.Msg, want) {
			t.Errorf("refusal %q does not say %q", te.Msg, want)
		}
	}
	if got := recorded(); fmt.Sprint(got) != fmt.Sprint(first) {
		t.Errorf("a refused claim changed the record: %+v", got)
	}

	// The owner changes its own settings: allowed and recorded.
	if err := claimNode(cfg(OwnerCNI, false, `,"podCIDRs":["10.244.7.0/24"]`), store); err != nil {
		t.Errorf("owner changing its settings: %v", err)
	}
	if got := recorded(); fmt.Sprint(got.PodCIDRs) != "[10.244.7.0/24]" {
		t.Errorf("owner's new pod CIDR not recorded: %+v", got)
	}

	// Take-over: allowed, the caller becomes the owner, the former owner is now refused.
	other.TakeOverNode = true
	if err := claimNode(other, store); err != nil {
		t.Fatalf("take-over: %v", err)
	}
	if got := recorded(); got.Owner != "kubenetctl" || got.MTU != 1400 {
		t.Errorf("after take-over: %+v", got)
	}
	if err := claimNode(cfg(OwnerCNI, false, ""), store); !asCNI(err, &te) || te.Code != ErrNodeOwned || !strings.Contains(te.Msg, `belong to "kubenetctl"`) {
		t.Errorf("former owner after the take-over: %v, want code %d naming kubenetctl", err, ErrNodeOwned)
	}

	// A file that is not kubenet's settings (garbage, too large, no owner) counts as none.
	for _, junk := range []string{"{not json", `{"bridge":"cbr0"}`, strings.Repeat(" ", safedir.MaxFileSize+1) + "{}"} {
		if err := os.WriteFile(file, []byte(junk), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := claimNode(cfg(OwnerCNI, false, ""), store); err != nil {
			t.Errorf("claim over %.20q: %v", junk, err)
		}
		if got := recorded(); got.Owner != OwnerCNI {
			t.Errorf("after a claim over %.20q: %+v", junk, got)
		}
	}
}

func asCNI(err error, te **types.Error) bool {
	e, ok := err.(*types.Error)
	*te = e
	return ok
}

// claimNode is claimNodeSettings without what it tells.
func claimNode(cfg *Config, dir *networkDir) error {
	_, err := claimNodeSettings(cfg, dir)
	return err
}
