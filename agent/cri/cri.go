// Package cri asks the node's container runtime, over its CRI socket, which pod sandboxes exist.
// kubenet-agent needs no more of CRI than that: the runtime's list of sandboxes is the truth
// about which pods still hold an attachment.
package cri

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// DefaultEndpoint is containerd's CRI socket, as kubelet's --container-runtime-endpoint names it.
const DefaultEndpoint = "unix:///run/containerd/containerd.sock"

// maxMessage bounds one answer of the runtime; kubelet allows the same 16 MiB.
const maxMessage = 16 << 20

// Client talks CRI v1 to one runtime.
type Client struct {
	endpoint string
	conn     *grpc.ClientConn
	runtime  runtimeapi.RuntimeServiceClient
}

// Dial prepares a client for endpoint: "unix:///path" or an absolute socket path. Nothing is
// sent yet: the connection is made, and remade after a runtime restart, by the calls.
func Dial(endpoint string) (*Client, error) {
	path, ok := strings.CutPrefix(endpoint, "unix://")
	if !ok && strings.Contains(endpoint, "://") {
		return nil, fmt.Errorf("CRI endpoint %q: only unix sockets are supported", endpoint)
	}
	if !filepath.IsAbs(path) {
		return nil, fmt.Errorf("CRI endpoint %q: the socket path must be absolute", endpoint)
	}
	conn, err := grpc.NewClient("unix://"+filepath.Clean(path),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMessage)))
	if err != nil {
		return nil, fmt.Errorf("CRI endpoint %q: %w", endpoint, err)
	}
	return &Client{endpoint: endpoint, conn: conn, runtime: runtimeapi.NewRuntimeServiceClient(conn)}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Endpoint is the endpoint the client was made for.
func (c *Client) Endpoint() string { return c.endpoint }

// Version returns the runtime's name and version, for the log.
func (c *Client) Version(ctx context.Context) (string, error) {
	v, err := c.runtime.Version(ctx, &runtimeapi.VersionRequest{})
	if err != nil {
		return "", fmt.Errorf("CRI Version at %s: %w", c.endpoint, err)
	}
	return fmt.Sprintf("%s %s (CRI %s)", v.RuntimeName, v.RuntimeVersion, v.RuntimeApiVersion), nil
}

// Sandboxes returns the IDs of every pod sandbox the runtime knows, in any state: a sandbox
// that is NOTREADY (stopped, or recovered after a reboot) still owns its network until the
// runtime tears it down with a CNI DEL. A runtime that cannot answer (not running, still
// loading its state) is an error, never an empty list.
func (c *Client) Sandboxes(ctx context.Context) ([]string, error) {
	// No filter: a filter on state would hide the NOTREADY ones.
	r, err := c.runtime.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return nil, fmt.Errorf("CRI ListPodSandbox at %s: %w", c.endpoint, err)
	}
	ids := make([]string, 0, len(r.GetItems()))
	for _, s := range r.GetItems() {
		if s.GetId() != "" {
			ids = append(ids, s.GetId())
		}
	}
	return ids, nil
}
