// Package ipam is a host-local compatible address allocator for the node's pod CIDRs.
//
// The on-disk layout is the one of the reference host-local IPAM plugin, so a node can switch
// between the two (or run both) without losing reservations:
//
//	<dataDir>/<network>/lock                  flock(2) taken around every change (internal/statedir)
//	<dataDir>/<network>/last_reserved_ip.<N>  round-robin cursor of range set N
//	<dataDir>/<network>/<address>             one file per reservation: "<containerID>\r\n<ifname>"
//
// Two things differ from host-local, both invisible to it: a reservation file is made to appear
// complete (written to a temporary name, synced, then hard-linked to its address name), so a crash
// never leaves an empty file that leaks the address; and Release looks at the addresses the caller
// says it holds before falling back to reading the whole directory.
package ipam
