package main

import (
	"fmt"

	"github.com/containernetworking/cni/pkg/types"
)

// PodArgs are the Kubernetes keys runtimes put in CNI_ARGS. kubenet keeps the pod's namespace and
// name in the attachment record so an operator can tell which pod holds an address.
// Field names are the wire names.
type PodArgs struct {
	types.CommonArgs
	K8S_POD_NAMESPACE          types.UnmarshallableString
	K8S_POD_NAME               types.UnmarshallableString
	K8S_POD_INFRA_CONTAINER_ID types.UnmarshallableString
	K8S_POD_UID                types.UnmarshallableString
}

// ParseCNIArgs reads CNI_ARGS ("K=V;K=V"). As with every reference plugin, keys kubenet does not
// know are an error unless IgnoreUnknown=1 is among them (all Kubernetes runtimes send it).
func ParseCNIArgs(s string) (PodArgs, error) {
	var args PodArgs
	if s == "" {
		return args, nil
	}
	if err := types.LoadArgs(s, &args); err != nil {
		return PodArgs{}, types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("CNI_ARGS %q: %v", s, err), "")
	}
	return args, nil
}

// Pod returns "namespace/name" when the runtime named the pod, else "".
func (a PodArgs) Pod() string {
	ns, name := string(a.K8S_POD_NAMESPACE), string(a.K8S_POD_NAME)
	switch {
	case name == "":
		return ""
	case ns == "":
		return name
	default:
		return fmt.Sprintf("%s/%s", ns, name)
	}
}
