package tcguard

import (
	"slices"
	"testing"
)

func TestProgramTags(t *testing.T) {
	// The tags of the program as Linux 6.18 (SHA-256) and 5.x (SHA-1) computed them when it was
	// written (tc filter show).
	want := []string{"483010f647be20ec", "45410e59010f0350"}
	if got := Tags(testBit); !slices.Equal(got, want) {
		t.Errorf("Tags(%#x) = %v, want %v; the program changed: check the new tags against the kernel (TestGuardCheck) and update", testBit, got, want)
	}
}
