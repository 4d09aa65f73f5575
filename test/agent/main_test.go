//go:build kubenet_e2e_agent

// Package agent tests cmd/kubenet-agent against a real kube-apiserver and etcd: a simulated
// cluster of network namespaces on one underlay segment (a control-plane namespace running the
// API server, three node namespaces each running an agent), Node objects made through the API,
// pods attached through libcni with the conflist each agent wrote and the binary it installed.
//
// The build tag keeps it out of `go test ./...`: the API server is built from source the first
// time (minutes, about 2 GiB of memory; hack/kubernetes/build.sh, shared with `make
// e2e-kubernetes`). Run it with `make e2e-agent`.
package agent

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/kubenet-dev/kubenet/test/controlplane"
	"github.com/kubenet-dev/kubenet/test/nettest"
)

// bins are the binaries of this run; TestMain sets them before any test runs and only reads
// them afterwards.
type bins struct {
	pluginDir  string // holds the kubenet CNI binary the agents install
	agent      string
	ctl        string // kubenetctl
	kubernetes string // holds kube-apiserver and etcd (hack/kubernetes/build.sh)
}

var testBins bins

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "kubenet-agent-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := 1
	if err := build(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
	} else {
		code = m.Run()
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

func build(dir string) error {
	var err error
	if testBins.pluginDir, err = nettest.BuildPlugin(dir); err != nil {
		return err
	}
	if testBins.agent, err = nettest.BuildCommand(dir, "kubenet-agent"); err != nil {
		return err
	}
	if testBins.ctl, err = nettest.BuildCommand(dir, "kubenetctl"); err != nil {
		return err
	}
	// Cached outside the checkout, with the rest of the cluster's binaries: seconds when warm.
	testBins.kubernetes, err = controlplane.Build(filepath.Join("..", ".."), "kube-apiserver", "etcd")
	return err
}
