package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kubenet-dev/kubenet/core"
	"github.com/kubenet-dev/kubenet/network"
	"github.com/kubenet-dev/kubenet/network/kubenet"
)

// listAllocations reads kubenet's state directory for the network; it changes nothing.
func listAllocations(o *options) ([]core.Allocation, error) {
	return core.Allocations(o.dataDir, o.network)
}

func runAllocations(in *invocation) error {
	allocs, err := listAllocations(in.o)
	if err != nil {
		return err
	}
	return printAllocations(in.stdout, allocs, in.o.json)
}
func printAllocations(w io.Writer, allocs []core.Allocation, asJSON bool) error {
	if asJSON {
		return json.NewEncoder(w).Encode(allocs)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ADDRESS\tCONTAINER\tIFNAME\tPOD\tRECORD")
	for _, a := range allocs {
		id := a.ContainerID
		if id == "" {
			id = "(unreadable)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%v\n", a.Address, id, a.IfName, a.Pod, a.Record)
	}
	return tw.Flush()
}

// validList is --valid: container IDs, optionally ID/IFNAME (default eth0), repeatable or
// comma-separated, so `--valid "$(crictl pods -q | paste -sd,)"` works.
type validList []core.ValidAttachment

func (l *validList) String() string { return fmt.Sprint(len(*l), " attachments") }

func (l *validList) Set(s string) error {
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		id, ifname, found := strings.Cut(item, "/")
		if !found {
			ifname = network.DefaultInterfaceName
		}
		if id == "" || ifname == "" {
			return fmt.Errorf("%q is not ID or ID/IFNAME", item)
		}
		*l = append(*l, core.ValidAttachment{ContainerID: id, IfName: ifname})
	}
	return nil
}

// runGC runs kubenet's GC with the valid list and reports what it removed.
func runGC(in *invocation) error {
	o := in.o
	if len(o.valid) == 0 && !o.all {
		return usagef("gc needs --valid ID[/IFNAME] for the attachments to keep (the runtime's pod sandboxes), or --all to remove every attachment")
	}
	if len(o.valid) > 0 && o.all {
		return usagef("gc takes --valid or --all, not both")
	}
	before, err := listAllocations(o)
	if err != nil {
		return err
	}
	logger, nodeNS, closeNS, err := o.environment(in.stderr)
	if err != nil {
		return err
	}
	defer closeNS()
	opts := o.kubenetOptions()
	opts.NodeNS, opts.Logger = nodeNS, logger
	kn := kubenet.New(opts)
	defer kn.Close()
	if err := kn.Init(&cliHost{}, network.HairpinMode(o.hairpin), o.nonMasq, o.mtu); err != nil {
		return usageError{err.Error()}
	}
	// No pod CIDR event: it would reconcile the node (bridge, SNAT) to kubenetctl's flags, and
	// collecting garbage must not change the configuration of the pods that stay.
	gcErr := kn.GC(o.valid)
	after, err := listAllocations(o)
	if err != nil {
		return err
	}
	still := map[netip.Addr]bool{}
	for _, a := range after {
		still[a.Address] = true
	}
	for _, a := range before {
		if !still[a.Address] {
			fmt.Fprintf(in.stdout, "released %s (container %s %s)\n", a.Address, a.ContainerID, a.IfName)
		}
	}
	return gcErr
}

// runNode prints the owner and the values of the network's node-wide settings, as recorded by
// whoever last applied them (a CNI configuration, a shim, kubenetctl).
func runNode(in *invocation) error {
	s, err := core.ReadNodeSettings(in.o.dataDir, in.o.network)
	if err != nil {
		return err
	}
	if s == nil {
		return fmt.Errorf("network %q in %s has no node-wide settings yet: nothing set the node up", in.o.network, in.o.dataDir)
	}
	backend, err := core.ReadNetfilterRecord(in.o.dataDir, in.o.network)
	if err != nil {
		return err
	}
	if in.o.json {
		return json.NewEncoder(in.stdout).Encode(struct {
			*core.NodeSettings
			Netfilter *core.BackendChoice `json:"netfilter,omitempty"`
		}{s, backend})
	}
	inUse := "not chosen yet (no pod since the choice)"
	if backend != nil {
		inUse = backend.String()
	}
	tw := tabwriter.NewWriter(in.stdout, 0, 4, 2, ' ', 0)
	for _, row := range [][2]any{
		{"owner", s.Owner}, {"bridge", s.Bridge}, {"podCIDRs", strings.Join(s.PodCIDRs, ",")},
		{"nonMasqueradeCIDRs", strings.Join(s.NonMasqueradeCIDRs, ",")}, {"mtu", s.MTU}, {"hairpinMode", s.HairpinMode},
		{"netfilterBackend", s.NetfilterBackend}, {"netfilter in use", inUse},
	} {
		fmt.Fprintf(tw, "%s\t%v\n", row[0], row[1])
	}
	return tw.Flush()
}

// peerPath is one row of the agent's /peers (agent.Path; kubenetctl does not link the agent).
type peerPath struct {
	Node     string `json:"node"`
	PodCIDR  string `json:"podCIDR"`
	Via      string `json:"via"`
	NextHop  string `json:"nextHop,omitempty"`
	Underlay string `json:"underlay,omitempty"`
	Reason   string `json:"reason"`
	Error    string `json:"error,omitempty"`
}

// maxPeersBody bounds what is read from the agent: a thousand nodes' paths are well under it.
const maxPeersBody = 16 << 20

func runPeers(in *invocation) error {
	u, err := url.Parse(in.o.agent)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return usagef("--agent %q: not an http(s) URL", in.o.agent)
	}
	client := &http.Client{Timeout: 10 * time.Second}
	resp, err := client.Get(u.JoinPath("peers").String())
	if err != nil {
		return fmt.Errorf("ask kubenet-agent for its peers: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxPeersBody))
	if err != nil {
		return fmt.Errorf("read kubenet-agent's peers: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("kubenet-agent's /peers: HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(body)))
	}
	var paths []peerPath
	if err := json.Unmarshal(body, &paths); err != nil {
		return fmt.Errorf("kubenet-agent's /peers: %w", err)
	}
	if in.o.json {
		return json.NewEncoder(in.stdout).Encode(paths)
	}
	tw := tabwriter.NewWriter(in.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tPOD CIDR\tVIA\tNEXT HOP\tUNDERLAY\tWHY")
	for _, p := range paths {
		via, why := p.Via, p.Reason
		if p.Error != "" {
			via, why = "none", p.Error
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", p.Node, p.PodCIDR, via, dash(p.NextHop), dash(p.Underlay), why)
	}
	return tw.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
