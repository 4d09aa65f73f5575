package procs

import "testing"

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
