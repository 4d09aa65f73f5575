package nft

import (
	"testing"

	"github.com/google/nftables"

	"github.com/kubenet-dev/kubenet/test/nettest"
)

// TestDumpDigest: the digest of a dump follows every byte of the named chains' rules but their
// handles: rewriting the same rules keeps it, and a rule changed in place (same handle, same
// comment), a comment changed, a rule added or a chain emptied each changes it; chains not named
// do not count, and a missing chain digests as an empty one.
func TestDumpDigest(t *testing.T) {
	n := nettest.NewNS(t)
	table := InetTable("digest")
	names := []string{"a", "b", "empty"}
	digest := func() Digest {
		t.Helper()
		var d Digest
		nettest.Do(t, n, func() error {
			dump, err := DumpRules(table)
			if err != nil {
				return err
			}
			d, err = dump.Digest(names)
			return err
		})
		return d
	}
	write := func(aRules []Rule) {
		t.Helper()
		nettest.Do(t, n, func() error {
			c, err := nftables.New()
			if err != nil {
				return err
			}
			c.AddTable(table)
			ReplaceChain(c, &nftables.Chain{Name: "a", Table: table}, aRules)
			ReplaceChain(c, &nftables.Chain{Name: "b", Table: table}, planned()[:1])
			return c.Flush()
		})
	}
	missing := digest()
	write(planned())
	base := digest()
	if base == missing {
		t.Fatal("the digest of the written chains equals that of a missing table")
	}
	write(planned())
	if got := digest(); got != base {
		t.Error("the same rules written again (new handles) digest differently")
	}
	nettest.Run(t, n, "nft", "add chain inet kubenet-digest other; add rule inet kubenet-digest other accept; add chain inet kubenet-digest empty")
	if got := digest(); got != base {
		t.Error("a chain not named, or an empty chain that was missing, changed the digest")
	}
	changes := []struct {
		name string
		edit func()
	}{
		{"a rule changed in place", func() { testEditRule(t, n, "a", "drop", "accept") }},
		{"a comment changed", func() { testEditRule(t, n, "a", `comment "drop"`, `comment "dropped"`) }},
		{"a rule added", func() { nettest.Run(t, n, "nft", "add rule inet kubenet-digest b accept") }},
		{"a chain emptied", func() { nettest.Run(t, n, "nft", "flush chain inet kubenet-digest b") }},
		{"a rule in an empty chain", func() { nettest.Run(t, n, "nft", "add rule inet kubenet-digest empty accept") }},
	}
	for _, c := range changes {
		write(planned())
		nettest.Run(t, n, "nft", "flush chain inet kubenet-digest empty")
		c.edit()
		if got := digest(); got == base {
			t.Errorf("%s: the digest did not change", c.name)
		}
	}
}
