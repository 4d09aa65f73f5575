package nettest

import (
	"fmt"
	"regexp"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
)

// endedElement matches a set element that nft lists with a timeout under a second ("timeout
// 4ms"): one kubenet ended (nft.EndTimeout) instead of deleting it, which the kernel still lists
// until its next tick. Every element kubenet keeps has a timeout of a century or none.
var endedElement = regexp.MustCompile(`\btimeout [0-9]+ms\b`)

// SettledRuleset returns `nft [flags] list ruleset` in n once it lists no ended element, polling
// for up to two seconds, so that an audit right after a DEL sees what the kernel holds after its
// next tick; an ended element still listed then is an error. Pass "-s" for a listing that
// compares over time: without it every element with a timeout shows its expiry counting down.
func SettledRuleset(n ns.NetNS, flags ...string) (string, error) {
	var out string
	err := Eventually(2*time.Second, func() error {
		var err error
		if out, err = Output(n, "nft", append(flags, "list", "ruleset")...); err != nil {
			return err
		}
		if m := endedElement.FindString(out); m != "" {
			return fmt.Errorf("nft still lists an ended element (%s) after 2s:\n%s", m, out)
		}
		return nil
	})
	return out, err
}
