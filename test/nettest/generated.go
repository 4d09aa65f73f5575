package nettest

import (
	"fmt"
	"os"
	"strings"
)

// ReplaceGenerated replaces what lies between the lines begin and end of the markdown file at
// path with body: benchmarks write their tables into docs whose prose is written by hand.
func ReplaceGenerated(path, begin, end, body string) error {
	old, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	before, rest, ok := strings.Cut(string(old), begin)
	_, after, ok2 := strings.Cut(rest, end)
	if !ok || !ok2 {
		return fmt.Errorf("%s lacks the markers %q and %q", path, begin, end)
	}
	return os.WriteFile(path, []byte(before+begin+"\n"+body+end+after), 0o644)
}
