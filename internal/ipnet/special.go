package ipnet

import "net/netip"

// SpecialRange is an address range no pod network may overlap: the kernel or every router treats
// its addresses specially, so a pod given one could not be reached, or would take traffic that
// belongs to the node or to something beyond it.
type SpecialRange struct {
	Prefix netip.Prefix
	// What names the range in errors: "overlaps 127.0.0.0/8 (loopback)".
	What string
	// PodDestination: pods send to this range on purpose (a cloud's metadata service sits at a
	// link-local address), so leaving it out of masquerading is a meaningful choice.
	PodDestination bool
}

// specialRanges is read only through SpecialRanges, which hands out a copy. 240.0.0.0/4 is not
// among them: Linux routes it, and clusters short of private space use it for pods. Neither are
// documentation, shared (100.64.0.0/10) or unique-local ranges: they are ordinary unicast to the
// kernel.
var specialRanges = [...]SpecialRange{
	// RFC 1122 "this network": 0.0.0.0 is the unspecified address a socket binds to for "any";
	// the kernel never sends from or to the rest of it.
	{Prefix: netip.MustParsePrefix("0.0.0.0/8"), What: `"this network", holds the unspecified address`},
	// Every 127/8 address is the node's own, on lo: a pod there would be the node.
	{Prefix: netip.MustParsePrefix("127.0.0.0/8"), What: "loopback"},
	// Never routed beyond a link; the node's neighbours there (a cloud's metadata service, its
	// gateway) would be taken from it.
	{Prefix: netip.MustParsePrefix("169.254.0.0/16"), What: "link-local", PodDestination: true},
	// Group addresses: no host has one as its unicast address.
	{Prefix: netip.MustParsePrefix("224.0.0.0/4"), What: "multicast"},
	// The limited broadcast address: every host on the link takes what is sent to it.
	{Prefix: netip.MustParsePrefix("255.255.255.255/32"), What: "the limited broadcast address"},
	// :: (unspecified), ::1 (loopback) and the deprecated IPv4-compatible addresses (RFC 4291),
	// which the sit driver reads as IPv4 tunnel endpoints.
	{Prefix: netip.MustParsePrefix("::/96"), What: "the unspecified and loopback addresses and IPv4-compatible addresses"},
	// IPv4-mapped (RFC 4291): a dual-stack socket reads them as the IPv4 address inside.
	{Prefix: netip.MustParsePrefix("::ffff:0:0/96"), What: "IPv4-mapped addresses"},
	// IPv4-translated (RFC 2765): stateless translators read them as IPv4 hosts.
	{Prefix: netip.MustParsePrefix("::ffff:0:0:0/96"), What: "IPv4-translated addresses"},
	// The well-known NAT64 prefix (RFC 6052): the way to every IPv4 host from an IPv6-only pod.
	{Prefix: netip.MustParsePrefix("64:ff9b::/96"), What: "the NAT64 prefix"},
	// The local-use NAT64 prefix (RFC 8215), the same for a site's own translator.
	{Prefix: netip.MustParsePrefix("64:ff9b:1::/48"), What: "the local-use NAT64 prefix"},
	// Discard-only (RFC 6666): routers drop it on purpose, to black-hole attacks.
	{Prefix: netip.MustParsePrefix("100::/64"), What: "discard-only addresses"},
	// Never routed beyond a link; every interface has an address in it (the node's own bridge too).
	{Prefix: netip.MustParsePrefix("fe80::/10"), What: "link-local", PodDestination: true},
	// Group addresses, as 224.0.0.0/4.
	{Prefix: netip.MustParsePrefix("ff00::/8"), What: "multicast"},
}

// SpecialRanges returns the address ranges no pod network may overlap, the one list the plugin
// (pod CIDRs in its configuration) and the agent (pod CIDRs and addresses of Nodes) check
// against. The slice is the caller's own.
func SpecialRanges() []SpecialRange {
	list := specialRanges
	return list[:]
}

// OverlappingSpecial returns the first special range p overlaps, if any.
func OverlappingSpecial(p netip.Prefix) (SpecialRange, bool) {
	for _, r := range specialRanges {
		if p.Overlaps(r.Prefix) {
			return r, true
		}
	}
	return SpecialRange{}, false
}

// SpecialHolding returns the special range a is in, if any.
func SpecialHolding(a netip.Addr) (SpecialRange, bool) {
	for _, r := range specialRanges {
		if r.Prefix.Contains(a) {
			return r, true
		}
	}
	return SpecialRange{}, false
}
