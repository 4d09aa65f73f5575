package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/kubenet-dev/kubenet/core"
	"github.com/kubenet-dev/kubenet/network"
	"github.com/kubenet-dev/kubenet/network/cni"
	"github.com/kubenet-dev/kubenet/network/kubenet"
)

// options are all flags. Global and per-command flags share one set so that they may appear
// before or after the command and its arguments, as kubectl users expect.
type options struct {
	// kubelet's flags
	plugin   string
	confDir  string
	binDirs  string
	cacheDir string
	hairpin  string
	nonMasq  string
	mtu      int
	podCIDR  string
	// kubenet's own
	dataDir   string
	network   string
	bridge    string
	nodeNetns string
	takeOver  bool
	netfilter string
	logLevel  string
	level     slog.Level // logLevel, parsed by validate
	// per command
	netns       string
	id          string
	ports       portList
	annotations annotationList
	json        bool
	valid       validList
	all         bool
	agent       string
	output      string
	kubeconfig  string
}

// newFlagSet registers every flag on a set that reports errors only through Parse's result (so
// the command prints them as one line); printUsage writes the help text to out.
func newFlagSet(o *options) *flag.FlagSet {
	fs := flag.NewFlagSet("kubenetctl", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	fs.StringVar(&o.plugin, "network-plugin", kubenet.PluginName, `network plugin: "kubenet", "cni", or "" for none`)
	fs.StringVar(&o.confDir, "cni-conf-dir", cni.DefaultConfDir, "CNI configuration directory (--network-plugin=cni)")
	fs.StringVar(&o.binDirs, "cni-bin-dir", cni.DefaultBinDir, "comma-separated CNI plugin directories (--network-plugin=cni)")
	fs.StringVar(&o.cacheDir, "cni-cache-dir", cni.DefaultCacheDir, "libcni cache directory (--network-plugin=cni)")
	fs.StringVar(&o.hairpin, "hairpin-mode", string(kubenet.DefaultHairpinMode), `how a pod reaches itself through a Service: "hairpin-veth", "promiscuous-bridge" or "none" (kubenet)`)
	fs.StringVar(&o.nonMasq, "non-masquerade-cidr", kubenet.DefaultNonMasqueradeCIDR, "comma-separated destinations that pod traffic reaches without SNAT (kubenet)")
	fs.IntVar(&o.mtu, "network-plugin-mtu", network.UseDefaultMTU, "pod MTU; 0 detects it from the node's default-route links (kubenet)")
	fs.StringVar(&o.podCIDR, "pod-cidr", "", "the node's pod CIDR(s), comma-separated, one per family (sent as the pod-cidr-change event)")
	fs.StringVar(&o.dataDir, "kubenet-data-dir", core.DefaultDataDir, "kubenet's address and attachment state directory (kubenet)")
	fs.StringVar(&o.network, "kubenet-network", kubenet.DefaultNetwork, "kubenet's network name (kubenet)")
	fs.StringVar(&o.bridge, "kubenet-bridge", core.DefaultBridge, "kubenet's bridge (kubenet)")
	fs.StringVar(&o.netfilter, "netfilter-backend", string(core.NetfilterAuto), `where kubenet's rules go: "auto" (nftables where the kernel holds them, else iptables), "nftables" or "iptables" (kubenet)`)
	fs.BoolVar(&o.takeOver, "take-over-node", false, "apply these settings to the node even though another owner (a CNI configuration, a shim) set it up with different ones; kubenetctl becomes the owner (kubenet)")
	fs.StringVar(&o.nodeNetns, "node-netns", "", "the node's network namespace, when kubenetctl does not run in it")
	fs.StringVar(&o.logLevel, "log-level", "error", "log level on stderr: debug, info, warn or error")
	fs.StringVar(&o.netns, "netns", "", "the pod sandbox's network namespace (setup, teardown, status)")
	fs.StringVar(&o.id, "id", "", "the pod sandbox ID (default: derived from --netns)")
	fs.Var(&o.ports, "port", "a host port HOSTPORT:CONTAINERPORT[/PROTO][@HOSTIP] (setup; repeatable)")
	fs.Var(&o.annotations, "annotation", "a pod annotation K=V, e.g. kubernetes.io/ingress-bandwidth=10M (setup; repeatable)")
	fs.BoolVar(&o.json, "json", false, "print JSON (setup, status, allocations, node, peers, policy explain, policy trace)")
	fs.Var(&o.valid, "valid", "an attachment to keep, ID or ID/IFNAME, comma-separated or repeated (gc)")
	fs.BoolVar(&o.all, "all", false, "remove every attachment (gc)")
	fs.StringVar(&o.output, "o", "text", `output format: "text" or "json" (policy explain, policy trace)`)
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file, as kubectl's: compare the kernel with what the API's objects mean now (policy explain)")
	fs.StringVar(&o.agent, "agent", "http://127.0.0.1:9309", "kubenet-agent's HTTP address (its --metrics-bind-address) (peers)")
	return fs
}

// validate checks the values of the global flags that no plugin sees before it acts: a bad one is
// bad usage (exit 2), not a failed operation.
func (o *options) validate() error {
	if err := o.level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return usagef("--log-level %q: %v", o.logLevel, err)
	}
	if o.output != "text" && o.output != "json" {
		return usagef("-o %q: want text or json", o.output)
	}
	if !network.HairpinMode(o.hairpin).Valid() {
		return usagef("--hairpin-mode %q: valid values are %q, %q and %q", o.hairpin, network.HairpinVeth, network.PromiscuousBridge, network.HairpinNone)
	}
	var v4, v6 int
	for _, s := range network.SplitList(o.podCIDR) {
		p, err := netip.ParsePrefix(s)
		if err != nil || p.Masked() != p {
			return usagef("--pod-cidr %q: %q is not a network address with a prefix length (10.244.1.0/24)", o.podCIDR, s)
		}
		if p.Addr().Is4() {
			v4++
		} else {
			v6++
		}
	}
	if v4 > 1 || v6 > 1 {
		return usagef("--pod-cidr %q: at most one CIDR per family", o.podCIDR)
	}
	return nil
}

// asJSON tells whether the command prints JSON (--json or -o json).
func (o *options) asJSON() bool { return o.json || o.output == "json" }

// parse reads flags anywhere among the positional arguments, which it returns.
func parse(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// checkCommandFlags refuses per-command flags given to a command that does not take them.
func checkCommandFlags(fs *flag.FlagSet, cmd command) error {
	perCommand := map[string]bool{}
	for _, c := range commands() {
		for _, name := range c.flags {
			perCommand[name] = true
		}
	}
	var bad []string
	fs.Visit(func(f *flag.Flag) {
		if perCommand[f.Name] && !slices.Contains(cmd.flags, f.Name) {
			bad = append(bad, "--"+f.Name)
		}
	})
	if len(bad) > 0 {
		return usagef("%s does not take %s", cmd.name, strings.Join(bad, ", "))
	}
	return nil
}

// portList is --port, repeatable.
type portList []*network.PortMapping

func (l *portList) String() string { return fmt.Sprint(len(*l), " ports") }

// Set parses HOSTPORT:CONTAINERPORT[/PROTO][@HOSTIP].
func (l *portList) Set(s string) error {
	pm, err := parsePort(s)
	if err != nil {
		return err
	}
	*l = append(*l, pm)
	return nil
}

func parsePort(s string) (*network.PortMapping, error) {
	spec, hostIP, _ := strings.Cut(s, "@")
	spec, proto, _ := strings.Cut(spec, "/")
	hp, cp, ok := strings.Cut(spec, ":")
	if !ok {
		return nil, fmt.Errorf("port %q: want HOSTPORT:CONTAINERPORT[/PROTO][@HOSTIP]", s)
	}
	hostPort, err1 := strconv.ParseUint(hp, 10, 16)
	containerPort, err2 := strconv.ParseUint(cp, 10, 16)
	if err1 != nil || err2 != nil || hostPort == 0 || containerPort == 0 {
		return nil, fmt.Errorf("port %q: ports are numbers from 1 to 65535", s)
	}
	switch strings.ToLower(proto) {
	case "", "tcp", "udp", "sctp":
	default:
		return nil, fmt.Errorf("port %q: protocol must be tcp, udp or sctp", s)
	}
	if hostIP != "" {
		a, err := netip.ParseAddr(strings.Trim(hostIP, "[]"))
		if err != nil {
			return nil, fmt.Errorf("port %q: %q is not an IP address", s, hostIP)
		}
		hostIP = a.String()
	}
	return &network.PortMapping{HostPort: int32(hostPort), ContainerPort: int32(containerPort), Protocol: strings.ToUpper(proto), HostIP: hostIP}, nil
}

// annotationList is --annotation, repeatable.
type annotationList map[string]string

func (a *annotationList) String() string { return fmt.Sprint(len(*a), " annotations") }

// Set parses K=V.
func (a *annotationList) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return errors.New("annotation " + strconv.Quote(s) + ": want KEY=VALUE")
	}
	if *a == nil {
		*a = annotationList{}
	}
	(*a)[k] = v
	return nil
}

// printUsage writes the usage text, made from the command table, and the flags to out.
func printUsage(fs *flag.FlagSet, out io.Writer) {
	fmt.Fprintln(out, "Usage:")
	for _, c := range commands() {
		fmt.Fprintln(out, strings.TrimRight("  kubenetctl [flags] "+c.name+" "+c.synopsis, " "))
	}
	fmt.Fprintln(out, "\nCommands:")
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	for _, c := range commands() {
		fmt.Fprintf(tw, "  %s\t%s\n", c.name, c.summary)
	}
	_ = tw.Flush()
	fmt.Fprint(out, `
The sandbox ID is derived from PATH unless --id is given. Exit status: 0 ok, 1 failed, 2 usage.

Flags:
`)
	fs.SetOutput(out)
	fs.PrintDefaults()
}
