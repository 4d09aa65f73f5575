package agent

import (
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
