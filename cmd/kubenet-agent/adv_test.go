package main

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestAdvOverlayFlags: a --vxlan-device the kernel cannot name, or that names a link kubenet
// owns for something else, is accepted at start-up and fails in every sync instead: the overlay
// is never set up and every route through it is refused (auto, vxlan), or every sync logs that
// the link is "left alone" (direct). The values below all parse today.
func TestAdvOverlayFlags(t *testing.T) {
	for _, bad := range []string{
		"--vxlan-device=kubenet-vxlan-0123", // 18 bytes: IFNAMSIZ is 16 with the NUL
		"--vxlan-device=a/b",
		"--vxlan-device=a b",
		"--vxlan-device=cbr0",    // the pods' bridge (the plugin's default)
		"--vxlan-device=.",       // dev_valid_name refuses "." and ".."
		"--bridge=kubenet-vxlan", // the bridge would be named as the overlay device
	} {
		t.Run(bad, func(t *testing.T) {
			t.Setenv("NODE_NAME", "n")
			if _, err := parseFlags([]string{bad}); err == nil {
				t.Errorf("parseFlags(%s) accepted it", bad)
			}
		})
	}
}

// TestAdvOverlayFlagsDocumented: the issue asks docs/agent.md for the modes, the flags and the
// port operators must open; its flag table has none of the overlay's flags.
func TestAdvOverlayFlagsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/agent.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"--routing", "--vxlan-port", "--vxlan-vni", "--vxlan-device"} {
		if !regexp.MustCompile("(?m)^\\| `" + regexp.QuoteMeta(f) + "` \\|").Match(doc) {
			t.Errorf("docs/agent.md's flag table has no row for %s", f)
		}
	}
	if !strings.Contains(string(doc), "kubenet-overlay") {
		t.Error("docs/agent.md never names the kubenet-overlay table (Uninstall leaves it, and the device, behind)")
	}
}
