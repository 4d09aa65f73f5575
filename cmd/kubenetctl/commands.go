package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/kubenet-dev/kubenet/core"
	"github.com/kubenet-dev/kubenet/network"
	"github.com/kubenet-dev/kubenet/network/kubenet"
	"github.com/kubenet-dev/kubenet/network/plugins"
)

// command is one row of kubenetctl's command table.
type command struct {
	name string
	// args names the positional arguments; a run must give exactly these.
	args []string
	// flags are the per-command flags the command takes (the global ones are for every command).
	flags []string
	// needsNetns: --netns is required.
	needsNetns bool
	// synopsis follows the name on the usage line; summary explains the command.
	synopsis, summary string
	run               func(*invocation) error
}

// invocation is one run of a command: the flags, the positional arguments, the output.
type invocation struct {
	o              *options
	args           []string
	stdout, stderr io.Writer
}

// commands is the table of every command, in the order the usage text lists them.
func commands() []command {
	pod := []string{"NAMESPACE", "NAME"}
	return []command{
		{
			name: "setup", args: pod, needsNetns: true, flags: []string{"netns", "id", "port", "annotation", "json"},
			synopsis: "NAMESPACE NAME --netns PATH [--port HOSTPORT:CONTAINERPORT[/PROTO][@HOSTIP]]... [--annotation K=V]... [--json]",
			summary:  "attach the pod sandbox whose network namespace is PATH and print its IPs (on failure, tear down what was done, as the kubelet shim does)",
			run:      runSetup,
		},
		{
			name: "teardown", args: pod, needsNetns: true, flags: []string{"netns", "id"},
			synopsis: "NAMESPACE NAME --netns PATH",
			summary:  "remove the pod sandbox's network (PATH may be gone already)",
			run:      runTeardown,
		},
		{
			name: "status", args: pod, needsNetns: true, flags: []string{"netns", "id", "json"},
			synopsis: "NAMESPACE NAME --netns PATH [--json]",
			summary:  "print the pod's IPs",
			run:      runStatus,
		},
		{
			name: "ready", synopsis: "", summary: "fail with the reason while the plugin cannot set up pods",
			run: runReady,
		},
		{
			name: "allocations", flags: []string{"json"}, synopsis: "[--json]",
			summary: "list kubenet's reserved addresses with their container, interface, pod and whether kubenet has a record of them (reads only)",
			run:     runAllocations,
		},
		{
			name: "gc", flags: []string{"valid", "all"}, synopsis: "(--valid ID[/IFNAME]... | --all)",
			summary: `remove every kubenet attachment not listed with --valid (e.g. --valid "$(crictl pods -q | paste -sd,)"), including reservations nobody holds any more`,
			run:     runGC,
		},
		{
			name: "node", flags: []string{"json"}, synopsis: "[--json]",
			summary: "print who owns kubenet's node-wide settings, what they are, and which netfilter backend holds the node's rules and why (reads only)",
			run:     runNode,
		},
		{
			name: "peers", flags: []string{"agent", "json"}, synopsis: "[--agent URL] [--json]",
			summary: "print how kubenet-agent reaches each other node's pod CIDRs: direct or through the VXLAN overlay, the next hop, and why (asks the agent)",
			run:     runPeers,
		},
		{
			name: "policy explain", args: []string{"NAMESPACE/POD"}, flags: []string{"json", "o", "kubeconfig"}, synopsis: "NAMESPACE/POD [--kubeconfig FILE] [-o text|json]",
			summary: "print, read back from the kernel, whether a pod of this node is isolated in each direction, by which policies, and the peers and ports it allows; say when the kernel differs from the agent's last pass or the pod is held, and with --kubeconfig from what the API's objects mean now (reads only; works with the agent down)",
			run:     runPolicyExplain,
		},
		{
			name: "policy trace", args: []string{"SRC", "DST", "PORT/PROTO"}, flags: []string{"json", "o"}, synopsis: "SRC DST PORT/PROTO [-o text|json]",
			summary: "say whether the installed policies allow a new connection from SRC to DST (NAMESPACE/POD of this node, or an address) on PORT/PROTO (8080/tcp, 53/udp, icmp), and which rule or missing rule decides (reads only)",
			run:     runPolicyTrace,
		},
	}
}

func findCommand(name string) (command, bool) {
	i := slices.IndexFunc(commands(), func(c command) bool { return c.name == name })
	if i < 0 {
		return command{}, false
	}
	return commands()[i], true
}

func commandNames() string {
	var names []string
	for _, c := range commands() {
		names = append(names, c.name)
	}
	return strings.Join(names, ", ")
}

// execute parses the command line, checks it against the command's row and runs the command.
func execute(args []string, stdout, stderr io.Writer) error {
	var o options
	fs := newFlagSet(&o)
	pos, err := parse(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		printUsage(fs, stdout)
		return nil
	}
	if err != nil {
		return usageError{err.Error()}
	}
	if len(pos) == 0 {
		return usagef("missing command (%s)", commandNames())
	}
	name := pos[0]
	if name == "policy" && len(pos) > 1 {
		name, pos = name+" "+pos[1], pos[1:]
	}
	cmd, ok := findCommand(name)
	if !ok {
		return usagef("unknown command %q (%s)", name, commandNames())
	}
	pos = pos[1:]
	if err := checkCommandFlags(fs, cmd); err != nil {
		return err
	}
	if len(pos) != len(cmd.args) {
		if len(cmd.args) == 0 {
			return usagef("%s takes no arguments", cmd.name)
		}
		return usagef("%s needs %s, got %d argument(s)", cmd.name, strings.Join(cmd.args, " "), len(pos))
	}
	if cmd.needsNetns && o.netns == "" {
		return usagef("%s needs --netns PATH", cmd.name)
	}
	if err := o.validate(); err != nil {
		return err
	}
	return cmd.run(&invocation{o: &o, args: pos, stdout: stdout, stderr: stderr})
}

// pod is the sandbox of a pod command: its namespace, name and ID.
func (in *invocation) pod() podRef {
	return podRef{namespace: in.args[0], name: in.args[1], id: network.ContainerID{Type: "kubenetctl", ID: sandboxID(in.o.netns, in.o.id)}}
}

func runSetup(in *invocation) error {
	return in.withPlugin(func(pm *network.PluginManager) error {
		pod := in.pod()
		if err := pm.SetUpPod(pod.namespace, pod.name, pod.id, in.o.annotations, nil); err != nil {
			// As the shim does: undo whatever part of the set-up happened.
			if terr := pm.TearDownPod(pod.namespace, pod.name, pod.id); terr != nil {
				err = fmt.Errorf("%w (and tearing down failed: %v)", err, terr)
			}
			return err
		}
		return printStatus(in.stdout, pm, pod, in.o.json)
	})
}

func runTeardown(in *invocation) error {
	return in.withPlugin(func(pm *network.PluginManager) error {
		pod := in.pod()
		return pm.TearDownPod(pod.namespace, pod.name, pod.id)
	})
}

func runStatus(in *invocation) error {
	return in.withPlugin(func(pm *network.PluginManager) error {
		return printStatus(in.stdout, pm, in.pod(), in.o.json)
	})
}

func runReady(in *invocation) error {
	return in.withPlugin(func(pm *network.PluginManager) error {
		if err := pm.Status(); err != nil {
			return fmt.Errorf("network plugin %q is not ready: %w", pm.PluginName(), err)
		}
		fmt.Fprintf(in.stdout, "network plugin %q is ready\n", pm.PluginName())
		if pm.PluginName() == kubenet.PluginName {
			if rec, err := core.ReadNetfilterRecord(in.o.dataDir, in.o.network); err == nil && rec != nil {
				fmt.Fprintf(in.stdout, "netfilter backend: %s\n", rec)
			}
		}
		return nil
	})
}

type podRef struct {
	namespace, name string
	id              network.ContainerID
}

// sandboxID is id, or one derived from the absolute netns path (stable, so teardown finds what
// setup created; cnitool does the same).
func sandboxID(netns, id string) string {
	if id != "" {
		return id
	}
	abs, err := filepath.Abs(netns)
	if err != nil {
		abs = netns
	}
	sum := sha256.Sum256([]byte(abs))
	return "kubenetctl-" + hex.EncodeToString(sum[:12])
}

func printStatus(w io.Writer, pm *network.PluginManager, pod podRef, asJSON bool) error {
	st, err := pm.GetPodNetworkStatus(pod.namespace, pod.name, pod.id)
	if err != nil {
		return err
	}
	if st == nil {
		return fmt.Errorf("network plugin %q does not know the addresses of pod %s/%s", pm.PluginName(), pod.namespace, pod.name)
	}
	if asJSON {
		return json.NewEncoder(w).Encode(st)
	}
	for _, ip := range st.IPs {
		fmt.Fprintln(w, ip)
	}
	return nil
}

// withPlugin probes the plugins as kubelet did, selects one by --network-plugin, sends the pod
// CIDR event, wraps the plugin in a PluginManager for f and releases everything afterwards.
// InitNetworkPlugin only fails on the flags' values (an unknown plugin, a bad hairpin mode,
// non-masquerade CIDR or MTU), so its error is a usage error.
func (in *invocation) withPlugin(f func(*network.PluginManager) error) error {
	o := in.o
	logger, nodeNS, closeNS, err := o.environment(in.stderr)
	if err != nil {
		return err
	}
	defer closeNS()
	all := plugins.Probe(plugins.Options{
		CNIConfDir: o.confDir, CNIBinDirs: network.SplitList(o.binDirs), CNICacheDir: o.cacheDir,
		NodeNS: nodeNS, Logger: logger, Kubenet: o.kubenetOptions(),
	})
	defer plugins.Close(all)
	host := &cliHost{netns: o.netns, ports: o.ports}
	plugin, err := network.InitNetworkPlugin(all, o.plugin, host, network.HairpinMode(o.hairpin), o.nonMasq, o.mtu)
	if err != nil {
		return usageError{err.Error()}
	}
	if o.podCIDR != "" {
		plugin.Event(network.PodCIDRChangeEvent, map[string]interface{}{network.PodCIDRChangeDetailCIDR: o.podCIDR})
	}
	pm, err := network.NewPluginManager(plugin, nil)
	if err != nil {
		return err
	}
	return f(pm)
}

// kubenetOptions are the kubenet plugin's options from the flags. A one-shot command does not
// hold host ports: its sockets would close at exit, and a long-lived shim holds them.
func (o *options) kubenetOptions() kubenet.Options {
	return kubenet.Options{
		DataDir: o.dataDir, Network: o.network, Bridge: o.bridge,
		SkipPortReacquire: true, Owner: Owner, TakeOverNode: o.takeOver, NetfilterBackend: o.netfilter,
	}
}

// Owner is kubenetctl's name as the owner of node-wide settings it applies.
const Owner = "kubenetctl"

// environment opens what every plugin command needs: the logger the flags ask for and the node
// namespace (--node-netns; nil without it), with the function that closes the namespace.
func (o *options) environment(stderr io.Writer) (*slog.Logger, ns.NetNS, func(), error) {
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: o.level}))
	if o.nodeNetns == "" {
		return logger, nil, func() {}, nil
	}
	n, err := ns.GetNS(o.nodeNetns)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("--node-netns: %w", err)
	}
	return logger, n, func() { _ = n.Close() }, nil
}

// cliHost is the Host of one command: the sandbox is --netns, its host ports --port.
type cliHost struct {
	netns string
	ports []*network.PortMapping
}

func (h *cliHost) GetNetNS(string) (string, error) {
	if _, err := os.Stat(h.netns); err != nil {
		return "", fmt.Errorf("network namespace %s: %w", h.netns, err)
	}
	return h.netns, nil
}

func (h *cliHost) GetPodPortMappings(string) ([]*network.PortMapping, error) { return h.ports, nil }
