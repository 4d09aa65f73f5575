// Command kubenet-agent runs on every node (a host-network DaemonSet, deploy/kubenet.yaml): it
// writes the kubenet conflist from its Node's spec.podCIDRs, installs the kubenet binary, keeps
// routes to the other nodes' pod CIDRs and sets the Node's NetworkUnavailable condition.
// docs/agent.md describes the flags, the metrics and the install.
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/pprof"
	"net/netip"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	clientfeatures "k8s.io/client-go/features"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	typednetworkingv1 "k8s.io/client-go/kubernetes/typed/networking/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/kubenet-dev/kubenet/agent"
	"github.com/kubenet-dev/kubenet/agent/cnidir"
	"github.com/kubenet-dev/kubenet/agent/cri"
	"github.com/kubenet-dev/kubenet/agent/routes"
	"github.com/kubenet-dev/kubenet/core"
	"github.com/kubenet-dev/kubenet/internal/policyrules"
)

// buildVersion is stamped at build time (-ldflags -X main.buildVersion=...).
var buildVersion = "dev"

type options struct {
	kubeconfig  string
	metricsAddr string
	profiling   bool
	logLevel    string
	version     bool
	clusterCIDR string
	serviceCIDR string
	routing     string
	vxlanPort   uint
	vxlanVNI    uint
	policyLog   bool
	logGroup    uint
	logRate     uint
	memLimitMiB uint
	cfg         agent.Config
}

func parseFlags(args []string) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("kubenet-agent", flag.ContinueOnError)
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file; empty: the in-cluster service account")
	fs.StringVar(&o.cfg.NodeName, "node-name", os.Getenv("NODE_NAME"), "this node's Node object (default $NODE_NAME)")
	fs.StringVar(&o.clusterCIDR, "cluster-cidr", "", "cluster pod CIDR(s), comma-separated: the conflist's nonMasqueradeCIDRs (pods reach them with their own address); a Node's pod CIDR outside them is refused")
	fs.StringVar(&o.serviceCIDR, "service-cidr", "", "service CIDR(s), comma-separated (kube-apiserver's --service-cluster-ip-range): a Node's pod CIDR overlapping one is refused")
	fs.IntVar(&o.cfg.Conflist.MTU, "mtu", 0, "MTU of the bridge and veths; 0: the plugin detects it")
	fs.StringVar(&o.cfg.Conflist.HairpinMode, "hairpin-mode", "hairpin-veth", "hairpin-veth, promiscuous-bridge or none")
	fs.StringVar(&o.cfg.Conflist.Bridge, "bridge", "", "bridge name (default: the plugin's, cbr0)")
	fs.StringVar(&o.cfg.Conflist.DataDir, "data-dir", "", "the plugin's state directory (default: the plugin's, /var/lib/cni/networks)")
	fs.StringVar(&o.cfg.Conflist.Name, "network-name", cnidir.DefaultName, "CNI network name")
	fs.StringVar(&o.cfg.Conflist.CNIVersion, "cni-version", cnidir.DefaultCNIVersion, "the conflist's cniVersion (cniVersions also lists 1.1.0 for runtimes that know it)")
	fs.StringVar(&o.cfg.ConfDir, "cni-conf-dir", agent.DefaultConfDir, "CNI conf dir the runtime reads")
	fs.StringVar(&o.cfg.ConfFile, "cni-conf-name", cnidir.DefaultFileName, "conflist file name in the conf dir")
	fs.StringVar(&o.cfg.BinDir, "cni-bin-dir", agent.DefaultBinDir, "CNI bin dir the runtime executes plugins from")
	fs.StringVar(&o.cfg.BinSource, "cni-bin-source", "", "kubenet binary to install into --cni-bin-dir when it differs; empty: install nothing")
	fs.BoolVar(&o.cfg.NetworkPolicy, "network-policy", true, "enforce NetworkPolicy on this node (off: the policy table is removed); needs the nftables backend")
	fs.BoolVar(&o.cfg.PolicyCutEstablished, "policy-cut-established", false, "when a policy change denies a connection that is already established, mark its conntrack entry cut so that its packets are dropped, whichever end sends (off: it flows until it ends, as the API allows)")
	fs.BoolVar(&o.policyLog, "policy-log", false, "log what NetworkPolicies drop: one JSON line per burst on stdout (pods, addresses, protocol, port, the policies), sent by the kernel rate-limited to an NFLOG group; off: the rules have no log action (the drop counters are there either way)")
	fs.UintVar(&o.logGroup, "policy-log-group", policyrules.DefaultLogGroup, "the NFLOG group (1-65535) of --policy-log; no other process on the node may bind it")
	fs.UintVar(&o.logRate, "policy-log-rate", policyrules.DefaultLogRate, "drops per second and direction --policy-log sends at most (bursts of as many); the rest is counted in kubenet_networkpolicy_log_lost_total")
	fs.StringVar(&o.cfg.ToolRoot, "tool-root", "", "the node's root file system mounted into the agent (deploy/kubenet.yaml: /host/root): with the iptables backend the agent runs the node's own iptables, ip6tables and ebtables from it, chrooted, in the node's legacy or nft mode; empty: the tools on the agent's PATH")
	fs.StringVar(&o.cfg.Conflist.NetfilterBackend, "netfilter-backend", "", `the conflist's netfilterBackend: "auto" (nftables where the kernel holds kubenet's rules, else iptables), "nftables" or "iptables"; empty leaves the key out (auto)`)
	fs.BoolVar(&o.cfg.ManageRoutes, "manage-routes", true, "keep routes to other nodes' pod CIDRs (off where a cloud route table does it)")
	fs.StringVar(&o.routing, "routing", string(agent.RoutingAuto), "how other nodes' pods are reached: auto (direct via a node's InternalIP where it is on one of this node's networks, else through the VXLAN overlay), direct (always via the InternalIP: every node on one link), vxlan (always through the overlay)")
	fs.UintVar(&o.vxlanPort, "vxlan-port", core.DefaultOverlayPort, "UDP port of the VXLAN overlay (8472: Linux's and flannel's); open it between the nodes")
	fs.UintVar(&o.vxlanVNI, "vxlan-vni", core.DefaultOverlayVNI, "VXLAN network identifier of the overlay (1-16777215), the same on every node")
	fs.StringVar(&o.cfg.VXLANDevice, "vxlan-device", core.DefaultOverlayDevice, "name of the overlay's VXLAN device")
	fs.IntVar(&o.cfg.RouteProtocol, "route-protocol", routes.DefaultProtocol, "route protocol number that marks the agent's routes (1-255)")
	fs.DurationVar(&o.cfg.ResyncPeriod, "resync-period", agent.DefaultResyncPeriod, "full re-sync interval; also repairs routes removed behind the agent's back")
	fs.StringVar(&o.cfg.RuntimeEndpoint, "container-runtime-endpoint", cri.DefaultEndpoint, "CRI socket of the runtime that runs the node's pods, asked which sandboxes exist so that attachments of dead sandboxes are collected; empty: collect nothing")
	fs.DurationVar(&o.cfg.StaleGrace, "stale-gc-grace", agent.DefaultStaleGrace, "an attachment is collected only after its sandbox has been missing, and its files old, for this long (longer than any RunPodSandbox)")
	fs.DurationVar(&o.cfg.StaleInterval, "stale-gc-interval", agent.DefaultStaleInterval, "how often the runtime is asked for its sandboxes")
	fs.DurationVar(&o.cfg.HealPeriod, "heal-period", agent.DefaultHealPeriod, "re-assert the network's node-wide rules, sysctls and hostPort map elements at least this often (also on every nftables change); 0: never")
	fs.StringVar(&o.metricsAddr, "metrics-bind-address", "127.0.0.1:9309", "address of /healthz, /readyz and /metrics; empty: no HTTP server")
	fs.BoolVar(&o.profiling, "profiling", false, "also serve Go's runtime profiles (CPU, heap) under /debug/pprof/ on --metrics-bind-address; they show the agent's internals, so keep the address local")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.UintVar(&o.memLimitMiB, "memory-limit-mib", defaultMemLimitMiB, "soft memory limit of the Go runtime in MiB (runtime/debug.SetMemoryLimit): the garbage collector works harder as the agent nears it, but the agent outgrows it when its live data does; 0: none (GOMEMLIMIT, when set, wins)")
	fs.BoolVar(&o.version, "version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if o.cfg.StaleGrace <= 0 || o.cfg.StaleInterval <= 0 {
		return nil, fmt.Errorf("--stale-gc-grace %s and --stale-gc-interval %s must be positive", o.cfg.StaleGrace, o.cfg.StaleInterval)
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if o.cfg.NetworkPolicy && o.cfg.Conflist.NetfilterBackend == string(core.NetfilterIPTables) {
		return nil, fmt.Errorf("--network-policy needs the nftables backend (policies are nftables sets and maps); with --netfilter-backend iptables pass --network-policy=false")
	}
	if o.memLimitMiB > maxMemLimitMiB {
		return nil, fmt.Errorf("--memory-limit-mib %d: must be at most %d (the limit in bytes is an int64)", o.memLimitMiB, maxMemLimitMiB)
	}
	if o.logGroup == 0 || o.logGroup > 65535 {
		return nil, fmt.Errorf("--policy-log-group %d: must be between 1 and 65535", o.logGroup)
	}
	if o.logRate == 0 || o.logRate > 1_000_000 {
		return nil, fmt.Errorf("--policy-log-rate %d: must be between 1 and 1000000", o.logRate)
	}
	if o.policyLog && !o.cfg.NetworkPolicy {
		return nil, fmt.Errorf("--policy-log needs --network-policy")
	}
	if o.policyLog {
		o.cfg.PolicyDropLog = policyrules.DropLog{Group: uint16(o.logGroup), Rate: uint32(o.logRate), Burst: uint32(o.logRate)}
	}
	routing, err := agent.ParseRouting(o.routing)
	if err != nil {
		return nil, fmt.Errorf("--%w", err)
	}
	o.cfg.Routing = routing
	if o.vxlanPort == 0 || o.vxlanPort > 65535 {
		return nil, fmt.Errorf("--vxlan-port %d: must be between 1 and 65535", o.vxlanPort)
	}
	if o.vxlanVNI == 0 || o.vxlanVNI >= 1<<24 {
		return nil, fmt.Errorf("--vxlan-vni %d: must be between 1 and 16777215", o.vxlanVNI)
	}
	o.cfg.VXLANPort, o.cfg.VXLANVNI = uint16(o.vxlanPort), uint32(o.vxlanVNI)
	if err := linkName(o.cfg.VXLANDevice); err != nil {
		return nil, fmt.Errorf("--vxlan-device %q: %w", o.cfg.VXLANDevice, err)
	}
	if bridge := cmp.Or(o.cfg.Conflist.Bridge, core.DefaultBridge); bridge == cmp.Or(o.cfg.VXLANDevice, core.DefaultOverlayDevice) {
		return nil, fmt.Errorf("--vxlan-device and the pods' bridge (--bridge) are both %q", bridge)
	}
	if o.cfg.Conflist.NonMasqueradeCIDRs, err = parseCIDRs("--cluster-cidr", o.clusterCIDR); err != nil {
		return nil, err
	}
	if o.cfg.ServiceCIDRs, err = parseCIDRs("--service-cidr", o.serviceCIDR); err != nil {
		return nil, err
	}
	return o, nil
}

// parseCIDRs reads a comma-separated list of network CIDRs.
func parseCIDRs(flagName, list string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range strings.Split(list, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil || p.Masked() != p {
			return nil, fmt.Errorf("%s %q: not a network CIDR", flagName, s)
		}
		out = append(out, p)
	}
	return out, nil
}

// defaultMemLimitMiB is the agent's default soft memory limit: at issue 27's size (10 000
// pods, 2 000 policies) its live heap is about 50 MiB, and without a limit the garbage collector
// let the heap grow to twice the live data between cycles, the peaks of a policy pass's garbage
// on top (peak RSS 165 – 177 MiB). The resident set is the Go runtime's memory plus some 30 MiB
// of the binary's own pages: 100 MiB kept the peak at 131 – 134 MiB, 140 MiB let it reach 171
// MiB; 110 MiB stays under issue 27's 150 MiB goal with a little more room for the collector.
// The manifest's memory limit is 200Mi.
const defaultMemLimitMiB = 110

// maxMemLimitMiB is the largest --memory-limit-mib whose bytes fit the runtime's int64: beyond
// it they wrapped around, to 0 (a collector running all the time) or below.
const maxMemLimitMiB = math.MaxInt64 >> 20

// softMemoryLimit is the limit in bytes for --memory-limit-mib, and whether to set it: not when
// it is 0, nor when GOMEMLIMIT (gomemlimit) is set, which the runtime has applied already.
func softMemoryLimit(mib uint, gomemlimit string) (int64, bool) {
	if mib == 0 || gomemlimit != "" {
		return 0, false
	}
	return int64(mib) << 20, true
}

func main() {
	o, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "kubenet-agent:", err)
		os.Exit(2)
	}
	if o.version {
		fmt.Println("kubenet-agent", buildVersion)
		return
	}
	if err := run(o); err != nil {
		slog.Error("kubenet-agent failed", "err", err)
		os.Exit(1)
	}
}

func run(o *options) error {
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return fmt.Errorf("--log-level %q: %w", o.logLevel, err)
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	slog.SetDefault(log)
	// client-go logs through klog; into the same JSON stream.
	klog.SetSlogLogger(log.With("component", "client-go"))

	if limit, ok := softMemoryLimit(o.memLimitMiB, os.Getenv("GOMEMLIMIT")); ok {
		debug.SetMemoryLimit(limit)
	}
	if err := streamInitialLists(); err != nil {
		return err
	}
	restCfg, err := clientConfig(o.kubeconfig)
	if err != nil {
		return err
	}
	restCfg.UserAgent = "kubenet-agent/" + buildVersion
	// Protobuf: a fraction of JSON's decoding work and garbage for a thousand Nodes.
	restCfg.ContentType = runtime.ContentTypeProtobuf
	restCfg.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	// The core/v1 client only: the agent reads Nodes and writes their status and Events, and a
	// clientset of every API group would be most of the binary.
	client, err := typedcorev1.NewForConfig(restCfg)
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	if o.cfg.NetworkPolicy {
		// NetworkPolicies are the one object of another group the agent reads.
		if o.cfg.Networking, err = typednetworkingv1.NewForConfig(restCfg); err != nil {
			return fmt.Errorf("kubernetes client: %w", err)
		}
	}
	o.cfg.Logger = log
	a, err := agent.New(client, o.cfg)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	if o.metricsAddr != "" {
		l, err := net.Listen("tcp", o.metricsAddr)
		if err != nil {
			return fmt.Errorf("--metrics-bind-address: %w", err)
		}
		srv := &http.Server{Handler: withProfiles(a.Handler(), o.profiling), ReadHeaderTimeout: 10 * time.Second}
		go func() {
			if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("http server", "err", err)
			}
		}()
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = srv.Shutdown(sctx)
		}()
		log.Info("serving /healthz, /readyz, /metrics", "addr", l.Addr().String())
	}
	log.Info("kubenet-agent starting", "version", buildVersion, "node", o.cfg.NodeName,
		"confDir", o.cfg.ConfDir, "binDir", o.cfg.BinDir, "manageRoutes", o.cfg.ManageRoutes, "runtimeEndpoint", o.cfg.RuntimeEndpoint,
		"networkPolicy", o.cfg.NetworkPolicy, "netfilterBackend", o.cfg.Conflist.NetfilterBackend)
	// Files and routes stay when the agent stops: an upgrade or restart must not disturb pods.
	return a.Run(ctx)
}

// streamInitialLists turns on client-go's WatchListClient, unless KUBE_FEATURE_WatchListClient
// says otherwise: the informer then receives the initial Nodes as a stream and keeps each one
// slimmed (agent.slimNode) as it arrives, instead of decoding one LIST response that holds
// every Node whole at once (at a thousand Nodes, most of the agent's peak memory). API servers
// without watch-list streaming get a LIST as before.
func streamInitialLists() error {
	if _, set := os.LookupEnv("KUBE_FEATURE_" + string(clientfeatures.WatchListClient)); set {
		return nil
	}
	gates, ok := clientfeatures.FeatureGates().(interface {
		Set(clientfeatures.Feature, bool) error
	})
	if !ok {
		return nil
	}
	if err := gates.Set(clientfeatures.WatchListClient, true); err != nil {
		return fmt.Errorf("client-go feature %s: %w", clientfeatures.WatchListClient, err)
	}
	return nil
}

func clientConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		c, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("in-cluster config (use --kubeconfig outside a pod): %w", err)
		}
		return c, nil
	}
	c, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("--kubeconfig %s: %w", kubeconfig, err)
	}
	return c, nil
}

// linkName says why the kernel would refuse name for a link (dev_valid_name), or nil; empty is
// the default.
func linkName(name string) error {
	switch {
	case name == "":
		return nil
	case len(name) > 15:
		return fmt.Errorf("longer than 15 bytes")
	case name == "." || name == "..":
		return fmt.Errorf("not a link name")
	case strings.ContainsAny(name, "/: \t\n\v\f\r"):
		return fmt.Errorf("a link name has no '/', ':' or white space")
	}
	return nil
}

// withProfiles adds Go's runtime profiles under /debug/pprof/ to h when on.
func withProfiles(h http.Handler, on bool) http.Handler {
	if !on {
		return h
	}
	mux := http.NewServeMux()
	mux.Handle("/", h)
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}
