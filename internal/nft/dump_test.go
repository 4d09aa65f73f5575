package nft

import (
	"encoding/binary"
	"slices"
	"testing"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"
)

func keys(m map[string][]*nftables.Rule) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// TestAttrWalk: the attributes of a message come out in order with their flags stripped and
// their padding skipped; a length that leaves the message, or is shorter than a header, is an
// error; bytes too few for a header at the end are ignored, as netlink's own decoders do.
func TestAttrWalk(t *testing.T) {
	attr := func(kind uint16, value ...byte) []byte {
		b := binary.NativeEndian.AppendUint16(nil, uint16(unix.NLA_HDRLEN+len(value)))
		b = binary.NativeEndian.AppendUint16(b, kind)
		b = append(b, value...)
		for len(b)%unix.NLA_ALIGNTO != 0 {
			b = append(b, 0)
		}
		return b
	}
	type seen struct {
		kind  uint16
		value string
	}
	cases := []struct {
		name    string
		msg     []byte
		want    []seen
		wantErr bool
	}{
		{"empty", nil, nil, false},
		{"two with padding", slices.Concat(attr(1, 'a'), attr(2, 'b', 'c', 'd', 'e', 'f')), []seen{{1, "a"}, {2, "bcdef"}}, false},
		{"flags stripped", attr(unix.NLA_F_NESTED|3, 'x'), []seen{{3, "x"}}, false},
		{"trailing bytes", append(attr(1, 'a'), 0, 0), []seen{{1, "a"}}, false},
		{"length beyond the message", attr(1, 'a', 'b', 'c', 'd')[:6], nil, true},
		{"length below a header", append(attr(1, 'a'), 2, 0, 1, 0), []seen{{1, "a"}}, true},
		{"zero length", []byte{0, 0, 1, 0, 'a', 'b', 'c', 'd'}, nil, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := attrWalk{rest: c.msg}
			var got []seen
			for w.next() {
				got = append(got, seen{w.kind, string(w.value)})
			}
			if !slices.Equal(got, c.want) || (w.err != nil) != c.wantErr {
				t.Errorf("walk = %v, err %v; want %v, error %v", got, w.err, c.want, c.wantErr)
			}
		})
	}
}
