// Package kubenet is the root of the kubenet module: a kubenet-style bridge network plugin for
// Kubernetes nodes. The code lives in the packages below it, in layers that only call downwards:
//
//	cmd/kubenet, cmd/kubenetctl, cmd/kubenet-agent    binaries
//	network/, agent/                                  kubelet's NetworkPlugin layer; the node agent
//	core/                                             the plugin's verbs over the mechanisms
//	bridge/ ipam/ hairpin/ masq/ hostport/ shaping/   one kernel mechanism each
//	isolation/ netpol/ overlay/
//	internal/                                         small shared helpers
//
// docs/architecture.md says where each kind of change goes.
package kubenet
