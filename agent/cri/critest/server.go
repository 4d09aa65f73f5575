// Package critest is a CRI runtime service for tests: it answers Version and ListPodSandbox on
// a unix socket with what the test sets, and counts the listings, so that code which asks a
// runtime for its sandboxes can be tested without one.
package critest

import (
	"context"
	"net"
	"sync"
	"testing"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Server is a fake runtime. Its zero sandboxes list is an empty, successful answer.
type Server struct {
	runtimeapi.UnimplementedRuntimeServiceServer

	mu        sync.Mutex
	sandboxes []*runtimeapi.PodSandbox
	err       error
	listings  int
	filters   []*runtimeapi.PodSandboxFilter
}

// Start serves a new Server on socket until the test ends.
func Start(t testing.TB, socket string) *Server {
	t.Helper()
	l, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{}
	g := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(g, s)
	go func() { _ = g.Serve(l) }()
	t.Cleanup(g.Stop)
	return s
}

// Sandbox is a sandbox with an ID and a state, as ListPodSandbox reports it.
func Sandbox(id string, state runtimeapi.PodSandboxState) *runtimeapi.PodSandbox {
	return &runtimeapi.PodSandbox{Id: id, State: state, Metadata: &runtimeapi.PodSandboxMetadata{Name: id, Namespace: "default", Uid: id}}
}

// Set makes ListPodSandbox answer sandboxes, or err when it is not nil.
func (s *Server) Set(err error, sandboxes ...*runtimeapi.PodSandbox) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sandboxes, s.err = sandboxes, err
}

// Listings returns how many ListPodSandbox calls were answered, with an error or not, and
// the filters they carried.
func (s *Server) Listings() (int, []*runtimeapi.PodSandboxFilter) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.listings, s.filters
}

// Version answers as a runtime named "critest".
func (s *Server) Version(context.Context, *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	return &runtimeapi.VersionResponse{Version: "0.1.0", RuntimeName: "critest", RuntimeVersion: "1.0", RuntimeApiVersion: "v1"}, nil
}

// ListPodSandbox answers what Set last set.
func (s *Server) ListPodSandbox(_ context.Context, r *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.listings++
	s.filters = append(s.filters, r.GetFilter())
	if s.err != nil {
		return nil, s.err
	}
	return &runtimeapi.ListPodSandboxResponse{Items: s.sandboxes}, nil
}
