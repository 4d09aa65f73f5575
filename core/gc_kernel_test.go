package core

import (
	"context"
	"testing"
	"time"

	"github.com/kubenet-dev/kubenet/test/nettest"
)

// TestGCSparedPodIsolatedAfterSwitch: the agent's collection of stale attachments (Collect with
// a cutoff) spares a pod whose record is younger than the cutoff, and decides so under the pod's
// attachment lock. An ADD that switches the node's backend (iptables to nftables) meanwhile puts
// back the isolation of every recorded pod whose lock it gets without waiting; GC writes nothing
// for a pod it spares, so that pod must not be passed over: once both are done it is isolated in
// the new backend.
func TestGCSparedPodIsolatedAfterSwitch(t *testing.T) {
	dataDir := t.TempDir()
	node := nettest.NewNS(t)
	parse := func(backend string) *Config {
		cfg, err := ParseConfig(conf(`"dataDir":"`+dataDir+`"`, `"netfilterBackend":"`+backend+`"`))
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	ipt, nft := parse("iptables"), parse("nftables")
	young := Attachment{ContainerID: "young", IfName: "eth0", NetNS: nettest.NewNS(t).Path()}
	switcher := Attachment{ContainerID: "switcher", IfName: "eth0", NetNS: nettest.NewNS(t).Path()}
	nettest.Do(t, node, func() error {
		if _, err := Add(context.Background(), ipt, young); err != nil {
			return err
		}
		// The switch runs while GC holds the young pod's lock to decide on it.
		var switchErr error
		k := Keeper{
			InUse:         func(string, string) bool { return false },
			WrittenBefore: time.Now().Add(-time.Hour),
			deciding: func(att Attachment) {
				if att.ContainerID == young.ContainerID {
					_, switchErr = Add(context.Background(), nft, switcher)
				}
			},
		}
		if _, err := Collect(context.Background(), ipt, k); err != nil {
			return err
		}
		if switchErr != nil {
			return switchErr
		}
		h, err := openAsFound(nft, nil)
		if err != nil {
			return err
		}
		defer h.Close()
		if h.nf.backend != NetfilterNFTables {
			t.Fatalf("the node's backend after the switch is %s", h.nf.backend)
		}
		rec, err := h.dir.records.Load(young)
		if err != nil || rec == nil {
			t.Fatalf("GC did not spare the young pod's record: %v %v", rec, err)
		}
		if err := h.nf.checkIsolation(h.isolationConfig(), h.portOf(young.key(), rec.IPs)); err != nil {
			t.Errorf("the pod GC spared during the switch is not isolated in the new backend: %v", err)
		}
		return nil
	})
}
