package procs

import (
	"os"
	"runtime"
	"testing"
)

func TestFor(t *testing.T) {
	cases := []struct {
		command string
		want    int
	}{
		{"STATUS", 1},
		{"ADD", 0},
		{"DEL", 0},
		{"CHECK", 0},
		{"GC", 0},
		{"VERSION", 0},
		{"", 0},
		{"status", 0}, // CNI verbs are upper case; anything else is refused later, on all CPUs
	}
	for _, tc := range cases {
		if got := For(tc.command); got != tc.want {
			t.Errorf("For(%q) = %d, want %d", tc.command, got, tc.want)
		}
	}
}

// TestAll: after one processor, All gives back what the process had by default (with
// GOMAXPROCS in the environment, which the runtime's default ignores: more than one, on a
// machine with more than one CPU).
func TestAll(t *testing.T) {
	def := runtime.GOMAXPROCS(1)
	defer runtime.GOMAXPROCS(def)
	All()
	got := runtime.GOMAXPROCS(0)
	switch {
	case os.Getenv("GOMAXPROCS") == "" && got != def:
		t.Errorf("GOMAXPROCS after All = %d, want the default %d", got, def)
	case runtime.NumCPU() > 1 && got == 1:
		t.Errorf("GOMAXPROCS after All = 1 on %d CPUs", runtime.NumCPU())
	}
}
