// Package criclient is the smallest CRI client the runtime tests need: it drives a container
// runtime's CRI socket (containerd's) the way kubelet does, through k8s.io/cri-api, for pod
// sandboxes and their containers. crictl would do the same, but it is not a Go module the
// module proxy serves, so the tests carry this instead.
package criclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Client talks CRI v1 to one runtime socket.
type Client struct {
	conn    *grpc.ClientConn
	Runtime runtimeapi.RuntimeServiceClient
	Images  runtimeapi.ImageServiceClient
}

// Dial connects to the runtime's unix socket. The connection is lazy: the first call (or
// WaitReady) finds out whether the runtime listens.
func Dial(socket string) (*Client, error) {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("CRI socket %s: %w", socket, err)
	}
	return &Client{conn: conn, Runtime: runtimeapi.NewRuntimeServiceClient(conn), Images: runtimeapi.NewImageServiceClient(conn)}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// WaitReady polls Version and Status until the runtime answers and reports both RuntimeReady
// and NetworkReady (the CRI plugin found a CNI configuration it can use, and a runtime that calls
// CNI STATUS got no error), or ctx ends. It
// returns the runtime's name and version.
func (c *Client) WaitReady(ctx context.Context) (string, error) {
	var last error
	for {
		v, err := c.Runtime.Version(ctx, &runtimeapi.VersionRequest{})
		if err == nil {
			err = c.ready(ctx)
		}
		if err == nil {
			return v.RuntimeName + " " + v.RuntimeVersion + " (CRI " + v.RuntimeApiVersion + ")", nil
		}
		last = err
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("runtime not ready: %w (last: %v)", ctx.Err(), last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (c *Client) ready(ctx context.Context) error {
	st, err := c.Runtime.Status(ctx, &runtimeapi.StatusRequest{})
	if err != nil {
		return err
	}
	// The two conditions kubelet requires; others are informational (containerd 2.2 adds
	// ContainerdHasNoDeprecationWarnings, false on a cgroup v1 machine such as this one).
	var notReady []error
	for _, typ := range []string{runtimeapi.RuntimeReady, runtimeapi.NetworkReady} {
		i := slices.IndexFunc(st.GetStatus().GetConditions(), func(c *runtimeapi.RuntimeCondition) bool { return c.Type == typ })
		switch {
		case i < 0:
			notReady = append(notReady, fmt.Errorf("no %s condition", typ))
		case !st.Status.Conditions[i].Status:
			c := st.Status.Conditions[i]
			notReady = append(notReady, fmt.Errorf("%s: %s %s", c.Type, c.Reason, c.Message))
		}
	}
	return errors.Join(notReady...)
}

// NetworkCondition returns the NetworkReady condition of the runtime's Status: what kubelet
// turns into the Node's Ready condition. A runtime that calls CNI STATUS (containerd 2) asks the
// plugin on every Status call.
func (c *Client) NetworkCondition(ctx context.Context) (*runtimeapi.RuntimeCondition, error) {
	st, err := c.Runtime.Status(ctx, &runtimeapi.StatusRequest{})
	if err != nil {
		return nil, fmt.Errorf("runtime status: %w", err)
	}
	for _, cond := range st.GetStatus().GetConditions() {
		if cond.Type == runtimeapi.NetworkReady {
			return cond, nil
		}
	}
	return nil, errors.New("the runtime's status has no NetworkReady condition")
}

// CNIVersions returns the cniVersion of each CNI network the runtime loaded, by name, from its
// verbose Status (containerd's "cniconfig": the version its libcni chose from the conflist's
// cniVersion and cniVersions).
func (c *Client) CNIVersions(ctx context.Context) (map[string]string, error) {
	st, err := c.Runtime.Status(ctx, &runtimeapi.StatusRequest{Verbose: true})
	if err != nil {
		return nil, fmt.Errorf("verbose runtime status: %w", err)
	}
	raw, ok := st.GetInfo()["cniconfig"]
	if !ok {
		return nil, errors.New("the verbose runtime status has no cniconfig")
	}
	var conf struct {
		Networks []struct {
			Config struct {
				Name       string
				CNIVersion string
			}
		}
	}
	if err := json.Unmarshal([]byte(raw), &conf); err != nil {
		return nil, fmt.Errorf("the verbose runtime status's cniconfig: %w", err)
	}
	out := map[string]string{}
	for _, n := range conf.Networks {
		out[n.Config.Name] = n.Config.CNIVersion
	}
	return out, nil
}

// RunPod runs a pod sandbox (its network set up by the CNI plugin) and returns its ID.
func (c *Client) RunPod(ctx context.Context, cfg *runtimeapi.PodSandboxConfig) (string, error) {
	r, err := c.Runtime.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: cfg})
	if err != nil {
		return "", fmt.Errorf("RunPodSandbox %s: %w", cfg.GetMetadata().GetName(), err)
	}
	return r.PodSandboxId, nil
}

// StartContainer creates a container in the pod and starts it, and returns its ID.
func (c *Client) StartContainer(ctx context.Context, podID string, pod *runtimeapi.PodSandboxConfig, cfg *runtimeapi.ContainerConfig) (string, error) {
	r, err := c.Runtime.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: podID, Config: cfg, SandboxConfig: pod})
	if err != nil {
		return "", fmt.Errorf("CreateContainer %s: %w", cfg.GetMetadata().GetName(), err)
	}
	if _, err := c.Runtime.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: r.ContainerId}); err != nil {
		return "", fmt.Errorf("StartContainer %s: %w", cfg.GetMetadata().GetName(), err)
	}
	return r.ContainerId, nil
}

// ContainerState returns the state of a container (CONTAINER_RUNNING, ...).
func (c *Client) ContainerState(ctx context.Context, id string) (runtimeapi.ContainerState, error) {
	r, err := c.Runtime.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
	if err != nil {
		return 0, fmt.Errorf("ContainerStatus %s: %w", id, err)
	}
	return r.GetStatus().GetState(), nil
}

// PodIPs returns the addresses the runtime reports for the pod: the primary one first, as
// kubelet would publish them in the pod's status.
func (c *Client) PodIPs(ctx context.Context, podID string) ([]netip.Addr, error) {
	r, err := c.Runtime.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: podID})
	if err != nil {
		return nil, fmt.Errorf("PodSandboxStatus %s: %w", podID, err)
	}
	network := r.GetStatus().GetNetwork()
	var out []netip.Addr
	for _, s := range append([]string{network.GetIp()}, ipStrings(network.GetAdditionalIps())...) {
		if s == "" {
			continue
		}
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("pod %s reports address %q: %w", podID, s, err)
		}
		out = append(out, a)
	}
	return out, nil
}

func ipStrings(ips []*runtimeapi.PodIP) []string {
	out := make([]string, 0, len(ips))
	for _, ip := range ips {
		out = append(out, ip.GetIp())
	}
	return out
}

// StopAndRemovePod stops the pod (its containers, then its network: CNI DEL) and removes it,
// as kubelet does when a pod is deleted.
func (c *Client) StopAndRemovePod(ctx context.Context, podID string) error {
	if _, err := c.Runtime.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: podID}); err != nil {
		return fmt.Errorf("StopPodSandbox %s: %w", podID, err)
	}
	if _, err := c.Runtime.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: podID}); err != nil {
		return fmt.Errorf("RemovePodSandbox %s: %w", podID, err)
	}
	return nil
}

// PodIDs lists the IDs of every pod sandbox the runtime knows.
func (c *Client) PodIDs(ctx context.Context) ([]string, error) {
	r, err := c.Runtime.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return nil, fmt.Errorf("ListPodSandbox: %w", err)
	}
	out := make([]string, 0, len(r.Items))
	for _, p := range r.Items {
		out = append(out, p.Id)
	}
	return out, nil
}

// ImageExists tells whether the runtime's image store has ref (as CRI sees it).
func (c *Client) ImageExists(ctx context.Context, ref string) (bool, error) {
	r, err := c.Images.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: ref}})
	if err != nil {
		return false, fmt.Errorf("ImageStatus %s: %w", ref, err)
	}
	return r.Image != nil, nil
}
