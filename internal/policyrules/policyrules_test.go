package policyrules

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
)

func rng(first, last string) Range {
	return Range{First: netip.MustParseAddr(first), Last: netip.MustParseAddr(last)}
}

func TestMergeRanges(t *testing.T) {
	tests := []struct {
		name string
		in   []Range
		want string
	}{
		{"none", nil, "[]"},
		{"one", []Range{rng("10.0.0.1", "10.0.0.9")}, "[10.0.0.1-10.0.0.9]"},
		{"unsorted, disjoint", []Range{rng("10.0.0.20", "10.0.0.29"), rng("10.0.0.1", "10.0.0.9")}, "[10.0.0.1-10.0.0.9 10.0.0.20-10.0.0.29]"},
		{"overlapping", []Range{rng("10.0.0.1", "10.0.0.9"), rng("10.0.0.5", "10.0.0.20")}, "[10.0.0.1-10.0.0.20]"},
		{"adjacent", []Range{rng("10.0.0.10", "10.0.0.19"), rng("10.0.0.1", "10.0.0.9")}, "[10.0.0.1-10.0.0.19]"},
		{"one address apart", []Range{rng("10.0.0.1", "10.0.0.9"), rng("10.0.0.11", "10.0.0.19")}, "[10.0.0.1-10.0.0.9 10.0.0.11-10.0.0.19]"},
		{"nested", []Range{rng("10.0.0.0", "10.0.0.255"), rng("10.0.0.5", "10.0.0.6")}, "[10.0.0.0-10.0.0.255]"},
		{"up to the last address", []Range{rng("255.255.255.0", "255.255.255.255"), rng("255.255.255.255", "255.255.255.255")}, "[255.255.255.0-255.255.255.255]"},
		{"IPv6 adjacent", []Range{Single(netip.MustParseAddr("fd00::1")), Single(netip.MustParseAddr("fd00::2"))}, "[fd00::1-fd00::2]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := append([]Range(nil), tt.in...)
			if got := fmt.Sprint(MergeRanges(tt.in)); got != tt.want {
				t.Errorf("MergeRanges = %s, want %s", got, tt.want)
			}
			if fmt.Sprint(in) != fmt.Sprint(tt.in) {
				t.Errorf("MergeRanges changed its input: %v", tt.in)
			}
		})
	}
}

func TestRangeValid(t *testing.T) {
	tests := []struct {
		r    Range
		want bool
	}{
		{rng("10.0.0.1", "10.0.0.1"), true},
		{rng("10.0.0.1", "10.0.0.2"), true},
		{rng("10.0.0.2", "10.0.0.1"), false},
		{rng("10.0.0.1", "fd00::1"), false},
		{rng("::ffff:10.0.0.1", "::ffff:10.0.0.2"), false},
		{Range{}, false},
		{PrefixRange(netip.MustParsePrefix("10.1.2.3/24")), true},
	}
	for _, tt := range tests {
		if got := tt.r.Valid(); got != tt.want {
			t.Errorf("%v.Valid() = %v, want %v", tt.r, got, tt.want)
		}
	}
	if got := PrefixRange(netip.MustParsePrefix("10.1.2.3/24")); got != rng("10.1.2.0", "10.1.2.255") {
		t.Errorf("PrefixRange = %v, want the masked network", got)
	}
}

func TestEntryEqual(t *testing.T) {
	p1 := &Ports{Protocol: TCP, First: 80, Last: 80}
	p2 := &Ports{Protocol: TCP, First: 80, Last: 80}
	udp := &Ports{Protocol: UDP, First: 80, Last: 80}
	a, b := Single(netip.MustParseAddr("10.0.0.1")), Single(netip.MustParseAddr("10.0.0.2"))
	tests := []struct {
		name string
		x, y Entry
		want bool
	}{
		{"same peer, any port", Entry{Peer: a}, Entry{Peer: a}, true},
		{"equal ports behind other pointers", Entry{Peer: a, Ports: p1}, Entry{Peer: a, Ports: p2}, true},
		{"other peer", Entry{Peer: a}, Entry{Peer: b}, false},
		{"any port against one port", Entry{Peer: a}, Entry{Peer: a, Ports: p1}, false},
		{"other protocol", Entry{Peer: a, Ports: p1}, Entry{Peer: a, Ports: udp}, false},
	}
	for _, tt := range tests {
		if got := tt.x.Equal(tt.y); got != tt.want {
			t.Errorf("%s: Equal = %v, want %v", tt.name, got, tt.want)
		}
	}
	if got := fmt.Sprint(Ports{Protocol: SCTP, First: 1, Last: 9}, " ", *p1, " ", Ports{Protocol: 99, First: 7, Last: 7}); got != "sctp/1-9 tcp/80 99/7" {
		t.Errorf("Ports.String = %q", got)
	}
}

func TestDirectionAllows(t *testing.T) {
	addr := netip.MustParseAddr
	tcp80 := &Ports{Protocol: TCP, First: 80, Last: 80}
	tcpAll := &Ports{Protocol: TCP, First: 0, Last: 65535}
	udpRange := &Ports{Protocol: UDP, First: 5000, Last: 5010}
	d := Direction{Isolated: true, Allow: []Entry{
		{Peer: rng("10.0.0.0", "10.0.0.255"), Ports: tcp80},
		{Peer: Single(addr("10.1.0.1")), Ports: nil},
		{Peer: rng("fd00::", "fd00::ff"), Ports: udpRange},
		{Peer: Single(addr("10.2.0.1")), Ports: tcpAll},
	}}
	tests := []struct {
		name     string
		d        Direction
		peer     string
		protocol uint8
		port     uint16
		want     bool
	}{
		{"not isolated allows all", Direction{}, "192.0.2.1", TCP, 1, true},
		{"isolated, nothing allowed", Direction{Isolated: true}, "10.0.0.1", TCP, 80, false},
		{"audit (staged policies only) allows all", Direction{Isolated: true, Audit: true}, "10.0.0.1", TCP, 80, true},
		{"peer and port in", d, "10.0.0.7", TCP, 80, true},
		{"port out", d, "10.0.0.7", TCP, 81, false},
		{"protocol out", d, "10.0.0.7", UDP, 80, false},
		{"peer out", d, "10.0.1.7", TCP, 80, false},
		{"no ports: every protocol", d, "10.1.0.1", SCTP, 9, true},
		{"no ports: ICMP", d, "10.1.0.1", 1, 0, true},
		{"port rule never ICMP", d, "10.0.0.7", 1, 0, false},
		{"range first", d, "fd00::1", UDP, 5000, true},
		{"range last", d, "fd00::ff", UDP, 5010, true},
		{"range past", d, "fd00::1", UDP, 5011, false},
		{"family differs", d, "::ffff:10.1.0.2", TCP, 80, false},
		{"mapped address counts as IPv4", d, "::ffff:10.1.0.1", TCP, 80, true},
		{"every port includes 0", d, "10.2.0.1", TCP, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.d.Allows(addr(tt.peer), tt.protocol, tt.port); got != tt.want {
				t.Errorf("Allows(%s, %d, %d) = %v, want %v", tt.peer, tt.protocol, tt.port, got, tt.want)
			}
		})
	}
}

func TestParseProtocol(t *testing.T) {
	for _, c := range []struct {
		in   string
		want uint8
		err  bool
	}{
		{"tcp", TCP, false}, {"UDP", UDP, false}, {"sctp", SCTP, false}, {"icmp", ICMP, false}, {"ICMPv6", ICMPv6, false},
		{"6", TCP, false}, {"47", 47, false}, {"0", 0, false},
		{"256", 0, true}, {"-1", 0, true}, {"tcpx", 0, true}, {"", 0, true},
	} {
		got, err := ParseProtocol(c.in)
		if (err != nil) != c.err || (!c.err && got != c.want) {
			t.Errorf("ParseProtocol(%q) = %d, %v; want %d, error %v", c.in, got, err, c.want, c.err)
		}
		if err != nil && !strings.Contains(err.Error(), `"`+c.in+`"`) {
			t.Errorf("ParseProtocol(%q): error %q does not name the value", c.in, err)
		}
		if !c.err && c.in != "0" && c.in != "47" && c.in != "6" && !strings.EqualFold(ProtocolName(got), c.in) {
			t.Errorf("ProtocolName(%d) = %q, want %q", got, ProtocolName(got), c.in)
		}
	}
}
