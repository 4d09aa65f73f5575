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
	"strings"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/kubenet-dev/kubenet/network"
	"github.com/kubenet-dev/kubenet/network/cni"
	"github.com/kubenet-dev/kubenet/network/kubenet"
)

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
		return usagef("missing command (%s)", commandNames)
	}
	cmd, pos := pos[0], pos[1:]
	if _, ok := commandFlags()[cmd]; !ok {
		return usagef("unknown command %q (%s)", cmd, commandNames)
	}
	if err := checkCommandFlags(fs, cmd); err != nil {
		return err
	}
	switch cmd {
	case "allocations", "gc":
		if len(pos) != 0 {
			return usagef("%s takes no arguments", cmd)
		}
		if cmd == "gc" {
			return collectGarbage(&o, stdout, stderr)
		}
		allocs, err := listAllocations(&o)
		if err != nil {
			return err
		}
		return printAllocations(stdout, allocs, o.json)
	}
	var pod podRef
	if cmd != "ready" {
		if len(pos) != 2 {
			return usagef("%s needs NAMESPACE NAME, got %d argument(s)", cmd, len(pos))
		}
		if o.netns == "" {
			return usagef("%s needs --netns PATH", cmd)
		}
		pod = podRef{namespace: pos[0], name: pos[1], id: network.ContainerID{Type: "kubenetctl", ID: sandboxID(o.netns, o.id)}}
	} else if len(pos) != 0 {
		return usagef("ready takes no arguments")
	}

	pm, closePlugin, err := o.pluginManager(stderr)
	if err != nil {
		return err
	}
	defer closePlugin()
	switch cmd {
	case "ready":
		if err := pm.Status(); err != nil {
			return fmt.Errorf("network plugin %q is not ready: %w", pm.PluginName(), err)
		}
		fmt.Fprintf(stdout, "network plugin %q is ready\n", pm.PluginName())
		return nil
	case "setup":
		if err := pm.SetUpPod(pod.namespace, pod.name, pod.id, o.annotations, nil); err != nil {
			// As the shim does: undo whatever part of the set-up happened.
			if terr := pm.TearDownPod(pod.namespace, pod.name, pod.id); terr != nil {
				err = fmt.Errorf("%w (and tearing down failed: %v)", err, terr)
			}
			return err
		}
		return printStatus(stdout, pm, pod, o.json)
	case "teardown":
		return pm.TearDownPod(pod.namespace, pod.name, pod.id)
	default: // status
		return printStatus(stdout, pm, pod, o.json)
	}
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

// pluginManager builds both plugins, selects one by --network-plugin as kubelet does, sends the
// pod CIDR event and wraps the plugin in a PluginManager.
func (o *options) pluginManager(stderr io.Writer) (*network.PluginManager, func(), error) {
	kn, nodeNS, logger, closeAll, err := o.newKubenet(stderr)
	if err != nil {
		return nil, nil, err
	}
	cn := cni.New(cni.Options{ConfDir: o.confDir, BinDirs: strings.Split(o.binDirs, ","), CacheDir: o.cacheDir, NodeNS: nodeNS, Logger: logger})
	host := &cliHost{netns: o.netns, ports: o.ports}
	plugin, err := network.InitNetworkPlugin([]network.NetworkPlugin{kn, cn}, o.plugin, host, network.HairpinMode(o.hairpin), o.nonMasq, o.mtu)
	if err != nil {
		closeAll()
		return nil, nil, err
	}
	if o.podCIDR != "" {
		plugin.Event(network.PodCIDRChangeEvent, map[string]interface{}{network.PodCIDRChangeDetailCIDR: o.podCIDR})
	}
	pm, err := network.NewPluginManager(plugin, nil)
	if err != nil {
		closeAll()
		return nil, nil, err
	}
	return pm, closeAll, nil
}

func (o *options) logger(stderr io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return nil, usagef("--log-level %q: %v", o.logLevel, err)
	}
	return slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level})), nil
}

// openNodeNS opens --node-netns (nil without it) and returns its closer.
func (o *options) openNodeNS() (ns.NetNS, func(), error) {
	if o.nodeNetns == "" {
		return nil, func() {}, nil
	}
	n, err := ns.GetNS(o.nodeNetns)
	if err != nil {
		return nil, nil, fmt.Errorf("--node-netns: %w", err)
	}
	return n, func() { _ = n.Close() }, nil
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

// newKubenet makes the kubenet plugin both paths use, in the node namespace and with the
// logger the flags ask for. closeAll closes the plugin and then the namespace.
func (o *options) newKubenet(stderr io.Writer) (kn *kubenet.Plugin, nodeNS ns.NetNS, logger *slog.Logger, closeAll func(), err error) {
	logger, err = o.logger(stderr)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	nodeNS, closeNS, err := o.openNodeNS()
	if err != nil {
		return nil, nil, nil, nil, err
	}
	kn = kubenet.New(kubenet.Options{NodeNS: nodeNS, DataDir: o.dataDir, Network: o.network, Bridge: o.bridge, Logger: logger, SkipPortReacquire: true})
	return kn, nodeNS, logger, func() { _ = kn.Close(); closeNS() }, nil
}
