// Package plugins lists the network plugins this module provides, as kubelet's
// cmd/kubelet/app/plugins.go did: ProbeNetworkPlugins returns the CNI wrapper and kubenet, and
// network.InitNetworkPlugin selects one of them by --network-plugin and Inits it.
package plugins

import (
	"errors"
	"io"
	"log/slog"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/kubenet-dev/kubenet/network"
	"github.com/kubenet-dev/kubenet/network/cni"
	"github.com/kubenet-dev/kubenet/network/kubenet"
)

// ProbeNetworkPlugins returns the CNI wrapper (reading cniConfDir, running plugins from
// cniBinDir, a comma-separated list, and from kubelet's vendor dirs /opt/<type>/bin) and the
// in-process kubenet plugin with its defaults, in that order. "" takes each default
// (/etc/cni/net.d, /opt/cni/bin).
func ProbeNetworkPlugins(cniConfDir, cniBinDir string) []network.NetworkPlugin {
	return Probe(Options{CNIConfDir: cniConfDir, CNIBinDirs: network.SplitList(cniBinDir)})
}

// Options configure Probe; zero values take the plugins' defaults.
type Options struct {
	CNIConfDir         string
	CNIBinDirs         []string
	CNICacheDir        string
	VendorCNIDirPrefix string
	CNITimeout         time.Duration
	// NodeNS and Logger apply to both plugins (kubenet's own take precedence when set).
	NodeNS ns.NetNS
	Logger *slog.Logger
	// Kubenet configures the kubenet plugin (data dir, network, bridge, ...).
	Kubenet kubenet.Options
}

// Probe returns the CNI wrapper and the kubenet plugin built from opts.
func Probe(opts Options) []network.NetworkPlugin {
	kn := opts.Kubenet
	if kn.NodeNS == nil {
		kn.NodeNS = opts.NodeNS
	}
	if kn.Logger == nil {
		kn.Logger = opts.Logger
	}
	return []network.NetworkPlugin{
		cni.New(cni.Options{
			ConfDir: opts.CNIConfDir, BinDirs: opts.CNIBinDirs, CacheDir: opts.CNICacheDir,
			VendorCNIDirPrefix: opts.VendorCNIDirPrefix, Timeout: opts.CNITimeout,
			NodeNS: opts.NodeNS, Logger: opts.Logger,
		}),
		kubenet.New(kn),
	}
}

// Close releases what the plugins hold (kubenet's host-port sockets; state on disk stays). A
// shim calls it when it shuts down.
func Close(plugins []network.NetworkPlugin) error {
	var errs []error
	for _, p := range plugins {
		if c, ok := p.(io.Closer); ok {
			errs = append(errs, c.Close())
		}
	}
	return errors.Join(errs...)
}
