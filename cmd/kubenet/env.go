package main

import (
	"fmt"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/utils"
)

// checkEnv runs the same checks skel applies to CNI_CONTAINERID and CNI_IFNAME, but names the
// variable and its value in the message: an operator reading "interface name contains / or :"
// in a runtime log should not have to guess which value was wrong.
func checkEnv(getenv func(string) string) *types.Error {
	checks := []struct {
		name  string
		valid func(string) *types.Error
	}{
		{"CNI_CONTAINERID", utils.ValidateContainerID},
		{"CNI_IFNAME", utils.ValidateInterfaceName},
	}
	for _, c := range checks {
		v := getenv(c.name)
		if v == "" {
			continue // skel reports missing variables for the verbs that need them
		}
		if err := c.valid(v); err != nil {
			return types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("%s %q: %s", c.name, v, err.Msg), err.Details)
		}
	}
	return nil
}
