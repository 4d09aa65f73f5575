package agent

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubenet-dev/kubenet/agent/routes"
)

// Reasons of the Events the agent records on its own Node.
const (
	// EventPodCIDRRefused: the node's own pod CIDRs break a rule (CIDRRules, or claimed by
	// another Node too); no conflist is written for them.
	EventPodCIDRRefused = "KubenetPodCIDRRefused"
	// EventRouteRefused: another Node's pod CIDR gets no route from this node, for what the
	// Node object says (not for what the kernel answered: that is in the condition).
	EventRouteRefused = "KubenetRouteRefused"
	// EventPeerPath: the path to a peer's pod CIDR was chosen or changed (direct or through
	// the VXLAN overlay), with the reason.
	EventPeerPath = "KubenetPeerPath"
)

// nodeRef is how events refer to a Node (as kubelet does: the UID is the name).
func nodeRef(n *corev1.Node) *corev1.ObjectReference {
	return &corev1.ObjectReference{Kind: "Node", Name: n.Name, UID: types.UID(n.Name)}
}

// reportRefusedPodCIDRs records an Event when the reason the node's pod CIDRs are refused is
// new: every sync finds it again, the Event says it once.
func (a *Agent) reportRefusedPodCIDRs(self *corev1.Node, refused error) {
	msg := ""
	if refused != nil {
		msg = refused.Error()
	}
	a.mu.Lock()
	changed := msg != a.refusedOwn
	a.refusedOwn = msg
	a.mu.Unlock()
	if changed && msg != "" {
		a.events.Event(nodeRef(self), corev1.EventTypeWarning, EventPodCIDRRefused, "no conflist written: "+msg)
	}
}

// reportRefusedRoutes records an Event for each peer pod CIDR that newly gets no route.
func (a *Agent) reportRefusedRoutes(self *corev1.Node, unusable []routes.Failure) {
	current := make(map[string]bool, len(unusable))
	for _, f := range unusable {
		current[f.Error()] = true
	}
	a.mu.Lock()
	last := a.refusedRoutes
	a.refusedRoutes = current
	a.mu.Unlock()
	if self == nil {
		return
	}
	for _, f := range unusable {
		if msg := f.Error(); !last[msg] {
			a.events.Event(nodeRef(self), corev1.EventTypeWarning, EventRouteRefused, "no "+msg)
		}
	}
}

// maxPathEvents is how many paths the first sync reports one Event each for; more get one summary.
const maxPathEvents = 16

// reportPaths records an Event for each peer pod CIDR whose path is new or changed: direct or
// vxlan, and why. The agent's first sync reports every path once; a restarted agent reports them
// again (Events are not state).
func (a *Agent) reportPaths(self *corev1.Node, paths map[netip.Prefix]Path) {
	current := make(map[netip.Prefix]string, len(paths))
	for p, path := range paths {
		current[p] = path.Via
	}
	a.mu.Lock()
	last := a.reportedPaths
	a.reportedPaths = current
	a.mu.Unlock()
	if self == nil {
		return
	}
	if last == nil && len(paths) > maxPathEvents {
		// A large cluster's first sync: one Event, not one per CIDR (the API server would
		// get thousands; the event library's spam filter would drop most of them anyway).
		overlaid := 0
		for _, path := range paths {
			if path.Via == ViaVXLAN {
				overlaid++
			}
		}
		a.events.Event(nodeRef(self), corev1.EventTypeNormal, EventPeerPath, fmt.Sprintf(
			"paths to %d pod CIDRs of other nodes: %d direct, %d through the VXLAN overlay (kubenetctl peers lists each and why)",
			len(paths), len(paths)-overlaid, overlaid))
		return
	}
	for _, p := range slices.SortedFunc(maps.Keys(paths), comparePrefix) {
		path := paths[p]
		if last[p] == path.Via {
			continue
		}
		a.events.Event(nodeRef(self), corev1.EventTypeNormal, EventPeerPath,
			fmt.Sprintf("node %s's pod CIDR %s: %s (%s)", path.Node, p, describeVia(path), path.Reason))
	}
}

func describeVia(p Path) string {
	if p.Via == ViaVXLAN {
		return fmt.Sprintf("through the VXLAN overlay to %s", p.Underlay)
	}
	return fmt.Sprintf("direct via %s", p.NextHop)
}
