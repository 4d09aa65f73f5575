package cri

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/kubenet-dev/kubenet/agent/cri/critest"
)

func TestDialEndpoints(t *testing.T) {
	tests := []struct {
		endpoint string
		wantErr  string
	}{
		{endpoint: "unix:///run/containerd/containerd.sock"},
		{endpoint: "/run/crio/crio.sock"},
		{endpoint: "unix:///run/../run/x.sock"},
		{endpoint: "tcp://127.0.0.1:1234", wantErr: "only unix sockets"},
		{endpoint: "npipe:////./pipe/containerd", wantErr: "only unix sockets"},
		{endpoint: "run/containerd.sock", wantErr: "must be absolute"},
		{endpoint: "unix://relative.sock", wantErr: "must be absolute"},
		{endpoint: "", wantErr: "must be absolute"},
	}
	for _, tt := range tests {
		c, err := Dial(tt.endpoint)
		if tt.wantErr == "" {
			if err != nil {
				t.Errorf("Dial(%q) = %v", tt.endpoint, err)
				continue
			}
			c.Close()
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("Dial(%q) = %v, want an error mentioning %q", tt.endpoint, err, tt.wantErr)
		}
	}
}

// TestSandboxes: every sandbox the runtime lists counts, NOTREADY ones too, and nothing is
// filtered in the request; a runtime that errs or does not listen gives an error, not a list.
func TestSandboxes(t *testing.T) {
	dir := t.TempDir()
	socket := filepath.Join(dir, "cri.sock")
	srv := critest.Start(t, socket)
	c, err := Dial("unix://" + socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	srv.Set(nil,
		critest.Sandbox("ready-1", runtimeapi.PodSandboxState_SANDBOX_READY),
		critest.Sandbox("stopped-2", runtimeapi.PodSandboxState_SANDBOX_NOTREADY),
		critest.Sandbox("", runtimeapi.PodSandboxState_SANDBOX_READY))
	ids, err := c.Sandboxes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ids, []string{"ready-1", "stopped-2"}) {
		t.Errorf("Sandboxes = %q, want the READY and the NOTREADY one (and no empty ID)", ids)
	}
	if n, filters := srv.Listings(); n != 1 || filters[0] != nil {
		t.Errorf("%d listings with filters %v, want one without a filter", n, filters)
	}
	v, err := c.Version(ctx)
	if err != nil || v != "critest 1.0 (CRI v1)" {
		t.Errorf("Version = %q, %v", v, err)
	}

	srv.Set(nil)
	if ids, err := c.Sandboxes(ctx); err != nil || len(ids) != 0 {
		t.Errorf("an empty runtime: Sandboxes = %q, %v, want none and no error", ids, err)
	}

	// containerd answers this way while it is still loading its state after a restart.
	srv.Set(status.Error(codes.Unknown, "server is not initialized yet"))
	if ids, err := c.Sandboxes(ctx); err == nil || ids != nil || !strings.Contains(err.Error(), "not initialized") {
		t.Errorf("a runtime that is not initialised: Sandboxes = %q, %v, want an error", ids, err)
	}

	nobody, err := Dial(filepath.Join(dir, "nobody.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer nobody.Close()
	ids, err = nobody.Sandboxes(ctx)
	if err == nil || ids != nil || status.Code(errors.Unwrap(err)) != codes.Unavailable {
		t.Errorf("no runtime on the socket: Sandboxes = %q, %v, want Unavailable", ids, err)
	}
}
