// Command kubenet is the kubenet CNI plugin (`"type": "kubenet"`). It reads the CNI environment
// and configuration, calls the core package and prints the result or error. Run without
// CNI_COMMAND it prints its name, version and the CNI versions it supports.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/kubenet-dev/kubenet/core"
)

// buildVersion is stamped by the Makefile (-ldflags -X main.buildVersion=...).
var buildVersion = "dev"

// operationTimeout bounds one CNI call below the CRI's 4-minute request timeout, like kubelet's
// 220 s for CNI calls, so a stuck kernel call fails instead of wedging the runtime.
const operationTimeout = 220 * time.Second

func main() {
	if err := checkEnv(os.Getenv); err != nil {
		_ = err.Print()
		os.Exit(1)
	}
	skel.PluginMainFuncs(skel.CNIFuncs{
		Add:    run(onAttachment(add)),
		Del:    run(onAttachment(core.Del)),
		Check:  run(onAttachment(core.Check)),
		Status: run(status),
		GC:     run(gc),
	}, version.PluginSupports(core.SupportedVersions()...), fmt.Sprintf("kubenet CNI plugin %s", buildVersion))
}

// run gives each verb a context that ends at the timeout or on SIGTERM/SIGINT.
func run(f func(context.Context, *skel.CmdArgs) error) func(*skel.CmdArgs) error {
	return func(args *skel.CmdArgs) error {
		ctx, cancel := context.WithTimeout(context.Background(), operationTimeout)
		defer cancel()
		ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
		defer stop()
		return f(ctx, args)
	}
}

// onAttachment adapts a verb that works on one attachment: it parses the configuration and the
// attachment (CNI_CONTAINERID, CNI_IFNAME, CNI_NETNS, CNI_ARGS) before calling it.
func onAttachment(verb func(context.Context, *core.Config, core.Attachment) error) func(context.Context, *skel.CmdArgs) error {
	return func(ctx context.Context, args *skel.CmdArgs) error {
		cfg, err := core.ParseConfig(args.StdinData)
		if err != nil {
			return err
		}
		pod, err := ParseCNIArgs(args.Args)
		if err != nil {
			return err
		}
		return verb(ctx, cfg, core.Attachment{ContainerID: args.ContainerID, IfName: args.IfName, NetNS: args.Netns, Pod: pod.Pod()})
	}
}

// add prints the result in the caller's CNI version.
func add(ctx context.Context, cfg *core.Config, att core.Attachment) error {
	result, err := core.Add(ctx, cfg, att)
	if err != nil {
		return err
	}
	return types.PrintResult(result, cfg.CNIVersion)
}

func status(ctx context.Context, args *skel.CmdArgs) error {
	cfg, err := core.ParseConfig(args.StdinData)
	if err != nil {
		return core.StatusConfigError(err)
	}
	return core.Status(ctx, cfg)
}

func gc(ctx context.Context, args *skel.CmdArgs) error {
	cfg, err := core.ParseConfig(args.StdinData)
	if err != nil {
		return err
	}
	valid, err := core.ParseValidAttachments(args.StdinData)
	if err != nil {
		return err
	}
	return core.GC(ctx, cfg, valid)
}
