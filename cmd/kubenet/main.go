// Command kubenet is the kubenet CNI plugin (`"type": "kubenet"`). It reads the CNI environment
// and configuration, calls the core package and prints the result or error; with the logFile
// key it also appends one JSON line per call to that file (calllog.go). Run without CNI_COMMAND
// it prints its name, version and the CNI versions it supports.
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
	// Sets the runtime's processors for the verb; it depends on nothing but the runtime and
	// syscall, so it initializes before the packages that could start threads.
	_ "github.com/kubenet-dev/kubenet/internal/procs"
	"github.com/kubenet-dev/kubenet/internal/verblog"
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
		Add:    run("ADD", onAttachment(core.ParseConfig, true, add)),
		Del:    run("DEL", onAttachment(core.ParseTeardownConfig, false, done(core.Del))),
		Check:  run("CHECK", onAttachment(core.ParseCheckConfig, false, done(core.Check))),
		Status: run("STATUS", status),
		GC:     run("GC", gc),
	}, version.PluginSupports(core.SupportedVersions()...), fmt.Sprintf("kubenet CNI plugin %s", buildVersion))
}

// verb is one CNI verb: it returns what the call log records of a success.
type verb func(context.Context, *skel.CmdArgs) (*verblog.Result, error)

// run gives each verb a context that ends at the timeout or on SIGTERM/SIGINT, and logs the call.
func run(name string, f verb) func(*skel.CmdArgs) error {
	return func(args *skel.CmdArgs) error {
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), operationTimeout)
		defer cancel()
		ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
		defer stop()
		result, err := f(ctx, args)
		logCall(ctx, name, args, start, result, err)
		return err
	}
}

// onAttachment adapts a verb that works on one attachment: it parses the configuration with
// parse and the attachment (CNI_CONTAINERID, CNI_IFNAME, CNI_NETNS, CNI_ARGS) before calling it.
// CNI_ARGS only names the pod for the record ADD writes, so only ADD (strictArgs) refuses
// malformed ones: DEL and CHECK must not fail on them.
func onAttachment(parse func([]byte) (*core.Config, error), strictArgs bool, f func(context.Context, *core.Config, core.Attachment) (*verblog.Result, error)) verb {
	return func(ctx context.Context, args *skel.CmdArgs) (*verblog.Result, error) {
		cfg, err := parse(args.StdinData)
		if err != nil {
			return nil, err
		}
		pod, err := ParseCNIArgs(args.Args)
		if err != nil && strictArgs {
			return nil, err
		}
		return f(ctx, cfg, core.Attachment{ContainerID: args.ContainerID, IfName: args.IfName, NetNS: args.Netns, Pod: pod.Pod()})
	}
}

// done adapts a verb without a result of its own.
func done(f func(context.Context, *core.Config, core.Attachment) error) func(context.Context, *core.Config, core.Attachment) (*verblog.Result, error) {
	return func(ctx context.Context, cfg *core.Config, att core.Attachment) (*verblog.Result, error) {
		if err := f(ctx, cfg, att); err != nil {
			return nil, err
		}
		return &verblog.Result{}, nil
	}
}

// add prints the result in the caller's CNI version.
func add(ctx context.Context, cfg *core.Config, att core.Attachment) (*verblog.Result, error) {
	result, err := core.Add(ctx, cfg, att)
	if err != nil {
		return nil, err
	}
	if err := types.PrintResult(result, cfg.CNIVersion); err != nil {
		return nil, err
	}
	logged := &verblog.Result{}
	for _, ip := range result.IPs {
		logged.IPs = append(logged.IPs, ip.Address.String())
	}
	return logged, nil
}

func status(ctx context.Context, args *skel.CmdArgs) (*verblog.Result, error) {
	cfg, err := core.ParseConfig(args.StdinData)
	if err != nil {
		return nil, core.StatusConfigError(err)
	}
	if err := core.Status(ctx, cfg); err != nil {
		return nil, err
	}
	return &verblog.Result{}, nil
}

func gc(ctx context.Context, args *skel.CmdArgs) (*verblog.Result, error) {
	cfg, err := core.ParseTeardownConfig(args.StdinData)
	if err != nil {
		return nil, err
	}
	valid, err := core.ParseValidAttachments(args.StdinData)
	if err != nil {
		return nil, err
	}
	if err := core.GC(ctx, cfg, valid); err != nil {
		return nil, err
	}
	return &verblog.Result{}, nil
}
