package core

import (
	"testing"

	"github.com/kubenet-dev/kubenet/hostport"
)

// TestAttachmentKeysStay: every key derived from an attachment's identity is what earlier
// releases derived. Nodes carry them across upgrades (links, pod MACs in isolation elements,
// record files, host-port and isolation owners): a change would orphan every running pod's state.
func TestAttachmentKeysStay(t *testing.T) {
	tests := []struct {
		network string
		att     Attachment
		veth    string
		ifb     string
		mac     string
		record  string
		legacy  string
		owner   string
	}{
		{"kubenet", Attachment{ContainerID: "0123456789abcdef", IfName: "eth0"}, "veth638db925905", "kifb638db925905", "52:fe:b4:65:93:71", "0123456789abcdef@eth0.json", "0123456789abcdef_eth0.json", "0123456789abcdef/eth0"},
		{"other", Attachment{ContainerID: "pod-a", IfName: "net1"}, "veth84889110765", "kifb84889110765", "86:9a:82:34:a5:01", "pod-a@net1.json", "pod-a_net1.json", "pod-a/net1"},
	}
	for _, tc := range tests {
		k := tc.att.key()
		if n := NamesFor(tc.network, tc.att); n.HostVeth != tc.veth || n.IFB != tc.ifb {
			t.Errorf("%s %v: names %+v, want %s %s", tc.network, tc.att, n, tc.veth, tc.ifb)
		}
		if mac := k.podMAC(tc.network).String(); mac != tc.mac {
			t.Errorf("%s %v: pod MAC %s, want %s", tc.network, tc.att, mac, tc.mac)
		}
		if r, l := k.recordName(), k.legacyRecordName(); r != tc.record || l != tc.legacy {
			t.Errorf("%v: record names %s %s, want %s %s", tc.att, r, l, tc.record, tc.legacy)
		}
		if o := k.owner(); o != (hostport.Owner{ContainerID: tc.att.ContainerID, IfName: tc.att.IfName}) || o.String() != tc.owner {
			t.Errorf("%v: owner %+v (%s), want %s", tc.att, o, o, tc.owner)
		}
		if back, ok := ownerKey(tc.owner); !ok || back != k {
			t.Errorf("ownerKey(%q) = %v %v, want %v", tc.owner, back, ok, k)
		}
		if back, ok := parseRecordName(tc.record); !ok || back != k {
			t.Errorf("parseRecordName(%q) = %v %v, want %v", tc.record, back, ok, k)
		}
	}
	if _, ok := ownerKey("no-slash"); ok {
		t.Error("ownerKey of a comment without \"/\" names an attachment")
	}
}
