package hostport

import (
	"strings"
	"testing"
)

// TestOwnerComment: every owner survives the comment, and a hostile interface name never
// reaches it raw.
func TestOwnerComment(t *testing.T) {
	for _, o := range []Owner{ownerA, {ContainerID: "c", IfName: `e"th0`}, {ContainerID: "c", IfName: `x\y$z'`}, {ContainerID: "c", IfName: "x41"}, {ContainerID: "c", IfName: "ü"}} {
		c := ownerComment(o)
		if strings.ContainsAny(c, "\"'\\$ ") {
			t.Errorf("comment of %q is %q", o, c)
		}
		if back, ok := parseOwnerComment(c); !ok || back != o {
			t.Errorf("comment %q of %q reads back as %q, %v", c, o, back, ok)
		}
	}
	if _, ok := parseOwnerComment("c/x:zz"); ok {
		t.Error("a comment with bad hex read as an owner")
	}
}
