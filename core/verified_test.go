package core

import (
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/kubenet-dev/kubenet/internal/nft"
	"github.com/kubenet-dev/kubenet/internal/safedir"
)

// TestVerifiedRules: a learned pair is known to the next verb (a new reader of the file), only
// as the pair it is; the file keeps the newest maxVerifiedPairs; a damaged file or a symlink in
// its place remembers nothing and is replaced by the next pair learned, never followed.
func TestVerifiedRules(t *testing.T) {
	digest := func(s string) nft.Digest { return nft.Digest(sha256.Sum256([]byte(s))) }
	dir := t.TempDir()
	root, err := safedir.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	newVerifiedRules(root).Learn(digest("plan"), digest("kernel"))
	v := newVerifiedRules(root)
	if !v.Known(digest("plan"), digest("kernel")) {
		t.Error("a learned pair is not known to the next reader")
	}
	for _, other := range [][2]string{{"plan", "other kernel"}, {"other plan", "kernel"}, {"kernel", "plan"}} {
		if v.Known(digest(other[0]), digest(other[1])) {
			t.Errorf("pair %v is known, never learned", other)
		}
	}

	for i := range maxVerifiedPairs + 4 {
		v.Learn(digest(fmt.Sprint("plan", i)), digest("kernel"))
	}
	v = newVerifiedRules(root)
	for i := range maxVerifiedPairs + 4 {
		if known, want := v.Known(digest(fmt.Sprint("plan", i)), digest("kernel")), i >= 4; known != want {
			t.Errorf("pair %d of %d known: %v, want %v (the newest %d stay)", i, maxVerifiedPairs+4, known, want, maxVerifiedPairs)
		}
	}

	path := filepath.Join(dir, VerifiedRulesFile)
	target := filepath.Join(t.TempDir(), "elsewhere")
	for name, plant := range map[string]func() error{
		"garbage": func() error { return os.WriteFile(path, []byte("{not json"), 0o644) },
		"symlink": func() error {
			if err := os.WriteFile(target, []byte(`{"pairs":[]}`), 0o644); err != nil {
				return err
			}
			return os.Symlink(target, path)
		},
	} {
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
		if err := plant(); err != nil {
			t.Fatal(err)
		}
		v := newVerifiedRules(root)
		if v.Known(digest("plan19"), digest("kernel")) {
			t.Errorf("%s: a pair is known", name)
		}
		v.Learn(digest("new"), digest("kernel"))
		if !newVerifiedRules(root).Known(digest("new"), digest("kernel")) {
			t.Errorf("%s: the pair learned after it is not known", name)
		}
		if st, err := os.Lstat(path); err != nil || !st.Mode().IsRegular() {
			t.Errorf("%s: %s is not a regular file now: %v", name, path, err)
		}
	}
	if b, err := os.ReadFile(target); err != nil || string(b) != `{"pairs":[]}` {
		t.Errorf("the symlink's target was written: %q, %v", b, err)
	}
}
