package core

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"time"

	"github.com/kubenet-dev/kubenet/internal/policyrules"
	"github.com/kubenet-dev/kubenet/internal/safedir"
	"github.com/kubenet-dev/kubenet/netpol"
)

// PolicyStateFile, in the network's directory of the data dir, records what the agent's last
// successful policy pass installed for each local pod: the chains its map elements go to and
// the policies that isolate it, which the kernel cannot tell (a group is shared by every pod
// with the same allow list, whatever the policies behind it). Operators' tools (kubenetctl
// policy explain) read it next to the kernel, and trust it only where the kernel agrees.
// host-local ignores it (no container ID in it).
const PolicyStateFile = "kubenet-policy.json"

// PolicyState is the content of PolicyStateFile.
type PolicyState struct {
	// Generation counts the passes that wrote the file (it starts again at 1 when the file was
	// missing or unreadable).
	Generation uint64           `json:"generation"`
	Written    time.Time        `json:"written"`
	Pods       []PolicyStatePod `json:"pods"`
}

// PolicyStatePod is one local pod's policies as the pass installed them.
type PolicyStatePod struct {
	Port    int                  `json:"port"`
	Pod     string               `json:"pod"` // "namespace/name", or the attachment for a container that is no pod
	Ingress PolicyStateDirection `json:"ingress"`
	Egress  PolicyStateDirection `json:"egress"`
}

// PolicyStateDirection is one direction of a pod.
type PolicyStateDirection struct {
	Isolated bool `json:"isolated"`
	// Chain is what the port's map element names after the pass: a group, the direction's allow
	// chain, or "" (no element: held).
	Chain string `json:"chain,omitempty"`
	// Policies are the policies that isolate the pod in the direction ("namespace/name").
	Policies []string `json:"policies,omitempty"`
	// Refused says why the pass did not install the direction's allow list (the pod keeps what
	// it had, or is denied).
	Refused string `json:"refused,omitempty"`
}

// Bounds a PolicyStateFile must keep: what one node can have, with room.
const (
	maxPolicyStatePods     = 1 << 14
	maxPolicyStateNameLen  = 512
	maxPolicyStatePolicies = 1 << 12
)

// policyStateOf is what a pass that installed rs with the result res records. Pure.
func policyStateOf(rs policyrules.Ruleset, res policyrules.Applied, generation uint64, now time.Time) PolicyState {
	refused := map[bool]map[string]string{true: {}, false: {}}
	for _, r := range res.Refused {
		for _, p := range r.Pods {
			refused[r.Ingress][p] = r.Err.Error()
		}
	}
	st := PolicyState{Generation: generation, Written: now.UTC(), Pods: []PolicyStatePod{}}
	for _, p := range rs.Pods {
		if p.Port <= 0 {
			continue
		}
		d := res.Dispatch[p.Port]
		st.Pods = append(st.Pods, PolicyStatePod{Port: p.Port, Pod: p.Name,
			Ingress: PolicyStateDirection{Isolated: p.Ingress.Isolated, Chain: d.Ingress, Policies: p.Ingress.Policies, Refused: refused[true][p.Name]},
			Egress:  PolicyStateDirection{Isolated: p.Egress.Isolated, Chain: d.Egress, Policies: p.Egress.Policies, Refused: refused[false][p.Name]},
		})
	}
	return st
}

// writePolicyState records a successful pass, readable by root only (it names the node's pods
// and policies), replacing the file whole.
func writePolicyState(root *safedir.Dir, rs policyrules.Ruleset, res policyrules.Applied) error {
	generation := uint64(1)
	if prev, err := readPolicyState(root); err == nil && prev != nil {
		generation = prev.Generation + 1
	}
	data, err := json.Marshal(policyStateOf(rs, res, generation, time.Now()))
	if err != nil {
		return err
	}
	if err := root.WriteFile(PolicyStateFile, data, 0o600, false); err != nil {
		return fmt.Errorf("record the policy pass: %w", err)
	}
	return nil
}

// ReadPolicyState reads the network's PolicyStateFile from dataDir: nil when there is none (no
// pass yet, or NetworkPolicy is off). Anything but a small regular file holding a state the agent
// could have written is an error naming the file: it is never followed out of the directory.
func ReadPolicyState(dataDir, network string) (*PolicyState, error) {
	return readFromDir(dataDir, network, readPolicyState)
}

func readPolicyState(root *safedir.Dir) (*PolicyState, error) {
	data, err := root.ReadFile(PolicyStateFile)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("policy state %s: %w", root.Join(PolicyStateFile), err)
	}
	var st PolicyState
	if err := json.Unmarshal(data, &st); err != nil {
		return nil, fmt.Errorf("policy state %s is corrupt: %w", root.Join(PolicyStateFile), err)
	}
	if err := st.validate(); err != nil {
		return nil, fmt.Errorf("policy state %s is corrupt: %w", root.Join(PolicyStateFile), err)
	}
	return &st, nil
}

// validate checks what no pass writes: a port out of range or twice, names too long or of
// another kind than a chain's.
func (st *PolicyState) validate() error {
	if len(st.Pods) > maxPolicyStatePods {
		return fmt.Errorf("%d pods, more than %d", len(st.Pods), maxPolicyStatePods)
	}
	seen := map[int]bool{}
	for _, p := range st.Pods {
		if p.Port <= 0 || p.Port > 1<<31-1 || seen[p.Port] {
			return fmt.Errorf("pod %.64q: port %d out of range or twice", p.Pod, p.Port)
		}
		seen[p.Port] = true
		if len(p.Pod) > maxPolicyStateNameLen {
			return fmt.Errorf("port %d: a pod name of %d bytes", p.Port, len(p.Pod))
		}
		for _, d := range []struct {
			PolicyStateDirection
			open string
		}{{p.Ingress, netpol.ChainAllowIngress}, {p.Egress, netpol.ChainAllowEgress}} {
			if len(d.Policies) > maxPolicyStatePolicies {
				return fmt.Errorf("port %d: %d policies", p.Port, len(d.Policies))
			}
			for _, name := range append([]string{d.Chain, d.Refused}, d.Policies...) {
				if len(name) > maxPolicyStateNameLen {
					return fmt.Errorf("port %d: a name of %d bytes", p.Port, len(name))
				}
			}
			if _, group := netpol.GroupDirection(d.Chain); d.Chain != "" && d.Chain != d.open && !group {
				return fmt.Errorf("port %d: chain %.64q is no group or allow chain", p.Port, d.Chain)
			}
		}
	}
	return nil
}
