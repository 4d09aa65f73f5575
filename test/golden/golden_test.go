package golden

import "testing"

func TestDiff(t *testing.T) {
	cases := []struct {
		name, want, got, diff string
	}{
		{"equal", "a\nb\n", "a\nb\n", ""},
		{"changed line", "a\nb\nc\n", "a\nB\nc\n", "  1: a\n- 2: b\n+ 2: B\n"},
		{"added at the end", "a\n", "a\nb\n", "  1: a\n+ 2: b\n"},
		{"removed first", "a\nb\n", "b\n", "- 1: a\n"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := Diff(tc.want, tc.got); got != tc.diff {
				t.Errorf("Diff = %q, want %q", got, tc.diff)
			}
		})
	}
}
