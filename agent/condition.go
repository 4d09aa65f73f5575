package agent

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/kubenet-dev/kubenet/agent/routes"
)

// Reasons of the NetworkUnavailable condition the agent sets.
const (
	// ReasonRoutesCreated: every route to the other nodes' pod CIDRs is in place (the route
	// controller's RouteCreated, under the agent's own name).
	ReasonRoutesCreated = "KubenetRoutesCreated"
	// ReasonRoutesIncomplete: some routes are missing, the message names them. The status stays
	// False: a node that reaches most of the cluster is not tainted away for one peer that is
	// misplaced, otherwise one bad node would make every node unschedulable.
	ReasonRoutesIncomplete = "KubenetRoutesIncomplete"
	// ReasonNoRoutes: the node has peers but a route to none of them (True: its pods reach no
	// other node's pods).
	ReasonNoRoutes = "KubenetNoRoutes"
)

// maxListed bounds the failures a condition message names; the log and the metrics have all.
const maxListed = 5

// Condition is the NetworkUnavailable condition's status, reason and message.
type Condition struct {
	Status  corev1.ConditionStatus
	Reason  string
	Message string
}

// RouteCondition derives the node's NetworkUnavailable condition from the route sync: the peers
// the node should reach and the routes that failed. The message depends on the failures only,
// never on how many peers there are: otherwise every node joining or leaving would make every
// agent of the cluster write its Node, N writes to the API server for one change.
func RouteCondition(peers []string, failures []routes.Failure, paths map[netip.Prefix]Path) Condition {
	if len(failures) == 0 {
		msg := "kubenet-agent: the routes to every other node's pod CIDRs are in place"
		overlaid := 0
		for _, p := range paths {
			if p.Via == ViaVXLAN {
				overlaid++
			}
		}
		if overlaid > 0 {
			msg += fmt.Sprintf(" (%d direct, %d through the VXLAN overlay)", len(paths)-overlaid, overlaid)
		}
		return Condition{corev1.ConditionFalse, ReasonRoutesCreated, msg}
	}
	failedPeers := map[string]bool{}
	for _, f := range failures {
		if f.Route.Node != "" {
			failedPeers[f.Route.Node] = true
		}
	}
	list := make([]string, 0, maxListed)
	for i, f := range failures {
		if i == maxListed {
			list = append(list, fmt.Sprintf("and %d more", len(failures)-maxListed))
			break
		}
		list = append(list, f.Error())
	}
	detail := strings.Join(list, "; ")
	reachable := slices.DeleteFunc(slices.Clone(peers), func(p string) bool { return failedPeers[p] })
	if len(peers) > 0 && len(reachable) == 0 {
		return Condition{corev1.ConditionTrue, ReasonNoRoutes,
			fmt.Sprintf("kubenet-agent: no route to any other node: %s", detail)}
	}
	return Condition{corev1.ConditionFalse, ReasonRoutesIncomplete,
		fmt.Sprintf("kubenet-agent: %d route(s) missing: %s", len(failures), detail)}
}
