package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"text/tabwriter"

	"github.com/kubenet-dev/kubenet/core"
	"github.com/kubenet-dev/kubenet/network"
	"github.com/kubenet-dev/kubenet/network/kubenet"
)

// listAllocations reads kubenet's state directory for the network; it changes nothing.
func listAllocations(o *options) ([]core.Allocation, error) {
	return core.Allocations(o.dataDir, o.network)
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

// collectGarbage runs kubenet's GC with the valid list and reports what it removed.
func collectGarbage(o *options, stdout, stderr io.Writer) error {
	if len(o.valid) == 0 && !o.all {
		return usagef("gc needs --valid ID[/IFNAME] for the attachments to keep (the runtime's pod sandboxes), or --all to remove every attachment")
	}
	before, err := listAllocations(o)
	if err != nil {
		return err
	}
	kn, closePlugin, err := o.kubenetPlugin(stderr)
	if err != nil {
		return err
	}
	defer closePlugin()
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
			fmt.Fprintf(stdout, "released %s (container %s %s)\n", a.Address, a.ContainerID, a.IfName)
		}
	}
	return gcErr
}

// kubenetPlugin is an initialised kubenet plugin for operations that bypass the plugin manager
// and only remove state.
func (o *options) kubenetPlugin(stderr io.Writer) (*kubenet.Plugin, func(), error) {
	kn, _, _, closeAll, err := o.newKubenet(stderr)
	if err != nil {
		return nil, nil, err
	}
	if err := kn.Init(&cliHost{}, network.HairpinMode(o.hairpin), o.nonMasq, o.mtu); err != nil {
		closeAll()
		return nil, nil, err
	}
	// No pod CIDR event: it would reconcile the node (bridge, SNAT) to kubenetctl's flags, and
	// collecting garbage must not change the configuration of the pods that stay.
	return kn, closeAll, nil
}
