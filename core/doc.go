// Package core is the kubenet network plugin's core: it validates a network configuration and
// sets up, checks and tears down one pod's attachment to the node's pod bridge. The CNI binary
// (cmd/kubenet), the kubelet-style NetworkPlugin (network/kubenet) and the node agent are thin
// faces over this package. It knows every mechanism package (bridge, ipam, hairpin, masq,
// hostport, shaping, isolation); none of them knows it, nor each other.
//
// One file per verb (add, del, check, gc, status); config.go and runtime.go validate the
// configuration and the runtime's capability arguments; attachment.go is the attachment record;
// mechanisms.go turns the core's Config into each mechanism's own config; lock.go is the network
// lock that guards reservations, records and the hostPort index.
//
// ADD reads as the pod's story: validate → reserve addresses → bridge and veth → isolation →
// hairpin → SNAT → host ports → shaping → result. Each per-attachment step pushes its undo on a
// stack, so a failure anywhere leaves nothing of the attachment behind. Node-wide state (the
// bridge, the SNAT and isolation chains, sysctls) is shared by all pods and is only ever
// reconciled, never undone.
package core
