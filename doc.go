// Package kubenet is the core of the kubenet network plugin: it validates a network
// configuration and sets up, checks and tears down one pod's attachment to the node's pod
// bridge. The CNI binary (cmd/kubenet) and the kubelet-style NetworkPlugin (network/kubenet) are
// thin faces over this package.
//
// ADD reads as the pod's story: validate → reserve addresses → bridge and veth → hairpin → SNAT →
// host ports → shaping → result. Each per-attachment step pushes its undo on a stack, so a
// failure anywhere leaves nothing of the attachment behind. Node-wide state (the bridge, the SNAT
// chain, sysctls) is shared by all pods and is only ever reconciled, never undone.
package kubenet
